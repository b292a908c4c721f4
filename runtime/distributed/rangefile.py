"""The same model file on both sides, proven by bytes: its size, a SHA-256 of its header,
and a hash of the range's tensors' SHA-256s (digests.py: each remembered while the file
is unchanged). Weights never cross the wire; the worker reads its own copy, found under
its models folder only.

Files are .safetensors or .gguf (ggufrange.py: each tensor as ComfyUI-GGUF holds it). The
main names its file by its path under ComfyUI's models folders ("diffusion_models/x",
"checkpoints/y"); a worker also finds it under the diffusion folder's other name ("unet/x")
and without the folder ("x"): its --models may be ComfyUI's models folder or a flat one.
"""
import hashlib
import os
import struct
from typing import Dict, Iterable, List

import torch

from ...placement.errors import PlacementError
from ..weights.weightfile import SafetensorsFile
from .digests import DIGESTS, FileDigests, digest_of
from .ggufrange import GGUFRangeFile

SUFFIXES = (".safetensors", ".gguf")
# ComfyUI's two names for one folder (folder_paths maps the old "unet" to "diffusion_models")
FOLDER_ALIASES = {"diffusion_models": "unet", "unet": "diffusion_models"}


def _is_gguf(path: str) -> bool:
    return path.lower().endswith(".gguf")


def candidates(relative: str) -> List[str]:
    """Where a main's model path is looked for, in order: as given, under the folder's other
    ComfyUI name, then without its first folder, then its bare name (a flat folder)."""
    parts = relative.split("/")
    out = [relative]
    if len(parts) > 1:
        if parts[0] in FOLDER_ALIASES:
            out.append("/".join([FOLDER_ALIASES[parts[0]]] + parts[1:]))
        out += ["/".join(parts[1:]), parts[-1]]
    return list(dict.fromkeys(out))


def resolve_under(models_dir: str, relative: str) -> str:
    """The file inside models_dir the main's `relative` names (candidates() in order);
    absolute paths, '..' and links that lead out of the folder are refused."""
    if not relative or os.path.isabs(relative) or "\\" in relative or \
            ".." in relative.split("/"):
        raise PlacementError(f"model path {relative!r} must be relative to the worker's "
                             f"models folder, without '..'")
    if not relative.lower().endswith(SUFFIXES):
        raise PlacementError(f"model path {relative!r}: remote ranges read .safetensors and "
                             f".gguf files only")
    root = os.path.realpath(models_dir)
    tried = candidates(relative)
    for name in tried:
        path = os.path.realpath(os.path.join(root, name))
        if not os.path.isfile(path):
            continue
        if os.path.commonpath([root, path]) != root:
            raise PlacementError(f"model path {name!r} leaves the worker's models folder")
        return path
    raise PlacementError(f"model file {relative!r} not found in the worker's models folder "
                         f"(looked for {', '.join(tried)})")


def open_range_file(path: str):
    """A SafetensorsFile, or a GGUFRangeFile (lookup, read_runs, close, path)."""
    if _is_gguf(path):
        return GGUFRangeFile(path)
    if not path.lower().endswith(".safetensors"):
        raise PlacementError(f"{os.path.basename(path)}: remote ranges read .safetensors "
                             f"and .gguf files only")
    return SafetensorsFile(path)


open_safetensors = open_range_file          # the name remote.py calls it by


def header_digest(path: str) -> str:
    """safetensors: the length and the JSON header; GGUF: every byte before the tensor
    data (key/values and the tensor table)."""
    with open(path, "rb") as fh:
        if _is_gguf(path):
            from .ggufrange import read_table
            _, data_offset = read_table(path)
            return hashlib.sha256(fh.read(data_offset)).hexdigest()
        head = fh.read(8)
        (n,) = struct.unpack("<Q", head)
        return hashlib.sha256(head + fh.read(n)).hexdigest()


def read_tensor(wf, key: str) -> torch.Tensor:
    entry = wf.lookup(key)
    if entry is None:
        raise PlacementError(f"{os.path.basename(wf.path)} has no tensor {key!r}")
    if isinstance(wf, GGUFRangeFile):
        return wf.read_value(key)
    dtype, shape, offset, nbytes = entry
    buf = torch.empty(nbytes, dtype=torch.uint8)
    wf.read_runs([(offset, 0, nbytes)], buf)
    return buf.view(dtype).reshape(shape)


def range_digest(wf, keys: Iterable[str], loaded: Dict[str, torch.Tensor] = None,
                 digests: FileDigests = DIGESTS) -> str:
    """A hash of the keys' tensor digests (digests.digest_of), each over the bytes of its
    value (the file's bytes; a GGUF BF16 vector's exact float32 form); `loaded` (key ->
    tensor) avoids a second read, and a tensor already hashed for the file as it is now
    is neither read nor hashed again."""
    keys = set(keys)
    known = digests.known(wf.path, keys)
    for key in keys - set(known):
        t = loaded[key] if loaded is not None and key in loaded else read_tensor(wf, key)
        known[key] = digests.of(wf.path, key, t)
    return digest_of(known)


def identity(path: str, digests: FileDigests = DIGESTS) -> dict:
    """{"size", "header_sha256"}: the header hashed once per version of the file."""
    return digests.identity(path, header_digest)
