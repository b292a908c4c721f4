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
            "clip_vision": 2 * GiB, "photomaker": 2 * GiB, "vae": 1 * GiB, "upscaler": 1 * GiB,
            # a YOLO detector sees one 640x640 letterboxed image: small feature maps
            "detector": 512 * MiB}


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


# c: the rehearsal's peak (runtime/measure/rehearse.py, the fused-attention GPU) of the
# released model at the shapes above, over tokens x hidden x act_bytes, times about 1.4
# and rounded (benchmarks/working_memory_estimate.py; the arithmetic in docs/metadata.md).
DIT = {
    "flux": DiT(20, 16, 0, 512, 1), "chroma": DiT(20, 16, 0, 512, 2),
    "flux2": DiT(25, 16, 0, 512, 1), "sd3": DiT(29, 16, 0, 333, 2),
    "hidream": DiT(40, 16, 0, 512, 2), "auraflow": DiT(17, 16, 0, 256, 2),
    "hunyuan_video": DiT(18, 16, 4, 256, 1), "qwen_image": DiT(15, 16, 0, 1024, 2),
    "z_image": DiT(21, 16, 0, 512, 2), "lumina2": DiT(28, 16, 0, 512, 2),
    "wan": DiT(13, 16, 4, 512, 2), "ltxv": DiT(15, 32, 8, 256, 2),
    # LTX-2: LTXV's video stream beside an audio one; each stream's text connector pads
    # the prompt to 1024 tokens with learnable registers (comfy/ldm/lightricks/
    # embeddings_connector.py), whatever the prompt's length
    "ltxav": DiT(15, 32, 8, 2 * 1024, 2),
    # Kandinsky 5: HunyuanVideo's VAE (8x, 4x in time), patch 2, Qwen2.5-VL text
    "kandinsky5": DiT(10, 16, 4, 256, 2),
    # PixArt: T5 prompt of up to 300 tokens (cross-attention)
    "pixart": DiT(16, 16, 0, 300, 2),
    # HunyuanDiT: 77 CLIP and 256 mT5 tokens (cross-attention)
    "hunyuan_dit": DiT(44, 16, 0, 333, 2),
    # CogVideoX: 8x/4x VAE, patch 2; 226 T5 tokens joined to the video's
    "cogvideox": DiT(28, 16, 4, 226, 2),
    # Cosmos Predict2: Wan 2.1's VAE, patch 2; 512 T5 tokens (cross-attention)
    "cosmos": DiT(16, 16, 4, 512, 2),
    # Hunyuan3D 2.0/2.1: a row of shape tokens (the workload's width is 8 px per token,
    # runtime/comfy/workload.from_latent_shape) and 1370 DINOv2 image tokens (518 px)
    "hunyuan3d": DiT(20, 8, 0, 1370, 2), "hunyuan3d21": DiT(28, 8, 0, 1370, 2),
    # Mochi: 8x/6x VAE, patch 2; 256 T5 tokens
    "mochi": DiT(21, 16, 6, 256, 2),
    # Stable Cascade: stage C's latent is 42x smaller than the image, stage B's 4x; the
    # width is the one most of its blocks take
    "cascade_c": DiT(23, 42, 0, 77, 2), "cascade_b": DiT(6, 4, 0, 8, 2),
    # ACE-Step: 16 latent rows of 8 px patched into one token per latent column, so
    # 32 px a side makes the workload's (8 x columns) x 128 px one token a column; 77
    # text and 256 lyric tokens (cross-attention)
    "ace_step": DiT(19, 32, 0, 333, 2),
    "dit": DiT(44, 16, 0, 512, 2),
}
UNETS = {"sd1_unet", "sd2_unet", "sdxl_unet", "svd_unet"}
# per architecture: SDXL keeps no attention at its full-resolution level
UNET_C = {"sd1_unet": 36, "sd2_unet": 36, "sdxl_unet": 22, "svd_unet": 36}
UNET_C_DEFAULT = 36
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


def unet(channels: int, shape: LatentShape, act_bytes: int, arch: str = "") -> Tuple[int, str]:
    c = UNET_C.get(arch, UNET_C_DEFAULT)
    positions = math.ceil(shape.width / 8) * math.ceil(shape.height / 8) * shape.batch * 2
    act = c * positions * channels * act_bytes
    return WORKSPACE + act, (f"{positions} latent positions x {channels} channels x {c} x "
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
