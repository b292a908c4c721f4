"""What a model file's bytes hash to, remembered while the file is unchanged: its header
and each tensor's SHA-256, keyed by the file's signature (device, inode, size, mtime).
A range of a file hashes only the tensors no earlier range of the same file hashed; a
file changed on disk (another signature) is hashed again from its first byte.

A range's digest is a hash of its tensors' digests (key, then the tensor's SHA-256, keys
sorted), so both sides can compute it from per-tensor digests they already hold.

The signature is what `make` and `rsync` trust. A file's timestamp moves in coarse ticks,
so a file modified within SETTLE_S of being hashed could change again under the same
signature: its digests are not remembered (git's "racily clean" rule), and a worker's
range of it is read again rather than kept.
"""
import hashlib
import os
import threading
import time
from collections import OrderedDict
from typing import Dict, Iterable, Optional, Tuple

import torch

Signature = Tuple[int, int, int, int]
FILES_KEPT = 64               # files whose digests are remembered (the least used go)
SETTLE_S = 2.0


def signature(path: str) -> Signature:
    st = os.stat(path)
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def settled(sig: Signature) -> bool:
    """Modified long enough ago that a change would move the signature."""
    return time.time_ns() - sig[3] >= SETTLE_S * 1e9


def tensor_sha256(t: torch.Tensor) -> str:
    return hashlib.sha256(t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
                          .numpy()).hexdigest()


def digest_of(digests: Dict[str, str]) -> str:
    """A range's digest from its tensors' (key -> SHA-256)."""
    h = hashlib.sha256()
    for key in sorted(digests):
        h.update(f"{key}\0{digests[key]}\n".encode())
    return h.hexdigest()


class _File:
    def __init__(self, sig: Signature):
        self.sig = sig
        self.header: Optional[str] = None
        self.tensors: Dict[str, str] = {}


class FileDigests:
    """Per-file digests of one process (the main's, or a worker's), thread-safe.
    `hashed_bytes` counts every byte this process hashed (what the stats report)."""

    def __init__(self, files_kept: int = FILES_KEPT):
        self._files: "OrderedDict[str, _File]" = OrderedDict()
        self._lock = threading.Lock()
        self._files_kept = files_kept
        self.hashed_bytes = 0

    def _entry(self, path: str, sig: Signature) -> _File:
        real = os.path.realpath(path)
        if not settled(sig):
            return _File(sig)         # hashed now, remembered once the file has settled
        with self._lock:
            entry = self._files.get(real)
            if entry is None or entry.sig != sig:
                entry = self._files[real] = _File(sig)
            self._files.move_to_end(real)
            while len(self._files) > self._files_kept:
                self._files.popitem(last=False)
            return entry

    def identity(self, path: str, header_sha256) -> dict:
        """{"size", "header_sha256"} of the file; `header_sha256(path)` runs only when
        the file is new here or changed."""
        sig = signature(path)
        entry = self._entry(path, sig)
        if entry.header is None:
            entry.header = header_sha256(path)
        return {"size": sig[2], "header_sha256": entry.header}

    def known(self, path: str, keys: Iterable[str]) -> Dict[str, str]:
        """The digests of those of `keys` known for the file as it is now."""
        entry = self._entry(path, signature(path))
        return {k: entry.tensors[k] for k in keys if k in entry.tensors}

    def of(self, path: str, key: str, value: torch.Tensor) -> str:
        """The digest of the file's tensor `key`, whose bytes are `value` (hashed only
        when not known for the file as it is now)."""
        entry = self._entry(path, signature(path))
        known = entry.tensors.get(key)
        if known is None:
            known = entry.tensors[key] = tensor_sha256(value)
            with self._lock:
                self.hashed_bytes += value.numel() * value.element_size()
        return known

    def forget(self) -> None:
        with self._lock:
            self._files.clear()


# this process's digests (a worker and a main in one process share them: the same file
# hashes the same)
DIGESTS = FileDigests()
