"""The same model file on both sides, proven by bytes: its size, a SHA-256 of its header,
and a SHA-256 of the range's tensors (key, then bytes, keys sorted). Weights never cross
the wire; the worker reads its own copy, found under its models folder only."""
import hashlib
import os
import struct
from typing import Dict, Iterable

import torch

from ...placement.errors import PlacementError
from ..weightfile import SafetensorsFile


def resolve_under(models_dir: str, relative: str) -> str:
    """A path inside models_dir; absolute paths and escapes (.., links out) refused."""
    if not relative or os.path.isabs(relative) or "\\" in relative or \
            ".." in relative.split("/"):
        raise PlacementError(f"model path {relative!r} must be relative to the worker's "
                             f"models folder, without '..'")
    root = os.path.realpath(models_dir)
    path = os.path.realpath(os.path.join(root, relative))
    if os.path.commonpath([root, path]) != root:
        raise PlacementError(f"model path {relative!r} leaves the worker's models folder")
    if not path.lower().endswith(".safetensors"):
        raise PlacementError(f"model path {relative!r}: remote ranges read .safetensors "
                             f"files only")
    if not os.path.isfile(path):
        raise PlacementError(f"model file {relative!r} not found in the worker's models "
                             f"folder")
    return path


def open_safetensors(path: str) -> SafetensorsFile:
    if not path.lower().endswith(".safetensors"):
        raise PlacementError(f"{os.path.basename(path)}: remote ranges read .safetensors "
                             f"files only")
    return SafetensorsFile(path)


def header_digest(path: str) -> str:
    with open(path, "rb") as fh:
        head = fh.read(8)
        (n,) = struct.unpack("<Q", head)
        return hashlib.sha256(head + fh.read(n)).hexdigest()


def read_tensor(wf: SafetensorsFile, key: str) -> torch.Tensor:
    entry = wf.lookup(key)
    if entry is None:
        raise PlacementError(f"{os.path.basename(wf.path)} has no tensor {key!r}")
    dtype, shape, offset, nbytes = entry
    buf = torch.empty(nbytes, dtype=torch.uint8)
    wf.read_runs([(offset, 0, nbytes)], buf)
    return buf.view(dtype).reshape(shape)


def range_digest(wf: SafetensorsFile, keys: Iterable[str],
                 loaded: Dict[str, torch.Tensor] = None) -> str:
    """Over the file's bytes of these keys; `loaded` (key -> tensor) avoids a second read."""
    h = hashlib.sha256()
    for key in sorted(set(keys)):
        t = loaded[key] if loaded is not None and key in loaded else read_tensor(wf, key)
        h.update(key.encode() + b"\0")
        h.update(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def identity(path: str) -> dict:
    return {"size": os.path.getsize(path), "header_sha256": header_digest(path)}
