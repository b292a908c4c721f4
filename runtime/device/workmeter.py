"""Working memory measured on a simulated device: the bytes of every tensor a placed
forward computes, alive now, charged to the device that computed it.

A GPU allocates each operation's output on the device the operation runs on; a simulated
device computes in host memory, so without this its ledger would see the weights and the
block inputs only, and a plan whose working-memory estimate is too small would pass here
and fail on a card. The device check's dispatch mode (simcheck.py) hands each operation's
outputs here: a storage that is not one of the operation's inputs is new memory, charged
to the device its operands are on (in a split, the device check locates them), else to
the device the running block belongs to (`set_device`, per thread: pipelined shares
compute at once; a factory has no operands), and given back when torch frees that
storage (a finalizer on the storage itself, so views keep it alive exactly as they keep
GPU memory alive). Going past
the device's capacity raises torch.OutOfMemoryError there, as a GPU would.

What it does not see: workspaces inside a kernel (cuBLAS, flash attention) and the
caching allocator's rounding; the planner's estimate carries a fixed GPU workspace for
those (placement/metadata/headroom.py)."""
import collections
import threading
import weakref
from typing import List, Sequence

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from .subclass_check import plain_call, storage_key


def input_keys(args, kwargs) -> set:
    """Storage keys of an operation's tensor arguments."""
    return {storage_key(a) for a in tree_flatten((args, kwargs))[0]
            if isinstance(a, torch.Tensor)}


class MeterMode(TorchDispatchMode):
    """Every operation run under it reports its outputs to `meter`."""

    def __init__(self, meter: "WorkMeter"):
        super().__init__()
        self.meter = meter

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        keys = input_keys(args, kwargs)
        out = plain_call(func, args, kwargs)        # tensor subclasses: subclass_check.py
        self.meter.produced(out, keys)
        return out


class Tally:
    """A ledger stand-in with no capacity: the peak alone (rehearse.py)."""

    def __init__(self):
        self.peak_bytes = 0

    def set_working(self, nbytes: int, what: str = "") -> None:
        self.peak_bytes = max(self.peak_bytes, nbytes)


class WorkMeter:
    def __init__(self, ledgers: Sequence):
        self.ledgers = list(ledgers)
        self.live: List[int] = [0] * len(self.ledgers)
        self._owner = {}                 # storage_key -> (device, bytes)
        # storages freed, not yet subtracted: a finalizer may run inside any allocation
        # (the cyclic GC), even one made while a lock here or in a ledger is held, so it
        # only appends (atomic); the next operation settles them before it counts its own
        self._freed_keys = collections.deque()
        self._lock = threading.Lock()
        self._local = threading.local()

    # -- which device computes now (this thread) --------------------------------------
    def set_device(self, d: int) -> None:
        self._local.device = d

    @property
    def device(self) -> int:
        return getattr(self._local, "device", 0)

    def device_of(self, t: torch.Tensor):
        """The device index that computed `t`'s storage (None: not computed under the
        meter, an input or a weight)."""
        return self.device_at(storage_key(t))

    def device_at(self, key: int):
        """The device index of the storage keyed `key` (None: not computed under the
        meter). The key must be taken before this call: a storage freed but not yet
        settled leaves its key here, and on the meta device the key is the storage
        object's id, which the next storage object made (a forward input's, asked for
        the first time) may reuse: its lookup would find the dead one's device."""
        self.settle()
        hit = self._owner.get(key)
        return None if hit is None else hit[0]

    def relocate(self, t: torch.Tensor, d: int) -> None:
        """`t`'s storage is on device d from now on (a hop's copy, allocated like its
        source): its bytes are charged there instead."""
        key = storage_key(t)
        self.settle()                    # after the key is taken: see device_at
        with self._lock:
            hit = self._owner.get(key)
            if hit is None or hit[0] == d:
                return
            src, nbytes = hit
            self._owner[key] = (d, nbytes)
            self.live[src] -= nbytes
            self.live[d] += nbytes
            left, live = self.live[src], self.live[d]
        self.ledgers[src].set_working(left)
        self.ledgers[d].set_working(live, f"{tuple(t.shape)} {t.dtype} copied there")

    # -- what the dispatch mode reports -------------------------------------------------
    def produced(self, out, input_keys, device=None) -> None:
        """`out`: an operation's result; input_keys: storage keys of its tensor inputs
        (an in-place operation or a view returns one of them: no new memory); `device`:
        where its operands are (the device check knows), else this thread's device."""
        d = self.device if device is None else device
        made = []
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor):
                continue
            try:
                storage = t.untyped_storage()
            except (RuntimeError, NotImplementedError):
                continue
            made.append((storage, storage_key(t), storage.nbytes(), t))
        self.settle()                   # after the keys are taken: see device_at
        for storage, key, nbytes, t in made:
            if nbytes == 0 or key in input_keys:
                continue
            with self._lock:
                if key in self._owner:
                    continue
                self._owner[key] = (d, nbytes)
                self.live[d] += nbytes
                live = self.live[d]
            weakref.finalize(storage, self._freed_keys.append, key)
            self.ledgers[d].set_working(live, f"{tuple(t.shape)} {t.dtype} computed there")

    def settle(self) -> None:
        """Subtract the storages freed since the last operation."""
        if not self._freed_keys:
            return
        touched = set()
        with self._lock:
            while self._freed_keys:
                hit = self._owner.pop(self._freed_keys.popleft(), None)
                if hit is not None:
                    self.live[hit[0]] -= hit[1]
                    touched.add(hit[0])
            lives = {d: self.live[d] for d in touched}
        for d, live in lives.items():
            self.ledgers[d].set_working(live)

    def forget(self) -> None:
        """At teardown: what is still alive stays the caller's (an output it keeps)."""
        with self._lock:
            self._owner.clear()
            self._freed_keys.clear()
            self.live = [0] * len(self.ledgers)
        for ledger in self.ledgers:
            ledger.set_working(0)
