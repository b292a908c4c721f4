"""Pipeline: a resident layer split whose stages run a batch's shares one behind the
other (runtime/split/pipeline.py: stage k computes share s while stage k+1 computes
share s-1). Priced for every resident layer split of layer_split.py when the batch has
two or more items; asked (parallel pipeline), it is the only placement priced."""
from typing import List, NamedTuple, Optional

from ...errors import PlacementError
from ...remote_devices import is_remote
from ...units import format_bytes as fmt
from ..costs import PIPELINE_EFFICIENCY
from ..option import Option
from .base import Kind, ms
from ..bounds import fastest_compute, fastest_link, least_hop
from .layer_split import LAYER_SPLIT, split_pool_for


class PipelineDetail(NamedTuple):
    split: Option             # the plain layer split it pipelines
    serial_s: float           # that split's forward


class PipelineKind(Kind):
    name = "pipeline"
    decision = "split"
    parallel = "pipeline"

    def persistent(self, ctx, c, room, offered) -> List[Option]:
        return self._of(ctx, c, lambda: LAYER_SPLIT.persistent(ctx, c, room, offered))

    def floating(self, ctx, c, rooms, offered) -> List[Option]:
        return self._of(ctx, c, lambda: LAYER_SPLIT.floating(ctx, c, rooms, offered))

    def bound(self, ctx, c, persistent) -> Optional[float]:
        """Its splits are layer_split's, which are priced only when nothing whole fits
        equal GPUs (a plain split only adds hops there, a pipelined one need not) and
        whose stages follow the room (less room may even them). Room-free, over the K
        local GPUs allowed: the plain split's forward F at least the whole forward C on
        the fastest GPU and two crossings; the stages' ideal at least C / b and two
        crossings of a share, plus (b - 1) x the largest stage, at least their mean
        over K stages; the pipelined forward at least (1 - e) x F + e x min(F, ideal)."""
        rule, w = ctx.rules[c], ctx.work[c]
        force = rule.only == self.name
        if not force and (not rule.pipeline or w.items < 2):
            return None
        devs = [d for d in split_pool_for(ctx, c, persistent, "layer")
                if d not in ctx.remote]
        if len(devs) < 2:
            return None
        b = max(1, w.items)
        compute = fastest_compute(ctx, c, devs)
        hop = least_hop(ctx, w.activation_bytes, devs, devs)
        share_hop = least_hop(ctx, w.activation_bytes // b, devs, devs)
        plain = compute + 2 * hop
        ideal = compute / b + 2 * share_hop + (b - 1) * (compute / (b * len(devs)) + share_hop)
        fwd = (1 - PIPELINE_EFFICIENCY) * plain + PIPELINE_EFFICIENCY * min(plain, ideal)
        return w.runs * fwd + (0.0 if persistent else
                               ctx.geos[c].total / fastest_link(ctx, c, devs))

    def _of(self, ctx, c, splits) -> List[Option]:
        rule = ctx.rules[c]
        force = rule.only == self.name
        if not force and (not rule.pipeline or ctx.work[c].items < 2):
            return []
        return [p for p in (self.pipelined(ctx, o, force) for o in splits()) if p is not None]

    def pipelined(self, ctx, o: Option, force: bool = False) -> Optional[Option]:
        """`o` (a resident layer split) with the batch's shares pipelined through its
        stages. Per share a stage takes u_j = its compute / b + the hop it sends; the
        shares take sum(u) + (b - 1) x max(u) (fill, steady state, drain), of whose
        saving over the plain split PIPELINE_EFFICIENCY is realised. None: remote ranges
        (run one by one), or a batch of 1 unless `force` (parallel pipeline asked: one
        share, priced as the plain split)."""
        if any(map(is_remote, o.runtime)):
            return None
        return ctx.memo(("pipeline", id(o), force), lambda: self._price(ctx, o, force))

    def _price(self, ctx, o, force) -> Optional[Option]:
        c = o.comp
        geo, w = ctx.geos[c], ctx.work[c]
        b = w.items
        if b < 2 and not (force and b >= 1):
            return None
        devs = [ctx.gidx[n] for n in o.runtime]
        stage = []
        for j, (first, last) in enumerate(o.detail.ranges):
            held = geo.prefix[last + 1] - geo.prefix[first] + (geo.non_block if j == 0 else 0)
            nxt = o.runtime[(j + 1) % len(o.runtime)]
            stage.append(ctx.compute_s(c, held / (geo.total or 1), devs[j]) / b
                         + ctx.model.hop_s(w.activation_bytes // b, o.runtime[j], nxt))
        ideal = sum(stage) + (b - 1) * max(stage)
        got = Option(c, self, list(o.runtime), o.runs, o.phase, o.source,
                     PipelineDetail(o, o.forward_s))
        for name in ("persist", "use", "host_persist", "host_use", "resident_bytes",
                     "streamed_bytes", "loaded_bytes", "compute_s", "load_s"):
            setattr(got, name, getattr(o, name))
        got.forward_s = o.forward_s - PIPELINE_EFFICIENCY * max(0.0, o.forward_s - ideal)
        got.hops = o.hops * b
        got.transfer_s = o.transfer_s + (b - 1) * len(o.runtime) * (
            ctx.model.hop_s(0, o.runtime[0], o.runtime[-1]))
        return got.priced()

    def to_plan(self, ctx, o, cp) -> None:
        LAYER_SPLIT.to_plan(ctx, o.detail.split, cp)
        cp.parallel = "pipeline"

    def fit_json(self, ctx, o) -> dict:
        return dict(super().fit_json(ctx, o), serial_forward_s=o.detail.serial_s or None)

    def reasons(self, ctx, o, use) -> List[str]:
        c = o.comp
        items = ctx.work[c].items
        lines = LAYER_SPLIT.reasons(ctx, o.detail.split, use)
        if items < 2:
            return lines + [f"parallel pipeline asked; batch of {items} per forward -> "
                            f"pipelined, run as the plain split until a forward brings 2 or "
                            f"more (then the stages run the shares one behind the other)"]
        asked = "parallel pipeline asked; " if ctx.rules[c].only == self.name else ""
        return lines + [f"{asked}batch of {items} per forward -> pipelined: the stages run "
                        f"the batch's shares one behind the other, {ms(o.forward_s)} per "
                        f"forward vs {ms(o.detail.serial_s)} for the plain split"]

    def failure(self, ctx, c, options, budgets, host, inventory):
        """Asked and fits nowhere: a pipeline is a resident layer split (a streamed split
        is not pipelined), so the GPUs must hold the whole component together, each also
        its working memory; a split taking turns also needs its host copy in host RAM."""
        geo = ctx.geos[c]
        sets = ctx.split_sets(c, ctx.budget)
        devs = sets[-1] if sets else list(ctx.devices(c))
        names = "&".join(ctx.gpus[d] for d in devs) or "two GPUs"
        if len(devs) < 2:
            return PlacementError(f"auto-fit: {c}: parallel pipeline needs two or more GPUs "
                                  f"it may run on and there are {len(devs)}; drop parallel "
                                  f"pipeline")
        together = geo.total + len(devs) * geo.headroom
        have = sum(ctx.budget[d] for d in devs)
        if together > have:
            return PlacementError(
                f"auto-fit: {c}: parallel pipeline over {names} holds the whole {c} "
                f"({fmt(geo.total)}) across them, at least {fmt(together)} with working "
                f"memory {fmt(geo.headroom)} on each, and their budgets hold {fmt(have)}, "
                f"short by {fmt(together - have)} (a streamed split is not pipelined); raise "
                f"max_vram or free GPU memory, or drop parallel pipeline")
        return PlacementError(
            f"auto-fit: {c}: parallel pipeline over {names} fits neither beside the rest of "
            f"the plan on the GPUs nor taking turns with its host copy ({fmt(geo.total)}) in "
            f"host RAM (budget {fmt(ctx.host_budget)}); raise the host budget or max_vram, or "
            f"drop parallel pipeline")


PIPELINE = PipelineKind()
