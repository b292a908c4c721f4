"""Batch parallel: the whole component on each of two or more GPUs, each computing a
share of every forward's batch at once, outputs gathered on the first
(runtime/parallel/batch.py). Each device holds it resident, or streams it with the same
prefix and depth from one shared packed host copy."""
from typing import List, NamedTuple, Optional

from ...errors import PlacementError
from ...plan import StreamPlan
from ...units import format_bytes as fmt
from ..bounds import fastest_compute, fastest_link
from ..costs import BATCH_PARALLEL_EFFICIENCY, STREAM_OVERLAP
from ..option import Option, ring_stall, streamed_forward
from .base import Kind, action, gpu_change, ms, per


class BatchDetail(NamedTuple):
    each: str                 # resident | stream: what every device does
    shares: dict              # device -> items of one forward's batch
    serial_s: float           # the same placement's forward on the first device alone
    resident_blocks: int = 0  # each == stream: the prefix and depth on every device
    depth: int = 0


def share_items(ctx, c: str, devs: List[int]) -> List[int]:
    """Items of one forward's batch per device, as runtime/parallel cuts them: in
    proportion to speed, each item to the device that would finish it first."""
    counts = [0] * len(devs)
    for _ in range(ctx.work[c].items):
        j = min(range(len(devs)), key=lambda j: ((counts[j] + 1) / ctx.tp[devs[j]], j))
        counts[j] += 1
    return counts


def share_headroom(ctx, c: str, items: int) -> int:
    """Working memory of a forward over `items` of the batch: the metadata's estimate (or
    the first call's rehearsal, nodes/planning.with_rehearsal) is the devices' kernel
    workspace plus activations in proportion to the batch; a fixed reserve or a given
    headroom is kept whole (nothing says what part of it scales). The workspace is the
    inventory's (ctx.workspace, which resolve.with_workspace also put in the estimate: 0
    on a simulated device with @workspace=0), not always the planner's default: against
    the default, every estimate under 256 MiB was kept whole, each device reserving the
    whole batch's activations for its share (issue 29 item 3: a two-way batch parallel
    measured 0.70 of its plan)."""
    geo, w = ctx.geos[c], ctx.work[c]
    hr = geo.headroom
    est = getattr(geo.info, "headroom_bytes", None)
    if est is None or int(est) != hr or w.items <= 1 or items >= w.items:
        return hr
    from ...metadata.headroom import WORKSPACE
    workspace = getattr(ctx, "workspace", None)
    workspace = WORKSPACE if workspace is None else max(0, int(workspace))
    if hr <= workspace:
        return hr
    return workspace + -(-(hr - workspace) * items // w.items)


def interchangeable(ctx, devs: List[int]) -> bool:
    """Whether `devs` price alike wherever they sit in a set: one speed, one host link,
    one link figure between any two of them."""
    def key():
        names = [ctx.gpus[d] for d in devs]
        links = {ctx.model.link(a, b)[1:3] for a in names for b in names if a != b}
        return len({ctx.tp[d] for d in devs}) <= 1 and \
            len({ctx.bw[d] for d in devs}) <= 1 and len(links) <= 1
    return ctx.memo(("interchangeable", tuple(devs)), key)


class BatchParallelKind(Kind):
    name = "batch_parallel"
    decision = "batch"
    parallel = "batch"

    def _sets(self, ctx, c, rooms) -> List[List[int]]:
        """The asked runtime list, else the k roomiest local GPUs for k = 2 .. the
        batch's items (a device needs a share)."""
        rule = ctx.rules[c]
        if rule.runtime is not None:
            devs = [ctx.gidx[n] for n in rule.runtime if n in ctx.gidx]
            return [devs] if len(devs) >= 2 else []
        order = sorted(ctx.devices(c), key=lambda d: (-rooms[d], d))
        top = min(len(order), max(2, ctx.work[c].items))
        return [order[:k] for k in range(2, top + 1)]

    def _allowed(self, ctx, c) -> bool:
        rule = ctx.rules[c]
        return rule.batch and (ctx.work[c].items >= 2 or rule.only == self.name)

    def bound(self, ctx, c, persistent) -> Optional[float]:
        """On interchangeable GPUs (one speed, one link, one figure between any two) and
        for an asked device list, the batch's cheapest in a room is never dearer than in
        less: a set's price depends on the room only through the tightest of its
        devices, the k roomiest are the roomiest set of k, and each device set streams
        with its cheapest prefix (_prefixes). Otherwise the set of the roomiest GPUs may
        be a slower one. Room-free: the ideal forward at least the batch computed by the
        `items` fastest GPUs together, the forward at least e x that + (1 - e) x the
        whole on the fastest, and (taking turns) at least the non-block weights loaded
        at the fastest link."""
        rule, geo, w = ctx.rules[c], ctx.geos[c], ctx.work[c]
        if not self._allowed(ctx, c) or rule.runtime is not None:
            return None
        if persistent and not rule.persist_res:
            return None
        if not persistent and (ctx.source(c) != "cpu" or not (rule.float_res or rule.stream)):
            return None
        devs = list(ctx.devices(c))
        if len(devs) < 2 or interchangeable(ctx, devs):
            return None
        speeds = sorted((ctx.tp[d] for d in devs), reverse=True)[:max(2, w.items)]
        ideal = w.flop / sum(speeds)
        fwd = BATCH_PARALLEL_EFFICIENCY * ideal + \
            (1 - BATCH_PARALLEL_EFFICIENCY) * fastest_compute(ctx, c, devs)
        return w.runs * fwd + (0.0 if persistent else
                               geo.non_block / fastest_link(ctx, c, devs))

    def persistent(self, ctx, c, room, offered) -> List[Option]:
        if not self._allowed(ctx, c) or not ctx.rules[c].persist_res:
            return []
        geo = ctx.geos[c]
        rooms = [x + geo.headroom for x in room.caps]
        out = []
        for devs in self._sets(ctx, c, rooms):
            hr = share_headroom(ctx, c, max(share_items(ctx, c, devs)))
            if all(geo.total + hr <= rooms[d] for d in devs):
                out.append(self.batch(ctx, c, devs, "resident", True))
        return [o for o in out if o is not None]

    def floating(self, ctx, c, rooms, offered) -> List[Option]:
        rule, geo = ctx.rules[c], ctx.geos[c]
        if not self._allowed(ctx, c) or ctx.source(c) != "cpu":
            return []                         # one shared host copy: never from disk
        out = []
        for devs in self._sets(ctx, c, rooms):
            hr = share_headroom(ctx, c, max(share_items(ctx, c, devs)))
            if rule.float_res and all(geo.total + hr <= rooms[d] for d in devs):
                out.append(self.batch(ctx, c, devs, "resident", False))
            if not (rule.stream and geo.n >= 2):
                continue
            for depth in range(ctx.depth_for(c), -1, -1):
                for k in self._prefixes(ctx, c, devs, rooms, hr, depth):
                    if k != geo.n:            # all resident: the resident option
                        out.append(self.batch(ctx, c, devs, "stream", False, k, depth))
        return [o for o in out if o is not None]

    def _prefixes(self, ctx, c, devs, rooms, hr, depth) -> List[int]:
        """The prefix every device streams with: the cheapest, priced as the batch prices
        it, of those every device fits (at most the largest all of them fit). The cost is
        not monotone in the prefix (the ring's stall; a component run a few times saves
        more by streaming a block than by loading it), so a smaller prefix, which a
        smaller room would force, may price best: offering it here too keeps the batch's
        cheapest in a room no dearer than in any smaller one (the search's bounds rest on
        that, fit/search.py). Walked down from the largest like streamed.best_prefix,
        each prefix's floor (no stall, the ideal forward) checked before it is priced:
        when a streamed byte costs more over the forwards than its load saves
        (runs x (1 - overlap) x slowest link >= fastest link) the floor only grows as the
        prefix shrinks, so the walk stops once it passes the best."""
        geo, w = ctx.geos[c], ctx.work[c]
        if ctx.rules[c].prefix_zero:
            return [0] if all(geo.stream_weights(0, depth) + hr <= rooms[d]
                              for d in devs) else []
        fits = [geo.best_prefix(rooms[d] - hr, depth) for d in devs]
        if any(k is None for k in fits):
            return []
        room = min(rooms[d] for d in devs) - hr
        counts = share_items(ctx, c, devs)
        names = [ctx.gpus[d] for d in devs]
        bws = [ctx.model.source_bandwidth(n, "cpu") for n in names]
        computes = [ctx.compute_s(c, n / w.items, d) for d, n in zip(devs, counts)]
        gather = max((ctx.model.hop_s(w.activation_bytes * n // w.items, names[j], names[0])
                      for j, n in enumerate(counts) if j and n), default=0.0)
        fewest = w.runs * (1 - STREAM_OVERLAP) * min(bws) >= max(bws)
        best = None
        for k in range(min(fits), -1, -1):
            if geo.stream_weights(k, depth) > room:
                continue
            if best is not None:
                streamed = geo.streamed_bytes(k)
                ideal = max(streamed_forward(cs, streamed / bw, depth, geo.n - k)
                            for cs, bw, n in zip(computes, bws, counts) if n) + gather
                floor = w.runs * ideal + (geo.non_block + geo.prefix[k]) / min(bws)
                if floor >= best[0]:
                    if fewest:
                        break
                    continue
            o = self.batch(ctx, c, devs, "stream", False, k, depth)
            if o is not None and (best is None or o.cost < best[0]):
                best = (o.cost, k)
        return [] if best is None else [best[1]]

    def batch(self, ctx, c, devs, each, persistent, k=0, depth=0, source="cpu"):
        return ctx.memo(("batch", c, tuple(devs), each, persistent, k, depth, source),
                        lambda: self._price(ctx, c, list(devs), each, persistent, k, depth,
                                            source))

    def _price(self, ctx, c, devs, each, persistent, k, depth, source) -> Optional[Option]:
        geo, w = ctx.geos[c], ctx.work[c]
        if len(devs) < 2:
            return None
        counts = share_items(ctx, c, devs)
        names = [ctx.gpus[d] for d in devs]
        hr = share_headroom(ctx, c, max(counts))
        streamed = geo.streamed_bytes(k) if each == "stream" else 0
        resident = geo.non_block + geo.prefix[k] if each == "stream" else geo.total

        def forward(d: int, share: float) -> float:
            compute = ctx.compute_s(c, share, d)
            if each != "stream":
                return compute
            bw = ctx.model.source_bandwidth(ctx.gpus[d], source)
            stall = ring_stall(geo, compute, k, bw, depth)
            return streamed_forward(compute, streamed / bw, depth, geo.n - k, stall)

        # a device without a share (a batch smaller than the devices) holds its copy idle
        times = [forward(d, n / w.items) for d, n in zip(devs, counts) if n]
        gather = max((ctx.model.hop_s(w.activation_bytes * n // w.items, names[j], names[0])
                      for j, n in enumerate(counts) if j and n), default=0.0)
        ideal = max(times) + gather
        serial = forward(devs[0], 1.0)
        detail = BatchDetail(each, dict(zip(names, counts)), serial,
                             k if each == "stream" else 0, depth if each == "stream" else 0)
        o = Option(c, self, names, w.runs, ctx.phase_of[c],
                   names[0] if persistent else source, detail)
        o.forward_s = ideal + (1 - BATCH_PARALLEL_EFFICIENCY) * max(0.0, serial - ideal)
        o.compute_s = max(ctx.compute_s(c, n / w.items, d) for d, n in zip(devs, counts))
        o.hops = sum(1 for n in counts[1:] if n)
        o.transfer_s = (streamed / min(ctx.model.source_bandwidth(n, source) for n in names)
                        if streamed else 0.0) + gather
        o.resident_bytes, o.streamed_bytes = resident, streamed
        if persistent:
            o.persist = {d: geo.total for d in devs}
            o.use = {d: hr for d in devs}
        else:
            held = geo.stream_weights(k, depth) if each == "stream" else geo.total
            o.use = {d: held + hr for d in devs}
            o.loaded_bytes = resident * len(devs)
            # each device loads over its own link, all from the one host copy
            o.load_s = resident / min(ctx.model.source_bandwidth(n, source) for n in names)
            o.host_persist = geo.total if source == "cpu" else 0   # one shared copy
        return o.priced()

    def where(self, o) -> str:
        return f"{o.detail.each} on {'&'.join(o.runtime)}"

    def to_plan(self, ctx, o, cp) -> None:
        cp.parallel = "batch"
        if o.detail.each == "stream":
            cp.stream = StreamPlan(o.detail.resident_blocks, o.detail.depth, 0)

    def fit_json(self, ctx, o) -> dict:
        return dict(super().fit_json(ctx, o), items_per_device=dict(o.detail.shares),
                    serial_forward_s=o.detail.serial_s or None)

    def reasons(self, ctx, o, use) -> List[str]:
        c, geo, b = o.comp, ctx.geos[o.comp], o.detail
        shares = ", ".join(f"{n} {k}" for n, k in b.shares.items())
        if b.each == "stream":
            each = (f"streamed on each ({b.resident_blocks} of {geo.n} blocks resident, "
                    f"{fmt(o.streamed_bytes)} {per(o)} over each device's own link, "
                    f"prefetch depth {b.depth}) from one shared host copy on {o.source}")
        elif o.persistent:
            each = "resident on each for the session"
        else:
            each = (f"on each only while {action(o)} runs, loaded from one shared host copy "
                    f"on {o.source}")
        asked = "parallel batch asked; " if ctx.rules[c].only == self.name else ""
        return [f"{asked}batch of {ctx.work[c].items} per forward -> batch parallel over "
                f"{'&'.join(o.runtime)}: the whole {c} on each device, {each}; items per "
                f"device {shares}; {ms(o.forward_s)} per forward vs {ms(b.serial_s)} on "
                f"{o.runtime[0]} alone"]

    def failure(self, ctx, c, options, budgets, host, inventory):
        """Asked and fits nowhere: each device must hold or stream the whole component,
        and the shared host copy must fit host RAM."""
        geo, rule = ctx.geos[c], ctx.rules[c]
        devs = [ctx.gidx[n] for n in rule.runtime if n in ctx.gidx] if rule.runtime \
            else sorted(ctx.devices(c), key=lambda d: -ctx.budget[d])[:2]
        names = "&".join(ctx.gpus[d] for d in devs) or "two GPUs"
        if len(devs) < 2:
            return PlacementError(f"auto-fit: {c}: parallel batch needs two or more GPUs it "
                                  f"may run on and there are {len(devs)}; drop parallel batch")
        need, how = geo.total + geo.headroom, "whole"
        if rule.stream and geo.n >= 2:
            need, how = min(need, geo.stream_weights(0, 0) + geo.headroom), \
                "streamed with no resident block"
        low = min(devs, key=lambda d: ctx.budget[d])
        if need > ctx.budget[low]:
            short = need - ctx.budget[low]
            return PlacementError(
                f"auto-fit: {c}: parallel batch over {names} needs at least {fmt(need)} on "
                f"each device ({how}, working memory {fmt(geo.headroom)}) and "
                f"{ctx.gpus[low]} has {fmt(ctx.budget[low])}, short by {fmt(short)}; "
                f"{gpu_change(ctx.gpus[low], short, budgets, options, inventory)}, or drop "
                f"parallel batch")
        return PlacementError(
            f"auto-fit: {c}: parallel batch over {names} needs its one shared host copy "
            f"({fmt(geo.total)}) in host RAM beside the rest (budget {fmt(ctx.host_budget)}), "
            f"or room on each device; raise the host budget, or drop parallel batch")


BATCH_PARALLEL = BatchParallelKind()
