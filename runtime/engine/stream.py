"""Block streaming: a byte ring on the device, as many blocks in flight as fit in it.

This is where a streamed block arrives: `Streamer.arrive` (called when execution enters
the block, whatever runs it: runtime/blocks/entry.py) waits for its copy, binds its tensors and
calls the `on_arrive` seam (LoRA patches, GGUF dequantization hang there; `region(gi)` is
the block's bytes in the ring).

Streamed blocks are consumed in a sequence that runs on across forwards (sampling
steps run the same blocks again): the j-th block consumed is schedule[j % n]. The ring
is one device buffer of `placement.layout.ring_bytes(sizes, depth)` bytes (what the
planner predicted); every block has its own offset in it (`ring_layout`), fixed for a
given order, so a block's tensors are bound (`.data`) to views of the ring once. When
block j starts, the copies of the blocks after it are issued as far as the ring has
room beside the blocks not consumed yet (`ahead`), each ordered after the compute
that read the bytes it overwrites (a compute mark), and the copy engine keeps working
across the step boundary instead of idling while the last blocks compute.

The schedule starts as the structural order. The first forward records the real
order and does not run ahead past its end; a block arriving out of order drains the
ring and the rest of that forward loads synchronously at offset 0 (still correct).
The observed order is then adopted and the ring laid out again. A forward that stops
midway (error, interrupt) is detected at the next one, which starts from a drained,
clean ring. Loading synchronously after that first forward (a block run twice per
forward, a later forward in another order) is a runtime fallback (fallbacks.py), said
once per placement.

What moved is counted as it arrives (`arrived_bytes`, `arrived_disk_bytes`): a block
that never runs moves nothing and counts nothing.
"""
import time
from typing import Callable, List, Optional, Sequence

import torch

from ...placement.layout import ring_bytes, ring_layout
from ..device.transfer import ALREADY_DONE
from ..host.residency import Group, rebind
from .fallbacks import Fallbacks


class Source:
    """Where a streamed group's bytes come from: a host buffer, or a file read."""
    __slots__ = ("host", "read")

    def __init__(self, host: Optional[torch.Tensor] = None,
                 read: Optional[Callable[[torch.Tensor], None]] = None):
        self.host = host
        self.read = read


class Streamer:
    def __init__(self, target, groups: Sequence[Group], sources: Sequence[Source], depth: int,
                 staging: Optional[Callable] = None, fallbacks: Optional[Fallbacks] = None):
        """`staging(nbytes)` allocates a host staging buffer (disk sources only);
        `fallbacks`: the placement's record of runtime fallbacks (its own if none)."""
        self.target = target
        self.transfer = target.transfer
        self.groups = list(groups)
        self.sources = list(sources)
        self.reads = [s.read for s in self.sources]
        self.sizes = [g.nbytes for g in self.groups]
        self.depth = depth
        self.n = n = len(self.groups)
        self.ring_bytes = ring_bytes(self.sizes, depth)
        self.ring: Optional[torch.Tensor] = None
        self.staging: Optional[torch.Tensor] = None
        self._make_staging = staging
        self.on_arrive: List[Callable[[int], None]] = []    # per-block arrival seam: (gi)
        self._views = {}
        self.skip_wait = False          # tests only: proves the race tests can fail
        self.wait_seconds = 0.0         # compute blocked on copies (overlap diagnostics)
        self.schedule = list(range(n))
        self.learning = True
        self.observed: List[int] = []
        self.dynamic = False            # a block runs twice per forward: always synchronous
        self.fallbacks = fallbacks if fallbacks is not None else Fallbacks(None)
        self.arrived_bytes = 0          # bytes of the blocks that arrived, all forwards
        self.arrived_disk_bytes = 0     # those read from the weights file
        self._lay_out()
        self._reset()

    @property
    def allocated(self) -> bool:
        return self.ring is not None

    # -- memory ----------------------------------------------------------------------
    def allocate(self) -> None:
        self.ring = self.target.alloc(self.ring_bytes, "slots", "stream ring")
        needs_staging = any(r is not None for r in self.reads) and \
            not self.transfer.reads_into_dst
        if needs_staging:
            try:
                self.staging = self._make_staging(self.ring_bytes)
            except BaseException:
                self.ring = None
                self.target.free(self.ring_bytes, "slots")
                raise
        self._endpoints()
        self._reset()

    def _endpoints(self) -> None:
        """Copy endpoints per group at its ring offset and at offset 0 (synchronous
        loads), so issuing a copy is list lookups."""
        if self.ring is None:
            return
        ring, staging = self.ring, self.staging
        host = staging if staging is not None else ring     # disk reads land here

        def ends(gi, off):
            nb = self.sizes[gi]
            src = self.sources[gi].host if self.reads[gi] is None else host[off:off + nb]
            return ring[off:off + nb], src
        self.ends = [ends(gi, self.offset[gi]) for gi in range(len(self.groups))]
        self.ends0 = [ends(gi, 0) for gi in range(len(self.groups))]

    def _lay_out(self) -> None:
        """Offsets of the blocks in the ring and how far ahead copies may run, for the
        current schedule (the first n entries run; the rest never do)."""
        order = self.schedule[:self.n]
        lay = ring_layout([self.sizes[gi] for gi in order], self.ring_bytes,
                          self.depth if self.n > 1 else 0)
        self.offset = [0] * len(self.groups)
        for p, gi in enumerate(order):
            self.offset[gi] = lay.offsets[p]
        self.ahead = lay.ahead
        self._endpoints()

    def free(self) -> None:
        try:
            self.drain()                # a failed copy surfaces here, after the frees
        finally:
            if self.ring is not None:
                self.target.free(self.ring_bytes, "slots")
            self.ring = self.staging = None
            self.ends = self.ends0 = []
            self._views = {}
            self._reset()               # nothing is in flight or bound any more

    def _bind(self, gi: int, off: int) -> None:
        views = self._views.get((gi, off))
        if views is None:               # made once per (block, offset), reused every step
            g = self.groups[gi]
            views = self._views[(gi, off)] = g.views(self.ring[off:off + g.nbytes])
        for t, v in zip(self.groups[gi].tensors, views):
            rebind(t, v)
        self.bound[gi] = off

    def region(self, gi: int) -> torch.Tensor:
        """Block gi's bytes in the ring where it arrived (for an on_arrive callback)."""
        off = self.bound[gi]
        return self.ring[off:off + self.sizes[gi]]

    # -- the ring ----------------------------------------------------------------------
    def _reset(self) -> None:
        self.q = 0                      # global index of the next block to consume
        self.issued = 0                 # global indices [0, issued) have copies submitted
        self.fstart = 0                 # global index where this forward began
        self.tickets = [None] * max(self.n, 1)      # by position in the schedule
        self.bound = [-1] * len(self.groups)   # ring offset each group's tensors point at
        self.sync = self.dynamic

    def _issue_upto(self, last: int) -> None:
        j = self.issued
        if j > last:
            return
        n, sched, ends, reads, tickets = self.n, self.schedule, self.ends, self.reads, \
            self.tickets
        transfer, ledger = self.transfer, self.target.ledger
        mark = transfer.compute_mark()
        while j <= last:                # Target.copy, inlined: this runs once per block
            p = j % n
            gi = sched[p]
            dst, src = ends[gi]
            ledger.h2d_bytes += self.sizes[gi]
            ledger.h2d_copies += 1
            tickets[p] = transfer.submit(dst, src, reads[gi], mark)
            j += 1
        self.issued = j

    def _horizon(self, q: int) -> int:
        """Last global index that may be in flight when block q is next."""
        last = q + self.ahead[q % self.n]
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
        if self.n and not self.sync:
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
        self._issue_upto(self._horizon(self.q))

    def arrive(self, gi: int) -> None:
        """Block gi is entered: wait for its copy (issuing the next ones), bind it."""
        if self.learning:
            self.observed.append(gi)
        self.arrived_bytes += self.sizes[gi]
        if self.reads[gi] is not None:
            self.arrived_disk_bytes += self.sizes[gi]
        q = self.q
        n = self.n
        if not self.sync and q - self.fstart < n and self.schedule[q % n] == gi:
            p = q % n
            last = q + self.ahead[p]
            if self.issued <= last:
                self._issue_upto(min(last, self.fstart + n - 1) if self.learning else last)
            ticket = self.tickets[p]
            off = self.offset[gi]
            if self.bound[gi] != off:
                self._bind(gi, off)
            # a copy carried out when submitted (the host's own link) has nothing to wait
            # for; anything else (a worker's, a CUDA event, an error) goes through wait
            if ticket.done is not ALREADY_DONE or ticket.error is not None \
                    or ticket.event is not None:
                if not self.skip_wait:
                    t0 = time.perf_counter()
                    self.transfer.wait(ticket)
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
            if not self.learning:       # the first forward only learns the order
                self.fallbacks.add(
                    "synchronous_streaming", self._planned_text(), "synchronous loads",
                    f"{self.groups[gi].name} arrived out of the order the first forward "
                    f"ran; the rest of that forward loaded its blocks one by one",
                    stacklevel=4, device=self.target.name, blocks=[self.groups[gi].name])
        if self.bound[gi] != 0:
            self._bind(gi, 0)
        dst, src = self.ends0[gi]
        ticket = self.target.copy(dst, src, self.reads[gi], self.transfer.compute_mark())
        self.transfer.wait(ticket)

    def _adopt(self, observed: List[int]) -> bool:
        """Take the order seen in the first forward; True when the schedule changed."""
        if not observed or observed == self.schedule:
            return False
        if len(set(observed)) != len(observed):
            self.dynamic = True
            twice = sorted({gi for gi in observed if observed.count(gi) > 1})
            self.fallbacks.add(
                "synchronous_streaming", self._planned_text(), "synchronous loads",
                "a streamed block runs more than once per forward, so no order can be "
                "prefetched; every block is loaded when it is entered",
                stacklevel=4, device=self.target.name,
                blocks=[self.groups[gi].name for gi in twice])
            return True
        called = set(observed)
        # blocks never called stay at the end of the schedule and are never loaded
        self.schedule = list(observed) + [gi for gi in range(self.n) if gi not in called]
        self.n = len(observed)
        self._lay_out()                 # same ring bytes, offsets for the real order
        return True

    def _planned_text(self) -> str:
        return f"prefetch {self.depth} block{'s' if self.depth != 1 else ''} ahead in the ring"

    def drain(self) -> None:
        self.transfer.drain()

    @property
    def streamed_bytes(self) -> int:
        return sum(self.sizes[gi] for gi in self.schedule[:self.n])

    @property
    def ahead_bytes(self) -> int:
        """Bytes already copied (or in flight) for blocks not consumed yet."""
        return sum(self.sizes[self.schedule[j % self.n]] for j in range(self.q, self.issued))
