"""ControlNet stand-ins for the official templates (issue 31 item 3), inside ComfyUI's
Python: tiny random ControlNets that ControlNetLoader loads as the real ones, fitted to
the diffusion stand-in they steer (builders.DIFFUSION: the same widths).

- Qwen-Image Fun ControlNet (its Union 2512): ComfyUI reads every width from the file
  (comfy/controlnet.py `load_controlnet_qwen_fun`); no hook.
- Qwen-Image InstantX ControlNet (Union, Inpainting): ComfyUI builds it from the
  diffusion model's config its detection reads from the file, whose 24 heads it
  hard-codes; the stand-in records the tiny config in its metadata (encoders.TINY_KEY),
  as a diffusion stand-in does, and `install_hook()` hands it to builders'
  model_config_from_unet hook while comfy.controlnet.load_controlnet loads such a file
  (that loader reads no metadata).
"""
import functools
import json
import os

import builders
import encoders

TINY_KEY = encoders.TINY_KEY
# file name -> (kind, the diffusion stand-in it steers, extra input channels)
FILES = {
    "Qwen-Image-2512-Fun-Controlnet-Union-2602.safetensors": ("qwen_fun", "qwen_image", 0),
    "Qwen-Image-InstantX-ControlNet-Union.safetensors": ("qwen_instantx", "qwen_image", 0),
    # the inpainting one takes the mask beside the image latent (64 + 4 packed channels)
    "Qwen-Image-InstantX-ControlNet-Inpainting.safetensors": ("qwen_instantx", "qwen_image", 4),
}
ARCHITECTURES = {"controlnet:qwen_image_controlnet"}
INSTANTX_LAYERS = 2


def _model(kind, unet_config, extra):
    import comfy.ldm.qwen_image.controlnet as qc
    import comfy.ops
    import torch
    ops = comfy.ops.disable_weight_init
    if kind == "qwen_fun":
        width = unet_config["num_attention_heads"] * unet_config.get("attention_head_dim", 128)
        # 33 latent channels (control, mask, inpaint latent) packed 2x2; five control
        # blocks hinting the main model's blocks 0, 12, 24, 36, 48 (the stand-in has 0-3)
        return qc.QwenImageFunControlNetModel(
            control_in_features=132, inner_dim=width,
            num_attention_heads=unet_config["num_attention_heads"],
            attention_head_dim=unet_config.get("attention_head_dim", 128),
            dtype=torch.float32, device="cpu", operations=ops)
    config = dict(unet_config, num_layers=INSTANTX_LAYERS)
    config.pop("image_model", None)
    return qc.QwenImageControlNetModel(extra_condition_channels=extra, dtype=torch.float32,
                                       device="cpu", operations=ops, **config)


def build(work, arch, dest):
    name = os.path.basename(dest)
    if name not in FILES:
        raise builders.NoBuilder(f"no stand-in builder for the ControlNet {name!r} yet "
                                 f"(tests/templates/controlnets.py FILES)")
    kind, base, extra = FILES[name]
    fam, widths = builders.diffusion_family(work, base)
    tiny = json.dumps({"name": name, "unet_config": widths}, sort_keys=True)
    built = os.path.join(work, "standins", f"controlnet_{kind}_{extra}.safetensors")
    if not encoders._up_to_date(built, tiny):
        unet_config = dict(fam.unet_config)
        unet_config.setdefault("attention_head_dim", 128)
        model = _model(kind, unet_config, extra)
        sd = encoders._randomize(encoders._state_dict(model), builders.seed_of(name))
        del model
        encoders._save(built, sd, "bfloat16", encoders._spec_metadata(tiny))
    builders._link(built, dest)


def install_hook():
    """While comfy.controlnet.load_controlnet loads a stand-in, its recorded config is
    the metadata builders' detection hook reads (the loader passes none)."""
    import comfy.controlnet
    load = comfy.controlnet.load_controlnet
    if getattr(load, "_placement_tiny", False):
        return

    @functools.wraps(load)
    def tiny_load(ckpt_path, model=None, model_options={}):
        spec = encoders.tiny_spec_of(ckpt_path)
        if not spec:
            return load(ckpt_path, model=model, model_options=model_options)
        token = builders.LOADING_METADATA.set({TINY_KEY: json.dumps(spec)})
        try:     # and its constructor overrides (the SD3.5 ControlNets' adm width)
            with encoders._overrides(spec.get("init_overrides")):
                return load(ckpt_path, model=model, model_options=model_options)
        finally:
            builders.LOADING_METADATA.reset(token)
    tiny_load._placement_tiny = True
    comfy.controlnet.load_controlnet = tiny_load
