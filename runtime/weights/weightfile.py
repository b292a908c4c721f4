"""Model files read by byte ranges: safetensors and GGUF headers parsed into
(dtype, shape, offset, nbytes) entries, and a group's tensors mapped to coalesced file
runs (`DiskLayout`) that are read with pread straight into a caller's buffer (a staging
slot or a ring slot), never the whole file into RAM. Several reads are in flight at once
(runtime/readpool: a few reader threads kept for the file's life). A file changed or
truncated while streaming is refused."""
import os
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from ...placement.errors import PlacementError
from ..host.residency import Group
from . import readpool


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

    def __init__(self, path: str, readers: Optional[int] = None, chunk: Optional[int] = None):
        self.path = path
        self.entries: Dict[str, FileEntry] = {}
        self.unsupported: Dict[str, str] = {}        # key -> why it cannot be read raw
        self.quantized: Dict[str, str] = {}          # key -> quant type (raw bytes entry)
        self._fd = os.open(path, os.O_RDONLY)
        st = os.fstat(self._fd)
        self._identity = (st.st_size, st.st_mtime_ns)   # a file changed under us is refused
        self._pool: Optional[readpool.ReadPool] = None
        try:
            self._parse(path)
            self._pool = readpool.ReadPool(
                self._fd, path, readpool.READERS if readers is None else readers,
                readpool.CHUNK if chunk is None else chunk)
            # no POSIX_FADV_SEQUENTIAL: its doubled readahead window measured 0.84x a
            # plain read of a block here (it reads past the block), WILLNEED no better
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
        """runs: (file offset, buffer offset, nbytes), read into the flat CPU uint8 `buf`
        with several reads in flight; returns once every byte is in `buf`."""
        pool = self._pool
        if pool is None:
            raise PlacementError(f"{self.path}: read after the file was closed")
        if buf.dtype != torch.uint8 or buf.device.type != "cpu" or not buf.is_contiguous():
            raise PlacementError(f"read_runs needs a contiguous CPU uint8 buffer, got "
                                 f"{buf.dtype} on {buf.device}")
        size = buf.numel()
        for file_off, buf_off, n in runs:
            if n < 0 or buf_off < 0 or buf_off + n > size or file_off < 0:
                raise PlacementError(f"{self.path}: run of {n} bytes at buffer offset "
                                     f"{buf_off} does not fit a {size}-byte buffer")
        self.check_unchanged()
        pool.read(runs, memoryview(buf.numpy()).cast("B"))

    def close(self) -> None:
        """Join the reader threads (after reads in progress), then close the descriptor."""
        pool, self._pool = getattr(self, "_pool", None), None
        if pool is not None:
            pool.close()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __del__(self):
        """A file dropped without close(): stop its readers, close its descriptor (no
        read can be in progress: a read holds a reference to the file)."""
        try:
            pool, self._pool = getattr(self, "_pool", None), None
            if pool is not None:
                pool.close(join=False)
            if getattr(self, "_fd", None) is not None:
                os.close(self._fd)
                self._fd = None
        except Exception:        # noqa: BLE001 (a finalizer must not raise)
            pass


class SafetensorsFile(WeightFile):
    def _parse(self, path: str) -> None:
        # the planner's reader: validated once per file version, one PlacementError line
        from ...placement.metadata.safetensors_header import read_header
        header = read_header(path)
        if header.header_only:
            raise PlacementError(f"{path}: holds only a safetensors header, no tensor data "
                                 f"(it plans like its model; it cannot run)")
        for e in header.entries:
            dtype = _ST_DTYPES.get(e.dtype)
            if dtype is None:
                self.unsupported[e.name] = f"stored as {e.dtype}"
                continue
            self.entries[e.name] = (dtype, e.shape, header.data_start + e.begin,
                                    e.end - e.begin)


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
        try:
            reader = gguf.GGUFReader(path)
        except OSError as e:
            raise PlacementError(f"cannot read {path}: {e.strerror or e}") from None
        except Exception as e:  # whatever numpy/struct raise on a malformed file
            detail = (str(e).splitlines() or [""])[0][:120]
            raise PlacementError(f"{path}: not a readable GGUF file "
                                 f"({type(e).__name__}: {detail})") from None
        try:
            self._entries_of(reader, path)
        except PlacementError:
            raise
        except Exception as e:
            raise PlacementError(f"{path}: bad GGUF tensor table ({type(e).__name__})") from None
        finally:
            del reader

    def _entries_of(self, reader, path: str) -> None:
        size = os.path.getsize(path)
        for t in reader.tensors:
            if int(t.data_offset) + int(t.n_bytes) > size:
                raise PlacementError(f"{path}: bad GGUF tensor table: tensor {t.name!r} "
                                     f"ends past the end of the file")
            qname = t.tensor_type.name
            dtype = self._RAW.get(qname)
            if dtype is None:                 # quantized: its raw bytes, for modules that
                self.quantized[t.name] = qname    # keep them raw (dequantized in their ops)
                self.entries[t.name] = (torch.uint8, (int(t.n_bytes),), int(t.data_offset),
                                        int(t.n_bytes))
                continue
            shape = tuple(int(d) for d in reversed(list(t.shape)))   # ggml order is reversed
            self.entries[t.name] = (dtype, shape, int(t.data_offset), int(t.n_bytes))


def open_weight_file(path: str, **readers) -> WeightFile:
    """readers: `readers=` threads besides the caller and `chunk=` bytes per read."""
    if not os.path.isfile(path):
        raise PlacementError(f"weights file {path!r} not found; disk residency needs the "
                             f"model's .safetensors or .gguf file")
    if path.lower().endswith(".gguf"):
        return GGUFFile(path, **readers)
    return SafetensorsFile(path, **readers)


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
