"""Read a .safetensors header (8-byte little-endian length, then JSON) without touching
the weights. Every way a file can be wrong becomes one PlacementError line."""
import json
import os
import struct
from typing import Dict, List, Tuple

from ..errors import PlacementError
from .tensors import SAFETENSORS_DTYPES, TensorInfo

# The safetensors library refuses headers above 100 MB; so do we (a hostile length must
# not make us allocate gigabytes).
MAX_HEADER_BYTES = 100_000_000


def read_safetensors(path) -> Tuple[List[TensorInfo], Dict[str, str]]:
    """(tensors in file order, the '__metadata__' strings)."""
    name = os.fspath(path)
    try:
        with open(name, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(8)
            if len(head) < 8:
                raise PlacementError(f"{name}: not a safetensors file: {size} bytes, "
                                     f"shorter than the 8-byte header length")
            (length,) = struct.unpack("<Q", head)
            if length > MAX_HEADER_BYTES or length + 8 > size:
                raise PlacementError(
                    f"{name}: not a safetensors file: header length {length} does not fit "
                    f"a {size}-byte file (limit {MAX_HEADER_BYTES})")
            raw = f.read(length)
    except OSError as e:
        raise PlacementError(f"cannot read {name}: {e.strerror or e}") from None
    return parse_header(raw, size - 8 - length, name)


def parse_header(raw: bytes, data_bytes: int, name: str = "<header>"
                 ) -> Tuple[List[TensorInfo], Dict[str, str]]:
    """Validate and decode a header; `data_bytes` is the size of the data section."""
    try:
        header = json.loads(raw)
    except (ValueError, RecursionError) as e:     # UnicodeDecodeError is a ValueError
        raise PlacementError(f"{name}: not a safetensors file: header is not JSON "
                             f"({type(e).__name__})") from None
    if not isinstance(header, dict):
        raise PlacementError(f"{name}: not a safetensors file: header is not a JSON object")
    meta = header.pop("__metadata__", None) or {}
    if not isinstance(meta, dict):
        raise PlacementError(f"{name}: bad safetensors header: __metadata__ is not an object")
    tensors = []
    spans = []
    for key, entry in header.items():
        try:
            dtype, shape, (begin, end) = entry["dtype"], entry["shape"], entry["data_offsets"]
        except (TypeError, KeyError, ValueError):
            raise PlacementError(f"{name}: bad safetensors header: tensor {key!r} needs "
                                 f"dtype, shape and two data_offsets") from None
        known = SAFETENSORS_DTYPES.get(dtype) if isinstance(dtype, str) else None
        if known is None:
            raise PlacementError(f"{name}: bad safetensors header: tensor {key!r} has unknown "
                                 f"dtype {str(dtype)[:20]!r}")
        if not isinstance(shape, list) or not all(_is_count(d) for d in shape):
            raise PlacementError(f"{name}: bad safetensors header: tensor {key!r} shape must "
                                 f"be a list of non-negative integers")
        if not (_is_count(begin) and _is_count(end)) or not begin <= end <= data_bytes:
            raise PlacementError(f"{name}: bad safetensors header: tensor {key!r} data_offsets "
                                 f"outside the {data_bytes}-byte data section")
        numel = 1
        for d in shape:
            numel *= d
        nbytes = (numel * known[1] + 7) // 8
        if end - begin != nbytes:
            raise PlacementError(f"{name}: bad safetensors header: tensor {key!r} spans "
                                 f"{end - begin} bytes, its shape and dtype need {nbytes}")
        tensors.append(TensorInfo(key, tuple(shape), known[0], nbytes))
        spans.append((begin, end, key))
    spans.sort()
    for (_, end_a, key_a), (begin_b, _, key_b) in zip(spans, spans[1:]):
        if begin_b < end_a:
            raise PlacementError(f"{name}: bad safetensors header: tensors {key_a!r} and "
                                 f"{key_b!r} overlap")
    return tensors, {str(k): str(v) for k, v in meta.items()}


def _is_count(x) -> bool:
    return type(x) is int and x >= 0
