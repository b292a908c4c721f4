"""A GGUF file's tensor table, and reads of one tensor's raw bytes by its byte range.

The `gguf` package parses the header (it memory-maps the file; no weight is read). Reads
go through `os.preadv` straight into the caller's uint8 buffer (a pinned staging slot,
say), so a tensor costs its own bytes and the file is never read whole into RAM.
"""
import os
from typing import Dict, Iterator, List, NamedTuple, Optional, Tuple

import torch

from ...placement.errors import PlacementError
from ...placement.metadata.gguf_file import open_reader
from .types import ggml_type

# city96's ComfyUI-GGUF converter stores the torch shape of tensors it had to reshape.
ORIG_SHAPE_KEY = "comfy.gguf.orig_shape."


class GGUFTensor(NamedTuple):
    name: str
    type: str                     # GGML type name: "F16", "Q4_K", ...
    shape: Tuple[int, ...]        # torch order (ComfyUI-GGUF's orig_shape where stored)
    offset: int                   # absolute file offset of the first byte
    nbytes: int

    @property
    def byte_range(self) -> Tuple[int, int]:
        return self.offset, self.offset + self.nbytes


class GGUFTensors:
    """`GGUFTensors(path)`: iterate, `[name]`, `.read_into(name, buf)`, `.read(name)`."""

    def __init__(self, path):
        self.path = os.fspath(path)
        reader = open_reader(self.path)
        try:
            self.tensors: Dict[str, GGUFTensor] = {}
            for t in reader.tensors:
                orig = reader.fields.get(ORIG_SHAPE_KEY + t.name)
                if orig is not None:
                    shape = tuple(int(x) for x in orig.contents())
                else:                                   # ggml lists dims fastest first
                    shape = tuple(int(x) for x in reversed(t.shape.tolist()))
                name = getattr(t.tensor_type, "name", None) or ggml_type(int(t.tensor_type)).name
                self.tensors[t.name] = GGUFTensor(t.name, name, shape, int(t.data_offset),
                                                  int(t.n_bytes))
        finally:
            del reader                                  # drops the memory map
        self.file_size = os.path.getsize(self.path)
        self._fd: Optional[int] = None

    # -- the table ---------------------------------------------------------------------
    def __iter__(self) -> Iterator[GGUFTensor]:
        return iter(self.tensors.values())

    def __len__(self) -> int:
        return len(self.tensors)

    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def __getitem__(self, name: str) -> GGUFTensor:
        t = self.tensors.get(name)
        if t is None:
            raise PlacementError(f"{os.path.basename(self.path)}: no tensor {name!r}")
        return t

    def types(self) -> Dict[str, int]:
        """GGML type name -> tensor count."""
        out: Dict[str, int] = {}
        for t in self:
            out[t.type] = out.get(t.type, 0) + 1
        return out

    # -- reads -------------------------------------------------------------------------
    def read_into(self, name: str, buf: torch.Tensor, at: int = 0) -> torch.Tensor:
        """Read tensor `name`'s bytes into `buf[at:at + nbytes]` (a contiguous CPU uint8
        tensor) and return that view."""
        t = self[name]
        if buf.dtype != torch.uint8 or buf.device.type != "cpu" or not buf.is_contiguous():
            raise PlacementError(f"read_into needs a contiguous CPU uint8 buffer, got "
                                 f"{buf.dtype} on {buf.device}")
        flat = buf.view(-1)
        if at < 0 or at + t.nbytes > flat.numel():
            raise PlacementError(f"{name}: {t.nbytes} bytes do not fit in the buffer at "
                                 f"{at} ({flat.numel()} bytes)")
        if t.offset + t.nbytes > self.file_size:
            raise PlacementError(f"{self.path}: file ends at byte {self.file_size}, tensor "
                                 f"{name!r} needs bytes up to {t.offset + t.nbytes}; the "
                                 f"file is truncated")
        view = flat[at:at + t.nbytes]
        self._pread(memoryview(view.numpy()), t.offset)
        return view

    def read(self, name: str) -> torch.Tensor:
        """A new uint8 tensor holding tensor `name`'s bytes (and nothing else)."""
        return self.read_into(name, torch.empty(self[name].nbytes, dtype=torch.uint8))

    def _pread(self, mv: memoryview, offset: int) -> None:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDONLY)
        done, n = 0, len(mv)
        while done < n:
            got = os.preadv(self._fd, [mv[done:]], offset + done)
            if got <= 0:
                raise PlacementError(f"{self.path}: file ends early at byte {offset + done}")
            done += got

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> "GGUFTensors":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def list_tensors(path) -> List[GGUFTensor]:
    """Name, type, shape and byte range of every tensor in a GGUF file."""
    return list(GGUFTensors(path))
