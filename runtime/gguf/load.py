"""Load a GGUF file into a model's structure, quantized weights kept quantized: the pack's
own GGUF loading (the Python API, the CLI demo), without ComfyUI-GGUF.

    model = load_gguf("flux-Q4_K.gguf", skeleton)        # skeleton: the architecture,
    with place(model, plan, "diffusion", inventory):      # e.g. built on the meta device
        out = model(...)                                   # blocks stream as Q4_K bytes

Quantized Linear weights become `GGUFLinear`s (uint8 rows, dequantized in the forward on
the weight's device into the input's dtype), so streaming, the splits and disk residency
move quantized bytes. F32/F16/BF16 tensors load as plain tensors in the file's dtype.
A quantized tensor that is not a Linear weight, a type without a dequantizer, a missing
or extra tensor, or a shape that differs from the skeleton's: one-line PlacementError.

`lazy=True` reads nothing: every tensor stays on the meta device and place() with
params=disk reads them from the file's byte ranges (the file never goes whole into RAM).
"""
import copy
import os
from typing import Callable, Optional

import torch
from torch import nn

from ...placement.errors import PlacementError
from .linear import GGUFLinear
from .reader import GGUFTensors
from .types import SUPPORTED, ggml_type

PLAIN = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


def load_gguf(path, skeleton: nn.Module, lazy: bool = False,
              read: Optional[Callable[[str], bool]] = None) -> nn.Module:
    """A new module (`skeleton` is deep-copied, never changed) holding the file's weights;
    `read(name)` False (or `lazy`) leaves that tensor on the meta device, unread."""
    name = os.path.basename(os.fspath(path))
    with GGUFTensors(path) as table:
        for t in table:
            if ggml_type(t.type).name not in SUPPORTED:
                raise PlacementError(f"{name}: tensor {t.name!r} is {t.type}, which the pack "
                                     f"cannot dequantize; supported: {', '.join(SUPPORTED)}")
        model = copy.deepcopy(skeleton)
        _swap_quantized_linears(model, table, name)
        wanted = model.state_dict(keep_vars=True)
        missing = [k for k in wanted if k not in table]
        extra = [t.name for t in table if t.name not in wanted]
        if missing or extra:
            what = (f"lacks {missing[0]!r}" + (f" and {len(missing) - 1} more" if len(missing) > 1
                                               else "")) if missing else \
                f"has {extra[0]!r} that the model does not"
            raise PlacementError(f"{name} {what}; pass the skeleton of the architecture the "
                                 f"file was written for")
        for key, current in wanted.items():
            t = table[key]
            quantized = t.type not in PLAIN
            dtype = torch.uint8 if quantized else PLAIN[t.type]
            size = tuple(current.size()) if quantized else t.shape
            if not quantized and tuple(current.shape) != t.shape:
                raise PlacementError(f"{name}: tensor {key!r} is {list(t.shape)} in the file, "
                                     f"{list(current.shape)} in the model")
            if lazy or (read is not None and not read(key)):
                value = torch.empty(size, dtype=dtype, device="meta")
            else:
                raw = table.read(key)
                value = raw.view(size) if quantized else raw.view(dtype).view(size)
            _set_tensor(model, key, value)
    return model


def _swap_quantized_linears(model: nn.Module, table: GGUFTensors, name: str) -> None:
    modules = dict(model.named_modules())
    for t in table:
        if t.type in PLAIN:
            continue
        owner, _, leaf = t.name.rpartition(".")
        lin = modules.get(owner)
        if leaf != "weight" or not isinstance(lin, nn.Linear):
            kind = type(lin).__name__ if lin is not None else "no module"
            raise PlacementError(f"{name}: tensor {t.name!r} is {t.type} but belongs to "
                                 f"{kind}; the pack keeps only Linear weights quantized")
        if t.shape != (lin.out_features, lin.in_features):
            raise PlacementError(f"{name}: tensor {t.name!r} is {list(t.shape)} in the file, "
                                 f"{[lin.out_features, lin.in_features]} in the model")
        q = GGUFLinear(lin.in_features, lin.out_features, lin.bias is not None, t.type,
                       device="meta")
        parent, _, attr = owner.rpartition(".")
        setattr(modules[parent] if parent else model, attr, q)
        modules[owner] = q


def _set_tensor(model: nn.Module, key: str, value: torch.Tensor) -> None:
    owner, _, leaf = key.rpartition(".")
    m = model.get_submodule(owner) if owner else model
    if leaf in m._parameters:
        m._parameters[leaf] = m.tagged(value) if isinstance(m, GGUFLinear) and leaf == "weight" \
            else nn.Parameter(value, requires_grad=False)
    else:
        m._buffers[leaf] = value
