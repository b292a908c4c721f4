"""Read a .safetensors header (8-byte little-endian length, then JSON) without touching
the weights. Every way a file can be wrong becomes one PlacementError line."""
import json
import os
import struct
from typing import Dict, List, NamedTuple, Optional, Tuple

from ..errors import PlacementError
from .tensors import SAFETENSORS_DTYPES, TensorInfo

# The safetensors library refuses headers above 100 MB; so do we (a hostile length must
# not make us allocate gigabytes).
MAX_HEADER_BYTES = 100_000_000


class Entry(NamedTuple):
    """One tensor of a validated header; offsets are into the data section."""
    name: str
    dtype: str                   # the safetensors name: 'BF16', 'F8_E4M3', ...
    shape: Tuple[int, ...]
    begin: int
    end: int


class Header(NamedTuple):
    data_start: int              # byte offset of the data section in the file
    entries: Tuple[Entry, ...]   # in header order
    metadata: Dict[str, str]
    # the file ends where its header does: a model's description without its weights
    # (cut after the header to plan for it); it plans, it cannot be run
    header_only: bool = False


_HEADERS: Dict[tuple, Header] = {}     # (path, size, mtime_ns) -> Header, validated once
_HEADER_CACHE = 64


def read_header(path) -> Header:
    """The validated header of a .safetensors file (read and checked once per file
    version); every way it can be wrong is one PlacementError line."""
    name = os.fspath(path)
    try:
        st = os.stat(name)
    except OSError as e:
        raise PlacementError(f"cannot read {name}: {e.strerror or e}") from None
    key = (os.path.realpath(name), st.st_size, st.st_mtime_ns)
    hit = _HEADERS.get(key)
    if hit is None:
        hit = _read(name)
        if len(_HEADERS) >= _HEADER_CACHE:
            _HEADERS.pop(next(iter(_HEADERS)))
        _HEADERS[key] = hit
    return hit


def _read(name: str) -> Header:
    try:
        with open(name, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(8)
            if len(head) < 8:
                raise PlacementError(f"{name}: not a safetensors file: {size} bytes, "
                                     f"shorter than the 8-byte header length")
            (length,) = struct.unpack("<Q", head)
            if length > MAX_HEADER_BYTES:
                raise PlacementError(
                    f"{name}: not a safetensors file: header length {length} is above the "
                    f"{MAX_HEADER_BYTES}-byte limit")
            if length + 8 > size:
                raise PlacementError(
                    f"{name}: safetensors header cut short: it declares {length} bytes, the "
                    f"file holds {size - 8} after the length (an interrupted download or copy?)")
            raw = f.read(length)
    except OSError as e:
        raise PlacementError(f"cannot read {name}: {e.strerror or e}") from None
    data_bytes = size - 8 - length
    if data_bytes == 0:
        # a header-only file: every tensor's data lies past its end; the offsets must
        # still span exactly their shapes' bytes, none overlapping
        entries, meta = parse_entries(raw, None, name)
        return Header(8 + length, tuple(entries), meta,
                      header_only=any(e.end > 0 for e in entries))
    entries, meta = parse_entries(raw, data_bytes, name)
    return Header(8 + length, tuple(entries), meta)


def read_safetensors(path) -> Tuple[List[TensorInfo], Dict[str, str]]:
    """(tensors in file order, the '__metadata__' strings)."""
    header = read_header(path)
    return _tensor_infos(header.entries), dict(header.metadata)


def parse_header(raw: bytes, data_bytes: int, name: str = "<header>"
                 ) -> Tuple[List[TensorInfo], Dict[str, str]]:
    """Validate and decode a header; `data_bytes` is the size of the data section."""
    entries, meta = parse_entries(raw, data_bytes, name)
    return _tensor_infos(entries), meta


def _tensor_infos(entries) -> List[TensorInfo]:
    out = []
    for e in entries:
        known = SAFETENSORS_DTYPES[e.dtype]
        out.append(TensorInfo(e.name, e.shape, known[0], e.end - e.begin))
    return out


def parse_entries(raw: bytes, data_bytes: Optional[int], name: str = "<header>"
                  ) -> Tuple[List[Entry], Dict[str, str]]:
    """The header's entries, each checked: a known dtype, a shape of counts, offsets
    inside the data section that span exactly the shape's bytes, no two overlapping.
    `data_bytes` None: a header-only file, the data section is as long as the header
    says."""
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
    entries = []
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
        if not (_is_count(begin) and _is_count(end)) or not begin <= end or \
                (data_bytes is not None and end > data_bytes):
            raise PlacementError(f"{name}: bad safetensors header: tensor {key!r} data_offsets "
                                 f"outside the {data_bytes}-byte data section")
        numel = 1
        for d in shape:
            numel *= d
        nbytes = (numel * known[1] + 7) // 8
        if end - begin != nbytes:
            raise PlacementError(f"{name}: bad safetensors header: tensor {key!r} spans "
                                 f"{end - begin} bytes, its shape and dtype need {nbytes}")
        entries.append(Entry(key, dtype, tuple(shape), begin, end))
        spans.append((begin, end, key))
    spans.sort()
    for (_, end_a, key_a), (begin_b, _, key_b) in zip(spans, spans[1:]):
        if begin_b < end_a:
            raise PlacementError(f"{name}: bad safetensors header: tensors {key_a!r} and "
                                 f"{key_b!r} overlap")
    return entries, {str(k): str(v) for k, v in meta.items()}


def _is_count(x) -> bool:
    return type(x) is int and x >= 0
