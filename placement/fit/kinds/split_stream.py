"""Streaming layer split: a component too big for its GPUs together. Each device keeps
a prefix of its range resident and streams the rest through its own ring over its own
link (runtime/split/layer.py). Layouts: the first devices filled and fully resident,
the last `streaming` ones sharing the rest in proportion to room, from all streaming
(most overlap) to only the last (most resident bytes: accelerate's layout, with a
prefetch ring); the cost model picks."""
from bisect import bisect_right
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

from ...plan import StreamPlan
from ...units import format_bytes as fmt
from ..bounds import fastest_compute, fastest_link, least_hop, split_pool, stream_floor
from ..costs import STREAM_OVERLAP
from ..geometry import Geometry, nearest
from ..option import Option, ring_stall, streamed_forward
from .base import Kind, network_line, per, size_line


class SpanDetail(NamedTuple):
    ranges: List[Tuple[int, int]]            # (first, last) per device
    per_device: Dict[str, Tuple[int, int]]   # device -> (resident blocks, of its range)
    resident_blocks: int                     # every device's resident prefix, summed
    depth: int
    layout: object                           # streaming devices (an int), or "remote"


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
        end = n if i == k - 1 else nearest(prefix, acc, start + 1, n - (k - 1 - i))
        out.append((start, end))
        start = end
    return out




def deepest_fitting(geo: Geometry, caps: Sequence[int], spans, top: int) -> Optional[int]:
    """The deepest ring, from `top` down, at which every device of `spans` holds its
    range: whole, or streamed through its ring (price_spans' own test, asked before
    anything is priced). A ring holds depth + 1 consecutive blocks, so one that fits
    fits at every shallower depth: each device only lowers the depth the ones before
    it left."""
    depth = top
    if depth < 0:
        return None
    for j, (a, b) in enumerate(spans):
        room = caps[j] - (geo.non_block if j == 0 else 0)
        while not geo.range_fits(a, b, room, depth):
            depth -= 1
            if depth < 0:
                return None
    return depth


def price_spans(ctx, kind, c: str, devs: List[int], caps: List[int], spans, depth: int,
                source: str, layout, hold=frozenset()) -> Optional[Option]:
    """A layer split over `spans` in which each device keeps a prefix of its range
    resident and streams the rest; devices in `hold` (positions) must keep all."""
    geo = ctx.geos[c]
    prefixes = []                      # every device's prefix first: most spans do not fit
    range_prefix, nb = geo.range_prefix, geo.non_block
    for j, (a, b) in enumerate(spans):
        k = range_prefix(a, b, caps[j] - nb, depth)
        if k is None or (j in hold and k < b - a):
            return None
        prefixes.append(k)
        nb = 0                         # the non-block weights are the first device's
    w = ctx.work[c]
    names = [ctx.gpus[d] for d in devs]
    per_device, use, fwd, compute_all, transfer_all = {}, {}, 0.0, 0.0, 0.0
    resident_total = streamed_total = 0
    prefix = geo.prefix
    bws = [ctx.model.source_bandwidth(n, source) for n in names]
    nb = geo.non_block
    for j, (d, (a, b), k) in enumerate(zip(devs, spans, prefixes)):
        resident = prefix[a + k] - prefix[a]
        streamed = prefix[b] - prefix[a + k]
        use[d] = nb + resident + geo.range_window(a + k, b, depth) + geo.headroom
        per_device[names[j]] = (k, b - a)
        compute = ctx.compute_s(c, (nb + prefix[b] - prefix[a]) / (geo.total or 1), d)
        if streamed:
            transfer = streamed / bws[j]
            stall = ring_stall(geo, ctx.compute_s(c, 1.0, d), a + k, bws[j], depth, a, b)
            fwd += streamed_forward(compute, transfer, depth, b - a - k, stall)
            transfer_all += transfer
        else:
            fwd += compute
        compute_all += compute
        resident_total += nb + resident
        streamed_total += streamed
        nb = 0
    comm = ring_hops(ctx, c, names)
    detail = SpanDetail([(a, b - 1) for a, b in spans], per_device,
                        sum(k for k, _ in per_device.values()), depth, layout)
    o = Option(c, kind, names, w.runs, ctx.phase_of[c], source, detail)
    o.use = use
    o.hops = len(names)
    o.resident_bytes, o.streamed_bytes, o.loaded_bytes = (resident_total, streamed_total,
                                                          resident_total)
    o.compute_s, o.transfer_s = compute_all, transfer_all + comm
    o.forward_s = fwd + comm
    o.load_s = resident_total / min(bws)
    o.host_persist = geo.total if source == "cpu" else 0
    return o.priced()


def ring_hops(ctx, c: str, names: List[str]) -> float:
    """Seconds per forward of c's activations going round `names` and back."""
    act = ctx.work[c].activation_bytes
    return ctx.memo(("ring hops", tuple(names), act), lambda: sum(
        ctx.model.hop_s(act, names[j], names[(j + 1) % len(names)])
        for j in range(len(names))))


def spans_floor(ctx, c: str, devs: List[int], caps: List[int], spans, depth: int,
                source: str) -> float:
    """A cost price_spans never goes below for these spans, found without any device's
    prefix: a device whose range does not fit its room streams at least what the room
    lacks plus the range's last depth + 1 blocks (the ring holds depth + 1 streamed
    blocks at once; fewer streamed would all be in it, and the range would fit), at no
    stall. A streamed byte costs runs x (1 - overlap) / its link per generation and
    saves 1 / the slowest link of loading: when that nets positive, the fewest bytes
    streamed is the cheapest, else loading is bounded by all of them streamed."""
    geo, w = ctx.geos[c], ctx.work[c]
    bws = [ctx.model.source_bandwidth(ctx.gpus[d], source) for d in devs]
    prefix, nb = geo.prefix, geo.non_block
    fwd, least, most = 0.0, 0, 0
    for j, (d, (a, b)) in enumerate(zip(devs, spans)):
        held = prefix[b] - prefix[a]
        compute = ctx.compute_s(c, (nb + held) / (geo.total or 1), d)
        lack = held - (caps[j] - nb)
        if lack <= 0:
            fwd += compute
        else:
            streamed = min(held, lack + prefix[b] - prefix[max(a, b - depth - 1)])
            fwd += streamed_forward(compute, streamed / bws[j], depth, 1)
            least += streamed
            most += held
        nb = 0
    fewest = w.runs * (1 - STREAM_OVERLAP) * min(bws) >= max(bws)
    comm = ring_hops(ctx, c, [ctx.gpus[d] for d in devs])
    return w.runs * (fwd + comm) + (geo.total - (least if fewest else most)) / min(bws)


def spans_to_plan(o, cp) -> None:
    """A split that streams: its ranges, and every device's prefix (resident_blocks
    counts them all; per_device has {device: [resident, of blocks]})."""
    s = o.detail
    cp.split_mode = "layer"
    cp.blocks = {n: [a, b] for n, (a, b) in zip(o.runtime, s.ranges) if b >= a}
    cp.stream = StreamPlan(s.resident_blocks, s.depth, 0,
                           {n: list(v) for n, v in s.per_device.items()})


def per_device_json(o) -> dict:
    return {n: list(v) for n, v in o.detail.per_device.items()}


def spans_line(ctx, o, how: str) -> str:
    s = o.detail
    parts = ", ".join(f"{n} blocks {a}-{b} ({s.per_device[n][0]} resident)"
                      for n, (a, b) in zip(o.runtime, s.ranges))
    return (f"{size_line(ctx, o.comp)} > what {'&'.join(o.runtime)} hold together -> layer "
            f"split, {how} ({parts}), params on {o.source}; {fmt(o.streamed_bytes)} "
            f"{per(o)} streamed (prefetch depth {s.depth}), {o.hops} hops"
            f"{network_line(ctx, o.runtime)}")


class SplitStreamKind(Kind):
    name = "split_stream"
    decision = "split"

    def floating(self, ctx, c, rooms, offered) -> List[Option]:
        """Too big for every device set a resident split was tried on: stream over all
        of them (most room, most links; a hop costs about a millisecond), with all, half,
        or the last few GPUs streaming."""
        out = []
        for devs, caps, streaming, spans, depth in self.layouts(ctx, c, rooms, offered):
            o = self.spans(ctx, c, devs, caps, depth, ctx.source(c), streaming, spans)
            if o is not None:
                out.append(o)
        return out

    def floor(self, ctx, c, rooms, offered) -> float:
        """The lowest of the layouts' floors (spans_floor), none of them priced."""
        return min((spans_floor(ctx, c, devs, caps, spans, depth, ctx.source(c))
                    for devs, caps, _, spans, depth in self.layouts(ctx, c, rooms, offered)),
                   default=float("inf"))

    def bound(self, ctx, c, persistent) -> Optional[float]:
        """Its layouts come from the room (every GPU with room, ranges in proportion to
        it, each device's largest prefix), and gated by what the kinds before it offer:
        in less room a layout over fewer GPUs, or streaming more, may price below every
        one of the full budget. Room-free: the whole forward computed on the fastest
        GPU, one crossing there and back at the cheapest link, and the blocks the GPUs
        cannot hold together streamed (stream_floor)."""
        rule, geo, w = ctx.rules[c], ctx.geos[c], ctx.work[c]
        if persistent or not (rule.split_stream and rule.float_split):
            return None
        devs = split_pool(ctx, c, local=True)
        if len(devs) < 2:
            return None
        least = geo.total - sum(max(0, ctx.budget[d] - geo.headroom) for d in devs)
        hops = 2 * least_hop(ctx, w.activation_bytes, devs, devs)
        return w.runs * hops + stream_floor(w.runs, fastest_compute(ctx, c, devs),
                                            geo.prefix[geo.n], geo.total, least,
                                            fastest_link(ctx, c, devs))

    def layouts(self, ctx, c, rooms, offered):
        """(devices, caps, streaming devices, spans, depth) of each layout floating()
        prices: over every GPU with room, the spans the same at every depth, at the
        deepest ring that fits them."""
        rule, geo = ctx.rules[c], ctx.geos[c]
        if not (rule.split_stream and rule.float_split) or not ctx.may_split(c, offered) \
                or any(o.kind.decision == "split" for o in offered):
            return
        sets = [devs for devs in ctx.split_sets(c, rooms)
                if not ctx.remote.intersection(devs)]
        if not sets:
            return
        devs = sets[-1]
        caps = [rooms[d] - geo.headroom for d in devs]
        k = len(devs)
        for streaming in sorted({k, (k + 1) // 2, 3, 2, 1} & set(range(1, k + 1)),
                                reverse=True):
            spans = stream_spans(geo, caps, streaming)
            depth = None if spans is None else deepest_fitting(geo, caps, spans,
                                                               ctx.depth_for(c))
            if depth is not None:
                yield devs, caps, streaming, spans, depth

    def spans(self, ctx, c, devs, caps, depth, source, streaming, spans) -> Optional[Option]:
        return ctx.memo(("split_stream", c, tuple(devs), tuple(caps), depth, source,
                         streaming),
                        lambda: price_spans(ctx, self, c, devs, caps, spans, depth, source,
                                            streaming))

    def to_plan(self, ctx, o, cp) -> None:
        spans_to_plan(o, cp)

    def fit_json(self, ctx, o) -> dict:
        return dict(super().fit_json(ctx, o), stream_per_device=per_device_json(o))

    def reasons(self, ctx, o, use) -> List[str]:
        streaming = o.runtime[len(o.runtime) - o.detail.layout:]
        if o.detail.layout == len(o.runtime):
            how = ("in proportion to room, each GPU streaming the tail of its range over "
                   "its own link")
        elif len(streaming) == 1:
            how = (f"{'&'.join(o.runtime[:-1])} filled and fully resident, {streaming[0]} "
                   f"streaming the rest")
        else:
            how = (f"{'&'.join(o.runtime[:-len(streaming)])} filled and fully resident, "
                   f"{'&'.join(streaming)} sharing the rest in proportion to room, each "
                   f"streaming the tail of its range over its own link")
        out = []
        if ctx.rules[o.comp].split_mode == "row":
            out.append(f"split_mode row needs {fmt(ctx.geos[o.comp].total)} held on "
                       f"{'&'.join(o.runtime)} and a row split cannot stream")
        return out + [spans_line(ctx, o, how)]



SPLIT_STREAM = SplitStreamKind()
