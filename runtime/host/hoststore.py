"""The packed host copies of streamed groups, kept across placements of one module.

A placement that streams from host memory reads each streamed block from one flat
host buffer (a Group packed largest element first; pinned when the device is CUDA).
Packing costs a full copy of the streamed weights, so a `HostStore` keeps the buffers
for the next placement of the same module (the next sampling run, the next encode):

    store = store_for(module)            # one per module, held weakly
    place(copy, plan, ..., host_store=store, repoint=shadow.repoint)

- A buffer is reused when its group is the same (names, dtypes, shapes) and the
  module's tensors still point where they pointed when it was packed; anything else
  (the module's tensors moved, were replaced, the plan streams other blocks) packs
  again. The placement's stats count the bytes packed (`host_pack_bytes`): 0 on a run
  that reused everything.
- After each placement's setup, buffers of groups it did not use are dropped (the
  placement changed). `drop_store(module)` drops them all (the caller's model was
  unloaded).
- One copy in host RAM: where a buffer is pageable, `repoint` (runtime/engine/shadow.py)
  points the module's own tensors into it, so the module's former storage is let go
  and the buffer is the module's storage from then on (dropping the store then frees
  nothing the module still uses). Pinned buffers are never given to the module (it
  would be left in pinned memory its owner did not pin): on CUDA the store's pinned
  copy is a second host copy of the streamed blocks, bounded by the pinned cap.
"""
import weakref
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from .residency import Group, give_back_freed_host_memory

Key = tuple


def group_key(g: Group) -> Key:
    return (tuple(tuple(n) for n in g.names), tuple(g.dtypes), tuple(g.shapes))


class _Entry:
    __slots__ = ("buf", "expect", "packed_from", "pinned")

    def __init__(self, buf: torch.Tensor, expect: List[int], packed_from: List[int],
                 pinned: bool):
        self.buf = buf
        self.expect = expect        # data_ptr of each source tensor that makes it current
        self.packed_from = packed_from  # ... and of the tensors it was packed from
        self.pinned = pinned


class HostStore:
    def __init__(self):
        self._entries: Dict[Key, _Entry] = {}
        self.packed_bytes = 0           # over the store's life

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        return sum(e.buf.numel() for e in self._entries.values())

    @property
    def pinned_bytes(self) -> int:
        return sum(e.buf.numel() for e in self._entries.values() if e.pinned)

    def pageable_ranges(self) -> List[Tuple[int, int]]:
        return [(e.buf.data_ptr(), e.buf.data_ptr() + e.buf.numel())
                for e in self._entries.values() if not e.pinned]

    def host_for(self, g: Group, sources: Sequence[torch.Tensor],
                 alloc: Callable[[int], Tuple[torch.Tensor, bool]],
                 repoint: Optional[Callable[[torch.Tensor, torch.Tensor], bool]] = None
                 ) -> Tuple[torch.Tensor, int]:
        """The packed host buffer of group `g` whose tensors now hold `sources`, and the
        bytes packed for it now (0: reused). `alloc(nbytes) -> (buffer, pinned)`."""
        key = group_key(g)
        ptrs = [s.data_ptr() for s in sources]
        e = self._entries.get(key)
        if e is not None and all(s.device.type == "cpu" for s in sources):
            if e.expect == ptrs:
                return e.buf, 0
            if e.packed_from == ptrs:   # still the storage it was packed from (a batch
                return e.buf, 0         # device's copy made before the pack): same bytes
        self._entries.pop(key, None)
        buf, pinned = alloc(g.nbytes)
        g.pack(buf, sources)
        expect = list(ptrs)
        if repoint is not None and not pinned:
            for i, (t, v) in enumerate(zip(g.tensors, g.views(buf))):
                if repoint(t, v):
                    expect[i] = v.data_ptr()
            give_back_freed_host_memory()
        self._entries[key] = _Entry(buf, expect, list(ptrs), pinned)
        self.packed_bytes += g.nbytes
        return buf, g.nbytes

    def retain(self, keys) -> None:
        """Drop the buffers of groups not in `keys` (the placement changed)."""
        keep = set(keys)
        for k in [k for k in self._entries if k not in keep]:
            del self._entries[k]

    def clear(self) -> None:
        self._entries.clear()


_STORES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
DROPS: List[Tuple[str, int]] = []      # (module class, bytes) of the last drops, diagnostics


def store_for(module: torch.nn.Module) -> HostStore:
    """The store of `module` (made on first use; goes when the module goes)."""
    store = _STORES.get(module)
    if store is None:
        store = _STORES[module] = HostStore()
    return store


def existing_store(module: torch.nn.Module) -> Optional[HostStore]:
    return _STORES.get(module)


def drop_store(module: torch.nn.Module) -> int:
    """Drop `module`'s packed copies (it was unloaded). Returns the bytes let go (buffers
    the module's tensors point into stay alive as its storage)."""
    store = _STORES.pop(module, None)
    if store is None:
        return 0
    n = store.nbytes
    store.clear()
    DROPS.append((type(module).__name__, n))
    del DROPS[:-32]
    return n
