"""Regenerate placement/catalog/tables.json: the tensor tables of the common models.

Each table is read from the real architecture instantiated on the `meta` device (no
weights, no downloads) from ComfyUI's own classes at the released sizes: diffusion
models through ComfyUI's model detection (the config below is what
comfy.model_detection.detect_unet_config reads from the released file; the built
model's state dict is detected again and must give the same config and model class),
text encoders through the classes comfy.sd.load_text_encoder_state_dicts picks (the
built table must be detected as the same encoder by comfy.sd.detect_te_model), VAEs
through the classes and configs comfy.sd.VAE picks for the released file's keys.

Run with a Python that has ComfyUI's requirements (torch included); the pack itself
never needs ComfyUI or torch to read the catalog:

    /tmp/comfyvenv/bin/python placement/catalog/build.py --comfyui /tmp/comfyui

This file is a script: it imports nothing from the pack, and torch/comfy only inside
main() (placement/ stays importable without them).
"""
import argparse
import json
import os
import re
import sys

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tables.json")
FORMAT = 1

# safetensors dtype name of the released file -> bytes per element
DTYPE_BYTES = {"BF16": 2, "F16": 2, "F32": 4, "F8_E4M3": 1}

# -- the diffusion models: (name, detected config, dtype, released file, published
#    parameter count, companions, note). The config is what ComfyUI's detection reads
#    from the released file's keys and shapes (comfy/model_detection.py).
_FLUX1 = {"image_model": "flux", "axes_dim": [16, 56, 56], "num_heads": 24, "mlp_ratio": 4.0,
          "theta": 10000, "out_channels": 16, "qkv_bias": True, "txt_ids_dims": [],
          "in_channels": 16, "hidden_size": 3072, "context_in_dim": 4096, "patch_size": 2,
          "vec_in_dim": 768, "depth": 19, "depth_single_blocks": 38, "guidance_embed": True,
          "yak_mlp": False, "txt_norm": False}
_FLUX2 = {"image_model": "flux2", "axes_dim": [32, 32, 32, 32], "num_heads": 48,
          "mlp_ratio": 3.0, "theta": 2000, "out_channels": 128, "global_modulation": True,
          "mlp_silu_act": True, "qkv_bias": False, "ops_bias": False,
          "default_ref_method": "index", "ref_index_scale": 10.0, "txt_ids_dims": [3],
          "in_channels": 128, "hidden_size": 6144, "context_in_dim": 15360, "patch_size": 1,
          "vec_in_dim": None, "depth": 8, "depth_single_blocks": 48, "guidance_embed": True,
          "yak_mlp": False, "txt_norm": False}
_MMDIT = {"in_channels": 16, "patch_size": 2, "out_channels": 16, "input_size": None,
          "adm_in_channels": 2048, "pos_embed_scaling_factor": None, "qk_norm": "rms"}
_SD35L = dict(_MMDIT, depth=38, num_patches=36864, pos_embed_max_size=192,
              context_embedder_config={"target": "torch.nn.Linear",
                                       "params": {"in_features": 4096, "out_features": 2432}},
              x_block_self_attn_layers=[])
_SD35M = dict(_MMDIT, depth=24, num_patches=147456, pos_embed_max_size=384,
              context_embedder_config={"target": "torch.nn.Linear",
                                       "params": {"in_features": 4096, "out_features": 1536}},
              x_block_self_attn_layers=list(range(13)))
_UNET = {"use_checkpoint": False, "image_size": 32, "use_spatial_transformer": True,
         "legacy": False, "out_channels": 4, "in_channels": 4, "model_channels": 320,
         "use_temporal_resblock": False, "use_temporal_attention": False}
_SDXL = dict(_UNET, num_classes="sequential", adm_in_channels=2816, num_res_blocks=[2, 2, 2],
             transformer_depth=[0, 0, 2, 2, 10, 10], channel_mult=[1, 2, 4],
             transformer_depth_middle=10, use_linear_in_transformer=True, context_dim=2048,
             transformer_depth_output=[0, 0, 0, 2, 2, 2, 10, 10, 10])
_SD15 = dict(_UNET, adm_in_channels=None, num_res_blocks=[2, 2, 2, 2],
             transformer_depth=[1, 1, 1, 1, 1, 1, 0, 0], channel_mult=[1, 2, 4, 4],
             transformer_depth_middle=1, use_linear_in_transformer=False, context_dim=768,
             transformer_depth_output=[1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0])


def _wan(dim, ffn, layers, in_dim, out_dim, model_type):
    return {"image_model": "wan2.1", "dim": dim, "out_dim": out_dim, "num_heads": dim // 128,
            "ffn_dim": ffn, "num_layers": layers, "patch_size": (1, 2, 2), "freq_dim": 256,
            "window_size": (-1, -1), "qk_norm": True, "cross_attn_norm": True, "eps": 1e-6,
            "in_dim": in_dim, "model_type": model_type}


_HUNYUAN = {"image_model": "hunyuan_video", "in_channels": 16, "patch_size": [1, 2, 2],
            "out_channels": 16, "vec_in_dim": 768, "axes_dim": [16, 56, 56], "meanflow": False,
            "context_in_dim": 4096, "hidden_size": 3072, "mlp_ratio": 4.0, "num_heads": 24,
            "depth": 20, "depth_single_blocks": 40, "theta": 256, "qkv_bias": True,
            "byt5": False, "guidance_embed": True, "use_cond_type_embedding": False,
            "vision_in_dim": None, "meanflow_sum": False}
_QWEN = {"image_model": "qwen_image", "in_channels": 64, "num_layers": 60}
_LTXV2B = {"image_model": "ltxv", "num_layers": 28, "attention_head_dim": 64,
           "cross_attention_dim": 2048}
_LTXV13B = {"image_model": "ltxv", "num_layers": 48, "attention_head_dim": 128,
            "cross_attention_dim": 4096}

_FLUX_WITH = {"te": ["clip-l", "t5xxl"], "vae": ["flux-vae"]}
_WAN_WITH = {"te": ["umt5-xxl"], "vae": ["wan2.1-vae"]}
DIFFUSION = [
    # name, config, supported_models class, dtype, released file, published params, with, note
    ("flux1-dev", _FLUX1, "Flux", "BF16", "flux1-dev.safetensors", 11.9e9, _FLUX_WITH, ""),
    ("flux1-schnell", dict(_FLUX1, guidance_embed=False), "FluxSchnell", "BF16",
     "flux1-schnell.safetensors", 11.9e9, _FLUX_WITH, ""),
    ("flux2-dev", _FLUX2, "Flux2", "BF16", "flux2-dev.safetensors", 32e9,
     {"te": ["mistral-3-small-flux2"], "vae": ["flux2-vae"]}, ""),
    ("sd3.5-large", _SD35L, "SD3", "BF16", "sd3.5_large.safetensors", 8.1e9,
     {"te": ["clip-l", "clip-g", "t5xxl"], "vae": ["sd3-vae"]},
     "the MMDiT alone; the released checkpoint also holds its VAE"),
    ("sd3.5-medium", _SD35M, "SD3", "BF16", "sd3.5_medium.safetensors", 2.5e9,
     {"te": ["clip-l", "clip-g", "t5xxl"], "vae": ["sd3-vae"]},
     "the MMDiT-X alone; the released checkpoint also holds its VAE"),
    ("sdxl", _SDXL, "SDXL", "F16", "sd_xl_base_1.0.safetensors", 2.567e9,
     {"te": ["clip-l", "clip-g"], "vae": ["sdxl-vae"]},
     "the UNet alone; the released checkpoint also holds its text encoders and VAE"),
    ("sd1.5", _SD15, "SD15", "F16", "v1-5-pruned-emaonly.safetensors", 0.86e9,
     {"te": ["clip-l"], "vae": ["sd1.5-vae"]},
     "the UNet alone; the released checkpoint also holds its text encoder and VAE"),
    ("wan2.1-t2v-1.3b", _wan(1536, 8960, 30, 16, 16, "t2v"), "WAN21_T2V", "F16",
     "wan2.1_t2v_1.3B_fp16.safetensors", 1.42e9, _WAN_WITH, ""),
    ("wan2.1-t2v-14b", _wan(5120, 13824, 40, 16, 16, "t2v"), "WAN21_T2V", "BF16",
     "wan2.1_t2v_14B_bf16.safetensors", 14.3e9, _WAN_WITH, ""),
    ("wan2.1-i2v-14b", _wan(5120, 13824, 40, 36, 16, "i2v"), "WAN21_I2V", "BF16",
     "wan2.1_i2v_720p_14B_bf16.safetensors", 16.4e9,
     {"te": ["umt5-xxl"], "vae": ["wan2.1-vae"]}, "also needs clip_vision_h"),
    ("wan2.2-ti2v-5b", _wan(3072, 14336, 30, 48, 48, "t2v"), "WAN22_T2V", "F16",
     "wan2.2_ti2v_5B_fp16.safetensors", 5e9, {"te": ["umt5-xxl"], "vae": ["wan2.2-vae"]}, ""),
    ("wan2.2-t2v-14b", _wan(5120, 13824, 40, 16, 16, "t2v"), "WAN21_T2V", "F16",
     "wan2.2_t2v_high_noise_14B_fp16.safetensors", 14.3e9, _WAN_WITH,
     "one of the two experts (high noise, low noise: the same table); they take turns"),
    ("wan2.2-i2v-14b", _wan(5120, 13824, 40, 36, 16, "t2v"), "WAN21_T2V", "F16",
     "wan2.2_i2v_high_noise_14B_fp16.safetensors", 14.3e9, _WAN_WITH,
     "one of the two experts (high noise, low noise: the same table); they take turns"),
    ("hunyuan-video", _HUNYUAN, "HunyuanVideo", "BF16",
     "hunyuan_video_t2v_720p_bf16.safetensors", 13e9,
     {"te": ["clip-l", "llava-llama3-8b"], "vae": ["hunyuan-video-vae"]}, ""),
    ("qwen-image", _QWEN, "QwenImage", "BF16", "qwen_image_bf16.safetensors", 20.45e9,
     {"te": ["qwen2.5-vl-7b"], "vae": ["qwen-image-vae"]}, ""),
    ("ltxv-2b", _LTXV2B, "LTXV", "BF16", "ltx-video-2b-v0.9.5.safetensors", None,
     {"te": ["t5xxl"]},
     "the transformer alone; the released checkpoint also holds its VAE (not in the catalog)"),
    ("ltxv-13b", _LTXV13B, "LTXV", "BF16", "ltxv-13b-0.9.7-dev.safetensors", 13e9,
     {"te": ["t5xxl"]},
     "the transformer alone; the released checkpoint also holds its VAE (not in the catalog)"),
]

# -- text encoders: (name, builder, TEModel comfy.sd.detect_te_model must give, dtype,
#    released file, published params, note)
TEXT = [
    ("clip-l", "sd1_clip.SDClipModel", "CLIP_L", "F16", "clip_l.safetensors", 123e6, ""),
    ("clip-g", "sdxl_clip.SDXLClipG", "CLIP_G", "F16", "clip_g.safetensors", 695e6, ""),
    ("t5xxl", "text_encoders.sd3_clip.T5XXLModel", "T5_XXL", "F16", "t5xxl_fp16.safetensors",
     4.76e9, "the T5 v1.1 XXL encoder"),
    ("umt5-xxl", "text_encoders.wan.UMT5XXlModel", "T5_XXL", "F16",
     "umt5_xxl_fp16.safetensors", 5.68e9, "the UMT5 XXL encoder"),
    ("qwen2.5-vl-7b", "text_encoders.qwen_image.Qwen25_7BVLIModel", "QWEN25_7B", "BF16",
     "qwen_2.5_vl_7b.safetensors", 8.29e9 - 0.545e9,
     "with its vision tower; as ComfyUI builds it: no LM head (the released file may hold it, 0.55B, unused)"),
    ("llava-llama3-8b", "text_encoders.hunyuan_video.LLAMAModel", "LLAMA3_8", "F16",
     "llava_llama3_fp16.safetensors", 8.03e9 - 0.525e9,
     "the Llama-3 8B language model as ComfyUI builds it: no LM head (the released file may hold it, 0.53B, unused)"),
    ("mistral-3-small-flux2", "text_encoders.flux.Mistral3_24BModel:pruned", "MISTRAL3_24B_PRUNED_FLUX2",
     "BF16", "mistral_3_small_flux2_bf16.safetensors", None,
     "Mistral Small 3.1 24B cut to the 30 layers Flux.2 reads"),
]

# -- VAEs: (name, builder, config, dtype, released file, published params, note)
_KL = {"double_z": True, "z_channels": 4, "resolution": 256, "in_channels": 3, "out_ch": 3,
       "ch": 128, "ch_mult": [1, 2, 4, 4], "num_res_blocks": 2, "attn_resolutions": [],
       "dropout": 0.0}
VAES = [
    ("flux-vae", "engine", dict(_KL, z_channels=16), "F32", "ae.safetensors", 83.8e6, ""),
    ("flux2-vae", "kl", dict(_KL, z_channels=32, batch_norm_latent=True), "F32",
     "flux2-vae.safetensors", 84e6, ""),
    ("sd3-vae", "engine", dict(_KL, z_channels=16), "F16", "(in sd3.5_large.safetensors)",
     83.8e6, ""),
    ("sdxl-vae", "kl", _KL, "F32", "sdxl_vae.safetensors", 83.7e6, ""),
    ("sd1.5-vae", "kl", _KL, "F32", "vae-ft-mse-840000-ema-pruned.safetensors", 83.7e6, ""),
    ("wan2.1-vae", "wan", {"dim": 96, "z_dim": 16, "dim_mult": [1, 2, 4, 4], "num_res_blocks": 2,
                           "attn_scales": [], "temperal_downsample": [False, True, True],
                           "dropout": 0.0}, "BF16", "wan_2.1_vae.safetensors", 127e6, ""),
    ("qwen-image-vae", "wan", {"dim": 96, "z_dim": 16, "dim_mult": [1, 2, 4, 4],
                               "num_res_blocks": 2, "attn_scales": [],
                               "temperal_downsample": [False, True, True], "dropout": 0.0},
     "BF16", "qwen_image_vae.safetensors", 127e6, "Wan 2.1's VAE architecture"),
    ("wan2.2-vae", "wan22", {"dim": 160, "z_dim": 48, "dim_mult": [1, 2, 4, 4],
                             "num_res_blocks": 2, "attn_scales": [],
                             "temperal_downsample": [False, True, True], "dropout": 0.0},
     "BF16", "wan2.2_vae.safetensors", 705e6, ""),
    ("hunyuan-video-vae", "kl3d", dict(_KL, z_channels=16, conv3d=True, time_compress=4), "BF16",
     "hunyuan_video_vae_bf16.safetensors", 246e6, ""),
]

# where each published parameter count comes from (the test holds every table within 2%
# of it); a model without one has None above
BASIS = {
    "flux1-dev": "Black Forest Labs: 12B; flux1-dev.safetensors is 23.8 GB of bf16 (11.9B)",
    "flux1-schnell": "flux1-schnell.safetensors: 23.8 GB of bf16 (11.9B)",
    "flux2-dev": "Black Forest Labs: a 32B flow transformer",
    "sd3.5-large": "Stability AI: 8.1B parameters",
    "sd3.5-medium": "Stability AI: 2.5B parameters",
    "sdxl": "SDXL paper (Podell et al. 2023): a 2.6B UNet (2.567B)",
    "sd1.5": "model card: an 860M UNet",
    "wan2.1-t2v-1.3b": "wan2.1_t2v_1.3B_fp16.safetensors: 2.84 GB of fp16 (1.42B)",
    "wan2.1-t2v-14b": "wan2.1_t2v_14B_bf16.safetensors: 28.6 GB of bf16 (14.3B)",
    "wan2.1-i2v-14b": "wan2.1_i2v_720p_14B_bf16.safetensors: 32.8 GB of bf16 (16.4B)",
    "wan2.2-ti2v-5b": "Wan 2.2 TI2V-5B: 5B",
    "wan2.2-t2v-14b": "wan2.2_t2v_high_noise_14B_fp16.safetensors: 28.6 GB of fp16 (14.3B)",
    "wan2.2-i2v-14b": "wan2.2_i2v_high_noise_14B_fp16.safetensors: 28.6 GB of fp16 (14.3B)",
    "hunyuan-video": "HunyuanVideo paper: 13B",
    "qwen-image": "qwen_image_bf16.safetensors: 40.9 GB of bf16 (20.45B; Qwen: a 20B MMDiT)",
    "ltxv-13b": "Lightricks: LTXV-13B",
    "clip-l": "CLIP ViT-L/14 text tower: 123M",
    "clip-g": "OpenCLIP ViT-bigG/14 text tower: 695M",
    "t5xxl": "T5 v1.1 XXL encoder: 4.76B",
    "umt5-xxl": "umt5_xxl_fp16.safetensors: 11.4 GB of fp16 (5.68B)",
    "qwen2.5-vl-7b": "Qwen2.5-VL-7B: 8.29B, less its 0.545B LM head",
    "llava-llama3-8b": "Llama 3 8B: 8.03B, less its 0.525B LM head",
    "flux-vae": "ae.safetensors: 335 MB of f32 (83.8M)",
    "flux2-vae": "flux2-vae.safetensors: 336 MB of f32 (84M)",
    "sd3-vae": "the SD3.5 VAE: 83.8M (its diffusers file: 168 MB of fp16)",
    "sdxl-vae": "sdxl_vae.safetensors: 335 MB of f32 (83.7M)",
    "sd1.5-vae": "vae-ft-mse-840000-ema-pruned.safetensors: 335 MB of f32 (83.7M)",
    "wan2.1-vae": "wan_2.1_vae.safetensors: 254 MB of bf16 (127M)",
    "qwen-image-vae": "qwen_image_vae.safetensors: 254 MB of bf16 (127M)",
    "wan2.2-vae": "wan2.2_vae.safetensors: 1.41 GB of bf16 (705M)",
    "hunyuan-video-vae": "hunyuan_video_vae_bf16.safetensors: 493 MB of bf16 (246M)",
}

ALIASES = {"flux-dev": "flux1-dev", "flux1": "flux1-dev", "flux-schnell": "flux1-schnell",
           "flux2": "flux2-dev", "sd35-large": "sd3.5-large", "sd35-medium": "sd3.5-medium",
           "sd15": "sd1.5", "sdxl-base": "sdxl", "t5-xxl": "t5xxl", "clip_l": "clip-l",
           "clip_g": "clip-g", "umt5": "umt5-xxl", "umt5xxl": "umt5-xxl",
           "qwen25-vl-7b": "qwen2.5-vl-7b", "ae": "flux-vae", "hunyuanvideo": "hunyuan-video",
           "wan2.1-1.3b": "wan2.1-t2v-1.3b", "wan2.1-14b": "wan2.1-t2v-14b",
           "wan2.2-5b": "wan2.2-ti2v-5b", "wan2.2-14b": "wan2.2-t2v-14b",
           "ltxv": "ltxv-2b", "mistral3-24b": "mistral-3-small-flux2"}


# -- the compact encoding ---------------------------------------------------------------
_INDEXED = re.compile(r"^(.*?)\.(\d+)\.(.+)$")


def encode(tensors):
    """[(name, shape, dtype)] -> a list whose items are either a tensor [name, shape] (or
    [name, shape, dtype] where it differs from the table's) or a run of alike blocks
    {"prefix": P, "first": i, "count": n, "tensors": [[suffix, shape(, dtype)], ...]}:
    the tensors P.i.suffix ... P.(i+n-1).suffix, block after block."""
    out = []
    i = 0
    while i < len(tensors):
        m = _INDEXED.match(tensors[i][0])
        if m is None:
            out.append(list(tensors[i]))
            i += 1
            continue
        prefix = m.group(1)
        # the blocks of this prefix, consecutive in the table
        blocks = []
        while i < len(tensors):
            m = _INDEXED.match(tensors[i][0])
            if m is None or m.group(1) != prefix:
                break
            index = int(m.group(2))
            if blocks and blocks[-1][0] == index:
                blocks[-1][1].append([m.group(3)] + list(tensors[i][1:]))
            else:
                blocks.append((index, [[m.group(3)] + list(tensors[i][1:])]))
            i += 1
        j = 0
        while j < len(blocks):
            first, body = blocks[j]
            n = 1
            while j + n < len(blocks) and blocks[j + n][0] == first + n and blocks[j + n][1] == body:
                n += 1
            out.append({"prefix": prefix, "first": first, "count": n, "tensors": body})
            j += n
    return out


def decode(items):
    """The inverse of encode (placement/catalog/__init__.py decodes the same way)."""
    for item in items:
        if isinstance(item, dict):
            for k in range(item["first"], item["first"] + item["count"]):
                for t in item["tensors"]:
                    yield [f"{item['prefix']}.{k}.{t[0]}"] + list(t[1:])
        else:
            yield item


# -- building on meta ---------------------------------------------------------------------
def _table(module):
    sd = module.state_dict()
    return [(k, list(v.shape)) for k, v in sd.items()], sd


def _diffusion(md, torch, config, cls_name):
    mc = md.model_config_from_unet_config(dict(config))
    if mc is None or type(mc).__name__ != cls_name:
        raise SystemExit(f"detection picked {type(mc).__name__} for {config}, not {cls_name}")
    with torch.device("meta"):
        model = mc.get_model({}, "", device="meta")
    table, sd = _table(model.diffusion_model)
    again = md.detect_unet_config(sd, "")
    norm = lambda c: json.loads(json.dumps(c, default=str))
    if norm(again) != norm(config):
        diff = {k: (again.get(k), config.get(k)) for k in set(again) | set(config)
                if norm(again.get(k)) != norm(config.get(k))}
        raise SystemExit(f"{cls_name}: the built table detects as another config: {diff}")
    again_cls = type(md.model_config_from_unet_config(again, sd)).__name__
    if again_cls != cls_name:
        raise SystemExit(f"{cls_name}: the built table is detected as {again_cls}")
    source = (f"{type(model.diffusion_model).__module__}.{type(model.diffusion_model).__name__}"
              f" via comfy.supported_models.{cls_name}")
    return table, source


def _text(sd_mod, torch, path, want):
    import importlib
    path, _, opt = path.partition(":")
    mod, _, cls = path.rpartition(".")
    klass = getattr(importlib.import_module("comfy." + mod), cls)
    options = {"num_layers": 30} if opt == "pruned" else {}
    with torch.device("meta"):
        wrapper = klass(device="meta", dtype=torch.float16, model_options=options)
    table, sd = _table(wrapper.transformer)
    got = sd_mod.detect_te_model(sd)
    if got is None or got.name != want:
        raise SystemExit(f"{path}: comfy.sd.detect_te_model says {got}, not {want}")
    t = wrapper.transformer
    return table, f"{type(t).__module__}.{type(t).__name__} via comfy.{path}"


def _vae(torch, kind, config):
    from comfy.ldm.models.autoencoder import AutoencoderKL, AutoencodingEngine
    with torch.device("meta"):
        if kind == "engine":
            m = AutoencodingEngine(
                regularizer_config={"target": "comfy.ldm.models.autoencoder.DiagonalGaussianRegularizer"},
                encoder_config={"target": "comfy.ldm.modules.diffusionmodules.model.Encoder", "params": config},
                decoder_config={"target": "comfy.ldm.modules.diffusionmodules.model.Decoder", "params": config})
        elif kind in ("kl", "kl3d"):
            m = AutoencoderKL(ddconfig=dict(config), embed_dim=config["z_channels"])
        elif kind == "wan":
            import comfy.ldm.wan.vae
            m = comfy.ldm.wan.vae.WanVAE(**config)
        elif kind == "wan22":
            import comfy.ldm.wan.vae2_2
            m = comfy.ldm.wan.vae2_2.WanVAE(**config)
        else:
            raise SystemExit(f"unknown VAE kind {kind}")
    table, _ = _table(m)
    return table, f"{type(m).__module__}.{type(m).__name__}"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--comfyui", required=True, help="a ComfyUI checkout (0.29.0)")
    ap.add_argument("--out", default=OUT)
    args = ap.parse_args(argv)
    sys.path.insert(0, os.path.abspath(args.comfyui))
    sys.argv = [sys.argv[0], "--cpu"]          # ComfyUI's device probe: no GPU needed
    import comfy.options
    comfy.options.enable_args_parsing()
    import torch
    import comfy.model_detection as md
    import comfy.sd as sd_mod
    version = "unknown"
    try:
        import comfyui_version
        version = comfyui_version.__version__
    except ImportError:
        pass

    models = {}

    def add(name, component, table, dtype, file, published, source, config, note, extra):
        params = 0
        for _, shape in table:
            n = 1
            for d in shape:
                n *= d
            params += n
        entry = {"component": component, "dtype": dtype, "file": file, "params": params,
                 "published_params": published and int(published),
                 "published_basis": BASIS.get(name), "bytes": params * DTYPE_BYTES[dtype],
                 "source": source, "config": config, "note": note, **extra,
                 "tensors": encode([[k, s] for k, s in table])}
        assert [list(t) for t in decode(entry["tensors"])] == [[k, s] for k, s in table]
        models[name] = entry
        print(f"{name:24} {component:9} {params / 1e9:8.3f}B  {len(table):5} tensors  "
              f"{source}", file=sys.stderr)

    for name, config, cls, dtype, file, pub, with_, note in DIFFUSION:
        table, source = _diffusion(md, torch, config, cls)
        add(name, "diffusion", table, dtype, file, pub, source,
            json.loads(json.dumps(config)), note, {"with": with_})
    for name, path, want, dtype, file, pub, note in TEXT:
        table, source = _text(sd_mod, torch, path, want)
        add(name, "te", table, dtype, file, pub, source, {"detected_as": want}, note, {})
    for name, kind, config, dtype, file, pub, note in VAES:
        table, source = _vae(torch, kind, config)
        add(name, "vae", table, dtype, file, pub, source, config, note, {})
    doc = {"format": FORMAT, "comfyui": version,
           "generated_by": "placement/catalog/build.py (meta-device instantiation)",
           "aliases": ALIASES, "models": models}
    # one model a line: a regenerated table shows in a diff as the lines that changed
    head = {k: v for k, v in doc.items() if k != "models"}
    with open(args.out, "w") as f:
        f.write(json.dumps(head, separators=(",", ":"))[:-1] + ',"models":{\n')
        f.write(",\n".join(json.dumps(k) + ":" + json.dumps(v, separators=(",", ":"))
                           for k, v in models.items()))
        f.write("\n}}\n")
    print(f"wrote {args.out}: {os.path.getsize(args.out)} bytes", file=sys.stderr)


if __name__ == "__main__":
    main()
