"""A GGUF file as a remote range reads it: every tensor as ComfyUI-GGUF's loader
(gguf_sd_loader) holds it, so that the main's module compares equal to what is read, byte
for byte, and the worker's module gets the same tensors:

- F32, F16: typed tensors of the torch shape;
- quantized types and BF16: their raw bytes, uint8, shaped as the `gguf` reader maps them
  (rows of whole blocks); ComfyUI-GGUF's tensors report their torch shape instead
  (`tensor_shape`), and so does `lookup`, for the main's check against `t.shape`;
- BF16 of one dimension: float32 (ComfyUI-GGUF converts those when it loads; exact).

The header digest covers every byte before the tensor data (key/values and the tensor
table: names, types, shapes, offsets); the range digest covers the tensors' bytes.
"""
import os
from typing import Dict, NamedTuple, Tuple

import numpy as np
import torch

from ...placement.errors import PlacementError
from ...placement.metadata.gguf_file import open_reader
from ..gguf.reader import ORIG_SHAPE_KEY
from ..weights.weightfile import WeightFile

TYPED = {"F32": torch.float32, "F16": torch.float16}


class RangeTensor(NamedTuple):
    name: str
    qtype: str                        # GGML type name: "F32", "Q8_0", ...
    shape: Tuple[int, ...]            # torch shape (ComfyUI-GGUF's tensor_shape)
    dtype: torch.dtype                # the value's dtype as ComfyUI-GGUF holds it
    storage: Tuple[int, ...]          # the value's own shape (raw rows for quantized)
    offset: int                       # absolute file offset
    nbytes: int

    @property
    def converted(self) -> bool:
        return self.qtype == "BF16" and len(self.shape) <= 1


def read_table(path: str) -> Tuple[Dict[str, RangeTensor], int]:
    """The file's tensors and where their data starts (the end of the header)."""
    reader = open_reader(path, os.path.basename(path))
    try:
        size, table = os.path.getsize(path), {}
        for t in reader.tensors:
            qtype = t.tensor_type.name
            orig = reader.fields.get(ORIG_SHAPE_KEY + t.name)
            shape = tuple(int(x) for x in orig.contents()) if orig is not None else \
                tuple(int(x) for x in reversed(t.shape.tolist()))
            offset, nbytes = int(t.data_offset), int(t.n_bytes)
            if offset + nbytes > size:
                raise PlacementError(f"{os.path.basename(path)}: tensor {t.name!r} ends past "
                                     f"the end of the file (truncated?)")
            if qtype in TYPED:
                dtype, storage = TYPED[qtype], shape
            elif qtype == "BF16" and len(shape) <= 1:
                dtype, storage = torch.float32, shape
            else:                    # as the reader maps it: uint8 rows, or int types
                dtype = torch.from_numpy(np.empty(0, dtype=t.data.dtype)).dtype
                storage = tuple(int(x) for x in t.data.shape)
            table[t.name] = RangeTensor(t.name, qtype, shape, dtype, storage, offset, nbytes)
        return table, int(reader.data_offset)
    finally:
        del reader                   # drops the memory map


class GGUFRangeFile(WeightFile):
    """`lookup(key)` -> (dtype, torch shape, offset, nbytes); `read_value(key)` -> the
    tensor as ComfyUI-GGUF holds it (read with pread, the file never whole in RAM)."""

    def _parse(self, path: str) -> None:
        self.table, self.data_offset = read_table(path)
        self.entries = {k: (t.dtype, t.shape, t.offset, t.nbytes) for k, t in self.table.items()}

    def read_value(self, key: str) -> torch.Tensor:
        t = self.table[key]
        raw = torch.empty(t.nbytes, dtype=torch.uint8)
        self.read_runs([(t.offset, 0, t.nbytes)], raw)
        if t.converted:
            return raw.view(torch.bfloat16).to(torch.float32).reshape(t.storage)
        return raw.view(t.dtype).reshape(t.storage)
