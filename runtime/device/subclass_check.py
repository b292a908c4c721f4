"""Tensor subclasses (ComfyUI-GGUF's GGMLTensor: a torch.Tensor subclass over a uint8
storage) under the simulated device's dispatch mode (simcheck.py).

What broke: a dispatch mode calls each aten op from Python, and a Python call whose
arguments include a subclass goes through the subclass's `__torch_function__` (torch's
default one wraps every result in the subclass). Without the mode, ops reached from C++
never pass there. So `torch.Tensor(g)` (the legacy constructor, which ComfyUI-GGUF uses
to drop its class) ran `aten.alias` through the mode, got a GGMLTensor back, and Python
then called `GGMLTensor.__init__` without its required `tensor_type`: TypeError.
`plain_call` runs the op as the dispatcher would without the mode, subclass wrapping
off; an op that came from Python is still wrapped once, by the outer `__torch_function__`.

Building a subclass over a tensor (`GGMLTensor(rows, ...)`) fails under any Python
dispatch mode: the alias gets a plain Python object first, which torch then refuses to
turn into the subclass. `build_subclass` builds it with the modes set aside (a view:
nothing to check or meter).

What is watched: a subclass with a storage is watched through that storage, as any
tensor (`watch_key`). One without a readable storage (a wrapper subclass) cannot be: the
check says so rather than run blind.
"""
from typing import Optional, Tuple

import torch
from torch.utils._python_dispatch import _disable_current_modes


def plain_call(func, args, kwargs):
    """`func(*args, **kwargs)` with no subclass `__torch_function__` wrapping."""
    with torch._C.DisableTorchFunctionSubclass():
        return func(*args, **kwargs)


def build_subclass(cls, data: torch.Tensor, **attrs) -> torch.Tensor:
    """`cls(data, **attrs)`, a subclass over `data`'s storage, built outside any mode."""
    with _disable_current_modes():
        return cls(data, **attrs)


def storage_key(t: torch.Tensor) -> int:
    """Which storage `t` views: its address, or on the meta device (no addresses) the
    storage object's identity (torch keeps one Python object per live storage)."""
    try:
        storage = t.untyped_storage()
    except (RuntimeError, NotImplementedError):   # a tensor subclass without storage
        return 0
    return id(storage) if t.is_meta else storage.data_ptr()


def watch_key(name: str, t: torch.Tensor) -> Tuple[int, Optional[str]]:
    """(storage key to watch, 0 for none; why `t` cannot be watched, or None)."""
    try:
        key = storage_key(t)
    except RuntimeError:                    # a wrapper subclass: no data pointer
        key = 0
    if key or type(t) in (torch.Tensor, torch.nn.Parameter) or t.numel() == 0:
        return key, None
    return 0, f"{name} is a {type(t).__name__} (a tensor subclass) without a storage to watch"
