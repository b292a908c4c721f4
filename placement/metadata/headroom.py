"""Compute headroom: the working memory a component needs beside its weights while it
runs, estimated from the latent shape and the architecture. Conservative on purpose
(over-reserving costs some speed, under-reserving an out-of-memory error). The
formulas and where their constants come from are in docs/metadata.md.

Every estimate is WORKSPACE (cuBLAS/attention workspaces and allocator slack) plus the
activations of the largest step:
  DiT        c * tokens * hidden * act_bytes,
             tokens = (ceil(W/px) * ceil(H/px) * latent_frames + text_tokens) * batch * cfg
  UNet       c * (W/8 * H/8) * batch * cfg * model_channels * act_bytes
  VAE decode elements_per_output_pixel * W * H * act_bytes (one sample: ComfyUI
             decodes as many samples at once as fit)
  text enc.  seq * (8 * hidden + f * ffn) * act_bytes (+ T5's materialised position bias);
             f = 4 for gated FFNs (T5 v1.1, UMT5, LLMs: gate, up, activation and product
             alive at once, as the simulated device's meter measured), 3 for CLIP
  upscaler   min(W*H, 512^2) * 3 * scale * 384 * 4  (ComfyUI upscales 512-pixel tiles in f32)
Unknown architectures get seed 003's fixed reserves (DiT 2 GiB, TE 2 GiB, VAE 1 GiB).
"""
import math
from typing import Iterable, NamedTuple, Optional, Tuple

from ..units import GiB, MiB, format_bytes

WORKSPACE = 256 * MiB

# seed 003: "reserves (DiT 2 GiB, TE 2 GiB, VAE 1 GiB)"; the others by kinship.
FALLBACK = {"diffusion": 2 * GiB, "controlnet": 2 * GiB, "te": 2 * GiB,
            "clip_vision": 2 * GiB, "photomaker": 2 * GiB, "vae": 1 * GiB, "upscaler": 1 * GiB}


class LatentShape(NamedTuple):
    width: int
    height: int
    frames: int = 1
    batch: int = 1


class DiT(NamedTuple):
    c: float            # activation widths alive at the peak, in units of `hidden`
    px: int             # output pixels per token side (VAE factor x patch size)
    temporal: int       # VAE time compression; 0: an image model
    text_tokens: int    # tokens of the prompt that join the attention
    cfg: int            # 2: cond and uncond run as one batch


# c calibrated against ComfyUI's memory_usage_factor (flash-attention path) and rounded
# up; see docs/metadata.md for the arithmetic.
DIT = {
    "flux": DiT(44, 16, 0, 512, 1), "chroma": DiT(44, 16, 0, 512, 2),
    "flux2": DiT(50, 16, 0, 512, 1), "sd3": DiT(44, 16, 0, 333, 2),
    "hidream": DiT(40, 16, 0, 512, 2), "auraflow": DiT(44, 16, 0, 256, 2),
    "hunyuan_video": DiT(28, 16, 4, 256, 1), "qwen_image": DiT(28, 16, 0, 1024, 2),
    "z_image": DiT(32, 16, 0, 512, 2), "lumina2": DiT(32, 16, 0, 512, 2),
    "wan": DiT(24, 16, 4, 512, 2), "ltxv": DiT(32, 32, 8, 256, 2),
    # Kandinsky 5: HunyuanVideo's VAE (8x, 4x in time), patch 2, Qwen2.5-VL text; its
    # constant by kinship with HunyuanVideo's (not calibrated: docs/metadata.md)
    "kandinsky5": DiT(28, 16, 4, 256, 2),
    "dit": DiT(44, 16, 0, 512, 2),
}
UNETS = {"sd1_unet", "sd2_unet", "sdxl_unet"}
UNET_C = 36
# VAE decode: activation elements per output pixel (frames handled per arch below).
VAE_ELEMENTS = {"taesd": 320, "wan_vae": 2200, "wan_vae_video": 7000,
                "ltxv_vae": 1200, "hunyuan_vae": 2800}
TEXT_SEQ = {"clip_l": 77, "clip_g": 77, "clip_h": 77, "clip": 77, "t5": 512, "umt5": 512,
            "llm": 1024, "vision": 1024}
VISION_SEQ = 577        # a 336-pixel CLIP ViT-L/14 image: 24 * 24 patches + class token
UPSCALE_TILE = 512


FIXED = "fixed reserve"


def fallback(component: str) -> Tuple[int, str]:
    value = FALLBACK.get(component, 2 * GiB)
    return value, f"{FIXED} {format_bytes(value)} (architecture not known)"


def dit(arch: str, hidden: int, shape: LatentShape, act_bytes: int, px: Optional[int] = None
        ) -> Tuple[int, str]:
    p = DIT.get(arch, DIT["dit"])
    px = px or p.px
    lat_frames = 1 + (max(shape.frames, 1) - 1) // p.temporal if p.temporal else 1
    image_tokens = math.ceil(shape.width / px) * math.ceil(shape.height / px) * lat_frames
    tokens = (image_tokens + p.text_tokens) * shape.batch * p.cfg
    act = int(p.c * tokens * hidden * act_bytes)
    return WORKSPACE + act, (f"{tokens} tokens x {hidden} hidden x {p.c:g} x {act_bytes} B "
                             f"+ {format_bytes(WORKSPACE)} workspace")


def unet(channels: int, shape: LatentShape, act_bytes: int) -> Tuple[int, str]:
    positions = math.ceil(shape.width / 8) * math.ceil(shape.height / 8) * shape.batch * 2
    act = UNET_C * positions * channels * act_bytes
    return WORKSPACE + act, (f"{positions} latent positions x {channels} channels x {UNET_C} x "
                             f"{act_bytes} B + {format_bytes(WORKSPACE)} workspace")


def vae(arch: str, top_channels: int, shape: LatentShape, act_bytes: int) -> Optional[Tuple[int, str]]:
    frames = max(shape.frames, 1)
    if arch == "vae":
        per_pixel = 17 * top_channels
    elif arch == "wan_vae":
        per_pixel = VAE_ELEMENTS["wan_vae" if frames == 1 else "wan_vae_video"]
    elif arch == "ltxv_vae":
        per_pixel = VAE_ELEMENTS["ltxv_vae"] * frames
    elif arch == "hunyuan_vae":
        per_pixel = VAE_ELEMENTS["hunyuan_vae"] * min(8, frames)
    elif arch == "taesd":
        per_pixel = VAE_ELEMENTS["taesd"]
    else:
        return None
    act = per_pixel * shape.width * shape.height * act_bytes
    return WORKSPACE + act, (f"{shape.width}x{shape.height} px x {per_pixel} elements x "
                             f"{act_bytes} B + {format_bytes(WORKSPACE)} workspace")


def text(encoders: Iterable[Tuple[str, int, int]], act_bytes: int) -> Optional[Tuple[int, str]]:
    """encoders: (arch, hidden, ffn) of each encoder; they run one after another."""
    best, why = -1, ""
    for arch, hidden, ffn in encoders:
        seq = TEXT_SEQ.get(arch, 1024)
        f = 3 if arch.startswith("clip") else 4     # gated FFNs hold four ffn-wide tensors
        act = seq * (8 * hidden + f * ffn) * act_bytes
        if arch in ("t5", "umt5"):       # relative position bias, f32, per head, twice
            act += (hidden // 64) * seq * seq * 4 * 2
        if act > best:
            best, why = act, f"{arch}: {seq} tokens x (8 x {hidden} + {f} x {ffn}) x {act_bytes} B"
    if best < 0:
        return None
    return WORKSPACE + best, f"{why} + {format_bytes(WORKSPACE)} workspace"


def vision(hidden: int, ffn: int, act_bytes: int) -> Tuple[int, str]:
    heads = max(hidden // 64, 1)
    act = VISION_SEQ * (8 * hidden + 3 * ffn) * act_bytes + heads * VISION_SEQ ** 2 * act_bytes
    return WORKSPACE + act, (f"{VISION_SEQ} tokens x (8 x {hidden} + 3 x {ffn}) x {act_bytes} B "
                             f"+ attention + {format_bytes(WORKSPACE)} workspace")


def upscaler(scale: int, shape: LatentShape) -> Tuple[int, str]:
    pixels = min(shape.width * shape.height, UPSCALE_TILE ** 2)
    act = pixels * 3 * scale * 384 * 4
    return WORKSPACE + act, (f"{pixels} px tile x 3 x {scale}x x 384 x 4 B "
                             f"+ {format_bytes(WORKSPACE)} workspace")
