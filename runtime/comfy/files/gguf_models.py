"""Models loaded by ComfyUI-GGUF (city96): which file they came from, for params disk.

ComfyUI-GGUF's loaders record no path, but its tensors are memory-mapped from the .gguf
file (`torch.from_numpy` over the `gguf` reader's memmap) until a load onto a GPU copies
them out. While they are, the mapping names the file (/proc/self/maps on Linux); the
disk engine then checks every tensor against the file's table before it reads a byte.
"""
import os
from typing import Callable, Optional

from ....placement.errors import PlacementError


def is_gguf_module(module) -> bool:
    """True when the module holds ComfyUI-GGUF tensors (a weight with `tensor_type`)."""
    return any(hasattr(p, "tensor_type") for p in module.parameters())


def mapped_file(address: int, maps: str = "/proc/self/maps") -> Optional[str]:
    """The file mapped at `address` in this process, or None (not mapped, or no maps)."""
    try:
        with open(maps) as fh:
            for line in fh:
                parts = line.split(None, 5)
                if len(parts) < 6:
                    continue
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                if lo <= address < hi:
                    return parts[5].strip() or None
    except OSError:
        return None
    return None


def gguf_model_file(module) -> Optional[str]:
    """The .gguf file a ComfyUI-GGUF model's weights are still mapped from, or None."""
    for p in module.parameters():
        if hasattr(p, "tensor_type") and p.device.type == "cpu" and p.numel():
            path = mapped_file(p.data_ptr())
            if path and path.lower().endswith(".gguf") and os.path.isfile(path) \
                    and in_model_folders(path):
                return path
            return None
    return None


def in_model_folders(path: str) -> bool:
    """Whether `path` lies in one of ComfyUI's model folders (folder_paths): the only
    files the engine reads, whatever named them."""
    try:
        import folder_paths
    except ImportError:
        return False
    real = os.path.realpath(path)
    for name in getattr(folder_paths, "folder_names_and_paths", {}):
        try:
            roots = folder_paths.get_folder_paths(name)
        except Exception:               # a folder type some custom node broke
            continue
        for root in roots:
            root = os.path.realpath(root)
            if os.path.commonpath([real, root]) == root:
                return True
    return False


def missing_file_error(module) -> PlacementError:
    return PlacementError(
        "diffusion: params disk needs this ComfyUI-GGUF model's .gguf file, and its weights "
        "are no longer mapped from it (a load onto a GPU copied them, this system has no "
        "/proc/self/maps, or the file is outside ComfyUI's model folders); use params cpu, "
        "or place the model before it first runs")


def gguf_key_map(path: str, module) -> Callable[[str], str]:
    """Module tensor name -> GGUF tensor name: ComfyUI-GGUF strips an optional
    'model.diffusion_model.' prefix when it loads; disk reads put it back."""
    from ...gguf import GGUFTensors
    with GGUFTensors(path) as table:
        names = set(table.tensors)
    probe = next((n for n, _ in module.named_parameters()), None)
    for prefix in ("", "model.diffusion_model."):
        if probe is None or prefix + probe in names:
            return (lambda k: k) if not prefix else (lambda k, p=prefix: p + k)
    raise PlacementError(f"params disk: {path} does not hold this model's tensors (no "
                         f"{probe!r}); it is not the file this model was loaded from")
