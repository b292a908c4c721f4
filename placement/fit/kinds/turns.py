"""Taking turns: the whole component on a GPU only while its phase runs (text encode,
sampling and decode never run at once, so they share the room); its weights rest in
host RAM, on disk, or on another GPU (params asked there) and are loaded each
generation."""
from typing import List

from ...units import format_bytes as fmt
from ..option import Option, PHASE_ORDER
from .base import Kind, action, ms, room_without, size_line
from .resident import whole_on


class TurnsKind(Kind):
    name = "turns"
    decision = "resident"
    whole = True
    moves_to_disk = True

    def floating(self, ctx, c, rooms, offered) -> List[Option]:
        rule, geo = ctx.rules[c], ctx.geos[c]
        if not (rule.float_res or rule.params_elsewhere):
            return []
        out = []
        for d in ctx.distinct_devices(c, rooms):
            if geo.total + geo.headroom > rooms[d]:
                continue
            if rule.float_res:
                out.append(whole_on(ctx, self, c, d, False, ctx.source(c)))
            if rule.params_elsewhere:
                out.append(whole_on(ctx, self, c, d, False, params_on=ctx.gidx[rule.params]))
        return out

    def to_disk(self, ctx, o, over):
        return whole_on(ctx, self, o.comp, ctx.gidx[o.runtime[0]], False, "disk")

    def reasons(self, ctx, o, use) -> List[str]:
        d = ctx.gidx[o.runtime[0]]
        return [f"{size_line(ctx, o.comp)} <= {o.runtime[0]} room "
                f"{fmt(room_without(ctx, use, o, d))} while {action(o)} runs -> on "
                f"{o.runtime[0]} only then; params rest on {o.source}, "
                f"{fmt(o.loaded_bytes)} loaded per generation ({ms(o.load_s)})"
                + _why_turns(ctx, use, o, d)]


def _why_turns(ctx, use, o, d: int) -> str:
    """Why a component that takes turns does not stay on its GPU for the session."""
    geo = ctx.geos[o.comp]
    for p, phase in enumerate(PHASE_ORDER):
        if p == o.phase:
            continue
        if use[p][d] + geo.total > ctx.budget[d]:
            return (f" (kept there it would leave {phase} {fmt(ctx.budget[d] - use[p][d])} "
                    f"of the {fmt(geo.total)} it needs)")
    if not ctx.rules[o.comp].persist_res:
        return ""
    return " (cheaper overall than keeping it there)"


TURNS = TurnsKind()
