"""Floors that hold in every room: what the search's bounds rest on (search.py).

The search bounds a component by its cheapest placement with every GPU to itself, and a
component set to take turns by its cheapest in the room left at that point. Both hold
only where a kind never offers, in less room, a placement cheaper than its cheapest in
more. The whole-on-one-GPU kinds, streaming on one GPU, the CPU and (on interchangeable
GPUs) batch parallel are such kinds. The others pick their layout from the room they are
given (the device set from the roomiest GPUs, the ranges in proportion to room, the
prefix the room allows, the device a worker's range takes, a split priced only when
nothing whole fits), and a layout a smaller room forces may price below every one the
full budget gives. Such a kind answers Kind.bound: a cost no placement it offers goes
below in any room within the budgets, found from the component's work and the devices'
figures alone (no layout, no room). The helpers below are what those floors share.
"""
from typing import Iterable, List, Sequence

from .costs import STREAM_OVERLAP


def split_pool(ctx, c: str, local: bool = False) -> List[int]:
    """Every GPU a split of `c` may use in some room within the budgets
    (FitContext.split_sets): the asked runtime list (two or more devices), else every GPU
    the rules allow whose budget holds more than c's working memory; `local`: without
    the workers' GPUs."""
    rule = ctx.rules[c]
    if rule.runtime is not None and len(rule.runtime) > 1:
        devs = [ctx.gidx[n] for n in rule.runtime if n in ctx.gidx]
    else:
        hr = ctx.geos[c].headroom
        devs = [d for d in range(ctx.G) if (rule.gpus is None or ctx.gpus[d] in rule.gpus)
                and ctx.budget[d] > hr]
    return [d for d in devs if not (local and d in ctx.remote)]


def fastest_compute(ctx, c: str, devs: Iterable[int]) -> float:
    """Seconds of one forward of the whole of `c` on the fastest of `devs`: a split's
    devices together never compute it faster (each computes its share at its speed)."""
    return min((ctx.compute_s(c, 1.0, d) for d in devs), default=float("inf"))


def least_hop(ctx, nbytes: int, froms: Sequence[int], tos: Sequence[int]) -> float:
    """The cheapest crossing of `nbytes` from a device of `froms` to another of `tos`
    (CostModel.hop_s over the distinct link figures of those pairs, found once a fit)."""
    figures = ctx.memo(("link figures", tuple(froms), tuple(tos)), lambda: tuple(
        {ctx.model.link(ctx.gpus[a], ctx.gpus[b])[1:3] for a in froms for b in tos
         if a != b}))
    return min((nbytes / bw + latency for bw, latency in figures), default=float("inf"))


def fastest_link(ctx, c: str, devs: Iterable[int]) -> float:
    """The fastest link from where c's weights rest (host RAM or disk) to `devs`."""
    source = ctx.source(c)
    return max((ctx.model.source_bandwidth(ctx.gpus[d], source) for d in devs),
               default=0.0)


def stream_floor(runs: int, compute: float, blocks: int, total: int, least: int,
                 bw: float) -> float:
    """Seconds no placement goes below that computes `compute` per forward (`runs`
    forwards) and streams S of the `blocks` bytes each forward (S >= `least`) over links
    of at most `bw`, loading the other total - S bytes once at most `bw`. Per device a
    streamed forward costs at least max(c, t) + (1 - overlap) x min(c, t) (no stall, no
    block overhead), which is at least c + (1 - overlap) t and t + (1 - overlap) c; summed
    over the devices, at least those of the sums. The cost is then piecewise linear in S
    with one kink (where t = c): its least is at an end or at the kink."""
    if bw <= 0:
        return float("inf")
    lose = 1 - STREAM_OVERLAP
    least = max(0, min(least, blocks))

    def cost(s: float) -> float:
        t = s / bw
        return runs * max(compute + lose * t, t + lose * compute) + (total - s) / bw
    kink = min(max(compute * bw, least), blocks)
    return min(cost(least), cost(blocks), cost(kink))
