"""Block streaming: a ring of `depth + 1` device slots, `depth` blocks in flight while
one computes.

Streamed blocks are consumed in a sequence that runs on across forwards (sampling
steps run the same blocks again): the j-th block consumed is schedule[j % n] and lives
in slot j % nslots. So at each block the ring issues the copy `depth` positions ahead,
into the slot of the block that just finished (ordered after it by a compute mark), and
the copy engine keeps working across the step boundary instead of idling while the
last blocks compute. A block's tensors are bound (`.data`) to views of its slot; they
are re-bound only when its slot changes (when n is not a multiple of nslots).

The schedule starts as the structural order. The first forward records the real
order and does not run ahead past its end; a block arriving out of order drains the
ring and the rest of that forward loads synchronously (still correct). The observed
order is then adopted. A forward that stops midway (error, interrupt) is detected at
the next one, which starts from a drained, clean ring.
"""
import time
import warnings
from functools import partial
from typing import Callable, List, Optional, Sequence

import torch

from .residency import Group, rebind


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
        self.reads = [s.read for s in self.sources]
        self.depth = depth
        self.n = n = len(self.groups)
        self.lookahead = min(depth, n - 1) if n else 0
        self.nslots = self.lookahead + 1 if n else 0
        self.slot_bytes = max((g.nbytes for g in self.groups), default=0)
        self.slots: List[torch.Tensor] = []
        self.staging: List[Optional[torch.Tensor]] = []
        self._make_staging = staging
        self.on_arrive: List[Callable[[int], None]] = []    # LoRA seam: (group index)
        self._views = {}
        self.skip_wait = False          # tests only: proves the race tests can fail
        self.wait_seconds = 0.0         # compute blocked on copies (overlap diagnostics)
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
        needs_staging = any(r is not None for r in self.reads) and \
            not self.transfer.reads_into_dst
        self.staging = [self._make_staging(self.slot_bytes) if needs_staging else None
                        for _ in range(self.nslots)]
        # copy endpoints per (slot, group), so issuing a copy is two list lookups
        self.dst = [[slot[:g.nbytes] for g in self.groups] for slot in self.slots]
        self.src = [[(st if st is not None else slot)[:g.nbytes] if r is not None
                     else s.host for g, s, r in zip(self.groups, self.sources, self.reads)]
                    for st, slot in zip(self.staging, self.slots)]
        self._reset()

    def free(self) -> None:
        try:
            self.drain()                # a failed copy surfaces here, after the frees
        finally:
            for _ in self.slots:
                self.target.free(self.slot_bytes, "slots")
            self.slots, self.staging, self.dst, self.src = [], [], [], []
            self._views = {}
            self._reset()               # nothing is in flight or bound any more

    def _bind(self, gi: int, s: int) -> None:
        views = self._views.get((gi, s))
        if views is None:               # made once per (block, slot), reused every step
            views = self._views[(gi, s)] = self.groups[gi].views(self.slots[s])
        for t, v in zip(self.groups[gi].tensors, views):
            rebind(t, v)
        self.bound[gi] = s

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
        self.q = 0                      # global index of the next block to consume
        self.issued = 0                 # global indices [0, issued) have copies submitted
        self.fstart = 0                 # global index where this forward began
        self.tickets = [None] * max(self.nslots, 1)
        self.bound = [-1] * len(self.groups)   # slot each group's tensors point at
        self.sync = self.dynamic

    def _issue_upto(self, last: int) -> None:
        ns, n, sched = self.nslots, self.n, self.schedule
        while self.issued <= last:
            j = self.issued
            s, gi = j % ns, sched[j % n]
            self.tickets[s] = self.target.copy(self.dst[s][gi], self.src[s][gi],
                                               self.reads[gi], self.transfer.compute_mark())
            self.issued = j + 1

    def _horizon(self, q: int) -> int:
        """Last global index that may be in flight when block q is next."""
        last = q + self.lookahead
        if self.learning:               # the order is not known past this forward yet
            last = min(last, self.fstart + self.n - 1)
        return last

    def begin_forward(self) -> None:
        """Root pre-hook: a clean ring, the first blocks in flight."""
        if self.q != self.fstart or self.sync:
            self.drain()                # an earlier forward stopped midway
            self._reset()
        if self.learning:
            self.observed = []          # what a stopped first forward saw is not an order
        if self.depth > 0 and self.n:
            self._issue_upto(self._horizon(self.q))

    def end_forward(self) -> None:
        """Root post-hook: adopt the observed order once; keep the copy engine busy."""
        if self.learning:
            self.learning = False
            observed, self.observed = self.observed, []
            if self._adopt(observed) or self.sync:
                self.drain()
                self._reset()
                return
        if self.q != self.fstart + self.n or self.sync:
            self.drain()
            self._reset()
            return
        self.fstart = self.q
        if self.depth > 0:
            self._issue_upto(self._horizon(self.q))

    def _pre(self, gi: int, module, args) -> None:
        if self.learning:
            self.observed.append(gi)
        q = self.q
        if not self.sync and q - self.fstart < self.n and self.schedule[q % self.n] == gi:
            self._issue_upto(self._horizon(q))
            s = q % self.nslots
            if self.bound[gi] != s:
                self._bind(gi, s)
            if not self.skip_wait:
                t0 = time.perf_counter()
                self.transfer.wait(self.tickets[s])
                self.wait_seconds += time.perf_counter() - t0
            self.q = q + 1
        else:
            self._load_now(gi)
        for fn in self.on_arrive:
            fn(gi)

    def _load_now(self, gi: int) -> None:
        """Out of order (or dynamic): drain the ring, load this block synchronously."""
        if not self.sync:
            self.drain()
            self.sync = True
        if self.bound[gi] != 0:
            self._bind(gi, 0)
        ticket = self.target.copy(self.dst[0][gi], self.src[0][gi], self.reads[gi],
                                  self.transfer.compute_mark())
        self.transfer.wait(ticket)

    def _adopt(self, observed: List[int]) -> bool:
        """Take the order seen in the first forward; True when the schedule changed."""
        if not observed or observed == self.schedule:
            return False
        if len(set(observed)) != len(observed):
            self.dynamic = True
            warnings.warn("a streamed block runs more than once per forward; streaming "
                          "falls back to synchronous loads for this module",
                          RuntimeWarning, stacklevel=2)
            return True
        called = set(observed)
        # blocks never called stay at the end of the schedule and are never loaded
        self.schedule = list(observed) + [gi for gi in range(self.n) if gi not in called]
        self.n = len(observed)
        self.lookahead = min(self.lookahead, self.n - 1)
        return True

    def drain(self) -> None:
        self.transfer.drain()

    @property
    def streamed_bytes(self) -> int:
        return sum(self.groups[gi].nbytes for gi in self.schedule[:self.n])

    @property
    def ahead_bytes(self) -> int:
        """Bytes already copied (or in flight) for blocks not consumed yet."""
        return sum(self.groups[self.schedule[j % self.n]].nbytes
                   for j in range(self.q, self.issued))
