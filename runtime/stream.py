"""Block streaming: a ring of `depth + 1` device slots, `depth` blocks in flight while
one computes.

Streamed block at schedule position p always lives in slot p % nslots, and its tensors
are bound to views of that slot once (residency.Group.bind), so the per-block hot path
is: issue the copy `depth` positions ahead (into the slot of the block that just
finished, after a compute mark), wait for this block's copy, go.
Between forwards all slots are free, so the end of one forward starts the copies of
the next forward's first blocks (the sampler's next step reuses them).

The schedule starts as the structural order; the first forward records the real
order. A block arriving out of order drains the ring and the rest of that forward
loads synchronously (still correct); the observed order is then adopted.
"""
import warnings
from functools import partial
from typing import Callable, List, Optional, Sequence

import torch

from .residency import Group


class Source:
    """Where a streamed group's bytes come from: a host buffer, or a file read."""
    __slots__ = ("host", "read")

    def __init__(self, host: Optional[torch.Tensor] = None,
                 read: Optional[Callable[[torch.Tensor], None]] = None):
        self.host = host
        self.read = read


class Streamer:
    def __init__(self, target, groups: Sequence[Group], modules: Sequence[torch.nn.Module],
                 sources: Sequence[Source], depth: int, staging: Optional[Callable] = None):
        """`staging(nbytes)` allocates a host staging buffer (disk sources only)."""
        self.target = target
        self.transfer = target.transfer
        self.groups = list(groups)
        self.modules = list(modules)
        self.sources = list(sources)
        self.depth = depth
        self.n = n = len(self.groups)
        self.lookahead = min(depth, n - 1) if n else 0
        self.nslots = self.lookahead + 1 if n else 0
        self.prime_count = min(self.nslots, n) if depth > 0 else 0
        self.slot_bytes = max((g.nbytes for g in self.groups), default=0)
        self.slots: List[torch.Tensor] = []
        self.staging: List[Optional[torch.Tensor]] = []
        self._make_staging = staging
        self.on_arrive: List[Callable[[int], None]] = []    # LoRA seam: (group index)
        self.skip_wait = False          # tests only: proves the race tests can fail
        self.schedule = list(range(n))
        self.learning = True
        self.observed: List[int] = []
        self.dynamic = False            # a block runs twice per forward: always synchronous
        self._handles = []
        self._reset()

    # -- memory ----------------------------------------------------------------------
    def allocate(self) -> None:
        for s in range(self.nslots):
            self.slots.append(self.target.alloc(self.slot_bytes, "slots", f"stream slot {s}"))
        needs_staging = any(src.read is not None for src in self.sources)
        self.staging = [self._make_staging(self.slot_bytes) if needs_staging else None
                        for _ in range(self.nslots)]
        self._bind()

    def free(self) -> None:
        self.drain()
        for _ in self.slots:
            self.target.free(self.slot_bytes, "slots")
        self.slots, self.staging = [], []
        self._reset()                   # nothing is in flight or primed any more

    def _bind(self) -> None:
        self.slot_of = [0] * self.n
        for p, gi in enumerate(self.schedule):
            self.slot_of[gi] = p % self.nslots
        for gi, g in enumerate(self.groups):
            g.bind(self.slots[self.slot_of[gi]])
        self.dst = [self.slots[self.slot_of[gi]][:g.nbytes] for gi, g in enumerate(self.groups)]
        self.src = []
        for gi, (g, s) in enumerate(zip(self.groups, self.sources)):
            if s.read is not None:
                self.src.append(self.staging[self.slot_of[gi]][:g.nbytes])
            else:
                self.src.append(s.host)

    # -- hooks -----------------------------------------------------------------------
    def attach(self) -> None:
        for gi, m in enumerate(self.modules):
            self._handles.append(m.register_forward_pre_hook(partial(self._pre, gi)))

    def detach(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    # -- the ring ----------------------------------------------------------------------
    def _reset(self) -> None:
        self.pos = 0
        self.issued = 0                 # positions [0, issued) have copies submitted
        self.tickets = [None] * max(self.nslots, 1)
        self.sync = self.dynamic

    def _issue(self, p: int) -> None:
        gi = self.schedule[p]
        src = self.sources[gi]
        self.tickets[p % self.nslots] = self.target.copy(
            self.dst[gi], self.src[gi], src.read, self.transfer.compute_mark())
        self.issued = p + 1

    def begin_forward(self) -> None:
        """Root pre-hook: a clean ring, the first blocks in flight."""
        if self.pos != 0 or self.sync or self.issued > self.prime_count:
            self.drain()                # an earlier forward stopped midway (error, interrupt)
            self._reset()
        while self.issued < self.prime_count:
            self._issue(self.issued)

    def end_forward(self) -> None:
        """Root post-hook: adopt the observed order once; start the next forward."""
        if self.learning:
            self.learning = False
            self._adopt(self.observed)
            self.observed = []
        if self.pos != self.n or self.sync:
            self.drain()
        self._reset()
        while self.issued < self.prime_count:
            self._issue(self.issued)

    def _pre(self, gi: int, module, args) -> None:
        if self.learning:
            self.observed.append(gi)
        pos = self.pos
        if pos < self.n and self.schedule[pos] == gi and not self.sync:
            ahead = min(pos + self.lookahead, self.n - 1)
            while self.issued <= ahead:
                self._issue(self.issued)
            ticket = self.tickets[pos % self.nslots]
            if not self.skip_wait:
                self.transfer.wait(ticket)
            self.pos = pos + 1
        else:
            self._load_now(gi)
        for fn in self.on_arrive:
            fn(gi)

    def _load_now(self, gi: int) -> None:
        """Out of order (or dynamic): drain the ring, load this block synchronously."""
        if not self.sync:
            self.drain()
            self.sync = True
        src = self.sources[gi]
        ticket = self.target.copy(self.dst[gi], self.src[gi], src.read, None)
        self.transfer.wait(ticket)

    def _adopt(self, observed: List[int]) -> None:
        if not observed or observed == self.schedule:
            return
        if len(set(observed)) != len(observed):
            self.dynamic = True
            self.prime_count = 0
            warnings.warn("a streamed block runs more than once per forward; streaming "
                          "falls back to synchronous loads for this module",
                          RuntimeWarning, stacklevel=2)
            return
        self.drain()
        self.schedule = list(observed)
        missing = [gi for gi in range(self.n) if gi not in set(observed)]
        # blocks never called keep a slot binding but are never loaded
        self.n_called = len(self.schedule)
        self.schedule += missing
        self.n = len(observed)
        self.prime_count = min(self.nslots, self.n) if self.depth > 0 else 0
        self._bind()

    def drain(self) -> None:
        self.transfer.drain()

    @property
    def streamed_bytes(self) -> int:
        return sum(self.groups[gi].nbytes for gi in self.schedule[:self.n])

    @property
    def primed_bytes(self) -> int:
        return sum(self.groups[gi].nbytes for gi in self.schedule[:self.prime_count])
