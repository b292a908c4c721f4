"""Where a CLIP's (text encoders') weights are in their files, for params disk.

The core loaders record how they built a CLIP (`cached_patcher_init`): Load CLIP /
DualCLIPLoader / TripleCLIPLoader pass their file list to `load_clip_model_patcher`,
Load Checkpoint its one file to `load_checkpoint_clip_patcher`. ComfyUI renames keys on
the way in (a sub-encoder prefix such as `clip_l.transformer.`, a checkpoint prefix
such as `text_encoders.` or `cond_stage_model.`, `lm_head.` -> `model.lm_head.`), and
some conversions change values (OpenCLIP's `in_proj` split, `text_projection`
transposed). So a module tensor is mapped to a file key only when it is exact:

- the longest dotted suffix of its name found among the files' keys belongs to one key
  in one file (a prefix rename), covering at least two name parts or the whole key;
- dtype and shape equal the module's (ComfyUI casts at load: an fp32 file loaded as
  fp16, or fp8 scaled weights, do not match);
- no other module tensor maps to that key;
- its values equal the module's: small tensors whole, large ones by their first row
  (a transposed or reordered tensor differs there), read by byte range.

Anything else stays unmapped; the engine streams blocks only from one file (the file
holding every block tensor; in a Flux DualCLIPLoader pair that is the T5, whose blocks
stream, while CLIP-L is not block-streamed and rests in host memory), so a block tensor
without an exact match is a node error naming it.
"""
import os
from typing import Callable, Dict, List, Tuple

import torch

from ....placement.errors import PlacementError
from ...blocks.find import find_blocks
from ...blocks.module_tensors import module_tensors

VALUE_CHECK_BYTES = 1 << 20     # tensors up to this size are compared whole
NOT_IN_FILE = "\0not-in-file:"  # key_map result for tensors the chosen file lacks


def clip_files(patcher) -> List[str]:
    """The files a CLIP was loaded from, when a core loader recorded them."""
    import comfy.sd
    init = getattr(patcher, "cached_patcher_init", None)
    if not init:
        return []
    fn, args = init[0], init[1]
    if fn is getattr(comfy.sd, "load_clip_model_patcher", None):
        return [str(p) for p in args[0]]
    if fn is getattr(comfy.sd, "load_checkpoint_clip_patcher", None):
        return [str(args[0])]
    return []


class FileKeys:
    """One safetensors file's header: key -> (dtype, shape)."""

    def __init__(self, path: str):
        from ...weights.weightfile import SafetensorsFile
        f = SafetensorsFile(path)
        try:
            self.entries = {k: (e[0], e[1]) for k, e in f.entries.items()}
            self.unsupported = dict(f.unsupported)
        finally:
            f.close()
        self.path = path


def _suffixes(name: str):
    parts = name.split(".")
    for i in range(len(parts)):
        yield i, ".".join(parts[i:])


def _values_equal(fh, key: str, t: torch.Tensor) -> bool:
    if t.device.type == "meta":
        return True                      # nothing to compare: the file is the only copy
    if t.numel() * t.element_size() <= VALUE_CHECK_BYTES or t.dim() == 0:
        return torch.equal(fh.get_tensor(key), t.detach().cpu())
    first = fh.get_slice(key)[0:1]
    return torch.equal(first, t.detach()[0:1].cpu())


def map_module_to_files(module: torch.nn.Module, paths: List[str]
                        ) -> Tuple[Dict[str, Tuple[str, str]], Dict[str, str]]:
    """(name -> (path, key)) for every exactly matched module tensor name, and
    (name -> why it is not mapped) for the others."""
    from safetensors import safe_open
    files = [FileKeys(p) for p in paths if p.lower().endswith(".safetensors")]
    index: Dict[str, List[Tuple[str, str]]] = {}
    transposed = set()        # ComfyUI rebuilds `text_projection.weight` transposed
    for f in files:
        for key in list(f.entries) + list(f.unsupported):
            for _, s in _suffixes(key):
                index.setdefault(s, []).append((f.path, key))
            if key.split(".")[-1] == "text_projection":
                transposed.add(f.path)
    by_path = {f.path: f for f in files}
    mapped: Dict[str, Tuple[str, str]] = {}
    why: Dict[str, str] = {}
    owner: Dict[Tuple[str, str], set] = {}
    tensors = module_tensors(module)
    for t, names in tensors.values():
        for name in names:
            hit = next(((i, s) for i, s in _suffixes(name) if s in index), None)
            if hit is None:
                why[name] = "no file key ends with its name"
                continue
            i, s = hit
            cands = index[s]
            if len(cands) != 1:
                why[name] = f"{len(cands)} file keys end with {s!r}"
                continue
            path, key = cands[0]
            if "." not in s and key != s:
                why[name] = f"only {s!r} matches {key!r}"
                continue
            if s.endswith("text_projection.weight") and path in transposed:
                why[name] = f"{os.path.basename(path)} stores text_projection transposed"
                continue
            f = by_path[path]
            if key in f.unsupported:
                why[name] = f"{key!r} is {f.unsupported[key]}"
                continue
            dtype, shape = f.entries[key]
            if dtype != t.dtype or tuple(shape) != tuple(t.shape):
                why[name] = (f"{key!r} is {dtype} {list(shape)}, the module holds {t.dtype} "
                             f"{list(t.shape)} (ComfyUI converted it at load)")
                continue
            mapped[name] = (path, key)
            owner.setdefault((path, key), set()).add(id(t))
    for name, pk in list(mapped.items()):
        if len(owner[pk]) > 1:
            del mapped[name]
            why[name] = f"{pk[1]!r} matches several module tensors"
    by_name = {n: t for t, names in tensors.values() for n in names}
    for path in {p for p, _ in mapped.values()}:
        with safe_open(path, framework="pt") as fh:
            for name, (p, key) in list(mapped.items()):
                if p != path:
                    continue
                try:
                    same = _values_equal(fh, key, by_name[name])
                except (RuntimeError, TypeError, ValueError) as exc:   # e.g. a quantized
                    same, what = False, f"cannot be compared ({exc})"  # tensor subclass
                else:
                    what = ("holds other values than the module (converted at load, or "
                            "a LoRA fused into the module)")
                if not same:
                    del mapped[name]
                    why[name] = f"{key!r} {what}"
    return mapped, why


def clip_disk_source(module: torch.nn.Module, paths: List[str]
                     ) -> Tuple[str, Callable[[str], str]]:
    """The one file the engine streams this text encoder's blocks from, and the key map
    (module tensor name -> file key; tensors that file lacks load from the module)."""
    what = "te: params disk"
    if not paths:
        raise PlacementError(f"{what} needs the text encoders' files, and this CLIP does "
                             f"not come from a core loader that records them (Load CLIP, "
                             f"DualCLIPLoader, Load Checkpoint); use params cpu")
    names = ", ".join(os.path.basename(p) for p in paths)
    if not any(p.lower().endswith(".safetensors") for p in paths):
        raise PlacementError(f"{what} reads .safetensors files only, this CLIP comes from "
                             f"{names}; use params cpu")
    mapped, why = map_module_to_files(module, paths)
    needed = [f"{bname}.{n}" for bname, block in find_blocks(module)
              for n, _ in list(block.named_parameters()) + list(block.named_buffers())]
    counts: Dict[str, int] = {}
    for n in (needed or list(mapped)):
        if n in mapped:
            counts[mapped[n][0]] = counts.get(mapped[n][0], 0) + 1
    chosen = max(counts, key=counts.get) if counts else None
    for n in needed:
        if n in mapped and mapped[n][0] == chosen:
            continue
        reason = why.get(n) or (f"it is in {os.path.basename(mapped[n][0])}, the other "
                                f"blocks in {os.path.basename(chosen)}")
        raise PlacementError(f"{what}: block tensor {n!r} has no exact match in {names} "
                             f"({reason}); use params cpu, or a file in the dtype ComfyUI "
                             f"loads it in")
    if chosen is None:
        raise PlacementError(f"{what}: no tensor of this text encoder has an exact match in "
                             f"{names}; use params cpu")
    keys = {n: key for n, (p, key) in mapped.items() if p == chosen}
    return chosen, lambda n: keys.get(n, NOT_IN_FILE + n)
