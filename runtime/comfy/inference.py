"""Weights ComfyUI loaded under torch.inference_mode, made usable by the engine.

ComfyUI runs every node under `torch.inference_mode()`, so the tensors its loaders make
are inference tensors. The engine rebinds each weight's `.data` to its own buffers and
fills those buffers from a copy thread, where inference mode is off (it is
thread-local): an inference tensor may not be written there, and an inference
Parameter whose `.data` is a normal tensor fails at the next use ("Inference tensors do
not track version counter").

So before a placement opens, each inference weight becomes a normal tensor over the
same memory (no copy), keeping its Python identity (torch.utils.swap_tensors): values,
storage and object stay the same; only the inference flag goes. ComfyUI treats normal
and inference weights alike. This can go once the engine's copy threads honour the
caller's inference mode.
"""
import torch

from ...placement.errors import PlacementError


def _normal_view(t: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode(False):
        return torch.empty(0, dtype=t.dtype, device=t.device).set_(
            t.untyped_storage(), t.storage_offset(), t.shape, t.stride())


def make_weights_normal(module: torch.nn.Module) -> int:
    """Turn the module's inference parameters and buffers into normal tensors in place
    (same object, same memory). Returns how many were changed."""
    seen, changed = set(), 0
    for t in list(module.parameters()) + list(module.buffers()):
        if id(t) in seen or not t.is_inference():
            continue
        seen.add(id(t))
        view = _normal_view(t)
        if isinstance(t, torch.nn.Parameter):
            view = torch.nn.Parameter(view, requires_grad=t.requires_grad)
        try:
            torch.utils.swap_tensors(t, view)
        except RuntimeError as exc:
            raise PlacementError(f"a weight of {type(module).__name__} is an inference "
                                 f"tensor the engine cannot take over ({exc})") from None
        changed += 1
    return changed
