"""VAE tiles before the CPU: the tile sizes auto-fit may decode an image in, what each
needs and costs.

A tiled decode (ComfyUI's VAE.decode_tiled, run by runtime/comfy/vae_tiles.py) decodes
square tiles of `tile` pixels with a 64-pixel overlap, in three passes ((t/2 x 2t),
(2t x t/2), (t x t): ComfyUI blends them to hide the seams). Working memory scales with
the tile's area instead of the frame's; compute with the pixels the three passes
decode, overlaps included.
"""
import math
from typing import List, NamedTuple, Tuple

from .metadata.headroom import WORKSPACE

# tile edges tried, largest first; 256 px is what ComfyUI itself falls back to on an
# out-of-memory error, the smallest that keeps seams invisible in practice
TILE_LADDER = (1024, 768, 512, 384, 256)
OVERLAP_PX = 64
# image VAEs decode_tiled handles in 2-D (video VAEs tile in time as well: not planned)
TILED_ARCHS = ("vae", "taesd")


class Tile(NamedTuple):
    edge: int            # pixels
    headroom: int        # working memory while decoding one tile
    work: float          # pixels decoded / pixels of the frame (3 passes, overlaps)


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
    if info.component != "vae" or frames > 1:
        return []
    if not set((info.arch or "").split("+")) & set(TILED_ARCHS):
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
