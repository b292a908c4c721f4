"""The quantized tensors of one streamed block, dequantized right after the block's bytes
arrive: the piece the ring's arrival seam (Streamer.on_arrive) calls. Nothing here knows
the ring: a block is its slot (a uint8 tensor holding the packed raw bytes) and a
scratch buffer of the compute dtype the weights are dequantized into.

    block = QuantizedBlock([(slot_offset, "Q4_K", (3072, 12288)), ...], torch.bfloat16)
    weights = block.views(scratch)            # bind the module's parameters to these once
    block.dequantize(slot, weights)           # after the copy into the slot was waited on

`scratch_bytes` is the block's dequantized size (each tensor aligned to 256 bytes): the
working memory a plan counts once per device (one scratch serves every block when the
dequantization runs on the compute stream, ordered before the block's compute).
"""
from typing import List, NamedTuple, Sequence, Tuple

import torch

from ...placement.errors import PlacementError
from .dequant import dequantize, quantized_nbytes
from .types import dequantizable

ALIGN = 256


class QuantizedTensor(NamedTuple):
    slot_offset: int          # where its raw bytes start in the block's slot
    nbytes: int               # raw bytes
    qtype: str
    shape: Tuple[int, ...]
    scratch_offset: int       # bytes into the compute-dtype scratch


class QuantizedBlock:
    def __init__(self, entries: Sequence[Tuple[int, object, Sequence[int]]],
                 dtype: torch.dtype):
        self.dtype = dtype
        elem = torch.empty((), dtype=dtype).element_size()
        self.tensors: List[QuantizedTensor] = []
        at = 0
        for slot_offset, qtype, shape in entries:
            t = dequantizable(qtype)
            shape = tuple(int(s) for s in shape)
            n = quantized_nbytes(shape, t)
            self.tensors.append(QuantizedTensor(int(slot_offset), n, t.name, shape, at))
            numel = 1
            for s in shape:
                numel *= s
            at += -(-numel * elem // ALIGN) * ALIGN
        self.scratch_bytes = at
        self.slot_bytes = max((t.slot_offset + t.nbytes for t in self.tensors), default=0)

    def views(self, scratch: torch.Tensor) -> List[torch.Tensor]:
        """The compute-dtype tensors inside `scratch` (uint8, >= scratch_bytes)."""
        if scratch.dtype != torch.uint8 or scratch.numel() < self.scratch_bytes:
            raise PlacementError(f"dequantization scratch must be uint8 of at least "
                                 f"{self.scratch_bytes} bytes, got {scratch.dtype} "
                                 f"{scratch.numel()}")
        elem = torch.empty((), dtype=self.dtype).element_size()
        out = []
        for t in self.tensors:
            qt = dequantizable(t.qtype)
            numel = t.nbytes // qt.type_size * qt.block_size
            out.append(scratch[t.scratch_offset:t.scratch_offset + numel * elem]
                       .view(self.dtype).view(t.shape))
        return out

    def dequantize(self, slot: torch.Tensor, outs: Sequence[torch.Tensor]) -> None:
        """Every quantized tensor of the block from `slot` into `outs` (same device)."""
        if slot.numel() < self.slot_bytes:
            raise PlacementError(f"block slot holds {slot.numel()} bytes, its quantized "
                                 f"tensors need {self.slot_bytes}")
        for t, out in zip(self.tensors, outs):
            dequantize(slot[t.slot_offset:t.slot_offset + t.nbytes], t.qtype, t.shape,
                       out=out)
