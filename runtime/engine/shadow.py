"""A structural copy of a module: what a placement runs when the caller's module must not
change (ComfyUI's MODEL, CLIP and VAE are shared by every clone and cached node output).

    shadow = Shadow(module)
    with place(shadow.module, plan, component, inventory, host_store=..., repoint=shadow.repoint):
        shadow.module(x)

The copy has its own Module objects (own parameter, buffer, submodule and hook dicts,
shallow copies of the other attributes) and its own Parameter and buffer objects over
the same memory, made as normal tensors: no value is copied and the original tensors
are not touched, so the engine's hooks, `.data` rebinding and its copy threads (outside
inference mode) see only the copy. ComfyUI's weights are inference tensors; aliasing
their memory with normal tensors leaves them inference tensors.

One thing reaches the originals, and only on request: `repoint(copy_tensor, view)` makes
the original behind `copy_tensor` use the memory of `view` (a slice of the engine's
packed host copy, same values, dtype, shape and device), keeping its object, its
requires_grad and its inference flag. That keeps host RAM at one copy of the weights.
"""
import copy
from typing import Dict, Optional, Tuple

import torch
from torch import nn
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from ...placement.errors import PlacementError

_CONTAINERS = (dict, set, list)


def alias(t: torch.Tensor, inference: bool = False,
          like: Optional[torch.Tensor] = None) -> torch.Tensor:
    """A plain tensor over `t`'s memory (shape and strides of `like`, default `t`), an
    inference tensor when `inference` is true, a normal one otherwise."""
    like = t if like is None else like
    size = like.size()          # not .shape: GGUF tensor subclasses report another there
    with torch.inference_mode(inference):
        if t.is_meta:
            return torch.empty_strided(size, like.stride(), dtype=like.dtype,
                                       device="meta")
        return torch.empty(0, dtype=like.dtype, device=t.device).set_(
            t.untyped_storage(), t.storage_offset(), size, like.stride())


def _copy_tensor(t: torch.Tensor) -> torch.Tensor:
    data = t.data if isinstance(t, nn.Parameter) else t
    if is_traceable_wrapper_subclass(data):
        # its values live in inner tensors (comfy_kitchen's QuantizedTensor: int8 or fp8
        # data and scales), not in a storage of its own that could be aliased or moved
        raise PlacementError(
            f"weights held as {type(data).__name__} (ComfyUI's quantized format: an int8 "
            f"or fp8 file with comfy_quant entries) are run by ComfyUI's own loader only; "
            f"the pack's engine cannot stream, split or simulate them yet: place this "
            f"model resident on its GPU (params on its runtime device, no stream_layers) "
            f"or on the cpu, or load a file without comfy_quant")
    v = alias(data)
    cls = type(data)
    if cls is not torch.Tensor:                  # a tensor subclass (e.g. GGUF's): keep it
        v = v.as_subclass(cls)
        v.__dict__.update(getattr(data, "__dict__", {}))
    if isinstance(t, nn.Parameter):
        v = nn.Parameter(v, requires_grad=t.requires_grad)
        v.__dict__.update(getattr(t, "__dict__", {}))
    return v


def meta_tensor(t: torch.Tensor, floating: Optional[torch.dtype] = None) -> torch.Tensor:
    """A meta tensor of `t`'s shape and dtype (a Parameter for a Parameter); a floating
    tensor takes `floating` as its dtype when given (the compute dtype of a rehearsal)."""
    data = t.data if isinstance(t, nn.Parameter) else t
    dtype = floating if floating is not None and data.is_floating_point() else data.dtype
    v = torch.empty(tuple(data.size()), dtype=dtype, device="meta")
    return nn.Parameter(v, requires_grad=False) if isinstance(t, nn.Parameter) else v


def structural_copy(root: nn.Module, make_tensor=None
                    ) -> Tuple[nn.Module, Dict[int, torch.Tensor]]:
    """(copy of `root`, {id(copy tensor): original tensor}). Shared submodules and tied
    tensors stay shared in the copy. `make_tensor` makes each copy tensor (default: an
    alias of the original's memory; `meta_tensor`: a weightless copy)."""
    make_tensor = make_tensor or _copy_tensor
    modules: Dict[int, nn.Module] = {}
    tensors: Dict[int, torch.Tensor] = {}
    originals: Dict[int, torch.Tensor] = {}

    def tensor(t):
        if t is None:
            return None
        hit = tensors.get(id(t))
        if hit is None:
            hit = tensors[id(t)] = make_tensor(t)
            originals[id(hit)] = t
        return hit

    def module(m):
        hit = modules.get(id(m))
        if hit is not None:
            return hit
        c = m.__class__.__new__(m.__class__)
        modules[id(m)] = c
        # own hook dicts, attribute lists and sets: what the engine adds stays in the copy
        state = {k: (copy.copy(v) if isinstance(v, _CONTAINERS) else v)
                 for k, v in m.__dict__.items()}
        state["_parameters"] = {k: tensor(p) for k, p in m._parameters.items()}
        state["_buffers"] = {k: tensor(b) for k, b in m._buffers.items()}
        state["_modules"] = {k: (module(s) if s is not None else None)
                             for k, s in m._modules.items()}
        c.__dict__.update(state)
        return c

    return module(root), originals


class Shadow:
    """`module`: the structural copy of `original` that a placement runs."""

    def __init__(self, original: nn.Module):
        self.original = original
        self.module, self._originals = structural_copy(original)

    def original_of(self, t: torch.Tensor) -> Optional[torch.Tensor]:
        return self._originals.get(id(t))

    def repoint(self, t: torch.Tensor, view: torch.Tensor) -> bool:
        """Make the original behind copy tensor `t` use `view`'s memory (same values).
        False (nothing done) where that would change what the original looks like."""
        orig = self._originals.get(id(t))
        if orig is None or orig.is_meta or orig.device != view.device or \
                orig.dtype != view.dtype or orig.size() != view.size():
            return False
        if orig.data_ptr() == view.data_ptr():
            return True
        orig.data = alias(view, inference=orig.is_inference())
        return True
