"""The planner's working-memory estimate against the rehearsal, for every diffusion family
of the integration suite (issue 29 item 2: "comes within 2x of the rehearsal").

    /tmp/comfyvenv/bin/python benchmarks/working_memory_estimate.py --comfyui /tmp/comfyui
        [--resolution 1024] [--video-resolution 512] [--frames 33] [--families a,b] [--tiny]

Runs inside ComfyUI's own Python (the families are ComfyUI's model classes; set up as
tests/integration/families_driver.py does: --cpu, PyTorch attention). Exits 1 when a
family is outside [LOW, HIGH] or cannot be measured, 0 when every one is inside.

What it assumes (where the estimate is meant to hold):
- Each family of tests/integration/test_families.py RUN is built on the meta device at
  its released size (families.py `full_config`: no weights, no memory), with the widths
  of its released text and image encoders (FULL below). `--tiny` uses the suite's tiny
  widths instead (fixed text projections then weigh more than at full size).
- The shapes the constants are for: images 1024x1024; video 33 frames at 512x512 (SVD:
  14 frames at 1024x576, its release); Hunyuan3D 3072 shape tokens (ComfyUI's
  EmptyLatentHunyuan3Dv2 default) against the 1370 tokens of a DINOv2 image at 518
  pixels. The prompt is as long as the estimate assumes for the architecture
  (headroom.DIT text_tokens; 77 for UNets) where the model takes any length.
- The estimate is asked as node-time planning asks it (nodes/planning.py): the size
  runtime/comfy/workload.from_latent_shape derives from the latent, batch 1, its CFG
  batch scaled to 1 (nodes/planning.with_cond_batch); one forward of batch 1 (cond
  alone) is rehearsed.
- Both sides are activations: the estimate less its fixed GPU workspace
  (headroom.WORKSPACE) against the rehearsal on meta (runtime/comfy/replan/rehearse_call.py:
  the tensors the forward computes alive at once, plus its inputs).

Prints one row per family: estimate, rehearsal (MiB), estimate/rehearsal, and FLAG where
the ratio is outside [LOW, HIGH].
"""
import argparse
import dataclasses
import math
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent / "tests" / "integration"
LOW, HIGH = 0.5, 2.0          # the "within 2x", both ways


def parse_args():
    ap = argparse.ArgumentParser()
    ap.add_argument("--comfyui", required=True)
    ap.add_argument("--resolution", type=int, default=1024)
    ap.add_argument("--video-resolution", type=int, default=512)
    ap.add_argument("--frames", type=int, default=33)
    ap.add_argument("--families", default="")
    ap.add_argument("--tiny", action="store_true",
                    help="the suite's tiny widths instead of the released sizes")
    return ap.parse_args()


ARGS = parse_args()
sys.path.insert(0, ARGS.comfyui)
sys.path.insert(0, str(TESTS))
os.chdir(ARGS.comfyui)
sys.argv = [sys.argv[0], "--cpu", "--disable-dynamic-vram", "--use-pytorch-cross-attention"]

import comfy.options  # noqa: E402

comfy.options.enable_args_parsing()

import torch  # noqa: E402

import comfy.model_management  # noqa: E402, F401
from families import FAMILIES  # noqa: E402
from headless import pack_module  # noqa: E402
from test_families import META, RUN  # noqa: E402

MiB = 1 << 20
DINO_TOKENS = 1370            # DINOv2 at 518 px, patch 14: 37 x 37 + the class token


@dataclasses.dataclass
class Full:
    """The released model's inputs: cross_attn width, extra conds (shapes, with "T" for
    the prompt's length), a fixed prompt length, a fixed latent."""
    width: int
    extras: dict = dataclasses.field(default_factory=dict)
    tokens: int = 0           # 0: the estimate's assumption
    latent: tuple = ()        # () : from the resolution options


FULL = {
    "sd15": Full(768),
    "sdxl": Full(2048, {"pooled_output": (1, 1280)}),
    # SVD: the CLIP vision embedding is one token; the latent's batch is the frames
    "svd": Full(1024, tokens=1, latent=(14, 4, 72, 128)),
    "sd3": Full(4096, {"pooled_output": (1, 2048)}),
    "flux1": Full(4096, {"pooled_output": (1, 768), "guidance": 3.5}),
    "flux2": Full(15360, {"guidance": 4.0}),
    "pixart_sigma": Full(4096),
    "hunyuan_dit": Full(1024, {"conditioning_mt5xl": (1, 256, 2048),
                               "attention_mask": ("mask", 77),
                               "attention_mask_mt5xl": ("mask", 256)}, tokens=77),
    "wan21": Full(4096), "wan22_5b": Full(4096),
    "wan22_a14b_high": Full(4096), "wan22_a14b_low": Full(4096),
    "hunyuan_video": Full(4096, {"pooled_output": (1, 768), "guidance": 6.0}),
    "hunyuan_video15": Full(3584, {"pooled_output": (1, 768)}),
    "ltxv": Full(4096, {"attention_mask": ("mask", "T")}),
    "cogvideox": Full(4096),
    # the text-to-image release: one latent frame
    "cosmos_predict2": Full(1024, latent=(1, 16, 1, 128, 128)),
    "kandinsky5": Full(3584, {"pooled_output": (1, 768)}),
    "hunyuan3d2": Full(1536, tokens=DINO_TOKENS, latent=(1, 64, 3072)),
    "hunyuan3d21": Full(1024, tokens=DINO_TOKENS, latent=(1, 64, 3072)),
    # the suite's META families (released size only, checked on meta there)
    "chroma": Full(4096, {"guidance": 0.0}),
    "auraflow": Full(2048),
    "qwen_image": Full(3584, latent=(1, 16, 1, 128, 128)),   # a Wan 2.1 latent
    "lumina2": Full(2304),
    "zimage": Full(2560),
    "hidream": Full(4096, {"pooled_output": (1, 2048),
                           "conditioning_llama3": (1, 32, 128, 4096)}, tokens=128),
    "mochi": Full(4096, {"attention_mask": ("mask", "T")}),
    "omnigen2": Full(2048, {"attention_mask": ("mask", "T")}),
    "cascade_c": Full(1280, {"pooled_output": (1, 1, 1280)}, tokens=77,
                      latent=(1, 16, 24, 24)),
    "cascade_b": Full(1280, {"pooled_output": (1, 1, 1280)}, tokens=77,
                      latent=(1, 4, 256, 256)),
    # about 95 s of audio (44.1 kHz, 512 samples per frame, 8x more in the latent)
    "ace_step": Full(768, {"conditioning_lyrics": ("ids", 256)}, tokens=77,
                     latent=(1, 8, 16, 1024)),
}


def pack(name):
    try:
        return pack_module(name)
    except Exception:                      # pack not linked yet: import the checkout
        sys.path.insert(0, str(HERE.parents[1]))
        import importlib
        return importlib.import_module(f"{HERE.parent.name}.{name}")


def latent(fam, base, full, shrink=1):
    """The latent at the size the estimate is for."""
    if full is not None and full.latent:
        return list(full.latent)
    fmt = base.latent_format
    ratio = int(getattr(fmt, "spacial_downscale_ratio", 8) or 8)
    temporal = int(getattr(fmt, "temporal_downscale_ratio", 1) or 1)
    lat = list(fam.latent)
    if len(lat) == 3:                              # a token sequence: kept as tested
        return lat
    if len(lat) == 5:
        side = ARGS.video_resolution // shrink
        lat[2] = 1 + (ARGS.frames - 1) // max(1, temporal)
    else:
        side = ARGS.resolution // shrink
    lat[-2] = lat[-1] = side // ratio
    return lat


def estimate(base, lat, hr):
    """The estimate's activations for one forward of batch 1 without CFG, asked with the
    size node-time planning derives from this latent."""
    wl = pack("runtime.comfy.replan.workload")
    fmt = base.latent_format
    ratio = int(getattr(fmt, "spacial_downscale_ratio", 8) or 8)
    temporal = int(getattr(fmt, "temporal_downscale_ratio", 1) or 1)
    work = wl.from_latent_shape(lat, spatial=ratio, temporal=temporal)
    describe = pack("placement.metadata.describe").describe_component
    info = describe("diffusion", [base.diffusion_model], resolution=tuple(work.resolution),
                    frames=work.frames, batch=work.batch)
    act = max(0, int(info.headroom_bytes or 0) - hr.WORKSPACE)
    assumed = hr.DIT[info.arch].cfg if info.arch in hr.DIT else \
        (2 if info.arch in hr.UNETS else 1)
    text = hr.DIT[info.arch].text_tokens if info.arch in hr.DIT else 77
    return act // assumed, info.arch, text, work


def conditioning(fam, full, tokens):
    if full is None:
        return fam.conditioning(0, tokens)[0]
    tokens = full.tokens or tokens
    extras = {}
    for name, spec in full.extras.items():
        if isinstance(spec, tuple) and spec and spec[0] in ("mask", "ids"):
            n = tokens if spec[1] == "T" else spec[1]
            extras[name] = (torch.ones if spec[0] == "mask" else torch.zeros)(
                1, n, dtype=torch.long)
        else:
            extras[name] = spec
    fam = dataclasses.replace(fam, context=(tokens, full.width), extras=extras)
    return fam.conditioning(0, tokens)[0]


def rehearsal(fam, base, x, cond):
    rc = pack("runtime.comfy.replan.rehearse_call")
    params = {"cross_attn": cond[0], **cond[1], "device": torch.device("cpu"), "noise": x,
              "width": x.shape[-1] * 8, "height": x.shape[-2] * 8 if x.ndim >= 4 else 8,
              "prompt_type": "positive"}
    conds = base.extra_conds(**params)
    # as the sampler hands them to the model (comfy/samplers.py: process_cond)
    kwargs = {k: v.process_cond(batch_size=x.shape[0], area=None).cond
              for k, v in conds.items()}
    c_crossattn = kwargs.pop("c_crossattn", None)
    c_concat = kwargs.pop("c_concat", None)
    t = torch.full((x.shape[0],), 0.5)
    got = rc.rehearse_call(base, (x, t, c_concat, c_crossattn, None, {}), kwargs)
    return got.working_bytes + got.input_bytes


def measure(fam_key, fam, hr):
    """(estimate, arch, rehearsal, workload) at the largest size the model takes."""
    full = None if ARGS.tiny else FULL[fam_key]
    why = ""
    # a tiny config whose position table is smaller than the resolution (SD3 covers
    # 32x32 latents): the largest size it takes, said in the row
    for shrink in (1, 2, 4, 8):
        try:
            _, base = fam.meta_model(full=full is not None)
            lat = latent(fam, base, full, shrink)
            est, arch, text, work = estimate(base, lat, hr)
            reh = rehearsal(fam, base, torch.zeros(lat), conditioning(fam, full, text))
            return est, arch, reh, work, ""
        except Exception as exc:           # noqa: BLE001  (one row says why)
            why = f"{type(exc).__name__}: " + \
                (str(exc).strip().splitlines() or [""])[0][:80]
    return None, None, None, None, why


def main():
    hr = pack("placement.metadata.headroom")
    only = {s for s in ARGS.families.split(",") if s}
    widths = "the suite's tiny widths" if ARGS.tiny else "released sizes"
    print(f"working memory of one forward, batch 1, no CFG (MiB): the planner's estimate "
          f"(less its {hr.WORKSPACE // MiB} MiB workspace) vs the rehearsal on meta; "
          f"images {ARGS.resolution}x{ARGS.resolution}, video {ARGS.frames} frames at "
          f"{ARGS.video_resolution}x{ARGS.video_resolution}; {widths}")
    print(f"{'family':<22}{'arch':<15}{'size':>16}{'estimate':>10}{'rehearsed':>11}"
          f"{'est/reh':>9}")
    flagged, missing = [], []
    for key in RUN + META:
        fam_key = key[:-3] if key.endswith("_d4") else key
        if only and fam_key not in only and key not in only:
            continue
        est, arch, reh, work, why = measure(fam_key, FAMILIES[fam_key], hr)
        if est is None:
            missing.append(fam_key)
            print(f"{fam_key:<22}not measured: {why}")
            continue
        ratio = est / reh if reh else math.inf
        flag = "" if LOW <= ratio <= HIGH else "  FLAG"
        if flag:
            flagged.append(fam_key)
        w, h = work.resolution
        size = f"{w}x{h}" + (f"x{work.frames}f" if work.frames > 1 else "") + \
            (f" b{work.batch}" if work.batch > 1 else "")
        print(f"{fam_key:<22}{arch:<15}{size:>16}{est / MiB:>10.1f}{reh / MiB:>11.1f}"
              f"{ratio:>9.2f}{flag}")
    print(f"outside [{LOW}, {HIGH}]: {', '.join(flagged) or 'none'}"
          + (f"; not measured: {', '.join(missing)}" if missing else ""))
    return 1 if flagged or missing else 0


if __name__ == "__main__":
    sys.exit(main())
