"""The file a ComfyUI diffusion MODEL was loaded from, and how its module's tensor names
map to that file's keys: what params disk and the workers read."""
from typing import Callable, Optional

import comfy.sd

from ....placement.errors import PlacementError
from .gguf_models import gguf_key_map, gguf_model_file


def diffusion_file(patcher) -> Optional[str]:
    """The file a MODEL was loaded from, when a core loader recorded it."""
    init = getattr(patcher, "cached_patcher_init", None)
    if not init:                # ComfyUI-GGUF records none: its mapping names the file
        return gguf_model_file(patcher.model.diffusion_model)
    fn, args = init[0], init[1]
    if fn is comfy.sd.load_diffusion_model or fn is comfy.sd.load_checkpoint_guess_config:
        return args[0]
    return None


def file_key_map(path: str, module) -> Callable[[str], str]:
    """Module tensor name -> file key: diffusion-model files store the names bare,
    checkpoints under a prefix."""
    from safetensors import safe_open
    if path.lower().endswith(".gguf"):
        return gguf_key_map(path, module)
    if not path.lower().endswith(".safetensors"):
        return lambda k: k
    with safe_open(path, framework="pt") as fh:
        keys = set(fh.keys())
    probe = next((n for n, _ in module.named_parameters()), None)
    for prefix in ("", "model.diffusion_model.", "diffusion_model.", "model."):
        if probe is None or prefix + probe in keys:
            return (lambda k: k) if not prefix else (lambda k, p=prefix: p + k)
    raise PlacementError(f"params disk: {path} does not hold this model's tensors "
                         f"(no {probe!r} under a known prefix); load the model from a "
                         f"safetensors file with a core loader")
