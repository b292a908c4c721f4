"""Byte geometry of one component: what a placement of it holds on each device.

A component is `non_block_bytes` (embeddings, final layers: always with the main
device) plus blocks in execution order. Streaming keeps a resident prefix of K blocks
and cycles the rest through a ring of `layout.ring_bytes(streamed sizes, depth)` bytes
(the ring of runtime/stream.py; the arithmetic is placement/layout.py's, shared with
the runtime, so what is predicted here is what the runtime allocates).
"""
from bisect import bisect_left, bisect_right
from typing import Dict, List, Optional, Sequence, Tuple

from .fit_costs import FIXED_RESERVES
from .layout import ring_bytes
from .units import MiB


def headroom_of(info) -> int:
    """Compute working memory: the metadata's estimate, else seed 003's fixed reserve."""
    if info.headroom_bytes is not None:
        return max(0, int(info.headroom_bytes))
    return FIXED_RESERVES.get(info.component, 512 * MiB)


class Geometry:
    """Prefix sums and stream footprints of one component, computed once per fit."""
    __slots__ = ("info", "comp", "total", "non_block", "sizes", "prefix", "n", "headroom",
                 "_sufmax", "_need", "_rings")

    def __init__(self, info, headroom: Optional[int] = None):
        self.info = info
        self.comp = info.component
        self.sizes = [max(0, int(b.nbytes)) for b in info.blocks]
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
        self._need: Dict[int, Tuple[List[int], List[int]]] = {}
        self._rings: Dict[Tuple[int, int, int], int] = {}

    @property
    def largest_block(self) -> int:
        return self._sufmax[0]

    def window(self, k: int, depth: int) -> int:
        """Bytes of the ring when blocks k.. are streamed with `depth` in flight."""
        return self.range_window(k, self.n, depth)

    def stream_weights(self, k: int, depth: int) -> int:
        """Weight bytes on the device while streaming with prefix k: resident + slots."""
        return self.non_block + self.prefix[k] + self.window(k, depth)

    def best_prefix(self, room: int, depth: int) -> Optional[int]:
        """Largest K < n whose stream footprint (weights, no headroom) fits `room`;
        None when not even K = 0 fits. O(log n) after a one-off table per depth."""
        table = self._need.get(depth)
        if table is None:
            need = [self.stream_weights(k, depth) for k in range(self.n)]
            rmin = need[:]
            for k in range(self.n - 2, -1, -1):
                rmin[k] = min(rmin[k], rmin[k + 1])
            table = self._need[depth] = (need, rmin)
        rmin = table[1]
        k = bisect_right(rmin, room) - 1
        return k if k >= 0 else None

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
        of the range fit `room` (layout.resident_prefix, with the rings cached)."""
        prefix = self.prefix
        if prefix[end] - prefix[start] <= room:
            return end - start
        for k in range(end - start - 1, -1, -1):      # blocks start+k..end-1 streamed
            if prefix[start + k] - prefix[start] + self.range_window(start + k, end,
                                                                      depth) <= room:
                return k
        return None

    def streamed_bytes(self, k: int) -> int:
        return self.prefix[self.n] - self.prefix[k]


def layer_ranges(geo: Geometry, caps: Sequence[int]) -> Optional[List[Tuple[int, int]]]:
    """Contiguous block ranges, one per device in order (index 0 is the main device and
    also holds the non-block weights), each device's weights within its cap (bytes for
    weights, headroom already taken off). Targets are proportional to the caps, so every
    device fills to the same fraction; cuts move only as far as the caps force them.
    Returns [(start, end_exclusive)] or None when no contiguous split fits.
    (stable-diffusion.cpp's docs say proportional but its code fills device 0 first.)"""
    n, prefix, k = geo.n, geo.prefix, len(caps)
    caps = list(caps)
    caps[0] -= geo.non_block
    if n == 0 or k == 0 or caps[0] < 0:
        return None
    total_caps = sum(max(0, c) for c in caps) + geo.non_block
    if prefix[n] + geo.non_block > total_caps:
        return None
    # lo[i]: the smallest block index where devices i.. can take all the rest (greedy
    # from the back fills each as far as it goes, which maximises what fits behind).
    lo = [n] * (k + 1)
    for i in range(k - 1, -1, -1):
        start = lo[i + 1]
        # the smallest s with prefix[start] - prefix[s] <= caps[i]
        lo[i] = bisect_left(prefix, prefix[start] - max(0, caps[i]), 0, start + 1)
    if lo[0] > 0:
        return None
    fill = (prefix[n] + geo.non_block) / float(total_caps) if total_caps else 0.0
    out, start, target = [], 0, -geo.non_block
    for i in range(k):
        target += max(0, caps[i] if i else caps[0] + geo.non_block) * fill
        if i == k - 1:
            end = n
        else:
            hi = bisect_right(prefix, prefix[start] + max(0, caps[i]), start, n + 1) - 1
            low = max(lo[i + 1], start)
            if low > hi:
                return None
            end = _nearest(prefix, target, low, hi)
        out.append((start, end))
        start = end
    return out


def stream_spans(geo: Geometry, caps: Sequence[int], streaming: int
                 ) -> Optional[List[Tuple[int, int]]]:
    """Contiguous ranges for a layer split that streams: the first k - `streaming`
    devices take as many blocks as their caps hold (the first also the non-block
    weights) and stay fully resident; the rest of the blocks go to the last `streaming`
    devices in proportion to their caps, each to stream the tail of its range. Every
    device gets at least one block. streaming = k: all in proportion; 1: fill then
    stream on the last (accelerate's layout, with a prefetch ring)."""
    n, k = geo.n, len(caps)
    if k < 2 or n < k or not 1 <= streaming <= k or min(caps) <= 0:
        return None
    prefix = geo.prefix
    out, start = [], 0
    for i in range(k - streaming):
        room = caps[i] - (geo.non_block if i == 0 else 0)
        end = bisect_right(prefix, prefix[start] + room, start, n) - 1
        end = min(end, n - (k - 1 - i))           # leave a block for each device after
        if end <= start:
            return None
        out.append((start, end))
        start = end
    tail = caps[k - streaming:]
    first = k - streaming
    whole = prefix[n] - prefix[start] + (geo.non_block if first == 0 else 0)
    acc = prefix[start] - (geo.non_block if first == 0 else 0)
    total_caps = float(sum(tail))
    for j, cap in enumerate(tail):
        i = first + j
        acc += whole * cap / total_caps
        end = n if i == k - 1 else _nearest(prefix, acc, start + 1, n - (k - 1 - i))
        out.append((start, end))
        start = end
    return out


def remote_tail_spans(geo: Geometry, remote_caps: Sequence[int]
                      ) -> Optional[List[Tuple[int, int]]]:
    """A local main device that streams beside worker devices that hold their ranges
    (runtime/distributed/planned.py: a worker reads its range once, it never streams):
    the workers take the last blocks, the last worker as many as its cap holds from the
    end, the one before it the blocks before those, and so on; the main device (first)
    keeps the rest and the non-block weights. Spans in the order main, workers...; None
    when a worker's cap holds no block or nothing is left for the main device."""
    prefix, end = geo.prefix, geo.n
    tails: List[Tuple[int, int]] = []
    for cap in reversed(list(remote_caps)):
        start = bisect_left(prefix, prefix[end] - cap, 0, end)
        start = max(start, 1)                     # leave a block for the main device
        if start >= end or prefix[end] - prefix[start] > cap:
            return None
        tails.append((start, end))
        end = start
    return [(0, end)] + tails[::-1]


def _nearest(prefix, target, low, high) -> int:
    j = bisect_left(prefix, target, low, high + 1)
    best = min((c for c in (j - 1, j) if low <= c <= high),
               key=lambda c: (abs(prefix[c] - target), c), default=min(max(j, low), high))
    return best


def row_shares(geo: Geometry, caps: Sequence[int]) -> Optional[List[int]]:
    """Row split: every block's matrices sliced across the devices in proportion to
    their caps (the main device also keeps the non-block weights). Returns the block
    bytes per device or None when the caps cannot hold them."""
    free = [max(0, c) for c in caps]
    free[0] -= geo.non_block
    if free[0] < 0:
        return None
    blocks = geo.prefix[geo.n]
    room = sum(free)
    if room <= 0 or blocks > room:
        return None
    shares = [blocks * f // room for f in free]
    shares[0] += blocks - sum(shares)           # rounding remainder to the main device
    if shares[0] > free[0]:
        return None
    return shares
