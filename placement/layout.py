"""Block layout and the one byte model: how a component's tensors group into blocks, the
byte geometry of the streaming ring, and what each kind of placement holds on each
device (one device resident or streamed, layer split ranges with their rings, row split
shards, batch parallel copies). The one place for this arithmetic: the runtime
(runtime/engine/stream.py, stages.py, split/layer.py, split/row.py, runtime/footprint.py), the
planner (placement/resolve.py for explicit plans, placement/fit for auto-fit) and the
ComfyUI adapter's shares (runtime/comfy/patchers/claims.py through runtime/footprint.py) all
read it, so the bytes the planner predicts are the bytes the runtime allocates. Pure
Python (no torch): the planner imports it; callers pass plain numbers.

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


def compute_fractions(info) -> List[float]:
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
    runtime/engine/stream.py schedules it: when block q's hook runs (block q-1's compute is
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
    seen = None                         # the copy state at the last step's start
    for q in range(total):
        last = min(total - 1, q + ahead[q % m])
        while issued <= last:           # issued at the hook: compute of q-1 is done
            engine = max(engine, end) + transfer[issued % m]
            land[issued] = engine
            issued += 1
        if q % m == 0:                  # the step begins (end_forward issued the above)
            if q:
                # the copies in flight, relative to the step's start: when they repeat,
                # every later step repeats the last one (the steady state is reached)
                state = (issued - q, engine - end, [land[j] - end for j in range(q, issued)])
                if seen is not None and _same_state(seen, state, end - step_start):
                    return end - step_start, max(0.0, end - step_start - bound)
                seen = state
            step_start = end
            end += lead
        end = max(end, land[q]) + compute[q % m]
    step = end - step_start
    return step, max(0.0, step - bound)


def _same_state(a, b, scale: float) -> bool:
    tol = 1e-9 * max(scale, 1e-12)
    return a[0] == b[0] and abs(a[1] - b[1]) <= tol and \
        all(abs(x - y) <= tol for x, y in zip(a[2], b[2]))


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


# -- what a placement holds on each device --------------------------------------------------
# One byte model for the planner (placement/resolve.py, placement/fit), the runtime
# (runtime/engine/stages.py, split/layer.py, split/row.py, runtime/footprint.py) and the ComfyUI
# adapter (runtime/comfy/patchers/claims.py). Inputs are plain numbers: `non_block` bytes (held by
# the main device, index 0), block `sizes` in execution order, each device's `room` for
# weights (its ledger capacity, the budget capped by free memory, less working memory).
def planned_prefix(stream, device: str, n: int) -> Tuple[Optional[int], Optional[list]]:
    """The one reading of a plan's stream prefix for `device`'s n streamed blocks (the
    engine, runtime/engine/one_device.py and split/layer.py, and its prediction,
    runtime/footprint.py): auto-fit's own entry for the device ([resident, of blocks],
    stream.per_device) where it matches the n blocks, else None; and the entry when there
    is one that does not match (the caller records what it used instead)."""
    entry = stream.per_device.get(device) if stream is not None else None
    if not entry:
        return None, None
    k, of = int(entry[0]), int(entry[1])
    if of == n and 0 <= k <= n:
        return k, None
    return None, list(entry)


def stream_prefix(stream, device: str, n: int) -> Tuple[int, Optional[list]]:
    """A streaming device's resident prefix of its n blocks: the plan's entry for it where
    that matches (planned_prefix), else the plan's resident_blocks; and the entry that did
    not match, if any."""
    k, mismatched = planned_prefix(stream, device, n)
    if k is None:
        k = min(max(0, int(stream.resident_blocks)), n)
    return k, mismatched


def prefix_and_ring(sizes: Sequence[int], k: int, depth: int) -> int:
    """Blocks `sizes` with the first k resident and the rest cycling through the ring."""
    k = max(0, min(int(k), len(sizes)))
    return sum(sizes[:k]) + ring_bytes(sizes[k:], max(0, depth))


def one_device_bytes(non_block: int, sizes: Sequence[int],
                     stream: Optional[Tuple[int, int]] = None) -> int:
    """One device (runtime/engine/one_device.py): every weight, or when streamed (`stream` =
    (resident prefix, prefetch depth)) the non-block weights, the prefix and the ring."""
    if stream is None:
        return non_block + sum(sizes)
    return non_block + prefix_and_ring(sizes, stream[0], stream[1])


def batch_parallel_bytes(non_block: int, sizes: Sequence[int],
                         streams: Sequence[Optional[Tuple[int, int]]]) -> List[int]:
    """Batch parallel (runtime/parallel/batch.py): each device holds its own one-device
    placement; `streams` has one (prefix, depth) or None per device."""
    return [one_device_bytes(non_block, sizes, s) for s in streams]


def range_prefix(sizes: Sequence[int], room: int, depth: int,
                 streaming: bool) -> Optional[int]:
    """Blocks of a layer split's range kept resident on a device with `room` for them:
    all when they fit; else, streaming, the largest prefix whose ring fits beside it.
    None: the runtime refuses (not streaming, or not even the ring fits)."""
    if sum(sizes) <= room:
        return len(sizes)
    return resident_prefix(sizes, room, depth) if streaming else None


def range_bytes(sizes: Sequence[int], room: int, depth: int, streaming: bool,
                planned: Optional[int] = None) -> int:
    """Bytes a layer split's range takes on its device (prefix + ring). `planned`: the
    plan's own prefix, taken where it fits. Where the runtime refuses the range, the
    least it would need (the whole range, or streaming the ring alone): more than
    `room`, so a caller compares with the room to know."""
    if planned is not None and prefix_and_ring(sizes, planned, depth) <= room:
        return prefix_and_ring(sizes, planned, depth)
    k = range_prefix(sizes, room, depth, streaming)
    if k is None:
        k = 0 if streaming else len(sizes)
    return prefix_and_ring(sizes, k, depth)


def split_rooms(rooms: Sequence[int], main: int) -> List[float]:
    """Each device's weight for a split's shares (layer ranges, row counts): its room,
    the main device's less what it holds besides (runtime/engine.room_weights)."""
    return [float(max(0, r - (main if i == 0 else 0))) for i, r in enumerate(rooms)]


def owner_of(ranges: Dict[str, Sequence[int]], devices: Sequence[str],
             n: int) -> Optional[List[int]]:
    """{device: [first, last]} -> device index per block; None when the ranges do not
    cover 0..n-1 exactly once with `devices`."""
    owner = [-1] * n
    for dev, (first, last) in ranges.items():
        if dev not in devices or not 0 <= first <= last < n:
            return None
        for i in range(first, last + 1):
            if owner[i] != -1:
                return None
            owner[i] = list(devices).index(dev)
    return None if -1 in owner else owner


def layer_split_bytes(non_block: int, sizes: Sequence[int], owner: Sequence[int],
                      rooms: Sequence[int], depth: int, streaming: bool,
                      prefixes: Optional[Sequence[Optional[int]]] = None) -> List[int]:
    """Layer split (runtime/split/layer.py): per device, the non-block weights on the
    main one plus its range's `range_bytes`. `prefixes[d]`: the plan's own resident
    prefix for device d (auto-fit's, when streaming), else None. A device over its room
    is one the runtime refuses."""
    out = []
    for d, room in enumerate(rooms):
        mine = [s for s, o in zip(sizes, owner) if o == d]
        base = non_block if d == 0 else 0
        k = prefixes[d] if prefixes is not None and d < len(prefixes) else None
        out.append(base + range_bytes(mine, room - base, depth, streaming, k))
    return out


# -- the row split ----------------------------------------------------------------------------
# runtime/split/row.py shards the 2-D Linear weights inside blocks of at least ROW_MIN x
# ROW_MIN (stable-diffusion.cpp's rule) by output rows over the devices, each Linear's
# rows in proportion to the devices' `split_rooms`; its bias goes with its rows. All else
# (non-block weights, smaller matrices, norms, convolutions) stays on the main device.
ROW_MIN = 256


def row_shardable(rows: int, cols: int) -> bool:
    return rows >= ROW_MIN and cols >= ROW_MIN


def row_counts(rows: int, weights: Sequence[float]) -> List[int]:
    """Rows per device in proportion to weights (largest remainder); weight 0 gets 0."""
    total = sum(weights)
    exact = [rows * w / total for w in weights]
    counts = [int(e) for e in exact]
    order = sorted(range(len(weights)), key=lambda i: (-(exact[i] - counts[i]), i))
    for i in order[:rows - sum(counts)]:
        counts[i] += 1
    return counts


def row_split_bytes(shards: Sequence[Tuple[int, int, int]], main: int,
                    rooms: Sequence[int]) -> Optional[List[int]]:
    """Bytes per device of a row split: `shards` are (rows, bytes per row, how many) of
    the sharded Linears (a row: the weight's row and the bias element), `main` the bytes
    of everything else. None: no room for any shard after `main` (the runtime refuses)."""
    weights = split_rooms(rooms, main)
    if not any(weights):
        return None
    out = [main] + [0] * (len(rooms) - 1)
    for rows, row_bytes, count in shards:
        for d, c in enumerate(row_counts(rows, weights)):
            out[d] += c * row_bytes * count
    return out


def row_split_applies(info) -> bool:
    """Whether the runtime row-splits this component: some block holds a Linear to shard
    (else it splits by layer). Without tensor shapes (`row_shards` None), when it has
    blocks."""
    shards = getattr(info, "row_shards", None)
    return bool(info.blocks) if shards is None else bool(shards)


def row_unsharded(info) -> int:
    """Bytes a row split keeps whole on the main device (all but the sharded rows)."""
    shards = getattr(info, "row_shards", None)
    total = max(int(info.total_bytes), sum(max(0, int(b.nbytes)) for b in info.blocks))
    if shards is None:                    # not known: the blocks are what is sharded
        return total - sum(max(0, int(b.nbytes)) for b in info.blocks)
    return total - sum(rows * row_bytes * count for rows, row_bytes, count in shards)


def row_split_held(info, rooms: Sequence[int]) -> Optional[List[int]]:
    """Row split bytes per device for a ComponentInfo (placement/metadata), as
    runtime/split/row.py allocates them, given `rooms` (each device's ledger capacity
    less working memory; the main device first). None: the main device's unsharded
    weights leave no room for any shard. Without tensor shapes (`info.row_shards` None:
    a hand-made description) the block bytes are cut in proportion to the rooms. Check
    `row_split_applies` first."""
    shards = getattr(info, "row_shards", None)
    if shards is None:
        shards = ((sum(max(0, int(b.nbytes)) for b in info.blocks), 1, 1),)
    return row_split_bytes(shards, row_unsharded(info), rooms)
