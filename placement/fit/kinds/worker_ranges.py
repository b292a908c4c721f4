"""Worker ranges: a model bigger than any one machine. The roomiest local GPU streams
its range through its ring while GPUs of worker machines (ALIAS.DEVICE,
placement/remote_devices.py) hold the last blocks for the session
(runtime/distributed/planned.py: a worker reads its range once, it never streams);
activations cross the network twice per forward. Chosen only when that prices faster
than the rest."""
from bisect import bisect_left
from typing import List, Optional, Sequence, Tuple

from ..bounds import fastest_compute, fastest_link, least_hop, split_pool, stream_floor
from ..geometry import Geometry
from ..option import Option
from .base import Kind
from .split_stream import per_device_json, price_spans, spans_line, spans_to_plan


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




class WorkerRangesKind(Kind):
    name = "worker_ranges"
    decision = "split"

    def floating(self, ctx, c, rooms, offered) -> List[Option]:
        """Device sets: the asked runtime (a local main device, then workers), else the
        roomiest local GPU with the 1, 2, ... roomiest workers."""
        geo, rule = ctx.geos[c], ctx.rules[c]
        if not rule.split_stream or not ctx.remote:
            return []
        if rule.runtime is not None:
            devs = [ctx.gidx[n] for n in rule.runtime if n in ctx.gidx]
            if len(devs) < 2 or devs[0] in ctx.remote or \
                    any(d not in ctx.remote for d in devs[1:]):
                return []
            sets = [devs]
        else:
            def usable(d):
                return (rule.gpus is None or ctx.gpus[d] in rule.gpus) and \
                    rooms[d] > geo.headroom
            local = sorted((d for d in range(ctx.G) if d not in ctx.remote and usable(d)),
                           key=lambda d: (-rooms[d], d))
            remote = sorted((d for d in ctx.remote if usable(d)), key=lambda d: (-rooms[d], d))
            if not local or not remote:
                return []
            sets = [[local[0]] + remote[:k] for k in range(1, len(remote) + 1)]
        out = []
        for devs in sets:
            caps = [rooms[d] - geo.headroom for d in devs]
            for depth in range(ctx.depth_for(c), -1, -1):
                o = self.ranges(ctx, c, devs, caps, depth, ctx.source(c))
                if o is not None:
                    out.append(o)
                    break
        return out

    def bound(self, ctx, c, persistent) -> Optional[float]:
        """The workers take as many of the last blocks as their room holds and the main
        device the largest prefix its room allows, at the deepest ring that fits: in less
        room a worker holding fewer blocks (streamed by the main device instead, which
        costs a component run a few times less than loading them) may price below the
        full budget's. Room-free: the whole forward on the fastest GPU, the network
        crossed there and back at the cheapest links, the blocks the main device and
        the workers cannot hold streamed (stream_floor)."""
        rule, geo, w = ctx.rules[c], ctx.geos[c], ctx.work[c]
        if persistent or not rule.split_stream or not ctx.remote:
            return None
        pool = split_pool(ctx, c)
        local = [d for d in pool if d not in ctx.remote]
        remote = [d for d in pool if d in ctx.remote]
        if not local or not remote:
            return None
        least = geo.total - max(max(0, ctx.budget[d] - geo.headroom) for d in local) - \
            sum(max(0, ctx.budget[d] - geo.headroom) for d in remote)
        hops = least_hop(ctx, w.activation_bytes, local, remote) + \
            least_hop(ctx, w.activation_bytes, remote, local)
        return w.runs * hops + stream_floor(w.runs, fastest_compute(ctx, c, pool),
                                            geo.prefix[geo.n], geo.total, least,
                                            fastest_link(ctx, c, pool))

    def ranges(self, ctx, c, devs, caps, depth, source) -> Optional[Option]:
        def build():
            spans = remote_tail_spans(ctx.geos[c], caps[1:])
            return None if spans is None else price_spans(
                ctx, self, c, devs, caps, spans, depth, source, "remote",
                hold=set(range(1, len(devs))))
        return ctx.memo(("worker_ranges", c, tuple(devs), tuple(caps), depth, source), build)

    def to_plan(self, ctx, o, cp) -> None:
        spans_to_plan(o, cp)

    def fit_json(self, ctx, o) -> dict:
        return dict(super().fit_json(ctx, o), stream_per_device=per_device_json(o))

    def reasons(self, ctx, o, use) -> List[str]:
        how = (f"{o.runtime[0]} streaming its range over its own link, "
               f"{'&'.join(o.runtime[1:])} holding the last blocks on the other "
               f"machine{'s' if len(o.runtime) > 2 else ''} (activations cross the network "
               f"twice per forward)")
        return [spans_line(ctx, o, how)]


WORKER_RANGES = WorkerRangesKind()
