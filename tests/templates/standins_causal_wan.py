"""Causal Forcing's diffusion model (video_causal_forcing_i2v) for the official
templates (issue 31 item 3), inside ComfyUI's Python.

ComfyUI 0.29.0 runs it as WAN21_CausalAR_T2V (model_base.WAN21_CausalAR, whose
CausalWanModel has the KV caches the `ar_video` sampler needs). The weights are Wan 2.1
T2V's, key for key; detection tells the class apart by nothing in them: its Wan 2.1
branch (model_detection.py) merges the file's metadata `config` -> "transformer" into the
unet_config, and the released file says `"causal_ar": true` there, which only
WAN21_CausalAR_T2V matches. So the stand-in is the Wan 2.1 T2V stand-in (builders.DIFFUSION
"wan21_t2v": the widths the UMT5 stand-in gives, recorded for install_unet_hook) with
that metadata beside the stand-in's own.
"""
import json
import os
import zlib

import builders
import encoders
import families

ARCHITECTURES = {"diffusion:wan21_causal_ar"}

# what the released file's metadata says (detection reads it as it reads the keys)
CAUSAL_CONFIG = json.dumps({"transformer": {"causal_ar": True}})
builders.DIFFUSION["wan21_causal_ar"] = dict(builders.DIFFUSION["wan21_t2v"])


def build(work, arch, dest):
    import safetensors.torch
    name = arch.split(":", 1)[1]
    if name != "wan21_causal_ar":
        raise builders.NoBuilder(f"no stand-in builder for {arch} "
                                 f"(tests/templates/standins_causal_wan.py)")
    fam, widths = builders.diffusion_family(work, name)
    seed = builders.seed_of(os.path.basename(dest))
    tiny = json.dumps({"unet_config": widths, "name": name}, sort_keys=True)
    built = os.path.join(work, "standins", f"{name}-{seed}-"
                         f"{zlib.crc32((tiny + CAUSAL_CONFIG).encode()):08x}.safetensors")
    if not os.path.exists(built):
        os.makedirs(os.path.dirname(built), exist_ok=True)
        sd = families.random_state_dict(fam.unet_config, seed)
        meta = {encoders.TINY_KEY: tiny, "config": CAUSAL_CONFIG}
        safetensors.torch.save_file(sd, built + ".part", metadata=meta)
        os.replace(built + ".part", built)
    builders._link(built, dest)
