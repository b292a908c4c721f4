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
from functools import lru_cache
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
    disjoint from p's and from each other's. The layout lays each block where the one
    before it ends, or at 0 (a wrap), so the regions from p on cover [offsets[p], ...)
    until the first wrap and, after it, also [0, the last end): a block after the wrap
    is clear while it ends at or before offsets[p]; a second wrap lands on the first."""
    m = len(sizes)
    out = []
    for p in range(m):
        base, end, wrapped, a = offsets[p], offsets[p] + sizes[p], False, 0
        if sizes[p] <= 0:
            base = None                           # an empty block holds nothing
        while a < m - 1:
            j = (p + a + 1) % m
            lo, hi = offsets[j], offsets[j] + sizes[j]
            if hi > lo and base is None:
                base, end = lo, hi
            elif hi > lo:
                if lo != end:                     # a wrap to 0
                    if wrapped and end > 0:
                        break
                    wrapped = True
                if (wrapped and hi > base) or (not wrapped and lo < base < hi):
                    break
                end = hi
            a += 1
        out.append(a)
    return out


# -- the ring's schedule (what depth the planner streams at) -------------------------------
# Flux's double and single blocks do the same FLOP per token: a double block runs its
# image weights over the image tokens and its text weights over the text tokens (12 h^2
# of matmul weights per token each side, besides the 6 h^2 modulation that sees one
# token), a single block its 12 h^2 over all tokens, and both attend jointly over all
# tokens. So per block the compute is equal while a double block has 2.4x the bytes:
# the double blocks are transfer-heavy. Other architectures: compute in proportion to
# bytes (uniform FLOP per byte).
EQUAL_FLOP_GROUPS = {
    "flux": {"double_blocks", "single_blocks", "transformer_blocks",
             "single_transformer_blocks"},
}


def compute_shares(info) -> List[float]:
    """Each block's share of the blocks' compute (sums to 1), in execution order."""
    blocks = list(getattr(info, "blocks", ()))
    if not blocks:
        return []
    equal = EQUAL_FLOP_GROUPS.get(str(getattr(info, "arch", "")).split("+")[0])
    if equal and all(b.group in equal for b in blocks):
        return [1.0 / len(blocks)] * len(blocks)
    total = sum(max(0, int(b.nbytes)) for b in blocks)
    if total <= 0:
        return [1.0 / len(blocks)] * len(blocks)
    return [max(0, int(b.nbytes)) / total for b in blocks]


def ring_schedule(compute: Sequence[float], transfer: Sequence[float],
                  sizes: Sequence[int], depth: int, lead: float = 0.0,
                  steps: int = 4) -> Tuple[float, float]:
    """(step seconds, stall seconds) of streaming blocks with per-block `compute` and
    `transfer` seconds through the ring of `ring_bytes(sizes, depth)`, as
    runtime/stream.py schedules it: when block q's hook runs (block q-1's compute is
    done), the copies of blocks up to q + ahead[q] are issued; the copy engine runs them
    one after the other; block q computes once its copy landed. The order wraps across
    steps (the next step's first copies start during this step's last blocks), so the
    last of `steps` steps is the steady state. `lead`: compute of each step before its
    first streamed block (resident blocks, embeddings), during which the copies issued
    at the end of the previous step (up to the first block's horizon) run. stall =
    step - max(lead + sum(compute), sum(transfer)): the time lost beyond what any
    schedule must take."""
    m = len(sizes)
    if m == 0:
        return 0.0, 0.0
    bound = max(lead + float(sum(compute)), float(sum(transfer)))
    if depth <= 0 or m == 1:            # synchronous: every copy, then its compute
        step = lead + float(sum(compute)) + float(sum(transfer))
        return step, step - bound
    ahead = _ahead_of(tuple(int(s) for s in sizes), depth)
    total = m * max(1, steps)
    land = [0.0] * total                # when block j's copy has landed
    issued = 0                          # copies [0, issued) are submitted
    engine = 0.0                        # the copy engine is free from then
    end = 0.0                           # the previous block's compute ended
    step_start = 0.0
    for q in range(total):
        last = min(total - 1, q + ahead[q % m])
        while issued <= last:           # issued at the hook: compute of q-1 is done
            engine = max(engine, end) + transfer[issued % m]
            land[issued] = engine
            issued += 1
        if q % m == 0:                  # the step begins (end_forward issued the above)
            step_start = end
            end += lead
        end = max(end, land[q]) + compute[q % m]
    step = end - step_start
    return step, max(0.0, step - bound)


@lru_cache(maxsize=4096)
def _ahead_of(sizes: Tuple[int, ...], depth: int) -> List[int]:
    """The runtime's ring layout's `ahead` (the planner asks for the same blocks at many
    links and prefixes: the layout depends on the sizes and depth alone)."""
    return ring_layout(sizes, ring_bytes(sizes, depth), depth).ahead


def choose_depth(compute: Sequence[float], transfer: Sequence[float], sizes: Sequence[int],
                 max_depth: int = 8, stall_share: float = 0.02) -> Tuple[int, List[float]]:
    """The smallest depth >= 1 whose predicted stall is at most `stall_share` of its
    step (or, when none is, the depth with the least stall), and the stall share at
    each depth 1..that depth (for the report's reason line). Depth stops growing once
    the ring holds every block."""
    m = len(sizes)
    shares: List[float] = []
    best = (float("inf"), 1)
    for depth in range(1, max(1, min(max_depth, m - 1)) + 1):
        step, stall = ring_schedule(compute, transfer, sizes, depth)
        share = stall / step if step > 0 else 0.0
        shares.append(share)
        if share <= stall_share:
            return depth, shares
        if share < best[0] - 1e-12:
            best = (share, depth)
    return best[1], shares[:best[1]]
