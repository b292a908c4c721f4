"""The block tensors a worker holds for its main process's ranges, shared between ranges
of the same file: a range loaded while another of the same file is held takes the
tensors that one read, so a grown or moved range reads only its new blocks, and a range
asked for again while held moves nothing.

An entry is keyed by (file path, tensor key, device as the main names it, the tensor's
digest): a file changed on disk is hashed again (digests.py), and a tensor whose bytes
did not change keeps its device copy. A tensor goes when no range holds it any more."""
import threading
from typing import Dict, Optional, Set, Tuple

import torch

Key = Tuple[str, str, str, str]      # (file path, tensor key, device name, digest)


class _Held:
    __slots__ = ("tensor", "ranges")

    def __init__(self, tensor: torch.Tensor):
        self.tensor = tensor
        self.ranges: Set[int] = set()


class HeldTensors:
    def __init__(self):
        self._held: Dict[Key, _Held] = {}
        self._lock = threading.Lock()

    def find(self, path: str, key: str, device: str, sha: str) -> Optional[torch.Tensor]:
        with self._lock:
            h = self._held.get((path, key, device, sha))
            return None if h is None else h.tensor

    def hold(self, path: str, key: str, device: str, sha: str, range_id: int,
             tensor: torch.Tensor) -> torch.Tensor:
        """Count the tensor as held for `range_id`; one already held with the same bytes
        is returned instead of `tensor` (its device copy is kept)."""
        with self._lock:
            h = self._held.get((path, key, device, sha))
            if h is None:
                h = self._held[(path, key, device, sha)] = _Held(tensor)
            h.ranges.add(range_id)
            return h.tensor

    def drop_range(self, range_id: int) -> None:
        with self._lock:
            for key in [k for k, h in self._held.items() if range_id in h.ranges]:
                h = self._held[key]
                h.ranges.discard(range_id)
                if not h.ranges:
                    del self._held[key]

    def bytes_on(self, device: str, without: Set[int] = frozenset()) -> int:
        """Bytes of the distinct storages held for `device`, not counting those only the
        ranges `without` hold (ranges about to be dropped)."""
        with self._lock:
            seen, total = set(), 0
            for (_, _, d, _), h in self._held.items():
                storage = h.tensor.untyped_storage()
                if d == device and h.ranges - without and storage.data_ptr() not in seen:
                    seen.add(storage.data_ptr())
                    total += storage.nbytes()
            return total

    def clear(self) -> None:
        with self._lock:
            self._held.clear()
