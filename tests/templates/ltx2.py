"""LTX-2 stand-ins for the official templates (issue 31 item 3), inside ComfyUI's Python.

An LTX-2 checkpoint is one file read by four loaders: CheckpointLoaderSimple (the
audio-video transformer under model.diffusion_model., the video VAE under vae.),
LTXVAudioVAELoader (audio_vae. and vocoder.), and LTXAVTextEncoderLoader, which loads
the Gemma 3 12B file beside the checkpoint's text_embedding_projection. ComfyUI reads
the transformer's, both VAEs' and the vocoder's sizes from the file's own "config"
metadata (as the released files carry them), so the stand-in writes tiny ones there and
needs no hook for them. What ComfyUI hard-codes:

- the projection's input, Gemma 3 12B's 49 hidden states of 3840 (comfy/text_encoders/
  lt.py LTXAVTEModel): the checkpoint's metadata (encoders.TINY_KEY) gives the tiny
  widths as an init override, which `install_hook()`'s LTXAVTEModel.__init__ takes;
- Gemma 3 12B's sizes (Gemma3_12B_Config, its vision tower included): init overrides in
  the Gemma stand-in's metadata (no model_options key reaches the config: LTXAVTEModel
  builds its Gemma without a model_name). The stand-in keeps 48 layers (32 wide):
  LTXAVTEModel.load_sd tells the Gemma file from the checkpoint by layer 47.
- 128 latent channels (video VAE, latent format) and the audio latent's 8 channels x 16
  frequency bins (LTXAVModel), 64 mel bins in stereo (the vocoder's 128 inputs): kept.

One stand-in serves LTX-2 and LTX-2.3 file names (the 2.0 layout: a single-linear
projection and the connectors in the transformer).
"""
import json
import os
import zlib

import builders
import encoders

TINY_KEY = encoders.TINY_KEY
ARCHITECTURES = {"checkpoint:ltxav", "te:gemma3_12b", "te:ltxav_projection",
                 "vae:ltxav_audio_vae", "lora:ltxav", "lora:gemma3_12b",
                 "latent_upscaler:ltxv_latent_upscaler"}
LTXAV_TE = "comfy.text_encoders.lt.LTXAVTEModel"

GEMMA_VISION_TINY = {"num_channels": 3, "hidden_act": "gelu_pytorch_tanh", "hidden_size": 16,
                     "image_size": 64, "intermediate_size": 32,
                     "model_type": "siglip_vision_model", "num_attention_heads": 1,
                     "num_hidden_layers": 1, "patch_size": 16}
# 48 layers: see the module docstring; a 256-token vocabulary (the tiny tokenizer's)
GEMMA_LAYERS = 48
encoders.TE_FILES["gemma3_12b"] = dict(
    file="enc_gemma3_12b.safetensors", arch="llm", model_name="gemma3_12b",
    cls="comfy.text_encoders.llama.Gemma3_12B", config={},
    init_overrides={"comfy.text_encoders.llama.Gemma3_12B_Config": {
        "vocab_size": 256, "hidden_size": 32, "intermediate_size": 64,
        "num_hidden_layers": GEMMA_LAYERS, "num_attention_heads": 2, "num_key_value_heads": 1,
        "head_dim": 16, "vision_config": GEMMA_VISION_TINY, "mm_tokens_per_image": 16}},
    dtype="bfloat16", tokenizer="spiece_gemma")
GEMMA_STATES = 32 * (GEMMA_LAYERS + 1)     # the projection's input: every hidden state
TEXT_WIDTH = 32                            # the projection's output (caption_channels)

# the transformer: 2 heads of 32 (video), 2 of 16 (audio), 4 blocks; its text
# connectors 2 heads wide enough for the projection's output (caption_channels)
TRANSFORMER = {"num_attention_heads": 2, "attention_head_dim": 32, "cross_attention_dim": 64,
               "audio_num_attention_heads": 2, "audio_attention_head_dim": 16,
               "audio_cross_attention_dim": 32, "connector_num_attention_heads": 2,
               "connector_num_layers": 1}
LAYERS = 4
AUDIO_VAE = {"model": {"params": {"ddconfig": {
    "double_z": True, "mel_bins": 64, "z_channels": 8, "resolution": 256,
    "downsample_time": False, "in_channels": 2, "out_ch": 2, "ch": 16, "ch_mult": [1, 2, 4],
    "num_res_blocks": 1, "attn_resolutions": [], "dropout": 0.0,
    "mid_block_add_attention": False, "norm_type": "pixel", "causality_axis": "height"},
    "sampling_rate": 16000}},
    "preprocessing": {"stft": {"filter_length": 1024, "hop_length": 160}}}
VOCODER = {"resblock_kernel_sizes": [3], "resblock_dilation_sizes": [[1, 3, 5]],
           "upsample_rates": [5, 4, 2, 2, 2], "upsample_kernel_sizes": [16, 16, 8, 4, 4],
           "upsample_initial_channel": 64, "stereo": True, "resblock": "1"}
UPSCALER = {"_class_name": "LatentUpsampler", "in_channels": 128, "mid_channels": 32,
            "num_blocks_per_stage": 1, "dims": 3, "spatial_upsample": True,
            "temporal_upsample": False, "spatial_scale": 2.0, "rational_resampler": False}


def _standin(work, name):
    return os.path.join(work, "standins", name)


def _projection(seed):
    import torch
    g = torch.Generator().manual_seed(seed)
    return {"text_embedding_projection.aggregate_embed.weight":
            torch.randn(TEXT_WIDTH, GEMMA_STATES, generator=g) / GEMMA_STATES ** 0.5}


def _te_tiny(seed):
    return {"name": "ltxav", "seed": seed,
            "init_overrides": {LTXAV_TE: {"tiny_projection": [GEMMA_STATES, TEXT_WIDTH]}}}


_WIDTH = {}


def text_width(work):
    """The width of what LTXAVTextEncoderLoader makes of the Gemma stand-in and a
    projection stand-in, read by encoding a prompt through ComfyUI's loader."""
    if not _WIDTH:
        import comfy.sd
        gemma = encoders.build_te_file(work, "gemma3_12b")[0]
        path = _standin(work, "ltxav_projection.safetensors")
        spec = json.dumps(_te_tiny(0), sort_keys=True)
        if not encoders._up_to_date(path, spec):
            encoders._save(path, _projection(0), "bfloat16", encoders._spec_metadata(spec))
        clip = comfy.sd.load_clip(ckpt_paths=[gemma, path], clip_type=comfy.sd.CLIPType.LTXV)
        enc = clip.encode_from_tokens(clip.tokenize("a red fox"), return_dict=True)
        _WIDTH["cond"] = int(enc["cond"].shape[-1])
        del clip
    return _WIDTH["cond"]


def unet_config(width):
    """What ComfyUI's detection gives the stand-in's transformer (its config metadata
    merged): the LTXAV model config's unet_config."""
    heads = TRANSFORMER["connector_num_attention_heads"]
    return {"image_model": "ltxav", "num_layers": LAYERS, **TRANSFORMER,
            "caption_channels": width, "connector_attention_head_dim": width // heads}


def build_checkpoint(work, dest):
    import comfy.ldm.lightricks.vae.audio_vae as audio_vae
    import comfy.ldm.lightricks.vae.causal_video_autoencoder as video_vae
    import families
    seed = builders.seed_of(os.path.basename(dest))
    width = text_width(work)
    unet = unet_config(width)
    transformer = {k: v for k, v in unet.items() if k != "image_model"}
    transformer.pop("num_layers")
    config = {"transformer": transformer, "vae": encoders.LTXV_TINY_CONFIG,
              "audio_vae": AUDIO_VAE, "vocoder": VOCODER}
    tiny = dict(_te_tiny(seed), ltx2_config=config)
    spec = json.dumps(tiny, sort_keys=True)
    path = _standin(work, f"ckpt_ltxav-{seed}-{zlib.crc32(spec.encode()):08x}.safetensors")
    if not encoders._up_to_date(path, spec):
        sd = {f"model.diffusion_model.{k}": v for k, v in
              families.random_state_dict(unet, seed, "LTXAV").items()}
        parts = {"vae.": video_vae.VideoVAE(config=dict(encoders.LTXV_TINY_CONFIG)),
                 "": audio_vae.AudioVAE(metadata={"config": json.dumps(config)})}
        for prefix, module in parts.items():
            part = encoders._randomize(encoders._state_dict(module), seed + len(prefix))
            sd.update({prefix + k.replace("autoencoder.", "audio_vae.", 1): v
                       for k, v in part.items()})
        sd.update(_projection(seed))
        meta = encoders._spec_metadata(spec, {"config": json.dumps(config)})
        encoders._save(path, sd, "bfloat16", meta)
    builders._link(path, dest)
    # LTXAVTextEncoderLoader and LTXVAudioVAELoader read it from checkpoints/
    models = os.path.dirname(os.path.dirname(dest))
    builders._link(path, os.path.join(models, "checkpoints", os.path.basename(dest)))
    return path


def build_upscaler(work, dest):
    import comfy.ops
    from comfy.ldm.lightricks.latent_upsampler import LatentUpsampler
    seed = builders.seed_of(os.path.basename(dest))
    spec = json.dumps({"name": "ltxv_latent_upscaler", "seed": seed, "config": UPSCALER},
                      sort_keys=True)
    path = _standin(work, f"ltxv_latent_upscaler-{seed}.safetensors")
    if not encoders._up_to_date(path, spec):
        model = LatentUpsampler.from_config(UPSCALER, operations=comfy.ops.disable_weight_init)
        sd = encoders._randomize(encoders._state_dict(model), seed)
        encoders._save(path, sd, "bfloat16",
                       encoders._spec_metadata(spec, {"config": json.dumps(UPSCALER)}))
    builders._link(path, dest)


def _lora(named_linears, prefix, seed, rank=4):
    import torch
    g = torch.Generator().manual_seed(seed)
    sd = {}
    for name, mod in named_linears:
        k = f"{prefix}{name}"
        sd[f"{k}.lora_down.weight"] = torch.randn(rank, mod.in_features, generator=g) * 0.1
        sd[f"{k}.lora_up.weight"] = torch.randn(mod.out_features, rank, generator=g) * 0.1
        sd[f"{k}.alpha"] = torch.tensor(float(rank))
    return sd


def build_lora(work, base, dest):
    """A random LoRA on every Linear of the transformer stand-in (diffusion_model.*) or
    of the Gemma stand-in's layers (text_encoders.gemma3_12b.transformer.*, the key
    format comfy/lora.py maps onto LTXAVTEModel)."""
    import safetensors.torch
    import torch
    seed = builders.seed_of(os.path.basename(dest))
    if base == "ltxav":
        import families
        unet = unet_config(text_width(work))
        shape = zlib.crc32(json.dumps(unet, sort_keys=True).encode())
        model = families.model_config_for(unet, "LTXAV").get_model(
            {}, "", device=torch.device("meta")).diffusion_model
        prefix = "diffusion_model."
    else:
        import comfy.ops
        spec = encoders.TE_FILES["gemma3_12b"]
        shape = zlib.crc32(json.dumps(spec, sort_keys=True).encode())
        with encoders._overrides(spec["init_overrides"]):
            model = encoders._resolve(spec["cls"])({}, torch.float32, "meta",
                                                   comfy.ops.manual_cast)
        prefix = "text_encoders.gemma3_12b.transformer."
    path = _standin(work, f"lora_{base}-{seed}-{shape:08x}.safetensors")
    if not os.path.exists(path):
        linears = [(n, m) for n, m in model.named_modules()
                   if isinstance(m, torch.nn.Linear) and n and
                   (base == "ltxav" or n.startswith("model.layers."))]
        safetensors.torch.save_file(_lora(linears, prefix, seed), path + ".part")
        os.replace(path + ".part", path)
    builders._link(path, dest)


def build(work, arch, dest):
    """Makes `dest` the stand-in of LTX-2 architecture `arch` ("kind:name")."""
    kind, name = arch.split(":", 1)
    if kind in ("checkpoint", "vae") or arch == "te:ltxav_projection":
        return build_checkpoint(work, dest)     # the audio VAE and projection travel in it
    if arch == "te:gemma3_12b":
        return builders._link(encoders.build_te_file(work, "gemma3_12b")[0], dest)
    if kind == "lora":
        return build_lora(work, name, dest)
    if kind == "latent_upscaler":
        return build_upscaler(work, dest)
    raise builders.NoBuilder(f"no stand-in builder for {arch} (tests/templates/ltx2.py)")


def install_hook():
    """LTXAVTEModel builds a stand-in's projection at its tiny widths (`tiny_projection`,
    an init override the checkpoint's metadata gives while load_clip loads it) instead of
    Gemma 3 12B's 49 x 3840 -> 3840 (or 4096 + 2048)."""
    import comfy.text_encoders.lt as lt
    cls = lt.LTXAVTEModel
    original = cls.__dict__["__init__"]
    if getattr(original, "_placement_ltx2", False):
        return

    def init(self, dtype_llama=None, device="cpu", dtype=None,
             text_projection_type="single_linear", model_options={}, tiny_projection=None):
        if tiny_projection is None:
            return original(self, dtype_llama=dtype_llama, device=device, dtype=dtype,
                            text_projection_type=text_projection_type,
                            model_options=model_options)
        width_in, width_out = tiny_projection
        # what LTXAVTEModel.__init__ does, at the tiny widths (the released ones would
        # allocate 0.7 G parameters first)
        import torch
        torch.nn.Module.__init__(self)
        self.dtypes = {dtype, dtype_llama}
        self.compat_mode = False
        self.text_projection_type = text_projection_type
        self.gemma3_12b = lt.Gemma3_12BModel(device=device, dtype=dtype_llama,
                                             model_options=model_options, layer="all",
                                             layer_idx=None)
        ops = self.gemma3_12b.operations
        if text_projection_type == "single_linear":
            self.text_embedding_projection = ops.Linear(width_in, width_out, bias=False,
                                                        dtype=dtype, device=device)
        else:
            self.text_embedding_projection = lt.DualLinearProjection(
                width_in, width_out, width_out, dtype=dtype, device=device, operations=ops)
    init._placement_ltx2 = True
    cls.__init__ = init
