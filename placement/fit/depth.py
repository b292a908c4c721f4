"""The ring depth auto-fit plans at when prefetch_depth is not set, and its reason line."""
from typing import Dict, List, Tuple

from ..layout import choose_depth
from .option import block_seconds

AUTO_STALL_SHARE = 0.02       # auto depth: the smallest ring losing at most this of a step
AUTO_MAX_DEPTH = 8


def auto_depths(geos, work, rules, gpus, model) -> Dict[str, Tuple[int, List[float]]]:
    """Per component the ring depth to plan at when prefetch_depth is not set: the
    smallest whose predicted stall (layout.ring_schedule over its blocks, all streamed,
    at each GPU's throughput and link) is <= AUTO_STALL_SHARE of the step, the deepest
    any GPU needs; with the stall share per depth up to it. The search still prices
    every depth from it down to 0 (a deeper ring holds fewer resident blocks) and keeps
    the fastest."""
    out = {}
    seen = {}       # equal GPUs (same throughput and link) give the same answer
    for c, geo in geos.items():
        if geo.n < 2:
            out[c] = (1, [])
            continue
        source = "disk" if rules[c].params == "disk" else "cpu"
        best = (1, [])
        for g in gpus:
            bw = model.source_bandwidth(g, source)
            if not bw or bw <= 0:
                continue
            key = (c, model.throughput[g], bw)
            if key not in seen:
                compute = work[c].flop / model.throughput[g]
                kept = ("auto depth", compute, bw)   # the model's table (geometry.py)
                if kept not in geo.stalls:
                    comp, trans, sizes, _ = block_seconds(geo, compute, 0, bw)
                    geo.stalls[kept] = choose_depth(comp, trans, sizes, AUTO_MAX_DEPTH,
                                                    AUTO_STALL_SHARE)
                depth, shares = geo.stalls[kept]
                seen[key] = (depth, list(shares))
            got = seen[key]
            if got[0] > best[0]:
                best = got
            elif not best[1]:
                best = got
        out[c] = best
    return out


def depth_reasons(result, auto, asked) -> None:
    """A reason line per streamed component: the depth and why, before the decision's
    line (which stays last: the editor and the table show the last reason)."""
    for c, cp in result.components.items():
        if cp.stream is None:
            continue
        d = cp.stream.prefetch_depth
        if asked is not None:
            _before_last(cp.reasons, f"prefetch depth {d}: prefetch_depth {asked} as set"
                         + (" (the fastest depth up to it)" if d != asked else ""))
            continue
        want, shares = auto.get(c, (d, []))
        by = ", ".join(f"{i}: {s:.0%}" for i, s in enumerate(shares, start=1))
        why = (f"the smallest ring whose predicted stall is <= {AUTO_STALL_SHARE:.0%} of the "
               f"step" if shares and shares[-1] <= AUTO_STALL_SHARE
               else "the ring with the least predicted stall")
        line = f"prefetch depth {want}: {why}" + (f" (stall by depth {by})" if by else "")
        if d != want:
            line += (f"; planned at depth {d}: a shallower ring leaves room for more "
                     f"resident blocks and was priced faster")
        _before_last(cp.reasons, line)


def _before_last(reasons, line) -> None:
    reasons.insert(max(0, len(reasons) - 1), line)
