"""GGML dequantization in torch: raw GGUF bytes (a uint8 tensor, on any device) to floats.

Written from the GGML block layouts (ggml-common.h; the `gguf` package's numpy reference
in gguf/quants.py is the oracle of tests/runtime/test_gguf_dequant.py). Every kernel
works on all blocks at once (a (n_blocks, type_size) view of the bytes), with fp32
intermediates computed in the same order as the reference, so an fp32 result is
bit-identical to `gguf.quants.dequantize` and a bf16/fp16 result is that value rounded
once (the last op writes into the output with the cast). Large tensors are done in
chunks of blocks on the CPU so the intermediates stay in cache; the GPU takes them whole.
"""
from math import prod
from typing import Callable, Dict, Optional, Sequence, Tuple

import torch

from ...placement.errors import PlacementError
from .types import QK_K, dequantizable

Kernel = Callable[[torch.Tensor, torch.Tensor, "Work"], None]

# IQ4_NL / IQ4_XS non-linear code book (ggml-common.h kvalues_iq4nl)
KVALUES_IQ4NL = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)

_consts: Dict[Tuple[str, torch.device], torch.Tensor] = {}


def _const(name: str, device: torch.device) -> torch.Tensor:
    key = (name, device)
    t = _consts.get(key)
    if t is None:
        t = _make_const(name).to(device)
        _consts[key] = t
    return t


def _make_const(name: str) -> torch.Tensor:
    u8 = torch.uint8
    if name == "sh8":                       # bit positions of a byte
        return torch.arange(8, dtype=u8)
    if name == "sh2":                       # 2-bit fields of a byte
        return torch.tensor([0, 2, 4, 6], dtype=u8)
    if name == "sh16x2":                    # 2-bit fields of a uint16 (IQ4_XS high scales)
        return torch.arange(0, 16, 2, dtype=torch.int32)
    if name == "iq4nl_pairs":               # byte -> (code book[low nibble], [high nibble])
        kv = torch.tensor(KVALUES_IQ4NL, dtype=torch.int8)
        byte = torch.arange(256)
        return torch.stack((kv[byte & 15], kv[byte >> 4]), dim=1).contiguous()
    raise KeyError(name)


def _f16(b: torch.Tensor, at: int) -> torch.Tensor:
    """The fp16 field at byte `at` of every block, as (n, 1) fp32."""
    field = b[:, at:at + 2]
    try:
        return field.view(torch.float16).float()
    except RuntimeError:                    # odd storage offset: copy the two bytes out
        return field.contiguous().view(torch.float16).float()


class Work:
    """Scratch of one dequantize call, allocated once at the chunk's size and reused by
    every chunk (fresh large temporaries per op cost more than the arithmetic on a CPU).
    `acc` is the fp32 accumulator: the output itself when it is fp32."""

    def __init__(self, rows: int, device: torch.device):
        self.rows, self.device = rows, device
        self._bufs: Dict[Tuple[str, torch.dtype], torch.Tensor] = {}

    def get(self, key: str, tail: Tuple[int, ...], dtype: torch.dtype, m: int) -> torch.Tensor:
        buf = self._bufs.get((key, dtype))
        if buf is None or buf.shape[1:] != tail:
            buf = torch.empty((self.rows, *tail), dtype=dtype, device=self.device)
            self._bufs[(key, dtype)] = buf
        return buf[:m]

    def acc(self, o: torch.Tensor) -> torch.Tensor:
        if o.dtype == torch.float32:
            return o
        return self.get("acc", tuple(o.shape[1:]), torch.float32, o.shape[0])


def _done(acc: torch.Tensor, o: torch.Tensor) -> None:
    if acc is not o:
        o.copy_(acc)                        # the one rounding to the output dtype


def _nibbles(qs: torch.Tensor, groups: int, width: int, w: Work) -> torch.Tensor:
    """(n, groups*width) bytes -> (n, groups, 2, width) uint8: low nibbles, then high."""
    n = qs.shape[0]
    q = w.get("nib", (groups, 2, width), torch.uint8, n)
    src = qs.reshape(n, groups, width)
    torch.bitwise_and(src, 15, out=q[:, :, 0])
    torch.bitwise_right_shift(src, 4, out=q[:, :, 1])
    return q


def _high_bits(qh: torch.Tensor, shift: int, w: Work) -> torch.Tensor:
    """(n, k) bytes -> (n, 8k) uint8: bit j of the little-endian bit string, << shift."""
    n, k = qh.shape
    bits = w.get("bits", (k, 8), torch.uint8, n)
    torch.bitwise_right_shift(qh.unsqueeze(-1), _const("sh8", qh.device), out=bits)
    bits.bitwise_and_(1)
    if shift:
        bits.bitwise_left_shift_(shift)
    return bits.view(n, 8 * k)


def _codes_times(codes: torch.Tensor, scale: torch.Tensor, o: torch.Tensor, w: Work,
                 minus: Optional[torch.Tensor] = None, plus: Optional[torch.Tensor] = None,
                 view: Optional[Tuple[int, ...]] = None) -> None:
    """o = float(codes) * scale [- minus | + plus], fp32 ops in the reference's order,
    cast once into o. `view` shapes the accumulator like the codes.

    On the CPU the fp32 steps run in the chunk's reused accumulator (a mixed-dtype op
    there copies its inputs to the common dtype first); a GPU casts inside the kernel,
    so there the last op writes the output directly: fewer kernels, less traffic."""
    if o.device.type != "cpu":
        out = o.view(view) if view else o
        c = minus if minus is not None else plus
        if c is None:
            torch.mul(codes, scale, out=out)
        else:
            (torch.sub if minus is not None else torch.add)(torch.mul(codes, scale), c, out=out)
        return
    acc = w.acc(o)
    a = acc.view(view) if view else acc
    a.copy_(codes)                          # integer codes -> fp32, exact
    a.mul_(scale)
    if minus is not None:
        a.sub_(minus)
    elif plus is not None:
        a.add_(plus)
    _done(acc, o)


# -- legacy quants: 32 elements per block -----------------------------------------------
def _q8_0(b, o, w):
    _codes_times(b[:, 2:].view(torch.int8), _f16(b, 0), o, w)


def _q4_0(b, o, w):
    n = b.shape[0]
    q = _nibbles(b[:, 2:18], 1, 16, w).view(torch.int8).sub_(8)
    _codes_times(q.view(n, 32), _f16(b, 0), o, w)


def _q4_1(b, o, w):
    n = b.shape[0]
    q = _nibbles(b[:, 4:20], 1, 16, w)
    _codes_times(q.view(n, 32), _f16(b, 0), o, w, plus=_f16(b, 2))


def _q5(b, o, w, with_min: bool):
    n = b.shape[0]
    at = 4 if with_min else 2
    q = _nibbles(b[:, at + 4:at + 20], 1, 16, w).view(n, 32)
    q.bitwise_or_(_high_bits(b[:, at:at + 4], 4, w))
    if with_min:
        _codes_times(q, _f16(b, 0), o, w, plus=_f16(b, 2))
    else:
        _codes_times(q.view(torch.int8).sub_(16), _f16(b, 0), o, w)


def _q5_0(b, o, w):
    _q5(b, o, w, False)


def _q5_1(b, o, w):
    _q5(b, o, w, True)


# -- K-quants: 256 elements per super-block ---------------------------------------------
def _q2_k(b, o, w):
    n = b.shape[0]
    sc, qs = b[:, 0:16], b[:, 16:80]
    dl = torch.mul(sc & 15, _f16(b, 80)).unsqueeze(-1)          # (n, 16, 1)
    ml = torch.mul(sc >> 4, _f16(b, 82)).unsqueeze(-1)
    q = w.get("q", (2, 4, 32), torch.uint8, n)
    sh = _const("sh2", b.device).view(1, 1, 4, 1)
    torch.bitwise_right_shift(qs.reshape(n, 2, 1, 32), sh, out=q).bitwise_and_(3)
    _codes_times(q.view(n, 16, 16), dl, o, w, minus=ml, view=(n, 16, 16))


def _q3_k(b, o, w):
    n = b.shape[0]
    hm, qs, sb = b[:, 0:32], b[:, 32:96], b[:, 96:108]
    lo, hi = sb[:, 0:8], sb[:, 8:12]
    sh2 = _const("sh2", b.device)
    sc = torch.empty((n, 2, 8), dtype=torch.uint8, device=b.device)
    torch.bitwise_and(lo, 15, out=sc[:, 0])
    torch.bitwise_right_shift(lo, 4, out=sc[:, 1])
    hsc = (hi.unsqueeze(1) >> sh2.view(1, 4, 1)).bitwise_and_(3).bitwise_left_shift_(4)
    sc = sc.view(n, 16).bitwise_or_(hsc.view(n, 16)).view(torch.int8).sub_(32)
    dl = torch.mul(sc, _f16(b, 108)).unsqueeze(-1)               # (n, 16, 1)
    q = w.get("q", (2, 4, 32), torch.uint8, n)
    torch.bitwise_right_shift(qs.reshape(n, 2, 1, 32), sh2.view(1, 1, 4, 1), out=q)
    q.bitwise_and_(3)
    # the high bit set means no offset: q = low2 + 4*bit - 4
    hb = w.get("hb", (8, 32), torch.uint8, n)
    torch.bitwise_right_shift(hm.reshape(n, 1, 32), _const("sh8", b.device).view(1, 8, 1),
                              out=hb)
    hb.bitwise_and_(1).bitwise_left_shift_(2)
    q = q.view(n, 256).bitwise_or_(hb.view(n, 256)).view(torch.int8).sub_(4)
    _codes_times(q.view(n, 16, 16), dl, o, w, view=(n, 16, 16))


def _scale_min_k4(s: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """The 12 packed bytes of Q4_K/Q5_K -> eight 6-bit scales and eight 6-bit mins."""
    n = s.shape[0]
    s = s.reshape(n, 3, 4)
    d, m, md = s[:, 0], s[:, 1], s[:, 2]
    sc = torch.empty((n, 2, 4), dtype=torch.uint8, device=s.device)
    mn = torch.empty((n, 2, 4), dtype=torch.uint8, device=s.device)
    torch.bitwise_and(d, 63, out=sc[:, 0])
    torch.bitwise_or(md & 15, (d >> 2) & 48, out=sc[:, 1])
    torch.bitwise_and(m, 63, out=mn[:, 0])
    torch.bitwise_or(md >> 4, (m >> 2) & 48, out=mn[:, 1])
    return sc.view(n, 8), mn.view(n, 8)


def _q4_k(b, o, w):
    n = b.shape[0]
    sc, mn = _scale_min_k4(b[:, 4:16])
    dl = torch.mul(sc, _f16(b, 0)).unsqueeze(-1)                # (n, 8, 1)
    dm = torch.mul(mn, _f16(b, 2)).unsqueeze(-1)
    q = _nibbles(b[:, 16:144], 4, 32, w)                         # (n, 4, 2, 32)
    _codes_times(q.view(n, 8, 32), dl, o, w, minus=dm, view=(n, 8, 32))


def _q5_k(b, o, w):
    n = b.shape[0]
    sc, mn = _scale_min_k4(b[:, 4:16])
    dl = torch.mul(sc, _f16(b, 0)).unsqueeze(-1)
    dm = torch.mul(mn, _f16(b, 2)).unsqueeze(-1)
    q = _nibbles(b[:, 48:176], 4, 32, w).view(n, 8, 32)
    hb = w.get("hb", (8, 32), torch.uint8, n)
    torch.bitwise_right_shift(b[:, 16:48].reshape(n, 1, 32),
                              _const("sh8", b.device).view(1, 8, 1), out=hb)
    q.bitwise_or_(hb.bitwise_and_(1).bitwise_left_shift_(4))
    _codes_times(q, dl, o, w, minus=dm, view=(n, 8, 32))


def _q6_k(b, o, w):
    n = b.shape[0]
    ql, qh = b[:, 0:128], b[:, 128:192]
    dsc = torch.mul(b[:, 192:208].view(torch.int8), _f16(b, 208)).unsqueeze(-1)  # (n,16,1)
    q = _nibbles(ql, 2, 64, w).view(n, 256)                      # (n, 2, 2, 64)
    hi = w.get("hi", (2, 4, 32), torch.uint8, n)
    torch.bitwise_right_shift(qh.reshape(n, 2, 1, 32), _const("sh2", b.device).view(1, 1, 4, 1),
                              out=hi)
    q.bitwise_or_(hi.bitwise_and_(3).bitwise_left_shift_(4).view(n, 256))
    q = q.view(torch.int8).sub_(32)
    _codes_times(q.view(n, 16, 16), dsc, o, w, view=(n, 16, 16))


# -- IQ4: non-linear 4-bit code book ----------------------------------------------------
def _iq4_nl(b, o, w):
    n = b.shape[0]
    pairs = _const("iq4nl_pairs", b.device)[b[:, 2:18].long()]  # (n, 16, 2)
    _codes_times(pairs.transpose(1, 2), _f16(b, 0).unsqueeze(-1), o, w, view=(n, 2, 16))


def _iq4_xs(b, o, w):
    n = b.shape[0]
    sh = b[:, 2].to(torch.int32) | (b[:, 3].to(torch.int32) << 8)        # (n,)
    hsc = (sh.unsqueeze(-1) >> _const("sh16x2", b.device)).bitwise_and_(3)  # (n, 8)
    lo = b[:, 4:8]
    lsc = torch.empty((n, 4, 2), dtype=torch.int32, device=b.device)
    lsc[:, :, 0] = lo & 15
    lsc[:, :, 1] = lo >> 4
    sc = lsc.view(n, 8).bitwise_or_(hsc.bitwise_left_shift_(4)).sub_(32)
    dl = torch.mul(sc, _f16(b, 0)).view(n, 8, 1, 1)
    pairs = _const("iq4nl_pairs", b.device)[b[:, 8:136].long().view(n, 8, 16)]  # (n,8,16,2)
    _codes_times(pairs.transpose(2, 3), dl, o, w, view=(n, 8, 2, 16))


KERNELS: Dict[str, Kernel] = {
    "Q8_0": _q8_0, "Q4_0": _q4_0, "Q4_1": _q4_1, "Q5_0": _q5_0, "Q5_1": _q5_1,
    "Q2_K": _q2_k, "Q3_K": _q3_k, "Q4_K": _q4_k, "Q5_K": _q5_k, "Q6_K": _q6_k,
    "IQ4_NL": _iq4_nl, "IQ4_XS": _iq4_xs,
}
_PLAIN = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}

# CPU: elements per chunk and thread (one chunk's scratch stays in the cores' caches and
# is reused; more threads take bigger chunks so each op's fork/join is amortised)
CPU_CHUNK_ELEMENTS_PER_THREAD = 1 << 18


def dequantized_numel(raw_bytes: int, qtype) -> int:
    t = dequantizable(qtype)
    return raw_bytes // t.type_size * t.block_size


def quantized_nbytes(shape: Sequence[int], qtype) -> int:
    """Bytes a tensor of `shape` takes in type `qtype` (the GGUF byte range length)."""
    t = dequantizable(qtype)
    numel = prod(int(s) for s in shape)
    if numel % t.block_size:
        raise PlacementError(f"{t.name} stores blocks of {t.block_size} elements; shape "
                             f"{tuple(shape)} has {numel}")
    return numel // t.block_size * t.type_size


def dequantize(raw: torch.Tensor, qtype, shape: Sequence[int],
               dtype: torch.dtype = torch.float32, *, out: Optional[torch.Tensor] = None,
               chunk_elements: Optional[int] = None) -> torch.Tensor:
    """The tensor of `shape` (torch order) stored in `raw`, the uint8 bytes of one GGUF
    tensor in type `qtype` (a name such as "Q4_K", a ggml id or a
    gguf.GGMLQuantizationType), computed on `raw`'s device, in `dtype` or into `out`.

    A type without a dequantizer is refused by name with a PlacementError."""
    t = dequantizable(qtype)
    shape = tuple(int(s) for s in shape)
    if raw.dtype != torch.uint8:
        raise PlacementError(f"dequantize takes the raw bytes as a uint8 tensor, not {raw.dtype}")
    want = quantized_nbytes(shape, t)
    if raw.numel() != want:
        raise PlacementError(f"{t.name} tensor of shape {shape} is {want} bytes, got "
                             f"{raw.numel()}")
    if out is None:
        out = torch.empty(shape, dtype=dtype, device=raw.device)
    elif (out.numel() != prod(shape) or not out.is_contiguous() or out.device != raw.device
          or not out.is_floating_point()):
        raise PlacementError(f"dequantize out= must be a contiguous floating tensor of "
                             f"{prod(shape)} elements on {raw.device}; got {out.dtype} "
                             f"{tuple(out.shape)} on {out.device}")
    raw = raw.reshape(-1)
    if not raw.is_contiguous():
        raw = raw.contiguous()
    flat = out.view(-1)
    if t.name in _PLAIN:
        try:
            src = raw.view(_PLAIN[t.name])
        except RuntimeError:                 # misaligned start: one aligned copy
            src = raw.clone().view(_PLAIN[t.name])
        flat.copy_(src)
        return out
    kernel = KERNELS[t.name]
    n_blocks = raw.numel() // t.type_size
    blocks = raw.view(n_blocks, t.type_size)
    rows = flat.view(n_blocks, t.block_size)
    if chunk_elements is None:
        chunk_elements = (CPU_CHUNK_ELEMENTS_PER_THREAD * max(1, torch.get_num_threads())
                          if raw.device.type == "cpu" else 0)
    step = max(1, chunk_elements // t.block_size) if chunk_elements else n_blocks
    work = Work(min(step, n_blocks), raw.device)
    if step >= n_blocks:
        kernel(blocks, rows, work)
        return out
    for s in range(0, n_blocks, step):
        kernel(blocks[s:s + step], rows[s:s + step], work)
    return out
