"""Write a state dict as a GGUF file, its 2-D weights quantized: tiny quantized models of
real architectures for tests and the demo (never a converter for real checkpoints: use
ComfyUI-GGUF's or llama.cpp's tools for those).

Which tensors are quantized follows ComfyUI-GGUF's converter: 2-D `.weight` tensors with
more than 1024 elements whose rows are whole blocks of the type; everything else is
stored F32. Legacy types and BF16 are quantized by the `gguf` package; Q4_K by
`quantize_q4_k` here (min/max per 32-element sub-block, 6-bit scales: simple, not
llama.cpp's search, but every byte is a valid Q4_K block). Other types are refused by name.
"""
import os
from typing import Callable, Dict, Optional

import numpy as np
import torch

from ...placement.errors import PlacementError
from .types import ggml_type

QUANTIZE_MIN_ELEMENTS = 1024      # ComfyUI-GGUF's QUANTIZATION_THRESHOLD
BY_PACKAGE = ("BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1")
WRITABLE = BY_PACKAGE + ("Q4_K",)


def quantize(t: torch.Tensor, qtype: str) -> np.ndarray:
    """The GGUF bytes of `t` (rows = its last dimension) in `qtype`, shape (..., row_bytes)."""
    q = ggml_type(qtype)
    arr = np.ascontiguousarray(t.detach().to("cpu", torch.float32).numpy())
    if arr.shape[-1] % q.block_size:
        raise PlacementError(f"{q.name} needs rows of whole {q.block_size}-element blocks; "
                             f"got shape {tuple(arr.shape)}")
    if q.name == "Q4_K":
        return quantize_q4_k(arr)
    if q.name not in BY_PACKAGE:
        raise PlacementError(f"writing GGUF type {q.name} is not available here; writable: "
                             f"{', '.join(WRITABLE)}")
    import gguf
    return gguf.quants.quantize(arr, gguf.GGMLQuantizationType[q.name])


def quantize_q4_k(x: np.ndarray) -> np.ndarray:
    """Q4_K blocks of `x` (float32, last dim a multiple of 256): per 32-element sub-block
    w = d*sc*q - dmin*mn with q in 0..15, sc and mn 6-bit, d and dmin fp16 per 256."""
    lead = x.shape[:-1]
    b = x.reshape(-1, 8, 32).astype(np.float32)
    n = b.shape[0]
    lo = np.minimum(b.min(axis=2), 0.0)                     # (n, 8), <= 0
    hi = b.max(axis=2)
    step = (hi - lo) / 15.0                                  # sub-block scale
    d = (step.max(axis=1) / 63.0).astype(np.float16)        # (n,)
    dmin = ((-lo).max(axis=1) / 63.0).astype(np.float16)
    d32, dmin32 = d.astype(np.float32)[:, None], dmin.astype(np.float32)[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(d32 > 0, np.rint(step / d32), 0).clip(0, 63).astype(np.uint8)
        mn = np.where(dmin32 > 0, np.rint(-lo / dmin32), 0).clip(0, 63).astype(np.uint8)
        scale = (d32 * sc)[:, :, None]
        offset = (dmin32 * mn)[:, :, None]
        q = np.where(scale > 0, np.rint((b + offset) / scale), 0).clip(0, 15).astype(np.uint8)
    out = np.empty((n, 144), dtype=np.uint8)
    out[:, 0:2] = d.view(np.uint8).reshape(n, 2)
    out[:, 2:4] = dmin.view(np.uint8).reshape(n, 2)
    # the 12 scale bytes: sc/mn 0-3 in the low 6 bits of bytes 0-3 / 4-7, their top two
    # bits carrying sc/mn 4-7's high bits; bytes 8-11 hold sc/mn 4-7's low nibbles
    out[:, 4:8] = sc[:, :4] | ((sc[:, 4:] >> 4) << 6)
    out[:, 8:12] = mn[:, :4] | ((mn[:, 4:] >> 4) << 6)
    out[:, 12:16] = (sc[:, 4:] & 15) | ((mn[:, 4:] & 15) << 4)
    # 4 chunks of 32 bytes: low nibble sub-block 2c, high nibble sub-block 2c+1
    q = q.reshape(n, 4, 2, 32)
    out[:, 16:144] = (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(n, 128)
    return out.reshape(*lead, -1)


def default_choice(name: str, t: torch.Tensor, qtype: str) -> str:
    """ComfyUI-GGUF's rule: quantize big 2-D weights whose rows are whole blocks."""
    q = ggml_type(qtype)
    if (name.endswith(".weight") and t.dim() == 2 and t.numel() > QUANTIZE_MIN_ELEMENTS
            and t.shape[-1] % q.block_size == 0):
        return q.name
    return "F32"


def write_gguf(path, state_dict: Dict[str, torch.Tensor], qtype: str,
               arch: Optional[str] = None,
               choose: Callable[[str, torch.Tensor, str], str] = default_choice) -> Dict[str, str]:
    """Write `state_dict` to `path` with `choose(name, tensor, qtype)` deciding each
    tensor's type; returns name -> type written. `arch` is general.architecture (ComfyUI-
    GGUF's loader wants one of its names, e.g. "flux")."""
    import gguf
    if ggml_type(qtype).name not in WRITABLE:
        quantize(torch.zeros(256), qtype)                     # raises the one-line error
    w = gguf.GGUFWriter(os.fspath(path), arch or "placement-test")
    written = {}
    try:
        for name, t in state_dict.items():
            kind = choose(name, t, qtype)
            if kind == "F32":
                w.add_tensor(name, np.ascontiguousarray(t.detach().cpu().float().numpy()))
            elif kind == "F16":
                w.add_tensor(name, np.ascontiguousarray(t.detach().cpu().half().numpy()))
            else:
                raw = quantize(t, kind)
                w.add_tensor(name, raw, raw_shape=raw.shape,
                             raw_dtype=gguf.GGMLQuantizationType[kind])
            written[name] = kind
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
    finally:
        w.close()
    return written
