"""HunyuanVideo 1.5 and Flux Redux stand-ins for the official templates (issue 31 item
3), inside ComfyUI's Python: HunyuanVideo 1.5's diffusion model (and Capybara v0.1, a
HunyuanVideo 1.5 model: its templates load it with HunyuanVideo 1.5's nodes), its VAE,
its ByT5 small glyph text encoder (beside the Qwen2.5-VL 7B stand-in of encoders.py),
the SigLIP 384 CLIP vision model it and Flux Redux read, and the Flux Redux style model.
How ComfyUI finds each, and what a stand-in records for what it does not read:

- Diffusion (model_detection.py, HunyuanVideo's branch): width, blocks, input channels
  and the Qwen2.5-VL width are read; HunyuanVideo15 is told apart by vision_in_dim 1152
  alone (the SigLIP width of `vision_in`), so the stand-in, whose vision_in takes the
  SigLIP stand-in's width, names its class (`config`, builders.install_unet_hook). 4
  double-stream blocks of width 128 (one head) and no single-stream ones, as released. Its
  ByT5 mapper (1472 -> 2048 -> 2048 -> width) is fixed by the constructor: an init
  override of ByT5Mapper makes it take the ByT5 stand-in's width (read by encoding a
  quoted prompt through ComfyUI's loader) into 32.
- VAE (sd.py: `decoder.conv_in.conv.weight` with 32 latent channels): the causal video
  VAE of comfy/ldm/hunyuan_video/vae_refiner.py, its widths (128...1024) hard-coded:
  init overrides of its Encoder and Decoder give tiny ones (16-64), applied by
  encoders.install_hooks' VAE hook.
- ByT5 small glyph (sd.py detect_te_model: SelfAttention.k 384 rows): 6 heads of 64
  kept, d_model and the FFN tiny, 2 layers; ComfyUI builds it from
  byt5_config_small_glyph.json, so its config travels as an init override of T5.
- SigLIP 384 (clip_vision.py): detection reads 23 layers, 729 positions and the width
  1152 from layer 0's layer_norm1. The stand-in is 32 wide (23 layers, 384 px, patches
  of 14): `install_hook()` shows detection that one shape at its released size
  (`detected_shapes`) and loads the file's own tensors; vision.install_hook checks
  detection picked clip_vision_siglip_384.json and builds the tiny config.
- Flux Redux (sd.py load_style_model, by `redux_down.weight`): ReduxImageEncoder's
  widths (SigLIP 1152 in, T5 4096 out) are constructor defaults: the stand-in records
  the SigLIP stand-in's width and the Flux text encoders' width (builders.te_widths) as
  init overrides, which `install_hook()` applies while such a file loads (the loader
  reads no metadata: the hook reads the file's).
"""
import contextvars
import functools
import json
import os

import builders
import encoders
import vision

TINY_KEY = encoders.TINY_KEY

ARCHITECTURES = {"diffusion:hunyuan_video15", "vae:hunyuan_video15_vae", "te:byt5_small",
                 "clip_vision:siglip_384", "style_model:flux_redux"}

# -- SigLIP 384 ------------------------------------------------------------------------
SIGLIP_DETECTED = "clip_vision_siglip_384.json"
SIGLIP = {"num_channels": 3, "hidden_act": "gelu_pytorch_tanh", "hidden_size": 32,
          "image_size": 384, "intermediate_size": 64, "model_type": "siglip_vision_model",
          "num_attention_heads": 2, "num_hidden_layers": 23, "patch_size": 14,
          "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}
# what detection reads that a 32-wide model cannot have: shown at its released shape
SIGLIP_DETECTED_SHAPES = {"vision_model.encoder.layers.0.layer_norm1.weight": [1152]}

# -- ByT5 small glyph ------------------------------------------------------------------
BYT5_TINY = {"d_model": 32, "d_ff": 32, "num_layers": 2}
encoders.TE_FILES["byt5_small"] = dict(
    file="enc_byt5_small_glyph.safetensors", arch="t5", model_name="byt5_small",
    base_json="text_encoders/byt5_config_small_glyph.json", config={},
    init_overrides={"comfy.text_encoders.t5.T5": {"config_dict": dict(BYT5_TINY)}},
    dtype="float16")
builders.TEXT_ENCODERS["byt5_small"] = "byt5_small"

# -- the diffusion model ---------------------------------------------------------------
BYT5_MAPPER = "comfy.ldm.hunyuan_video.model.ByT5Mapper"
builders.DIFFUSION["hunyuan_video15"] = dict(
    family="hunyuan_video15", depth=4, config="HunyuanVideo15",
    fixed={"vision_in_dim": SIGLIP["hidden_size"], "depth_single_blocks": 0},
    te=(("qwen25_7b", "byt5_small"), "hunyuan_video_15"), widths={"context_in_dim": "cond"},
    init=None)

# -- the VAE ---------------------------------------------------------------------------
VAE_PARTS = ("comfy.ldm.hunyuan_video.vae_refiner.Encoder",
             "comfy.ldm.hunyuan_video.vae_refiner.Decoder")
# five levels as the released [128, 256, 512, 1024, 1024], each step at most doubling;
# the encoder's last a multiple of 64 (it averages it into the 2 x 32 latent channels),
# the decoder's first (its last, reversed) a multiple of the 32 latent channels
VAE_WIDTHS = {VAE_PARTS[0]: [16, 16, 32, 32, 64], VAE_PARTS[1]: [16, 16, 32, 32, 32]}
VAE_DDCONFIG = {"block_out_channels": [128, 256, 512, 1024, 1024], "in_channels": 3,
                "out_channels": 3, "num_res_blocks": 2, "ffactor_spatial": 16,
                "ffactor_temporal": 4, "downsample_match_channel": True,
                "upsample_match_channel": True, "z_channels": 32}      # as sd.py builds it


def _byt5_width(work):
    """The width of what the ByT5 stand-in gives the diffusion model
    (conditioning_byt5small: only for quoted text), through ComfyUI's loader."""
    import comfy.sd
    paths = [encoders.build_te_file(work, k)[0] for k in ("qwen25_7b", "byt5_small")]
    clip = comfy.sd.load_clip(ckpt_paths=paths, clip_type=comfy.sd.CLIPType.HUNYUAN_VIDEO_15,
                              model_options={})
    enc = clip.encode_from_tokens(clip.tokenize('a sign that says "fox"'), return_dict=True)
    if "conditioning_byt5small" not in enc:
        raise RuntimeError("the ByT5 stand-in gave no conditioning_byt5small for quoted text")
    width = int(enc["conditioning_byt5small"].shape[-1])
    del clip
    return width


def _diffusion_init(work):
    """The ByT5 mapper's tiny sizes (set once, before anything is built from the entry)."""
    spec = builders.DIFFUSION["hunyuan_video15"]
    if spec.get("init") is None:
        spec["init"] = {BYT5_MAPPER: {"in_dim": _byt5_width(work), "hidden_dim": 32,
                                      "out_dim": 32}}
    return spec["init"]


def build_vae(work, dest, seed=0):
    import comfy.ldm.hunyuan_video.vae_refiner as vr
    init = {part: {"block_out_channels": list(w)} for part, w in VAE_WIDTHS.items()}
    spec = json.dumps({"name": "hunyuan_video15_vae", "init_overrides": init}, sort_keys=True)
    path = os.path.join(work, "standins", "vae_hunyuan_video15.safetensors")
    if not encoders._up_to_date(path, spec):
        with encoders._overrides(init):
            sd = {f"encoder.{k}": v for k, v in
                  encoders._state_dict(vr.Encoder(**VAE_DDCONFIG)).items()}
            sd.update({f"decoder.{k}": v for k, v in
                       encoders._state_dict(vr.Decoder(**VAE_DDCONFIG)).items()})
        encoders._save(path, encoders._randomize(sd, seed), "float16",
                       encoders._spec_metadata(spec))
    builders._link(path, dest)


def build_siglip(work, dest, seed=0):
    import comfy.clip_vision
    spec = json.dumps({"name": "siglip_384", "clip_vision": [SIGLIP_DETECTED, SIGLIP],
                       "detected_shapes": SIGLIP_DETECTED_SHAPES}, sort_keys=True)
    path = os.path.join(work, "standins", "clip_vision_siglip_384.safetensors")
    if not encoders._up_to_date(path, spec):
        model = comfy.clip_vision.ClipVisionModel(dict(SIGLIP))
        sd = encoders._randomize(encoders._state_dict(model.model), seed)
        del model
        encoders._save(path, sd, "float16", encoders._spec_metadata(spec))
    builders._link(path, dest)


def build_redux(work, dest, seed=0):
    import comfy.ldm.flux.redux
    txt = builders.te_widths(work, ("clip_l", "t5xxl"), "flux")["cond"]
    init = {"comfy.ldm.flux.redux.ReduxImageEncoder": {"redux_dim": SIGLIP["hidden_size"],
                                                        "txt_in_features": txt}}
    spec = json.dumps({"name": "flux_redux", "init_overrides": init}, sort_keys=True)
    path = os.path.join(work, "standins", "style_flux_redux.safetensors")
    if not encoders._up_to_date(path, spec):
        with encoders._overrides(init):
            model = comfy.ldm.flux.redux.ReduxImageEncoder()
        sd = encoders._randomize(encoders._state_dict(model), seed)
        encoders._save(path, sd, "bfloat16", encoders._spec_metadata(spec))
    builders._link(path, dest)


# -- hooks -----------------------------------------------------------------------------
_FILE_SD = contextvars.ContextVar("comfyui_placement_tiny_clip_vision_sd", default=None)


def install_hook():
    """A SigLIP stand-in's released shapes shown to detection (its own tensors loaded);
    a Redux stand-in's recorded widths applied while load_style_model builds it."""
    import torch
    import comfy.clip_vision
    import comfy.sd
    detect = comfy.clip_vision.load_clipvision_from_sd
    if getattr(detect, "_placement_tiny", False):
        return

    @functools.wraps(detect)
    def load_clipvision_from_sd(sd, prefix="", convert_keys=False):
        shapes = (vision._LOADING.get() or {}).get("detected_shapes")
        if not shapes:
            return detect(sd, prefix, convert_keys)
        probe = dict(sd)
        for key, shape in shapes.items():
            if key not in sd:
                raise RuntimeError(f"CLIP vision stand-in lacks {key}, which detection reads")
            probe[key] = torch.empty(shape, device="meta")
        token = _FILE_SD.set(sd)
        try:
            return detect(probe, prefix, convert_keys)
        finally:
            _FILE_SD.reset(token)
    load_clipvision_from_sd._placement_tiny = True
    comfy.clip_vision.load_clipvision_from_sd = load_clipvision_from_sd

    load_sd = comfy.clip_vision.ClipVisionModel.load_sd

    @functools.wraps(load_sd)
    def tiny_load_sd(self, sd):
        own = _FILE_SD.get()
        return load_sd(self, own if own is not None else sd)
    comfy.clip_vision.ClipVisionModel.load_sd = tiny_load_sd

    load_style = comfy.sd.load_style_model

    @functools.wraps(load_style)
    def load_style_model(ckpt_path):
        spec = encoders.tiny_spec_of(ckpt_path) or {}
        with encoders._overrides(spec.get("init_overrides")):
            return load_style(ckpt_path)
    comfy.sd.load_style_model = load_style_model


def build(work, arch, dest):
    """Makes `dest` the stand-in of architecture `arch` ("kind:name")."""
    kind, name = arch.split(":", 1)
    if kind == "diffusion":
        _diffusion_init(work)
        return builders.build_diffusion(work, name, dest)
    if kind == "vae":
        return build_vae(work, dest)
    if kind == "te":
        return builders._link(encoders.build_te_file(work, name)[0], dest)
    if kind == "clip_vision":
        return build_siglip(work, dest)
    if kind == "style_model":
        return build_redux(work, dest)
    raise builders.NoBuilder(f"no stand-in builder for {arch} "
                             f"(tests/templates/standins_hunyuan15.py)")

