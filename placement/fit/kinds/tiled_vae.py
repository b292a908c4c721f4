"""Tiled VAE: a VAE whose full-frame decode does not fit its GPU decodes in tiles
(ComfyUI's decode_tiled, run by runtime/comfy/apply/vae_tiles.py) before it is sent to the
CPU. The tile ladder and what each tile needs and costs are tiles.py's; this kind picks
the largest tile that fits, resident for the session or taking turns."""
from typing import List

from ...units import format_bytes as fmt
from ..option import Option
from .base import Kind, action, ms, room_without, size_line
from .resident import persistent_devices, whole_on


def tile_within(ctx, c: str, room: int):
    """The largest tile whose working memory fits `room` (None: none does)."""
    for tile in ctx.tiles.get(c, ()):
        if tile.headroom <= room:
            return tile
    return None


class TiledVaeKind(Kind):
    name = "tiled_vae"
    decision = "resident"
    whole = True
    moves_to_disk = True

    def persistent(self, ctx, c, room, offered) -> List[Option]:
        geo = ctx.geos[c]
        if not ctx.rules[c].persist_res or not ctx.tiles.get(c):
            return []
        out = []
        for d in persistent_devices(ctx, c, room):
            # full-frame working memory does not fit beside the rest: a tile may
            if geo.total <= room.caps[d] or geo.total > room.weights_room(d):
                continue
            tile = tile_within(ctx, c, room.phase_room(d) - geo.total)
            if tile is not None:
                out.append(whole_on(ctx, self, c, d, True, tile=tile))
        return out

    def floating(self, ctx, c, rooms, offered) -> List[Option]:
        geo = ctx.geos[c]
        if not ctx.rules[c].float_res or not ctx.tiles.get(c):
            return []
        out = []
        for d in ctx.distinct_devices(c, rooms):
            if geo.total + geo.headroom <= rooms[d]:
                continue                       # the full frame fits: no tile
            tile = tile_within(ctx, c, rooms[d] - geo.total)
            if tile is not None:               # tiles before the CPU
                out.append(whole_on(ctx, self, c, d, False, ctx.source(c), tile=tile))
        return out

    def to_disk(self, ctx, o, over):
        return whole_on(ctx, self, o.comp, ctx.gidx[o.runtime[0]], False, "disk",
                        tile=o.detail)

    def to_plan(self, ctx, o, cp) -> None:
        cp.tile = o.detail.edge
        cp.tile_frames = o.detail.frames

    def reasons(self, ctx, o, use) -> List[str]:
        tile, name = o.detail, o.runtime[0]
        room = room_without(ctx, use, o, ctx.gidx[name])
        frames = f" x {tile.frames} frames" if tile.frames else ""
        where = (f"resident on {name} for the session" if o.persistent else
                 f"on {name} while {action(o)} runs, params on {o.source}")
        return [f"{size_line(ctx, o.comp)} (full frame) > {name} room {fmt(room)} -> "
                f"decoded in {tile.edge}x{tile.edge} px{frames} tiles (ComfyUI's tiled "
                f"decode, {fmt(tile.headroom)} working memory, {tile.work:.1f}x the "
                f"full-frame pixels: {ms(o.compute_s)}), {where}; the cpu only when the "
                f"smallest tile does not fit"]


TILED_VAE = TiledVaeKind()
