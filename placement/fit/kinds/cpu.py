"""CPU: the component computes on the CPU from its weights in host RAM (or read from
disk each generation): asked, the last resort when no GPU has room, or when the cost
model predicts it faster than copying to a GPU."""
from typing import List

from ...units import format_bytes as fmt
from ..option import Option
from .base import Kind, ms, per


def on_cpu(ctx, c: str, source: str = "cpu") -> Option:
    return ctx.memo(("cpu", c, source), lambda: _on_cpu(ctx, c, source))


def _on_cpu(ctx, c, source) -> Option:
    geo, w = ctx.geos[c], ctx.work[c]
    disk = source == "disk"
    o = Option(c, CPU, ["cpu"], w.runs, ctx.phase_of[c], source)
    o.host_persist = 0 if disk else geo.total
    o.host_use = geo.headroom + (geo.total if disk else 0)
    o.resident_bytes = geo.total
    o.loaded_bytes = geo.total if disk else 0
    o.compute_s = o.forward_s = w.flop / ctx.cpu_tp
    o.load_s = geo.total / ctx.model.disk_bandwidth if disk else 0.0
    return o.priced()


class CpuKind(Kind):
    name = "cpu"
    decision = "cpu"
    moves_to_disk = True

    def floating(self, ctx, c, rooms, offered) -> List[Option]:
        return [on_cpu(ctx, c, ctx.source(c))] if ctx.rules[c].cpu else []

    def to_disk(self, ctx, o, over):
        return on_cpu(ctx, o.comp, "disk")

    def reasons(self, ctx, o, use) -> List[str]:
        c, geo, rule = o.comp, ctx.geos[o.comp], ctx.rules[o.comp]
        if rule.runtime == ["cpu"]:
            return [f"runs on cpu as asked, {ms(o.compute_s)} {per(o)}"]
        if not ctx.gpus:
            return [f"no GPU in the inventory -> runs on cpu, {ms(o.compute_s)} {per(o)}"]
        need = geo.total + geo.headroom
        if geo.n >= 2:
            need = min(need, geo.stream_weights(0, 0) + geo.headroom)
        most = max(ctx.budget[d] - use[o.phase][d] for d in range(ctx.G))
        on_gpu = (rule.gpus is None or len(rule.gpus) > 0) and any(
            (rule.persist_res, rule.float_res, rule.stream, rule.persist_split,
             rule.float_split))
        if on_gpu and need <= most:       # it had room: the cost model chose the cpu
            return [f"{c} needs at least {fmt(need)} on a GPU and {fmt(most)} is left, but "
                    f"the cpu is predicted faster ({ms(o.compute_s)} {per(o)}, no copies) -> "
                    f"runs on cpu"]
        return [f"{c} needs at least {fmt(need)} on a GPU, the most left beside the rest is "
                f"{fmt(most)} -> runs on cpu (last resort), {ms(o.compute_s)} {per(o)}"]


CPU = CpuKind()
