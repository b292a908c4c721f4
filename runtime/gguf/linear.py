"""A Linear whose weight stays quantized (raw GGUF bytes, uint8) and is dequantized in its
forward, on the weight's device, into the input's dtype: what the ring streams and the
splits shard as quantized bytes (bytes over the link = the quantized bytes).

The weight is a uint8 Parameter of shape (out_features, row_bytes): every row is whole
blocks of the type, so a row slice (a row split's shard) is itself a valid tensor of the
type. `quantized_rows(linear)` gives the function that turns such rows into floats, for
this class and for ComfyUI-GGUF's layers (duck-typed: a weight with `tensor_type`).
"""
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from ..device.subclass_check import build_subclass
from .dequant import dequantize, quantized_nbytes
from .types import dequantizable

PLAIN_IDS = (0, 1)          # F32, F16: ComfyUI-GGUF keeps them as ordinary tensors


class QuantizedWeight(nn.Parameter):
    """A GGUFLinear's weight: its own class, so that planning, which skips torch's plain
    classes, reads the type and torch shape it carries (as on ComfyUI-GGUF's tensors)."""

    def __deepcopy__(self, memo):
        out = super().__deepcopy__(memo)            # torch's copy keeps no attributes
        out.tensor_type, out.tensor_shape = self.tensor_type, self.tensor_shape
        return out


class GGUFLinear(nn.Linear):
    """`GGUFLinear(in_features, out_features, bias, qtype)`: weight = uint8 raw rows."""

    def __init__(self, in_features: int, out_features: int, bias: bool, qtype: str,
                 device=None, bias_dtype=torch.float32):
        nn.Module.__init__(self)
        self.in_features, self.out_features = in_features, out_features
        self.qtype = dequantizable(qtype).name
        row = quantized_nbytes((in_features,), self.qtype)
        self.weight = self.tagged(torch.empty((out_features, row), dtype=torch.uint8,
                                              device=device))
        self.bias = nn.Parameter(torch.empty(out_features, dtype=bias_dtype, device=device),
                                 requires_grad=False) if bias else None

    def tagged(self, raw: torch.Tensor) -> "QuantizedWeight":
        """`raw` as this layer's weight, marked as ComfyUI-GGUF marks its tensors (type
        name, torch shape): planning (placement/metadata) counts quantized bytes of a type."""
        weight = QuantizedWeight(raw, requires_grad=False)
        weight.tensor_type = self.qtype
        weight.tensor_shape = torch.Size((self.out_features, self.in_features))
        return weight

    def dequantize_rows(self, rows: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return dequantize(rows, self.qtype, (rows.shape[0], self.in_features), dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.dequantize_rows(self.weight, x.dtype)
        b = None if self.bias is None else self.bias.to(x.dtype)
        return F.linear(x, w, b)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, qtype={self.qtype}"


def quantized_rows(linear: nn.Module) -> Optional[Callable[[torch.Tensor, torch.dtype],
                                                             torch.Tensor]]:
    """`fn(rows, dtype) -> float weight rows` when `linear`'s weight is quantized bytes,
    else None. ComfyUI-GGUF's layers dequantize (and apply their patches) in their own
    get_weight: used as is, so a shard computes what their forward would."""
    if isinstance(linear, GGUFLinear):
        return linear.dequantize_rows
    w = getattr(linear, "weight", None)
    qtype = getattr(w, "tensor_type", None)
    if qtype is None or int(qtype) in PLAIN_IDS or not hasattr(linear, "get_weight"):
        return None
    cls, shape = type(w), tuple(w.tensor_shape)

    def rows_to_float(rows: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        t = build_subclass(cls, rows, tensor_type=qtype, patches=[],
                           tensor_shape=torch.Size((rows.shape[0],) + shape[1:]))
        return torch.Tensor(linear.get_weight(t, dtype))
    return rows_to_float
