"""VAE tiles before the CPU: the tile sizes auto-fit may decode an image in, what each
needs and costs.

A tiled decode (ComfyUI's VAE.decode_tiled, run by runtime/comfy/apply/vae_tiles.py) decodes
square tiles of `tile` pixels with a 64-pixel overlap, in three passes ((t/2 x 2t),
(2t x t/2), (t x t): ComfyUI blends them to hide the seams). Working memory scales with
the tile's area instead of the frame's; compute with the pixels the three passes
decode, overlaps included.
"""
import math
from typing import List, NamedTuple, Optional, Tuple

from ..metadata.headroom import WORKSPACE

# tile edges tried, largest first; 256 px is what ComfyUI itself falls back to on an
# out-of-memory error, the smallest that keeps seams invisible in practice
TILE_LADDER = (1024, 768, 512, 384, 256)
OVERLAP_PX = 64
# image VAEs decode_tiled handles in 2-D; video VAEs it tiles in time and space (3-D)
TILED_ARCHS = ("vae", "taesd")
VIDEO_ARCHS = ("wan_vae", "ltxv_vae", "hunyuan_vae")
# frames per temporal tile, largest first, and their overlap (VAE Decode (Tiled)'s
# temporal_size default is 64, temporal_overlap 8)
TIME_LADDER = (64, 32, 16, 8)
TIME_OVERLAP = 8


class Tile(NamedTuple):
    edge: int            # pixels
    headroom: int        # working memory while decoding one tile
    work: float          # pixels decoded / pixels of the frame (3 passes, overlaps)
    frames: Optional[int] = None     # video: frames per temporal tile; None: all of them


def _pass_pixels(size: int, tile: int, overlap: int) -> int:
    """Pixels one pass decodes along one axis: tiles of `tile` stepping tile - overlap."""
    if tile >= size:
        return size
    count = math.ceil((size - overlap) / (tile - overlap))
    return count * tile


def work_factor(edge: int, resolution: Tuple[int, int]) -> float:
    width, height = resolution
    overlap = min(OVERLAP_PX, edge // 4)
    decoded = 0
    for tx, ty in ((edge // 2, edge * 2), (edge * 2, edge // 2), (edge, edge)):
        decoded += _pass_pixels(width, tx, overlap) * _pass_pixels(height, ty, overlap)
    return decoded / float(width * height)


def tiles_for(info, headroom: int, resolution: Tuple[int, int], frames: int = 1) -> List[Tile]:
    """The tiles worth planning for a VAE at `resolution` (smaller than the frame),
    largest first; [] when the component is not an image VAE ComfyUI tiles in 2-D."""
    if info.component != "vae":
        return []
    archs = set((info.arch or "").split("+"))
    if frames > 1:
        video = archs & set(VIDEO_ARCHS)
        return _video_tiles(sorted(video)[0], headroom, resolution, frames) if video else []
    if not archs & set(TILED_ARCHS):
        return []
    width, height = resolution
    pixels = width * height
    activations = max(0, headroom - WORKSPACE)
    out = []
    for edge in TILE_LADDER:
        if edge * edge >= pixels or edge >= max(width, height):
            continue
        need = WORKSPACE + math.ceil(activations * edge * edge / pixels)
        out.append(Tile(edge, need, work_factor(edge, resolution)))
    return out


def _time_share(arch: str, t: int, frames: int) -> float:
    """The share of the full clip's working memory one temporal tile of t frames needs
    (the shapes of placement/metadata/headroom.vae: LTXV's grows with the frames,
    HunyuanVideo's up to 8 of them, Wan's decodes frame by frame with a cache)."""
    if arch == "ltxv_vae":
        return min(1.0, t / frames)
    if arch == "hunyuan_vae":
        return min(1.0, min(8, t) / min(8, frames))
    return 1.0


def _time_work(t: int, frames: int) -> float:
    if t >= frames:
        return 1.0
    # VAE Decode (Tiled)'s rule, which runtime/comfy/vae_tiles.tile_args follows
    overlap = TIME_OVERLAP if t >= 2 * TIME_OVERLAP else TIME_OVERLAP // 2
    count = math.ceil((frames - overlap) / (t - overlap))
    return count * t / frames


def _video_tiles(arch: str, headroom: int, resolution: Tuple[int, int], frames: int) -> List[Tile]:
    """Tiles in time and space for a video VAE (ComfyUI's decode_tiled_3d), the largest
    working memory first; the full clip at full frame is not a tile."""
    width, height = resolution
    pixels = width * height
    activations = max(0, headroom - WORKSPACE)
    edges = [e for e in TILE_LADDER if e * e < pixels and e < max(width, height)]
    times = [t for t in TIME_LADDER if t < frames]
    out = []
    for edge in [None] + edges:
        area = 1.0 if edge is None else edge * edge / pixels
        space_work = 1.0 if edge is None else work_factor(edge, resolution)
        for t in [None] + times:
            if edge is None and t is None:
                continue
            share = 1.0 if t is None else _time_share(arch, t, frames)
            if edge is None and share >= 1.0:
                continue            # a time tile that saves no memory is no tile
            need = WORKSPACE + math.ceil(activations * area * share)
            work = space_work * (1.0 if t is None else _time_work(t, frames))
            out.append(Tile(edge if edge is not None else max(width, height), need, work, t))
    out.sort(key=lambda tile: (-tile.headroom, tile.work))
    return out
