"""Layer split: contiguous block ranges on two or more GPUs, each computing its range
and handing the hidden state on (runtime/split/layer.py); the main device also holds
the non-block weights. Held for the session, or loaded while its phase runs. The
ranges are proportional to the room on each device (stable-diffusion.cpp's docs say
proportional but its code fills device 0 first)."""
from bisect import bisect_left, bisect_right
from typing import List, NamedTuple, Optional, Sequence, Tuple

from ...units import format_bytes as fmt
from ..bounds import fastest_compute, fastest_link, least_hop, split_pool
from ..geometry import Geometry, nearest
from ..option import Option
from .base import Kind, action, ms, network_line, per, room_without, size_line


class SplitDetail(NamedTuple):
    mode: str                               # layer | row
    ranges: Optional[List[Tuple[int, int]]]  # layer: [(first, last)] per device kept
    layout: tuple                           # (device set, the ranges' ends or row shares)


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
            end = nearest(prefix, target, low, hi)
        out.append((start, end))
        start = end
    return out




def split_option(ctx, kind, c: str, devs: List[int], held: List[int], compute: float,
                 comm: float, hops: int, persistent: bool, source: str, detail) -> Option:
    """A split holding `held` bytes of weights on each of `devs`: for the session
    (persistent), or loaded from `source` while its phase runs."""
    geo, w = ctx.geos[c], ctx.work[c]
    names = [ctx.gpus[i] for i in devs]
    o = Option(c, kind, names, w.runs, ctx.phase_of[c], names[0] if persistent else source,
               detail)
    o.hops = hops
    o.resident_bytes = geo.total
    o.compute_s, o.transfer_s, o.forward_s = compute, comm, compute + comm
    if persistent:
        o.persist = {devs[j]: h for j, h in enumerate(held)}
        o.use = {d: geo.headroom for d in devs}
    else:
        o.use = {devs[j]: h + geo.headroom for j, h in enumerate(held)}
        o.loaded_bytes = geo.total
        # counted serially: the host side (one pinned staging path) is the bottleneck,
        # so a split never loads faster than one whole copy on the slowest link
        o.load_s = geo.total / min(ctx.model.source_bandwidth(n, source) for n in names)
        o.host_persist = geo.total if source == "cpu" else 0
    return o.priced()


def split_candidates(ctx, kind, c: str, mode: str, rooms: Sequence[int], persistent: bool,
                     offered) -> List[Option]:
    """The splits of `kind` over each device set: `rooms` are bytes per GPU for the
    weights and working memory (held for the session, or while c's phase runs)."""
    rule, geo = ctx.rules[c], ctx.geos[c]
    asked = rule.persist_split if persistent else rule.float_split
    if not asked or rule.split_mode != mode or ctx.G < 2 or not ctx.may_split(c, offered):
        return []
    out = []
    for devs in ctx.split_sets(c, rooms):
        if not persistent and ctx.remote.intersection(devs):
            continue                          # remote GPUs: held for the session only
        o = kind.split(ctx, c, devs, [rooms[d] - geo.headroom for d in devs], persistent,
                       ctx.source(c))
        if o is not None:
            out.append(o)
    return out


def split_pool_for(ctx, c: str, persistent: bool, mode: str) -> List[int]:
    """The GPUs a resident split of `mode` may use (split_candidates, in any room):
    none when the rules price no such split."""
    rule = ctx.rules[c]
    asked = rule.persist_split if persistent else rule.float_split
    if not asked or rule.split_mode != mode or ctx.G < 2:
        return []
    devs = split_pool(ctx, c, local=not persistent)
    return devs if len(devs) >= 2 else []


def split_bound(ctx, c: str, persistent: bool, mode: str) -> Optional[float]:
    """Kind.bound of a resident layer split (split_candidates): at least the whole forward
    on the fastest GPU and two crossings per forward, loaded (taking turns) at the
    fastest link."""
    devs = split_pool_for(ctx, c, persistent, mode)
    if not devs:
        return None
    geo, w = ctx.geos[c], ctx.work[c]
    fwd = fastest_compute(ctx, c, devs) + 2 * least_hop(ctx, w.activation_bytes, devs, devs)
    return w.runs * fwd + (0.0 if persistent else geo.total / fastest_link(ctx, c, devs))


class LayerSplitKind(Kind):
    name = "layer_split"
    decision = "split"

    def persistent(self, ctx, c, room, offered) -> List[Option]:
        hr = ctx.geos[c].headroom
        return split_candidates(ctx, self, c, "layer", [x + hr for x in room.caps], True,
                                offered)

    def floating(self, ctx, c, rooms, offered) -> List[Option]:
        return split_candidates(ctx, self, c, "layer", rooms, False, offered)

    def bound(self, ctx, c, persistent) -> Optional[float]:
        """The device sets are the roomiest GPUs and the ranges in proportion to room:
        on GPUs of different speeds or links, less room may leave a faster set or more
        blocks on the faster GPU. Room-free: the whole forward on the fastest GPU, two
        crossings at the cheapest link, and (taking turns) every byte loaded at the
        fastest link."""
        return split_bound(ctx, c, persistent, "layer")

    def floor(self, ctx, c, rooms, offered) -> Optional[float]:
        """inf when every GPU with room beside the working memory holds less than the
        weights, all together (no device set splits them); else the splits are priced."""
        geo = ctx.geos[c]
        held = sum(r - geo.headroom for r in rooms if r > geo.headroom)
        return float("inf") if held < geo.total else None

    def split(self, ctx, c, devs, caps, persistent, source) -> Optional[Option]:
        ranges = ctx.memo(("layer_ranges", c, tuple(caps)),
                          lambda: layer_ranges(ctx.geos[c], caps))
        if ranges is None:
            return None
        return self.with_ranges(ctx, c, devs, [e for _, e in ranges], persistent, source)

    def with_ranges(self, ctx, c, devs, ends, persistent, source) -> Optional[Option]:
        """The split whose device j runs blocks ends[j-1]..ends[j]-1."""
        return ctx.memo(("layer_split", c, tuple(devs), tuple(ends), persistent, source),
                        lambda: self._price(ctx, c, list(devs), ends, persistent, source))

    def _price(self, ctx, c, devs, ends, persistent, source) -> Optional[Option]:
        geo, w = ctx.geos[c], ctx.work[c]
        spans = list(zip([0] + list(ends[:-1]), ends))
        keep = [(i, s, e) for i, (s, e) in enumerate(spans) if e > s or i == 0]
        if len(keep) < 2:
            return None               # everything landed on one device: not a split
        used = [devs[i] for i, _, _ in keep]
        held = [geo.prefix[e] - geo.prefix[s] + (geo.non_block if j == 0 else 0)
                for j, (_, s, e) in enumerate(keep)]
        compute = sum(ctx.compute_s(c, h / (geo.total or 1), used[j])
                      for j, h in enumerate(held))
        names = [ctx.gpus[d] for d in used]
        comm = sum(ctx.model.hop_s(w.activation_bytes, names[j], names[(j + 1) % len(names)])
                   for j in range(len(names)))
        detail = SplitDetail("layer", [(s, e - 1) for _, s, e in keep], (tuple(devs),
                                                                        tuple(ends)))
        # hops: main -> ... -> last -> main (the final layers)
        return split_option(ctx, self, c, used, held, compute, comm, len(used), persistent,
                            source, detail)

    def to_plan(self, ctx, o, cp) -> None:
        cp.split_mode = "layer"
        # the main device may hold only the non-block weights: no range, no key
        cp.blocks = {n: [a, b] for n, (a, b) in zip(o.runtime, o.detail.ranges) if b >= a}

    def reasons(self, ctx, o, use) -> List[str]:
        c = o.comp
        most = max((room_without(ctx, use, o, ctx.gidx[n]) for n in o.runtime), default=0)
        where = "persistent" if o.persistent else f"while {action(o)} runs, params on {o.source}"
        parts = ", ".join(f"{n} blocks {a}-{b}" for n, (a, b) in zip(o.runtime, o.detail.ranges))
        why = ("parallel pipeline asked" if ctx.rules[c].only == "pipeline"
               else f"{size_line(ctx, c)} > most room on one GPU {fmt(most)}")
        return [f"{why} -> layer split over {'&'.join(o.runtime)} in proportion to room "
                f"({parts}; {o.runtime[0]} also holds the non-block weights), {where}; "
                f"{o.hops} hops {per(o)} ({ms(o.transfer_s)})"
                f"{network_line(ctx, o.runtime)}"]



LAYER_SPLIT = LayerSplitKind()
