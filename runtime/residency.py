"""Where weights rest and how a group of them is laid out for one-copy transfers.

A `Group` is a set of tensors (a block's parameters and buffers, or all non-block
ones) packed into one flat byte buffer: largest element size first, so every tensor
starts aligned to its own element size and the flat size is exactly the tensors'
bytes. The module's tensors are bound (`t.data = view`) to views of a device buffer
or ring slot once; a block then arrives with one copy and no per-parameter work.

Resting places:
- cpu: one flat host buffer per streamed group, pinned when the compute device is
  CUDA (a capped number of bytes; past the cap pageable, with a warning). The
  module's own storage is packed into it group by group, so host RAM holds the
  weights once. Never pins mmap-backed pages (we pin only our own buffers).
- disk: a safetensors or GGUF file read by byte ranges straight into a staging slot;
  nothing stays in RAM but the slots and the page cache. Quantized GGUF tensors go
  raw into modules that keep them raw (uint8); there is no dequantization here.
"""
import json
import os
import struct
import warnings
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from ..placement.errors import PlacementError
from ..placement.units import format_bytes


def rebind(t: torch.Tensor, value: torch.Tensor) -> None:
    """Point tensor `t` (a Parameter or buffer, identity kept) at `value`'s memory.
    `.data` cannot cross to or from the meta device; swap_tensors can."""
    try:
        t.data = value
    except RuntimeError:
        if isinstance(t, torch.nn.Parameter):
            value = torch.nn.Parameter(value, requires_grad=t.requires_grad)
        torch.utils.swap_tensors(t, value)


class Group:
    """Tensors packed into one flat buffer. `names[i]` are the module names of tensor i."""

    def __init__(self, name: str, tensors: Sequence[torch.Tensor],
                 names: Sequence[Sequence[str]], order_key: Optional[Callable] = None):
        self.name = name
        idx = sorted(range(len(tensors)),
                     key=lambda i: (-tensors[i].element_size(),
                                    order_key(i) if order_key else i))
        self.tensors = [tensors[i] for i in idx]
        self.names = [list(names[i]) for i in idx]
        self.dtypes = [t.dtype for t in self.tensors]
        self.shapes = [tuple(t.shape) for t in self.tensors]
        self.offsets, self.sizes, off = [], [], 0
        for t in self.tensors:
            n = t.numel() * t.element_size()
            self.offsets.append(off)
            self.sizes.append(n)
            off += n
        self.nbytes = off

    def views(self, buf: torch.Tensor) -> List[torch.Tensor]:
        return [buf[o:o + n].view(d).view(s) for o, n, d, s in
                zip(self.offsets, self.sizes, self.dtypes, self.shapes)]

    def bind(self, buf: torch.Tensor) -> None:
        for t, v in zip(self.tensors, self.views(buf)):
            rebind(t, v)

    def pack(self, buf: torch.Tensor, sources: Sequence[torch.Tensor]) -> None:
        for v, src in zip(self.views(buf), sources):
            v.copy_(src)


# -- files -------------------------------------------------------------------------
_ST_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
    "U8": torch.uint8, "BOOL": torch.bool,
    "F8_E4M3": getattr(torch, "float8_e4m3fn", None),
    "F8_E5M2": getattr(torch, "float8_e5m2", None),
}

FileEntry = Tuple[torch.dtype, Tuple[int, ...], int, int]   # dtype, shape, offset, nbytes


class WeightFile:
    """Byte ranges of tensors in a model file, read with pread (no Python-side copies)."""

    def __init__(self, path: str):
        self.path = path
        self.entries: Dict[str, FileEntry] = {}
        self.unsupported: Dict[str, str] = {}        # key -> why it cannot be read raw
        self.quantized: Dict[str, str] = {}          # key -> quant type (raw bytes entry)
        self._fd = os.open(path, os.O_RDONLY)
        st = os.fstat(self._fd)
        self._identity = (st.st_size, st.st_mtime_ns)   # a file changed under us is refused
        try:
            self._parse(path)
        except BaseException:
            self.close()                  # a bad header must not leak the descriptor
            raise

    def _parse(self, path: str) -> None:
        raise NotImplementedError

    def check_unchanged(self) -> None:
        st = os.fstat(self._fd)
        if st.st_size < self._identity[0]:
            raise PlacementError(f"{self.path}: the file is truncated while streaming "
                                 f"({st.st_size} bytes, {self._identity[0]} when opened)")
        if (st.st_size, st.st_mtime_ns) != self._identity:
            raise PlacementError(f"{self.path}: the file changed while streaming (size or "
                                 f"modification time differs from when it was opened); "
                                 f"rerun once it is written")

    def lookup(self, key: str) -> Optional[FileEntry]:
        if key in self.unsupported:
            raise PlacementError(f"{os.path.basename(self.path)}: tensor {key!r} is "
                                 f"{self.unsupported[key]}, which disk residency cannot "
                                 f"read; use a F32/F16/BF16 file or params=cpu")
        return self.entries.get(key)

    def refuse_dequant(self, key: str, wanted) -> None:
        raise PlacementError(f"{os.path.basename(self.path)}: tensor {key!r} is quantized "
                             f"({self.quantized[key]}) but the module wants {wanted}; disk "
                             f"residency streams quantized bytes only into modules that "
                             f"hold them raw (uint8, e.g. ComfyUI-GGUF) and has no on-device "
                             f"dequantization yet; use an unquantized file or params=cpu")

    def read_runs(self, runs: Sequence[Tuple[int, int, int]], buf: torch.Tensor) -> None:
        """runs: (file offset, buffer offset, nbytes)."""
        self.check_unchanged()
        arr = buf.numpy()
        for file_off, buf_off, n in runs:
            view = memoryview(arr[buf_off:buf_off + n])
            done = 0
            while done < n:
                got = os.preadv(self._fd, [view[done:]], file_off + done)
                if got <= 0:
                    raise PlacementError(f"{self.path}: file ends early at byte "
                                         f"{file_off + done}; the file is truncated")
                done += got

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class SafetensorsFile(WeightFile):
    def _parse(self, path: str) -> None:
        with open(path, "rb") as fh:
            head = fh.read(8)
            if len(head) != 8:
                raise PlacementError(f"{path}: not a safetensors file (too short)")
            (n,) = struct.unpack("<Q", head)
            try:
                header = json.loads(fh.read(n))
            except (ValueError, UnicodeDecodeError):
                raise PlacementError(f"{path}: not a safetensors file (bad header)") from None
        base = 8 + n
        for key, info in header.items():
            if key == "__metadata__":
                continue
            dtype = _ST_DTYPES.get(info["dtype"])
            if dtype is None:
                self.unsupported[key] = f"stored as {info['dtype']}"
                continue
            start, end = info["data_offsets"]
            self.entries[key] = (dtype, tuple(info["shape"]), base + start, end - start)


class GGUFFile(WeightFile):
    _RAW = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
            "F64": torch.float64, "I8": torch.int8, "I16": torch.int16, "I32": torch.int32,
            "I64": torch.int64}

    def _parse(self, path: str) -> None:
        try:
            import gguf
        except ImportError:
            raise PlacementError("disk residency from a .gguf file needs the 'gguf' "
                                 "package (pip install gguf)") from None
        reader = gguf.GGUFReader(path)
        for t in reader.tensors:
            qname = t.tensor_type.name
            dtype = self._RAW.get(qname)
            if dtype is None:                 # quantized: its raw bytes, for modules that
                self.quantized[t.name] = qname    # keep them raw (dequantized in their ops)
                self.entries[t.name] = (torch.uint8, (int(t.n_bytes),), int(t.data_offset),
                                        int(t.n_bytes))
                continue
            shape = tuple(int(d) for d in reversed(list(t.shape)))   # ggml order is reversed
            self.entries[t.name] = (dtype, shape, int(t.data_offset), int(t.n_bytes))
        del reader


def open_weight_file(path: str) -> WeightFile:
    if not os.path.isfile(path):
        raise PlacementError(f"weights file {path!r} not found; disk residency needs the "
                             f"model's .safetensors or .gguf file")
    if path.lower().endswith(".gguf"):
        return GGUFFile(path)
    return SafetensorsFile(path)


class DiskLayout:
    """Where each tensor of a group is in the file; runs coalesce neighbours."""

    def __init__(self, group: Group, file: WeightFile, key_map: Callable[[str], str],
                 required: bool):
        self.runs: List[Tuple[int, int, int]] = []
        self.from_module: List[int] = []      # tensors not in the file (non-persistent buffers)
        for i, names in enumerate(group.names):
            entry = None
            for name in names:
                entry = file.lookup(key_map(name))
                if entry is not None:
                    break
            if entry is None:
                if required:
                    raise PlacementError(f"{os.path.basename(file.path)} has no tensor "
                                         f"{key_map(names[0])!r} (block {group.name}); pass "
                                         f"the file this model was loaded from, or a key_map")
                self.from_module.append(i)
                continue
            dtype, shape, off, n = entry
            key = key_map(name)
            if key in file.quantized and (dtype != group.dtypes[i] or n != group.sizes[i]):
                file.refuse_dequant(key, f"{group.dtypes[i]} {list(group.shapes[i])}")
            if dtype != group.dtypes[i] or n != group.sizes[i]:
                raise PlacementError(
                    f"{os.path.basename(file.path)}: tensor {key_map(names[0])!r} is "
                    f"{dtype} {list(shape)} but the module has {group.dtypes[i]} "
                    f"{list(group.shapes[i])}; disk residency needs the file's dtypes")
            buf_off = group.offsets[i]
            if self.runs and self.runs[-1][0] + self.runs[-1][2] == off \
                    and self.runs[-1][1] + self.runs[-1][2] == buf_off:
                f0, b0, n0 = self.runs[-1]
                self.runs[-1] = (f0, b0, n0 + n)
            else:
                self.runs.append((off, buf_off, n))


def file_order_key(group_tensors, group_names, file: WeightFile, key_map):
    """Sort key that follows the file, so a block is usually one contiguous read."""
    def key(i):
        for name in group_names[i]:
            e = file.entries.get(key_map(name))
            if e is not None:
                return e[2]
        return -1
    return key


# -- pinned host memory --------------------------------------------------------------
class PinnedPool:
    """Pins our own host buffers at their exact size through the process-wide account
    (runtime/pinned.py: registered in place, unpinned and uncounted when the last view
    is gone), up to `cap_bytes` pinned in use; past it, pageable with one warning, which
    `warning` keeps for stats()."""

    def __init__(self, enabled: bool, cap_bytes: int, account=None):
        self.enabled = enabled
        self.cap = cap_bytes
        self._account = account
        self.pageable_bytes = 0
        self.warning: Optional[str] = None

    @property
    def account(self):
        if self._account is None:
            from .pinned import account
            self._account = account()
        return self._account

    @property
    def pinned_bytes(self) -> int:
        """Pinned host bytes in use now (the pack's, process-wide: host stores included)."""
        return self.account.in_use if self.enabled else 0

    def alloc(self, nbytes: int) -> torch.Tensor:
        return self.alloc_flagged(nbytes)[0]

    def alloc_flagged(self, nbytes: int):
        """(buffer, pinned)."""
        if self.enabled:
            try:
                buf = self.account.alloc(nbytes, self.cap)
                if buf is not None:
                    return buf, True
                self._warn(f"pinned host memory cap {format_bytes(min(self.cap, self.account.cap))} "
                           f"reached")
            except RuntimeError as exc:
                self._warn(f"pinning failed ({exc})")
        self.pageable_bytes += nbytes
        return torch.empty(nbytes, dtype=torch.uint8), False

    def _warn(self, why: str) -> None:
        if self.warning is None:
            self.warning = (f"{why}: the rest of the weights rest in pageable memory, "
                            f"copies from it are slower")
            warnings.warn(self.warning, RuntimeWarning, stacklevel=3)


def _find_malloc_trim():
    try:
        import ctypes
        import ctypes.util
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc.malloc_trim
    except (OSError, AttributeError):
        return None                     # not glibc: nothing to do


_malloc_trim = _find_malloc_trim()


def give_back_freed_host_memory() -> None:
    """glibc keeps freed heap memory (its mmap threshold rises after large frees), so
    packing weights into new buffers would leave the old copies in RSS; trim returns
    them to the OS."""
    if _malloc_trim is not None:
        _malloc_trim(0)


def default_pinned_cap() -> int:
    """Half the host RAM (a quarter on Windows): pinned pages cannot be swapped."""
    from .pinned import default_cap
    return default_cap()
