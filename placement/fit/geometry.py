"""Byte geometry of one component: what a placement of it holds on each device.

A component is `non_block_bytes` (embeddings, final layers: always with the main
device) plus blocks in execution order. Streaming keeps a resident prefix of K blocks
and cycles the rest through a ring of `layout.ring_bytes(streamed sizes, depth)` bytes
(the ring of runtime/engine/stream.py; the arithmetic is placement/layout.py's, shared with
the runtime, so what is predicted here is what the runtime allocates). Each kind of
placement (kinds/) lays its blocks out from these sums.
"""
from bisect import bisect_left, bisect_right
from collections import OrderedDict
from functools import lru_cache
from typing import List, Optional, Tuple

from ..layout import compute_fractions, ring_bytes, ring_suffix_bytes
from ..units import MiB
from .costs import FIXED_RESERVES


def headroom_of(info) -> int:
    """Compute working memory: the metadata's estimate, else seed 003's fixed reserve."""
    if info.headroom_bytes is not None:
        return max(0, int(info.headroom_bytes))
    return FIXED_RESERVES.get(info.component, 512 * MiB)


class Geometry:
    """Prefix sums and stream footprints of one component, computed once per fit."""
    __slots__ = ("info", "comp", "total", "non_block", "sizes", "key", "prefix", "n",
                 "headroom", "compute_fractions", "_sufmax", "_need", "_rings", "stalls")

    def __init__(self, info, headroom: Optional[int] = None):
        self.info = info
        self.comp = info.component
        self.sizes = [max(0, int(b.nbytes)) for b in info.blocks]
        self.key = tuple(self.sizes)
        self.n = len(self.sizes)
        prefix = [0]
        for s in self.sizes:
            prefix.append(prefix[-1] + s)
        self.prefix = prefix
        # blocks may (wrongly) claim more than the total; never let non-block go negative
        self.total = max(int(info.total_bytes), prefix[-1])
        self.non_block = self.total - prefix[-1]
        self.headroom = headroom_of(info) if headroom is None else int(headroom)
        sufmax = [0] * (self.n + 1)
        for k in range(self.n - 1, -1, -1):
            sufmax[k] = max(self.sizes[k], sufmax[k + 1])
        self._sufmax = sufmax
        self.compute_fractions = compute_fractions(info)     # each block's share of the compute
        # stream footprints per depth, ring bytes per (start, end, depth), and
        # ring_stall's answers (option.py): the search prices one range at one depth on
        # one kind of link many times over (each phase, each room it tries), and a
        # session plans one model set again and again
        self._need, self._rings, self.stalls = model_tables(
            self.key, self.non_block, tuple(self.compute_fractions))

    @property
    def largest_block(self) -> int:
        return self._sufmax[0]

    def window(self, k: int, depth: int) -> int:
        """Bytes of the ring when blocks k.. are streamed with `depth` in flight."""
        return self._table(depth)[0][k]

    def stream_weights(self, k: int, depth: int) -> int:
        """Weight bytes on the device while streaming with prefix k: resident + slots."""
        return self.non_block + self.prefix[k] + self._table(depth)[0][k]

    def best_prefix(self, room: int, depth: int) -> Optional[int]:
        """Largest K < n whose stream footprint (weights, no headroom) fits `room`;
        None when not even K = 0 fits. O(log n) after a one-off table per depth."""
        k = bisect_right(self._table(depth)[1], room) - 1
        return k if k >= 0 else None

    def _table(self, depth: int) -> Tuple[Tuple[int, ...], List[int]]:
        """(ring bytes of every suffix, the smallest stream footprint from each prefix
        on) at `depth`."""
        table = self._need.get(depth)
        if table is None:
            rings = suffix_rings(self.key, depth)
            rmin = [self.non_block + self.prefix[k] + rings[k] for k in range(self.n)]
            for k in range(self.n - 2, -1, -1):
                rmin[k] = min(rmin[k], rmin[k + 1])
            table = self._need[depth] = (rings, rmin)
        return table

    def range_window(self, start: int, end: int, depth: int) -> int:
        """Ring bytes when blocks start..end-1 are streamed."""
        if end - start <= 0:
            return 0
        key = (start, end, depth)
        got = self._rings.get(key)
        if got is None:
            got = self._rings[key] = ring_bytes(self.sizes[start:end], depth)
        return got

    def range_prefix(self, start: int, end: int, room: int, depth: int) -> Optional[int]:
        """Largest k such that blocks start..start+k-1 resident plus the ring for the rest
        of the range fit `room` (layout.resident_prefix, with the rings cached).

        Found by bisection: keeping one more block resident never lowers the footprint
        (the block's bytes join the prefix, and the ring loses at most that block: a
        window that held it, without it, lies inside a window of the blocks left), so the
        footprint rises with k and the largest k that fits is where it first does not."""
        prefix = self.prefix
        if prefix[end] - prefix[start] <= room:
            return end - start
        if not self.range_fits(start, end, room, depth):  # not even all streamed fits
            return None
        window, base = self.range_window, prefix[start]
        lo, hi = 0, end - start - 1                     # lo fits; the largest that fits
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if prefix[start + mid] - base + window(start + mid, end, depth) <= room:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def range_fits(self, start: int, end: int, room: int, depth: int) -> bool:
        """Whether blocks start..end-1 fit `room` at all: whole, or all streamed through
        the ring (range_prefix is then not None)."""
        return (self.prefix[end] - self.prefix[start] <= room
                or self.range_window(start, end, depth) <= room)

    def streamed_bytes(self, k: int) -> int:
        return self.prefix[self.n] - self.prefix[k]


_GEOMETRIES: "OrderedDict[tuple, Geometry]" = OrderedDict()


def geometry_of(info, headroom: Optional[int] = None) -> Geometry:
    """The Geometry of `info` with `headroom`, kept for the same ComponentInfo object (a
    session describes a file once, from its header cache, and plans it again and again);
    another object, even an equal one, gets its own."""
    key = (id(info), headroom)
    geo = _GEOMETRIES.get(key)
    if geo is None or geo.info is not info:
        geo = _GEOMETRIES[key] = Geometry(info, headroom)
        while len(_GEOMETRIES) > 64:
            _GEOMETRIES.popitem(last=False)
    return geo


@lru_cache(maxsize=64)
def model_tables(sizes: Tuple[int, ...], non_block: int, shares: Tuple[float, ...]
                 ) -> Tuple[dict, dict, dict]:
    """The footprint, ring-bytes and ring-stall tables of one model (its block sizes,
    non-block bytes and compute shares), shared by every plan of it in this process, as
    suffix_rings is: pure functions of those figures and of the keys they are asked
    with."""
    return {}, {}, {}


@lru_cache(maxsize=1024)
def suffix_rings(sizes: Tuple[int, ...], depth: int) -> Tuple[int, ...]:
    """ring_bytes of every suffix of `sizes` (and 0 for the empty one): a pure function
    of the block sizes, so a model planned again (another budget, another request)
    reuses it."""
    return tuple(ring_suffix_bytes(sizes, depth))


def nearest(prefix, target, low, high) -> int:
    """The cut in low..high whose prefix bytes are nearest `target` (ties: the lower)."""
    j = bisect_left(prefix, target, low, high + 1)
    best = best_gap = None
    for c in (j - 1, j):                       # the lower first: a tie keeps it
        if low <= c <= high:
            gap = abs(prefix[c] - target)
            if best is None or gap < best_gap:
                best, best_gap = c, gap
    return min(max(j, low), high) if best is None else best


def stream_prefix(info, budget_bytes: int, depth: int) -> Tuple[int, int, int]:
    """The largest resident prefix K for streaming `info` on a device with `budget_bytes`:
    K blocks + non-block weights + the prefetch ring (min(depth, streamed-1)+1 slots of
    the largest streamed block) + working memory must fit. Returns (K, streamed bytes
    per forward, resident bytes). K is 0 when not even the ring fits: the caller's
    accounting then reports the overrun (explicit placements are not second-guessed)."""
    geo = Geometry(info)
    if geo.n == 0:
        return 0, 0, geo.total
    k = geo.best_prefix(int(budget_bytes) - geo.headroom, max(0, int(depth))) or 0
    return k, geo.streamed_bytes(k), geo.non_block + geo.prefix[k]
