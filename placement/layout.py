"""Block layout: how a component's tensors group into blocks, and the byte geometry of
the streaming ring. The one place for this arithmetic: the runtimes (runtime/stream.py,
runtime/split/layer.py, runtime/place.py), the planner's shapes (placement/fit_shapes.py)
and the ComfyUI shares (runtime/comfy/shares.py) all read it, so the bytes the planner
predicts are the bytes the runtime allocates. Pure Python (no torch): the planner
imports it.

The ring. Streamed blocks run in a fixed cyclic order (one forward, then the next
forward again). The ring is one device buffer of `ring_bytes(sizes, depth)` bytes: the
most bytes any `min(depth, m - 1) + 1` consecutive streamed blocks take (the order
wraps from the last block to the first, since sampling steps run the blocks again).
Every streamed block has its own offset in it (`ring_layout`), so a run of small
blocks holds more blocks ahead than a run of large ones: the budget is bytes, not
slots of the largest block. While block p computes, the blocks p+1 .. p+ahead[p] may
be in flight: as many as fit beside the blocks not consumed yet.
"""
from typing import Dict, Hashable, Iterable, List, Optional, Sequence, Tuple


# -- grouping -----------------------------------------------------------------------------
def group_blocks(block_members: Sequence[Iterable[Hashable]], ids: Iterable[Hashable]
                 ) -> Tuple[List[List[Hashable]], List[Hashable]]:
    """Split tensor ids into one list per block (in `ids` order) and the non-block rest.
    `block_members[b]` are the ids block b holds; an id held by two blocks (a shared
    tensor) is non-block, so it stays resident. A block left with no ids of its own
    gets an empty list: callers drop it (nothing to stream)."""
    owner: Dict[Hashable, int] = {}
    for b, members in enumerate(block_members):
        for i in members:
            owner[i] = b if owner.get(i, b) == b else -1
    per_block: List[List[Hashable]] = [[] for _ in block_members]
    rest: List[Hashable] = []
    for i in ids:
        b = owner.get(i, -1)
        (per_block[b] if b >= 0 else rest).append(i)
    return per_block, rest


# -- the ring -----------------------------------------------------------------------------
def ring_span(streamed: int, depth: int) -> int:
    """Consecutive blocks the ring must hold at once: the one computing + `depth` ahead."""
    return min(max(0, depth), streamed - 1) + 1 if streamed > 0 else 0


def ring_bytes(sizes: Sequence[int], depth: int) -> int:
    """Bytes of the ring for streamed blocks of `sizes` (execution order) at `depth`:
    the largest sum of `ring_span` cyclically consecutive sizes."""
    m = len(sizes)
    w = ring_span(m, depth)
    if w == 0:
        return 0
    if w == m:
        return sum(sizes)
    run = sum(sizes[:w])
    best = run
    for p in range(1, m):                     # window p .. p+w-1 (cyclic)
        run += sizes[(p + w - 1) % m] - sizes[p - 1]
        if run > best:
            best = run
    return best


def ring_suffix_bytes(sizes: Sequence[int], depth: int) -> List[int]:
    """ring_bytes(sizes[k:], depth) for every k in 0..len(sizes) (the planner's table)."""
    return [ring_bytes(sizes[k:], depth) for k in range(len(sizes))] + [0]


def resident_prefix(sizes: Sequence[int], room: int, depth: int) -> Optional[int]:
    """Largest k such that blocks [:k] resident plus the ring for blocks [k:] fit `room`
    (all resident when everything fits). None: not even an all-streamed ring fits."""
    held = sum(sizes)
    for k in range(len(sizes), -1, -1):
        if held + ring_bytes(sizes[k:], depth) <= room:
            return k
        if k:
            held -= sizes[k - 1]
    return None


class RingLayout:
    """Where each streamed block lives in the ring, and how far ahead copies may run.
    `offsets[p]`, `sizes[p]`, `ahead[p]` are by position p in the cyclic order."""
    __slots__ = ("ring", "offsets", "sizes", "ahead")

    def __init__(self, ring: int, offsets: List[int], sizes: List[int], ahead: List[int]):
        self.ring, self.offsets, self.sizes, self.ahead = ring, offsets, sizes, ahead


def ring_layout(sizes: Sequence[int], ring: int, depth: int) -> RingLayout:
    """Offsets of the blocks in a ring of `ring` bytes, one after the other, wrapping to
    0 where the next block does not fit before the end. The cycle repeats every forward,
    so the position that starts at offset 0 is chosen (of up to 64 tried) to leave the
    most blocks in flight at the worst position, then in total. depth 0: synchronous,
    nothing ahead."""
    sizes = [int(s) for s in sizes]
    m = len(sizes)
    if m == 0:
        return RingLayout(ring, [], [], [])
    if max(sizes) > ring:
        raise ValueError(f"ring of {ring} bytes is smaller than a block of {max(sizes)}")
    if depth <= 0:
        return RingLayout(ring, [0] * m, sizes, [0] * m)
    best = None
    step = max(1, m // 64)
    for start in range(0, m, step):
        offsets = [0] * m
        off = 0
        for i in range(m):
            p = (start + i) % m
            if off + sizes[p] > ring:
                off = 0
            offsets[p] = off
            off += sizes[p]
        ahead = _ahead(sizes, offsets)
        score = (min(ahead), sum(ahead))
        if best is None or score > best[0]:
            best = (score, offsets, ahead)
            if score[0] == m - 1:
                break
    return RingLayout(ring, best[1], sizes, best[2])


def _ahead(sizes: List[int], offsets: List[int]) -> List[int]:
    """Per position p: how many of the next blocks (cyclic, fewer than m) have regions
    disjoint from p's and from each other's."""
    m = len(sizes)
    out = []
    for p in range(m):
        live = [(offsets[p], offsets[p] + sizes[p])]
        a = 0
        while a < m - 1:
            j = (p + a + 1) % m
            lo, hi = offsets[j], offsets[j] + sizes[j]
            if hi > lo and any(lo < h and l < hi for l, h in live):
                break
            live.append((lo, hi))
            a += 1
        out.append(a)
    return out
