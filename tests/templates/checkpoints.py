"""Checkpoint stand-ins for the official templates (issue 31 item 3), inside ComfyUI's
Python: one file holding a diffusion model, its text encoders and its VAE, as
CheckpointLoaderSimple loads the real ones.

A checkpoint is written the way ComfyUI's own CheckpointSave writes one: the stand-ins
of its parts are loaded by ComfyUI's loaders (UNETLoader's, CLIPLoader's and
VAELoader's functions, through the stand-ins' hooks) and `comfy.sd.save_checkpoint`
stores them with the model's own key conversion (SDXL's CLIP-G in OpenCLIP layout, the
VAE under first_stage_model., ...). The file's metadata (encoders.TINY_KEY) carries what
its parts' files carried: the diffusion model's widths and class (builders.py), the text
encoders' config overrides as te_model_options, and every part's constructor overrides;
`install_hook()` applies them while such a file loads (real files load unchanged). The
VAE file's own metadata (LTXV's "config") travels as it is.
"""
import functools
import json
import os

import builders
import encoders
import vision

TINY_KEY = encoders.TINY_KEY

# checkpoint architecture -> its parts: the diffusion stand-in (builders.DIFFUSION), the
# text encoders it holds with their CLIP type (None: it holds none, as LTXV's, whose
# T5 a CLIPLoader loads) and its VAE (encoders.VAES)
CHECKPOINTS = {
    "flux": dict(diffusion="flux", te=(("clip_l", "t5xxl"), "flux"), vae="flux_vae"),
    "flux_schnell": dict(diffusion="flux_schnell", te=(("clip_l", "t5xxl"), "flux"),
                         vae="flux_vae"),
    "sdxl": dict(diffusion="sdxl", te=(("clip_l", "clip_g"), "sdxl"), vae="sd_vae"),
    "ltxv": dict(diffusion="ltxv", te=None, vae="ltxv_vae"),
}


def _te_model_options(keys):
    """The text-encoder stand-ins' config overrides, keyed as a checkpoint's CLIP reads
    them ({model_name}_model_config: a CLIP file's "model_config" is rewritten so only
    by CLIPLoader's long-CLIP pass)."""
    out = {}
    for key in keys:
        spec = encoders.TE_FILES[key]
        out[f"{spec['model_name']}_model_config"] = dict(spec["config"])
    return out


def build(work, arch, dest, spec=None):
    """Makes `dest` the checkpoint stand-in of `arch`, of the parts `spec` names (a
    CHECKPOINTS entry; by default arch's; clip_vision: a vision.CONFIGS name, SVD's)."""
    import comfy.clip_vision
    import comfy.sd
    import comfy.utils
    spec = spec or CHECKPOINTS.get(arch)
    if spec is None:
        raise builders.NoBuilder(f"no stand-in builder for checkpoint files ({arch}) yet "
                                 f"(tests/templates/checkpoints.py CHECKPOINTS)")
    seed = builders.seed_of(os.path.basename(dest))
    unet = os.path.join(work, "standins", f"ckpt_unet_{arch}-{seed}.safetensors")
    builders.build_diffusion(work, spec["diffusion"], unet)
    model_sd, model_meta = comfy.utils.load_torch_file(unet, return_metadata=True)
    unet_tiny = json.loads(model_meta[TINY_KEY])
    vae_path = encoders.build_vae_file(work, spec["vae"])[0]
    vae_sd, vae_meta = comfy.utils.load_torch_file(vae_path, return_metadata=True)
    vae_tiny = json.loads(vae_meta[TINY_KEY])
    overrides = {}
    for part in [unet_tiny, vae_tiny] + [
            encoders.TE_FILES[k] for k in (spec["te"] or ((), None))[0]]:
        for qualname, over in (part.get("init_overrides") or {}).items():
            overrides[qualname] = encoders._merge(overrides.get(qualname), over)
    tiny = {"name": arch, "unet_config": unet_tiny["unet_config"],
            "config": unet_tiny.get("config"), "init_overrides": overrides,
            "te_model_options": _te_model_options(spec["te"][0]) if spec["te"] else {}}
    vision_path = None
    if spec.get("clip_vision"):     # what vision.install_hook checks and builds instead
        vision_path = vision.build(work, spec["clip_vision"])
        tiny["clip_vision"] = encoders.tiny_spec_of(vision_path)["clip_vision"]
    tiny_json = json.dumps(tiny, sort_keys=True)
    built = os.path.join(work, "standins", f"ckpt_{arch}-{seed}.safetensors")
    if not encoders._up_to_date(built, tiny_json):
        model = comfy.sd.load_diffusion_model(unet)
        clip = None
        if spec["te"]:
            keys, clip_type = spec["te"]
            clip = comfy.sd.load_clip(
                ckpt_paths=[encoders.build_te_file(work, k)[0] for k in keys],
                clip_type=builders.clip_type_of(clip_type))
        vae = comfy.sd.VAE(sd=vae_sd, metadata=vae_meta)
        metadata = {k: v for k, v in vae_meta.items() if k != TINY_KEY}
        metadata[TINY_KEY] = tiny_json
        clip_vision = comfy.clip_vision.load(vision_path) if vision_path else None
        comfy.sd.save_checkpoint(built + ".part", model, clip, vae, clip_vision=clip_vision,
                                 metadata=metadata)
        os.replace(built + ".part", built)
        del model, clip, vae, clip_vision
    builders._link(built, dest)


def install_hook():
    """A checkpoint stand-in's text-encoder config overrides and constructor overrides,
    applied while comfy.sd.load_state_dict_guess_config loads it."""
    import comfy.sd
    load = comfy.sd.load_state_dict_guess_config
    if getattr(load, "_placement_tiny", False):
        return

    @functools.wraps(load)
    def tiny_load(sd, output_vae=True, output_clip=True, output_clipvision=False,
                  embedding_directory=None, output_model=True, model_options={},
                  te_model_options={}, metadata=None, disable_dynamic=False):
        tiny = json.loads((metadata or {}).get(TINY_KEY) or "{}")
        te_options = dict(te_model_options)
        for key, value in (tiny.get("te_model_options") or {}).items():
            te_options[key] = encoders._merge(te_options.get(key), value)
        # a CLIP vision part (SVD's) is built as vision.py's stand-ins are
        token = vision._LOADING.set(tiny) if "clip_vision" in tiny else None
        try:
            with encoders._overrides(tiny.get("init_overrides")):
                return load(sd, output_vae, output_clip, output_clipvision,
                            embedding_directory, output_model, model_options,
                            te_model_options=te_options, metadata=metadata,
                            disable_dynamic=disable_dynamic)
        finally:
            if token is not None:
                vision._LOADING.reset(token)
    tiny_load._placement_tiny = True
    comfy.sd.load_state_dict_guess_config = tiny_load
