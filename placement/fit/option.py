"""One evaluated placement of one component: the common core every kind fills in.

An `Option` says where the weights rest (`persist` per GPU for the session,
`host_persist` in host RAM), what it needs while its phase runs (`use` per GPU,
`host_use`), and what it costs (`cost` = runs x forward + load, in seconds). What only
one kind of placement has (a stream's resident prefix, a split's ranges, a batch's
shares, a VAE's tile) is that kind's `detail` (kinds/*.py). The search compares cores
and never looks inside a detail.

The time helpers below are the streaming arithmetic every streaming kind shares.
"""
from typing import Optional

from ..layout import ring_schedule
from .costs import STREAM_BLOCK_OVERHEAD_S, STREAM_OVERLAP
from .geometry import Geometry

PHASE_ORDER = ("encode", "sample", "decode", "upscale")


class Option:
    """The core of one placement (immutable once built). By the question they answer:

    what and when  comp, kind (its kinds/ module's Kind), phase, runs (forwards per
                   generation)
    where          runtime (devices computing), source (where the weights rest: a GPU,
                   cpu or disk), detail (the kind's own layout)
    memory         persist {gpu: bytes for the session}, use {gpu: bytes while its phase
                   runs}, host_persist / host_use (host RAM, same two meanings),
                   resident_bytes, streamed_bytes (per forward), loaded_bytes (per
                   generation)
    time           compute_s, transfer_s, forward_s (one forward), load_s (once per
                   generation), hops, cost = runs x forward_s + load_s
    """
    __slots__ = ("comp", "kind", "phase", "runs", "runtime", "source", "detail",
                 "persist", "use", "host_persist", "host_use",
                 "resident_bytes", "streamed_bytes", "loaded_bytes",
                 "compute_s", "transfer_s", "forward_s", "load_s", "hops", "cost")

    def __init__(self, comp, kind, runtime, runs, phase, source, detail=None):
        self.comp, self.kind, self.runtime, self.runs, self.phase = comp, kind, runtime, runs, phase
        self.source, self.detail = source, detail
        self.persist, self.use = {}, {}
        self.host_persist = self.host_use = 0
        self.resident_bytes = self.streamed_bytes = self.loaded_bytes = self.hops = 0
        self.compute_s = self.transfer_s = self.forward_s = self.load_s = 0.0

    def priced(self) -> "Option":
        self.cost = self.runs * self.forward_s + self.load_s
        return self

    @property
    def persistent(self) -> bool:
        return bool(self.persist)

    @property
    def parallel(self) -> str:
        return self.kind.parallel

    def __repr__(self) -> str:
        return (f"Option({self.comp} {self.kind.name} on {'&'.join(self.runtime)}, "
                f"source {self.source}, cost {self.cost:.4g} s)")


def streamed_forward(compute: float, transfer: float, depth: int, streamed_blocks: int,
                     stall: float = 0.0) -> float:
    """Seconds of one streamed forward: copies overlap compute when prefetching.
    `stall`: what the ring's schedule loses beyond max(compute, transfer) at this depth
    (ring_stall: transfer-heavy blocks in a row outrunning a shallow ring)."""
    if depth > 0:
        t = max(compute, transfer) + (1 - STREAM_OVERLAP) * min(compute, transfer) + stall
    else:
        t = compute + transfer
    return t + streamed_blocks * STREAM_BLOCK_OVERHEAD_S


def block_seconds(geo: Geometry, compute: float, k: int, bandwidth: float, lo: int = 0,
                  hi: Optional[int] = None):
    """Per streamed block (k..hi) its compute and transfer seconds and its size, and the
    lead: the resident blocks' (lo..k) compute, which runs before the first streamed
    block of each forward while the copies issued ahead keep going. `compute` is the
    whole component's on this device; the blocks' compute is their byte share of it
    (non-block weights are mostly embeddings and norms: no block's time), split by
    layout.compute_fractions."""
    hi = geo.n if hi is None else hi
    sizes = geo.sizes[k:hi]
    blocks = compute * geo.prefix[geo.n] / max(1, geo.total)
    shares = geo.compute_fractions
    comp = [blocks * w for w in shares[k:hi]]
    lead = blocks * sum(shares[lo:k])
    return comp, [n / bandwidth for n in sizes], sizes, lead


def ring_stall(geo: Geometry, compute: float, k: int, bandwidth: float, depth: int,
               lo: int = 0, hi: Optional[int] = None) -> float:
    """Seconds per forward the ring at `depth` loses beyond max(compute, transfer) when
    blocks k..hi stream (lo..k resident before them)."""
    hi = geo.n if hi is None else hi
    if depth <= 0 or hi - k < 2 or bandwidth <= 0:
        return 0.0
    key = (compute, k, bandwidth, depth, lo, hi)
    stall = geo.stalls.get(key)
    if stall is None:
        comp, trans, sizes, lead = block_seconds(geo, compute, k, bandwidth, lo, hi)
        stall = geo.stalls[key] = ring_schedule(comp, trans, sizes, depth, lead)[1]
    return stall


__all__ = ["Option", "PHASE_ORDER", "streamed_forward", "block_seconds", "ring_stall"]
