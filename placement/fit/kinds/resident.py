"""Resident: the whole component on one GPU for the session (weights loaded once).

`whole_on` builds every placement of the whole component on one GPU: this kind's, and
those of turns.py (on the GPU only while its phase runs) and tiled_vae.py (a VAE
decoding in tiles), which differ in where the weights rest and in working memory."""
from typing import List, Optional

from ...units import format_bytes as fmt
from ..option import Option
from .base import Kind, room_without, size_line


def whole_on(ctx, kind: Kind, c: str, d: int, persistent: bool, source: str = "cpu",
             params_on: Optional[int] = None, tile=None) -> Option:
    """Whole on GPU d. persistent: rests there; params_on: rests on that other GPU and
    is copied over while its phase runs; else rests in `source` (cpu or disk). `tile`
    (tiles.Tile): a VAE decoding in tiles, with the tile's working memory and the
    passes' extra compute."""
    return ctx.memo(("whole", kind.name, c, d, persistent, source, params_on, tile),
                    lambda: _whole_on(ctx, kind, c, d, persistent, source, params_on, tile))


def _whole_on(ctx, kind, c, d, persistent, source, params_on, tile) -> Option:
    geo, w = ctx.geos[c], ctx.work[c]
    name = ctx.gpus[d]
    hr = geo.headroom if tile is None else tile.headroom
    if persistent:
        source = name
    elif params_on is not None:
        source = ctx.gpus[params_on]
    o = Option(c, kind, [name], w.runs, ctx.phase_of[c], source, tile)
    o.resident_bytes = geo.total
    o.compute_s = o.forward_s = ctx.compute_s(c, 1.0, d) * (tile.work if tile else 1.0)
    if persistent:
        o.persist, o.use = {d: geo.total}, {d: hr}
    elif params_on is not None:                       # rests on another GPU
        o.persist, o.use = {params_on: geo.total}, {d: geo.total + hr}
        o.loaded_bytes = geo.total
        o.load_s = geo.total / ctx.model.peer(source, name)
    else:
        o.use = {d: geo.total + hr}
        o.loaded_bytes = geo.total
        o.load_s = geo.total / ctx.model.source_bandwidth(name, source)
        o.host_persist = geo.total if source == "cpu" else 0
    return o.priced()


def persistent_devices(ctx, c: str, room):
    """The GPUs c may rest on for the session, once per equal (budget, held, speed)."""
    seen = set()
    for d in ctx.devices(c):
        sig = (ctx.budget[d], room.free[d], tuple(e[d] for e in room.extra),
               ctx.tp[d], ctx.bw[d])
        if sig not in seen:
            seen.add(sig)
            yield d


class ResidentKind(Kind):
    name = "resident"
    decision = "resident"
    whole = True

    def persistent(self, ctx, c, room, offered) -> List[Option]:
        if not ctx.rules[c].persist_res:
            return []
        geo = ctx.geos[c]
        return [whole_on(ctx, self, c, d, True) for d in persistent_devices(ctx, c, room)
                if geo.total <= room.caps[d]]

    def reasons(self, ctx, o, use) -> List[str]:
        d = ctx.gidx[o.runtime[0]]
        return [f"{size_line(ctx, o.comp)} <= {o.runtime[0]} room "
                f"{fmt(room_without(ctx, use, o, d))} -> resident on {o.runtime[0]} for the "
                f"session"]


RESIDENT = ResidentKind()
