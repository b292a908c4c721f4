"""The plan's tiled VAE decode, run by ComfyUI's own tiler.

Auto-fit plans `ComponentPlan.tile` (pixels) for a VAE whose full-frame decode does not
fit its GPU (placement/fit/tiles.py, placement/fit/kinds/tiled_vae.py). VAEDecode calls
`vae.decode(samples)`; on the pack's placed copy of the VAE (never the loader's object)
that call becomes `decode_tiled` with the plan's tile (and, for a video VAE, its frames
per temporal tile) and ComfyUI's default overlap, exactly what the VAE Decode (Tiled)
node would run, so a plain VAEDecode in the workflow decodes in
tiles without editing the graph.
"""
from typing import List, Optional

OVERLAP_PX = 64      # VAE Decode (Tiled)'s default; a quarter of the tile when smaller
TIME_OVERLAP = 8     # frames; VAE Decode (Tiled)'s temporal_overlap default


def tile_args(vae, tile_px: int, tile_frames: Optional[int] = None) -> dict:
    """decode_tiled's arguments, in latent units, for square tiles of `tile_px` pixels
    and, for a video VAE, temporal tiles of `tile_frames` frames (as VAE Decode (Tiled)
    converts its temporal_size and temporal_overlap)."""
    compression = max(1, int(vae.spacial_compression_decode()))
    overlap = min(OVERLAP_PX, tile_px // 4)
    args = {"tile_x": max(1, tile_px // compression), "tile_y": max(1, tile_px // compression),
            "overlap": overlap // compression}
    temporal = vae.temporal_compression_decode() if tile_frames else None
    if temporal:
        frames = int(tile_frames)
        overlap_t = TIME_OVERLAP if frames >= 2 * TIME_OVERLAP else TIME_OVERLAP // 2
        args["tile_t"] = tile_t = max(2, frames // int(temporal))
        args["overlap_t"] = max(1, min(tile_t // 2, overlap_t // int(temporal)))
    return args


def decode_in_tiles(placed_vae, tile_px: int, tile_frames: Optional[int] = None) -> List[str]:
    """Make the placed copy's decode run ComfyUI's decode_tiled with the plan's tile."""
    args = tile_args(placed_vae, int(tile_px), tile_frames)

    def decode(samples_in, vae_options={}):      # VAE.decode's signature
        if getattr(placed_vae, "latent_dim", 2) == 2 and samples_in.ndim == 5:
            samples_in = samples_in[:, :, 0]        # as VAE.decode does for image latents
        return placed_vae.decode_tiled(samples_in, **args)

    placed_vae.decode = decode                      # an instance attribute on the copy
    placed_vae.placement_tile = int(tile_px)
    placed_vae.placement_tile_frames = tile_frames
    frames = f" x {tile_frames} frames" if tile_frames else ""
    return [f"vae: decodes in {tile_px}x{tile_px} px{frames} tiles (the plan's tile; "
            f"ComfyUI's decode_tiled, overlap {min(OVERLAP_PX, tile_px // 4)} px)"]
