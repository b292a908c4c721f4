"""Streamed: a resident prefix of K blocks on one GPU and the rest copied through a ring
of prefetch slots each forward (runtime/engine/stream.py), the weights resting in host RAM or,
RAM first, partly on disk: the first `host_blocks` streamed blocks stay in RAM and the
rest are read from the file each forward (plan.StreamPlan.host_blocks)."""
from typing import List, NamedTuple, Optional

from ...plan import StreamPlan
from ...units import format_bytes as fmt
from ..costs import STREAM_OVERLAP
from ..option import Option, ring_stall, streamed_forward
from .base import Kind, action, ms, per, room_without, size_line


class StreamDetail(NamedTuple):
    resident_blocks: int      # K: blocks kept on the GPU
    depth: int                # prefetch depth of the ring
    host_blocks: int = 0      # source disk: streamed blocks resting in host RAM


def stream_on(ctx, c: str, d: int, k: int, depth: int, source: str = "cpu",
              host_blocks: int = 0) -> Option:
    """Streamed on GPU d with a resident prefix of k blocks."""
    return ctx.memo(("stream", c, d, k, depth, source, host_blocks),
                    lambda: _stream_on(ctx, c, d, k, depth, source, host_blocks))


def _stream_on(ctx, c, d, k, depth, source, host_blocks) -> Option:
    geo, w = ctx.geos[c], ctx.work[c]
    name = ctx.gpus[d]
    bw = ctx.model.source_bandwidth(name, source)
    compute = ctx.compute_s(c, 1.0, d)
    streamed = geo.streamed_bytes(k)
    in_ram = 0
    if source == "disk":
        host_blocks = max(0, min(host_blocks, geo.n - k))
        in_ram = geo.prefix[k + host_blocks] - geo.prefix[k]
    else:
        host_blocks = 0
    transfer = in_ram / ctx.model.source_bandwidth(name, "cpu") + (streamed - in_ram) / bw
    resident = geo.non_block + geo.prefix[k]
    o = Option(c, STREAMED, [name], w.runs, ctx.phase_of[c], source,
               StreamDetail(k, depth, host_blocks))
    o.use = {d: geo.stream_weights(k, depth) + geo.headroom}
    o.host_persist = geo.total if source == "cpu" else in_ram
    o.resident_bytes, o.streamed_bytes, o.loaded_bytes = resident, streamed, resident
    o.compute_s, o.transfer_s = compute, transfer
    # disk sources: the schedule at the mean link of RAM and disk reads
    stall = ring_stall(geo, compute, k, streamed / transfer if transfer > 0 else bw, depth)
    o.forward_s = streamed_forward(compute, transfer, depth, geo.n - k, stall)
    o.load_s = resident / bw
    return o.priced()


def best_prefix(ctx, c: str, d: int, room: int, depth: int, source: str) -> Optional[int]:
    """The resident prefix to stream with in `room` (weights only), priced as stream_on
    prices it (the ring's stall included, which is not monotone in the prefix). Every
    block kept resident saves its copy on each forward but is loaded (not overlapped)
    once per phase: with enough forwards (runs x (1 - overlap) >= 1, a sampled model)
    the cost without the stall only grows as the prefix shrinks, so the walk down from
    the largest prefix that fits stops once that floor passes the best found; a
    component run once prices every prefix that fits. The floor (no stall) is checked
    before the stall is computed: a prefix whose floor loses is never scheduled."""
    geo = ctx.geos[c]
    if ctx.rules[c].prefix_zero:
        return 0 if geo.stream_weights(0, depth) <= room else None
    kmax = geo.best_prefix(room, depth)
    if kmax is None:
        return None
    w = ctx.work[c]
    sampled = w.runs * (1 - STREAM_OVERLAP) >= 1
    compute = ctx.compute_s(c, 1.0, d)
    bw = ctx.model.source_bandwidth(ctx.gpus[d], source)
    best = None
    for k in range(kmax, -1, -1):
        if geo.stream_weights(k, depth) > room:
            continue
        if best is not None:
            floor = w.runs * streamed_forward(compute, geo.streamed_bytes(k) / bw, depth,
                                              geo.n - k) + (geo.non_block + geo.prefix[k]) / bw
            if floor >= best[0]:
                if sampled:
                    break
                continue
        o = stream_on(ctx, c, d, k, depth, source)
        if best is None or o.cost < best[0]:
            best = (o.cost, k)
    return best[1]


def host_blocks_within(ctx, o: Option, host_bytes: int) -> int:
    """The most streamed blocks of `o` (in execution order) that `host_bytes` hold."""
    geo, k = ctx.geos[o.comp], o.detail.resident_blocks
    h = 0
    while k + h < geo.n and geo.prefix[k + h + 1] - geo.prefix[k] <= host_bytes:
        h += 1
    return h


class StreamedKind(Kind):
    name = "streamed"
    decision = "stream"
    moves_to_disk = True

    def floating(self, ctx, c, rooms, offered) -> List[Option]:
        if not ctx.rules[c].stream:
            return []
        geo, source = ctx.geos[c], ctx.source(c)
        out = []
        for d in ctx.distinct_devices(c, rooms):
            for depth in range(ctx.depth_for(c), -1, -1):
                k = best_prefix(ctx, c, d, rooms[d] - geo.headroom, depth, source)
                if k is not None:
                    out.append(stream_on(ctx, c, d, k, depth, source))
        return out

    def floor(self, ctx, c, rooms, offered) -> float:
        """On each GPU at least what its room lacks for the weights is streamed every
        forward, at best overlapped (any depth, no stall, one streamed block's overhead),
        the rest loaded once. A streamed byte costs runs x (1 - overlap) / link and saves
        1 / link of loading: when that nets positive, the fewest streamed is the
        cheapest, else loading is bounded by every block streamed."""
        if not ctx.rules[c].stream:
            return float("inf")
        geo, w, source = ctx.geos[c], ctx.work[c], ctx.source(c)
        blocks = geo.prefix[geo.n]
        fewest = w.runs * (1 - STREAM_OVERLAP) >= 1
        floor = float("inf")
        for d in ctx.distinct_devices(c, rooms):
            bw = ctx.model.source_bandwidth(ctx.gpus[d], source)
            lack = min(blocks, max(0, geo.total - (rooms[d] - geo.headroom)))
            cost = w.runs * streamed_forward(ctx.compute_s(c, 1.0, d), lack / bw, 1, 1) + \
                (geo.total - (lack if fewest else blocks)) / bw
            floor = min(floor, cost)
        return floor

    def to_disk(self, ctx, o, over):
        """On disk, RAM first: the first streamed blocks stay in host RAM, as many as the
        bytes it may go on holding once `over` is freed."""
        s = o.detail
        moved = stream_on(ctx, o.comp, ctx.gidx[o.runtime[0]], s.resident_blocks, s.depth,
                          "disk")
        keep = o.host_persist - over
        return self._with_host_blocks(ctx, moved, host_blocks_within(ctx, moved, keep))

    def refill(self, ctx, o, room):
        """Host RAM left over takes streamed blocks back from disk (the most often read
        first: the search offers it to sampled components first). On disk the resident
        prefix is read from the file at each load, so a shorter prefix with more
        streamed blocks held in RAM may be cheaper now (and needs less GPU memory, so it
        still fits)."""
        if o.source != "disk" or ctx.rules[o.comp].params == "disk":
            return o
        room += o.host_persist
        alts = [o]
        for k in range(o.detail.resident_blocks, -1, -1):
            alt = stream_on(ctx, o.comp, ctx.gidx[o.runtime[0]], k, o.detail.depth, "disk")
            alts.append(self._with_host_blocks(ctx, alt, host_blocks_within(ctx, alt, room)))
        return min(alts, key=lambda a: (a.cost, -a.detail.host_blocks))

    @staticmethod
    def _with_host_blocks(ctx, o, host_blocks):
        s = o.detail
        return stream_on(ctx, o.comp, ctx.gidx[o.runtime[0]], s.resident_blocks, s.depth,
                         "disk", host_blocks)

    def to_plan(self, ctx, o, cp) -> None:
        s = o.detail
        cp.stream = StreamPlan(s.resident_blocks, s.depth, s.host_blocks)

    def reasons(self, ctx, o, use) -> List[str]:
        c, geo, s = o.comp, ctx.geos[o.comp], o.detail
        name = o.runtime[0]
        room = room_without(ctx, use, o, ctx.gidx[name])
        hidden = "hidden under" if o.transfer_s <= o.compute_s else "longer than"
        size = size_line(ctx, c)
        if ctx.rules[c].prefix_zero:
            head = f"{size}; offload_mode sequential streams every block"
        elif geo.total + geo.headroom <= room:
            head = (f"{size} fits {name} room {fmt(room)}, but streaming overlaps its load "
                    f"with compute")
        else:
            head = f"{size} > {name} room {fmt(room)}"
        return [f"{head} -> streamed on {name}, {s.resident_blocks} of {geo.n} blocks "
                f"resident, {fmt(o.streamed_bytes)} {per(o)} streamed from {o.source} "
                f"(prefetch depth {s.depth}: transfer {ms(o.transfer_s)} {hidden} compute "
                f"{ms(o.compute_s)})"]

    def disk_reason(self, ctx, o) -> str:
        geo, s = ctx.geos[o.comp], o.detail
        k = s.resident_blocks
        in_ram = geo.prefix[k + s.host_blocks] - geo.prefix[k]
        return (f"host RAM budget {fmt(ctx.host_budget)} cannot hold every offloaded "
                f"component -> params on disk, RAM first: {s.host_blocks} of {geo.n - k} "
                f"streamed blocks ({fmt(in_ram)}) rest in host RAM, "
                f"{fmt(o.streamed_bytes - in_ram)} read from disk {per(o)}; the resident "
                f"prefix is read from disk each {action(o)} ({ms(o.load_s)})")


STREAMED = StreamedKind()
