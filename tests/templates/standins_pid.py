"""PiD, the Pixel Diffusion Decoder (utility_pid_latent_upscale_dit), for the official
templates (issue 31 item 3), inside ComfyUI's Python.

PiD (supported_models.PiD, comfy/ldm/pixeldit/pid.py PidNet) is PixelDiT's pixel-space
body (3 channels in and out, no VAE: the template decodes with "pixel_space") beside an
LQ branch that reads a Flux latent (PiDConditioning's `lq_latent`) and gates it into
every other patch block. Detection finds it by `lq_proj.latent_proj.0.weight` and reads
the LQ branch's input channels (16: Flux's latent, the v1 layout without `pit_head`)
and width; it takes the gate interval as 14 blocks over the gates it counts and builds
the body at PixelDiT's released sizes (the constructor's defaults). So the stand-in is
PixelDiT's tiny body (standins_image_dits2's, 4 patch blocks at 8-pixel patches) with a
16-wide LQ branch of one res block, gating every other block: the body's sizes, the
interval and the res-block count travel in its metadata (`fixed`) for
builders.install_unet_hook; the text width is what the Gemma 2 stand-in gives. The file
is written as PixelDiT's released layout (each pixel block's `adaLN_modulation.0` one
Linear), which PixelDiTT2I.process_unet_state_dict (PiD's too) splits.
"""
import json
import os
import zlib

import builders
import encoders
import families
import standins_image_dits2

ARCHITECTURES = {"diffusion:pid"}

_BODY = {k: v for k, v in families.FAMILIES["pixeldit"].unet_config.items()
         if k != "image_model"}
# the LQ branch: Flux's 16 latent channels at 8x down (what detection reads), 16 wide
# (GroupNorm's 4 groups), one res block, a gate before every other patch block
_LQ = {"lq_latent_channels": 16, "latent_spatial_down_factor": 8, "lq_hidden_dim": 16,
       "lq_num_res_blocks": 1, "lq_interval": 2}
families.FAMILIES["pid"] = families.Family(
    "pid", "PiD", "PiD", "PiD", {"image_model": "pid", **_BODY, **_LQ},
    latent=(1, 3, 64, 64), context=(8, _BODY["txt_embed_dim"]), depth_keys=("patch_depth",),
    notes="Detection reads the LQ branch's channels and width; the body's sizes, the "
          "gate interval and the res blocks travel in the metadata.")
builders.DIFFUSION["pid"] = dict(
    family="pid",
    fixed={k: v for k, v in {**_BODY, **_LQ}.items() if k != "txt_embed_dim"},
    te=(("gemma2_2b",), "pixeldit"), widths={"txt_embed_dim": "cond"})


def build(work, arch, dest):
    import safetensors.torch
    name = arch.split(":", 1)[1]
    if name != "pid":
        raise builders.NoBuilder(f"no stand-in builder for {arch} "
                                 f"(tests/templates/standins_pid.py)")
    fam, widths = builders.diffusion_family(work, name)
    seed = builders.seed_of(os.path.basename(dest))
    tiny = json.dumps({"unet_config": widths, "name": name, "layout": "released"},
                      sort_keys=True)
    built = os.path.join(work, "standins", f"{name}-{seed}-{zlib.crc32(tiny.encode()):08x}"
                         ".safetensors")
    if not os.path.exists(built):
        os.makedirs(os.path.dirname(built), exist_ok=True)
        sd = standins_image_dits2._pixeldit_released_layout(
            families.random_state_dict(fam.unet_config, seed))
        # PixelDiT's file keeps its body under `core.`; PiD's detection reads the LQ
        # branch at the top level, beside the body
        sd = {k[len("core."):]: v for k, v in sd.items()}
        safetensors.torch.save_file(sd, built + ".part", metadata={encoders.TINY_KEY: tiny})
        os.replace(built + ".part", built)
    builders._link(built, dest)
