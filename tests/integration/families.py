"""Tiny random diffusion models of ComfyUI 0.29.0's own families, for integration tests.

Imported only inside ComfyUI's Python (like comfy_driver.py): it needs `comfy` on the
path and `comfy.options.enable_args_parsing()` already called by the driver.

For each family, FAMILIES[key] holds:
  - `unet_config`: the config ComfyUI's detection (comfy/model_detection.py
    `detect_unet_config`) derives from the file we write. The model is built through
    ComfyUI's own path (`model_config_from_unet_config` -> `get_model`), so the module
    class and its key layout are exactly what UNETLoader builds back from the file;
    `verify()` re-runs detection on the saved file and compares key sets and shapes.
  - `build(dir) -> file name`: writes the random weights (seeded; Linear/Conv weights
    and biases ~N(0, 0.02), norm weights 1 and norm biases 0; buffers left
    uninitialised by the constructor are filled too) as a bare diffusion-model state
    dict (no "model.diffusion_model." prefix: `load_diffusion_model` strips it when
    present, and a bare dict is what UNET files hold).
  - `conditioning(seed)`: a CONDITIONING list [[cross_attn, {extra keys}]] with the
    shapes that family's `extra_conds` read; `empty_latent()`: {"samples": zeros} of the
    family's latent shape (5-D for video models), small.
  - `config`: the model config class detection must pick (comfy/supported_models.py),
    `model_class`: the comfy/model_base.py class it builds.
  - `tier`: "tiny" (the smallest widths and depths detection accepts, a few MB for most
    families; SD1.5/SDXL/SVD/PixArt/HunyuanDiT/Cosmos keep hard-coded widths and weigh
    100-480 MB), "min" (detection hard-codes full widths: the smallest file it accepts
    is minimal depth at full width, 1-4 GB: built and run only on request) or "meta"
    (detection hard-codes the whole architecture: no smaller file is detected as this
    family; check it on the meta device at full size with `Family.meta_model()`).
  - `full_config`: the config detection derives from the released checkpoint, for
    full-size checks on the meta device (`Family.meta_model(full=True)`).
  - `notes`: what detection reads and hard-codes, and why this size.
  - `depth_keys` / `with_depth(n)`: the same family with n blocks per block list (a
    streaming ring or a split over several devices needs more than the default 1-2).
"""
import dataclasses
import hashlib
import json
import os
from typing import Optional

import torch
import safetensors.torch

import comfy.model_detection
import comfy.supported_models  # noqa: F401  (detection's table)

STD = 0.02
DEFAULT_SEED = 1234
FORMAT = 1            # bump when the way weights are drawn changes (cached files rebuild)

# -- the models --------------------------------------------------------------------


@dataclasses.dataclass
class Family:
    key: str
    title: str
    config: str                       # expected comfy.supported_models class name
    model_class: str                  # expected comfy.model_base class name
    unet_config: dict                 # detection's output for the file we write
    latent: tuple                     # the empty latent's shape
    context: tuple                    # (tokens, width) of cross_attn
    extras: dict = dataclasses.field(default_factory=dict)   # extra cond keys
    tier: str = "tiny"                # tiny | min | meta
    full_config: Optional[dict] = None
    seed: int = DEFAULT_SEED
    metadata: Optional[dict] = None   # safetensors metadata (e.g. {"config": ...})
    notes: str = ""
    pair: Optional[str] = None        # Wan 2.2 A14B: the two experts share a pair id
    depth_keys: tuple = ()            # unet_config keys that are block counts (with_depth)
    file_key: Optional[str] = None    # at_size: the weights of this key (same config)

    @property
    def filename(self):
        return f"tiny_{self.file_key or self.key}.safetensors"

    @property
    def digest(self):
        text = json.dumps({"config": self.unet_config, "seed": self.seed, "std": STD,
                           "format": FORMAT, "metadata": self.metadata},
                          sort_keys=True, default=str)
        return hashlib.sha1(text.encode()).hexdigest()[:16]

    def build(self, directory, reuse=True):
        """Writes the random weights into `directory`; returns the file name. A file this
        module wrote before from the same config and seed is kept (reuse=True)."""
        if self.tier == "meta":
            raise MetaOnly(f"{self.title}: {self.notes}")
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, self.filename)
        if reuse and os.path.exists(path):
            try:
                with safetensors.safe_open(path, "pt") as fh:
                    if (fh.metadata() or {}).get("families_digest") == self.digest:
                        return self.filename
            except Exception:
                pass
        sd = random_state_dict(self.unet_config, self.seed)
        meta = {k: (v if isinstance(v, str) else json.dumps(v))
                for k, v in (self.metadata or {}).items()}
        meta["families_digest"] = self.digest
        tmp = path + ".part"
        safetensors.torch.save_file(sd, tmp, metadata=meta)
        os.replace(tmp, path)
        return self.filename

    def conditioning(self, seed=0, tokens=None):
        """[[cross_attn, extras]] for one prompt (batch 1), seeded; `tokens` replaces the
        prompt's length (the length the family's real text encoders produce)."""
        g = torch.Generator().manual_seed(seed)
        length, width = self.context
        tokens = tokens or length
        cross = torch.randn(1, tokens, width, generator=g)
        extras = {}
        for name, spec in self.extras.items():
            if isinstance(spec, tuple):              # a shape: seeded N(0, 1)
                extras[name] = torch.randn(*spec, generator=g)
            elif torch.is_tensor(spec):              # a fixed tensor (masks)
                extras[name] = spec.clone()
            else:                                    # a number (guidance)
                extras[name] = spec
        return [[cross, extras]]

    def empty_latent(self, batch=None):
        """{"samples": zeros} of the family's latent shape; `batch` replaces its first
        dimension (for SVD that dimension is the frames)."""
        shape = tuple(self.latent) if batch is None else (batch,) + tuple(self.latent[1:])
        return {"samples": torch.zeros(shape)}

    def with_depth(self, n):
        """The same family with every block list of depth `n` (a new key and file), for
        runs that need more blocks than the 1-2 of the default (streaming rings, splits
        over several devices). Families whose block count detection does not read (or
        ties to the width) have no depth_keys."""
        if not self.depth_keys:
            raise ValueError(f"{self.key}: detection does not read a free block count")
        config = dict(self.unet_config)
        for k in self.depth_keys:
            config[k] = n
        return dataclasses.replace(self, key=f"{self.key}_d{n}", unet_config=config,
                                   title=f"{self.title} (depth {n})", file_key=None)

    def at_size(self, depth=0, latent_scale=1, text_tokens=0, config=None, tag=""):
        """The same family at another workload: every block list of depth `depth`
        (with_depth; 0 keeps the family's), the latent `latent_scale` times as high and
        wide (its last two dimensions, as families_driver's --latent-scale), a prompt of
        `text_tokens` tokens (0 keeps the family's); `config` ({unet_config key: value},
        what detection reads: a width), named `tag`, makes it a wider file of the same
        family. The key says so ("flux1_d8_x2", "sd3_x4_t512", "ltxv_w256_d4_x2"); a
        variant that changes only the workload reads the weights of the family it came
        from (file_key)."""
        fam = self
        if config:
            if not tag:
                raise ValueError(f"{self.key}: a config change needs a tag for its key")
            fam = dataclasses.replace(fam, key=f"{fam.key}_{tag}", file_key=None,
                                      unet_config=dict(fam.unet_config, **config))
            fam = dataclasses.replace(fam, title=f"{self.title} ({fam.key})")
        fam = fam.with_depth(depth) if depth else fam
        key, changes = fam.key, {}
        if latent_scale != 1:
            shape = tuple(fam.latent)
            changes["latent"] = shape[:-2] + (shape[-2] * latent_scale,
                                              shape[-1] * latent_scale)
            key += f"_x{latent_scale}"
        if text_tokens:
            if any(torch.is_tensor(v) for v in fam.extras.values()):
                raise ValueError(f"{self.key}: its masks are as long as its prompt; "
                                 f"text_tokens would need them resized")
            changes["context"] = (text_tokens, fam.context[1])
            key += f"_t{text_tokens}"
        if not changes:
            return fam
        return dataclasses.replace(fam, key=key, file_key=fam.file_key or fam.key,
                                   title=f"{fam.title} ({key})", **changes)

    def meta_model(self, full=False):
        """(model config, model_base instance) built on the meta device."""
        return meta_model(self.full_config if full else self.unet_config)


class MetaOnly(RuntimeError):
    """This family has no size smaller than the released one that detection accepts."""


def _unet(depth_in, depth_out, nres, **kw):
    base = {"use_checkpoint": False, "image_size": 32, "use_spatial_transformer": True,
            "legacy": False, "num_res_blocks": nres, "transformer_depth": depth_in,
            "transformer_depth_output": depth_out}
    base.update(kw)
    return base


_SVD_VIDEO = {"extra_ff_mix_layer": True, "use_spatial_context": True,
              "merge_strategy": "learned_with_images", "merge_factor": 0.0,
              "video_kernel_size": [3, 1, 1], "use_temporal_resblock": True,
              "use_temporal_attention": True, "disable_temporal_crossattention": False}
_FLUX = {"image_model": "flux", "axes_dim": [16, 56, 56], "mlp_ratio": 4.0, "theta": 10000,
         "out_channels": 16, "qkv_bias": True, "txt_ids_dims": [], "in_channels": 16,
         "patch_size": 2, "guidance_embed": True, "yak_mlp": False, "txt_norm": False}
_FLUX2 = {"image_model": "flux2", "axes_dim": [32, 32, 32, 32], "mlp_ratio": 3.0, "theta": 2000,
          "out_channels": 128, "global_modulation": True, "mlp_silu_act": True,
          "qkv_bias": False, "ops_bias": False, "default_ref_method": "index",
          "ref_index_scale": 10.0, "txt_ids_dims": [3], "patch_size": 1, "in_channels": 128,
          "vec_in_dim": None, "guidance_embed": True, "yak_mlp": False, "txt_norm": False}
_CHROMA = {"image_model": "chroma", "axes_dim": [16, 56, 56], "num_heads": 24, "mlp_ratio": 4.0,
           "theta": 10000, "out_channels": 64, "qkv_bias": True, "txt_ids_dims": [],
           "in_channels": 64, "hidden_size": 3072, "context_in_dim": 4096, "patch_size": 2,
           "vec_in_dim": None, "in_dim": 64, "out_dim": 3072, "hidden_dim": 5120, "n_layers": 5}
_WAN = {"image_model": "wan2.1", "patch_size": (1, 2, 2), "freq_dim": 256,
        "window_size": (-1, -1), "qk_norm": True, "cross_attn_norm": True, "eps": 1e-6,
        "model_type": "t2v"}
_HYV = {"image_model": "hunyuan_video", "in_channels": 16, "patch_size": [1, 2, 2],
        "out_channels": 16, "vec_in_dim": 768, "axes_dim": [16, 56, 56], "meanflow": False,
        "mlp_ratio": 4.0, "theta": 256, "qkv_bias": True, "byt5": False, "guidance_embed": True,
        "use_cond_type_embedding": False, "vision_in_dim": None, "meanflow_sum": False}
_HYV15 = dict(_HYV, in_channels=65, out_channels=32, patch_size=[1, 1, 1], vec_in_dim=None,
              byt5=True, guidance_embed=False, use_cond_type_embedding=True, vision_in_dim=1152,
              meanflow_sum=False)
_COSMOS2 = {"image_model": "cosmos_predict2", "max_img_h": 240, "max_img_w": 240,
            "max_frames": 128, "in_channels": 16, "out_channels": 16, "patch_spatial": 2,
            "patch_temporal": 1, "concat_padding_mask": True, "crossattn_emb_channels": 1024,
            "pos_emb_cls": "rope3d", "pos_emb_learnable": True, "pos_emb_interpolation": "crop",
            "min_fps": 1, "max_fps": 30, "use_adaln_lora": True, "adaln_lora_dim": 256,
            "extra_per_block_abs_pos_emb": False, "rope_h_extrapolation_ratio": 4.0,
            "rope_w_extrapolation_ratio": 4.0, "rope_t_extrapolation_ratio": 1.0,
            "extra_h_extrapolation_ratio": 1.0, "extra_w_extrapolation_ratio": 1.0,
            "extra_t_extrapolation_ratio": 1.0, "rope_enable_fps_modulation": False}
_LUMINA2 = {"image_model": "lumina2", "patch_size": 2, "in_channels": 16, "dim": 2304,
            "cap_feat_dim": 2304, "qk_norm": True, "n_heads": 24, "n_kv_heads": 8,
            "axes_dims": [32, 32, 32], "axes_lens": [300, 512, 512], "rope_theta": 10000.0,
            "ffn_dim_multiplier": 4.0}
_ZIMAGE = {"image_model": "lumina2", "patch_size": 2, "in_channels": 16, "dim": 3840,
           "cap_feat_dim": 2560, "qk_norm": True, "n_heads": 30, "n_kv_heads": 30,
           "axes_dims": [32, 48, 48], "axes_lens": [1536, 512, 512], "rope_theta": 256.0,
           "ffn_dim_multiplier": 8.0 / 3.0, "z_image_modulation": True, "time_scale": 1000.0,
           "pad_tokens_multiple": 32}
_HIDREAM = {"image_model": "hidream", "attention_head_dim": 128, "axes_dims_rope": [64, 32, 32],
            "caption_channels": [4096, 4096], "max_resolution": [128, 128], "in_channels": 16,
            "llama_layers": list(range(32)) + [31] * 16, "num_attention_heads": 20,
            "num_routed_experts": 4, "num_activated_experts": 2, "num_layers": 16,
            "num_single_layers": 32, "out_channels": 16, "patch_size": 2, "text_emb_dim": 2048}
_MOCHI = {"image_model": "mochi_preview", "depth": 48, "patch_size": 2, "num_heads": 24,
          "hidden_size_x": 3072, "hidden_size_y": 1536, "mlp_ratio_x": 4.0, "mlp_ratio_y": 4.0,
          "learn_sigma": False, "in_channels": 12, "qk_norm": True, "qkv_bias": False,
          "out_bias": True, "attn_drop": 0.0, "patch_embed_bias": True,
          "posenc_preserve_area": True, "timestep_mlp_bias": True, "attend_to_padding": False,
          "timestep_scale": 1000.0, "use_t5": True, "t5_feat_dim": 4096, "t5_token_length": 256,
          "rope_theta": 10000.0}
_OMNIGEN2 = {"image_model": "omnigen2", "axes_dim_rope": [40, 40, 40],
             "axes_lens": [1024, 1664, 1664], "ffn_dim_multiplier": None, "hidden_size": 2520,
             "in_channels": 16, "multiple_of": 256, "norm_eps": 1e-05,
             "num_attention_heads": 21, "num_kv_heads": 7, "num_layers": 32,
             "num_refiner_layers": 2, "out_channels": None, "patch_size": 2,
             "text_feat_dim": 2048, "timestep_scale": 1000.0}
_ACE = {"audio_model": "ace", "attention_head_dim": 128, "in_channels": 8, "inner_dim": 2560,
        "max_height": 16, "max_position": 32768, "max_width": 32768, "mlp_ratio": 2.5,
        "num_attention_heads": 20, "num_layers": 24, "out_channels": 8, "patch_size": [16, 1],
        "rope_theta": 1000000.0, "speaker_embedding_dim": 512, "text_embedding_dim": 768,
        "ssl_encoder_depths": [8, 8], "ssl_latent_dims": [1024, 768],
        "ssl_names": ["mert", "m-hubert"], "lyric_encoder_vocab_size": 6693,
        "lyric_hidden_size": 1024}


def _families():
    F = []
    add = F.append
    # -- UNets: model_channels (320) and context_dim are matched exactly by the configs;
    # depth per level and channel_mult are read from the keys, so one level of width 320
    add(Family(
        "sd15", "SD1.5", "SD15", "BaseModel",
        _unet([1], [1, 1], [1], adm_in_channels=None, in_channels=4, out_channels=4,
              model_channels=320, channel_mult=[1], transformer_depth_middle=1,
              use_linear_in_transformer=False, context_dim=768, use_temporal_resblock=False,
              use_temporal_attention=False),
        latent=(1, 4, 8, 8), context=(8, 768),
        full_config=_unet([1, 1, 1, 1, 1, 1, 0, 0], [1] * 9 + [0] * 3, [2, 2, 2, 2],
                          adm_in_channels=None, in_channels=4, out_channels=4,
                          model_channels=320, channel_mult=[1, 2, 4, 4],
                          transformer_depth_middle=1, use_linear_in_transformer=False,
                          context_dim=768, use_temporal_resblock=False,
                          use_temporal_attention=False),
        notes="model_channels 320 and context_dim 768 are what SD15 matches: one level, "
              "one res block and one transformer block (about 26M parameters)."))
    add(Family(
        "sdxl", "SDXL", "SDXL", "SDXL",
        _unet([0, 0, 2, 2, 10, 10], [0] * 7, [6], num_classes="sequential",
              adm_in_channels=2816, in_channels=4, out_channels=4, model_channels=320,
              channel_mult=[1], transformer_depth_middle=-2, use_linear_in_transformer=True,
              context_dim=2048, use_temporal_resblock=False, use_temporal_attention=False),
        latent=(1, 4, 4, 4), context=(8, 2048), extras={"pooled_output": (1, 1280)},
        full_config=_unet([0, 0, 2, 2, 10, 10], [0, 0, 0, 2, 2, 2, 10, 10, 10], [2, 2, 2],
                          num_classes="sequential", adm_in_channels=2816, in_channels=4,
                          out_channels=4, model_channels=320, channel_mult=[1, 2, 4],
                          transformer_depth_middle=10, use_linear_in_transformer=True,
                          context_dim=2048, use_temporal_resblock=False,
                          use_temporal_attention=False),
        notes="SDXL matches transformer_depth [0,0,2,2,10,10] exactly (24 transformer blocks "
              "in the input res blocks) with model_channels 320 and context 2048: smallest "
              "accepted is one level of width 320, six res blocks, no middle block, no "
              "output transformers (about 120M parameters, 0.5 GB in float32). Latent 4x4: "
              "this one level never downsamples."))
    add(Family(
        "svd", "SVD", "SVD_img2vid", "SVD_img2vid",
        _unet([1, 1, 1, 1, 1, 1, 0, 0], [0] * 9, [8], num_classes="sequential",
              adm_in_channels=768, in_channels=8, out_channels=4, model_channels=320,
              channel_mult=[1], transformer_depth_middle=-2, use_linear_in_transformer=True,
              context_dim=1024, **_SVD_VIDEO),
        latent=(2, 4, 4, 4), context=(1, 1024),
        full_config=_unet([1, 1, 1, 1, 1, 1, 0, 0], [1] * 9 + [0] * 3, [2, 2, 2, 2],
                          num_classes="sequential", adm_in_channels=768, in_channels=8,
                          out_channels=4, model_channels=320, channel_mult=[1, 2, 4, 4],
                          transformer_depth_middle=1, use_linear_in_transformer=True,
                          context_dim=1024, **_SVD_VIDEO),
        notes="SVD matches transformer_depth [1,1,1,1,1,1,0,0], model_channels 320, "
              "in_channels 8, context 1024, adm 768: one level of width 320 with eight video "
              "res blocks, no middle block (about 120M parameters). The latent's batch is "
              "the frames (2 here)."))
    # -- DiTs
    add(Family(
        "sd3", "SD3/3.5", "SD3", "SD3",
        {"in_channels": 16, "patch_size": 2, "out_channels": 16, "depth": 2, "input_size": None,
         "adm_in_channels": 32,
         "context_embedder_config": {"target": "torch.nn.Linear",
                                     "params": {"in_features": 32, "out_features": 128}},
         "num_patches": 256, "pos_embed_max_size": 16, "qk_norm": "rms",
         "pos_embed_scaling_factor": None, "x_block_self_attn_layers": []},
        latent=(1, 16, 8, 8), context=(8, 32), extras={"pooled_output": (1, 32)},
        full_config={"in_channels": 16, "patch_size": 2, "out_channels": 16, "depth": 38,
                     "input_size": None, "adm_in_channels": 2048,
                     "context_embedder_config": {"target": "torch.nn.Linear",
                                                 "params": {"in_features": 4096,
                                                            "out_features": 2432}},
                     "num_patches": 36864, "pos_embed_max_size": 192, "qk_norm": "rms",
                     "pos_embed_scaling_factor": None, "x_block_self_attn_layers": []},
        notes="MMDiT's width is 64 x depth (read from x_embedder): depth 2 gives width 128; "
              "qk_norm rms as in SD3.5 Large. pos_embed covers latents up to 32x32."))
    add(Family(
        "flux1", "Flux.1", "Flux", "Flux",
        dict(_FLUX, num_heads=1, hidden_size=128, context_in_dim=32, vec_in_dim=32, depth=2,
             depth_single_blocks=2),
        latent=(1, 16, 8, 8), context=(8, 32), extras={"pooled_output": (1, 32),
                                                       "guidance": 3.5},
        full_config=dict(_FLUX, num_heads=24, hidden_size=3072, context_in_dim=4096,
                         vec_in_dim=768, depth=19, depth_single_blocks=38),
        depth_keys=('depth', 'depth_single_blocks'),
        notes="num_heads = hidden // 128 (axes_dim hard-coded 16+56+56): width 128, 1 head."))
    add(Family(
        "flux2", "Flux.2", "Flux2", "Flux2",
        dict(_FLUX2, num_heads=1, hidden_size=128, context_in_dim=64, depth=2,
             depth_single_blocks=2),
        latent=(1, 128, 8, 8), context=(8, 64), extras={"guidance": 4.0},
        full_config=dict(_FLUX2, num_heads=48, hidden_size=6144, context_in_dim=15360, depth=8,
                         depth_single_blocks=48),
        depth_keys=('depth', 'depth_single_blocks'),
        notes="num_heads = hidden // 128 (axes 4x32): width 128; in/out channels 128 are "
              "hard-coded (the Flux.2 latent). Text is padded to 512 tokens by Flux2."))
    add(Family(
        "chroma", "Chroma", "Chroma", "Chroma",
        dict(_CHROMA, depth=1, depth_single_blocks=0),
        latent=(1, 16, 8, 8), context=(8, 4096), extras={"guidance": 0.0}, tier="min",
        full_config=dict(_CHROMA, depth=19, depth_single_blocks=38),
        depth_keys=('depth', 'depth_single_blocks'),
        notes="Detection hard-codes the modulation approximator (64 -> 5120 x 5 layers -> "
              "3072) and its 3072-wide output must equal the hidden size: the smallest "
              "accepted file is full width with one double block and no single block "
              "(about 518M parameters, 2 GB in float32). Tiny is impossible."))
    add(Family(
        "hidream", "HiDream", "HiDream", "HiDream", dict(_HIDREAM),
        latent=(1, 16, 8, 8), context=(8, 4096), tier="meta", full_config=dict(_HIDREAM),
        notes="Detection hard-codes everything (16 double + 32 single MoE layers, width "
              "2560, Llama layer list): only the released size (about 17B) is detected. "
              "Check on the meta device at full size."))
    add(Family(
        "auraflow", "AuraFlow", "AuraFlow", "AuraFlow",
        {"max_seq": 1024, "cond_seq_dim": 2048, "n_double_layers": 1, "n_layers": 2},
        latent=(1, 4, 8, 8), context=(8, 2048), tier="min",
        full_config={"max_seq": 9216, "cond_seq_dim": 2048, "n_double_layers": 4,
                     "n_layers": 36},
        notes="Only the layer counts, max_seq and cond_seq_dim are read (AuraFlow matches "
              "cond_seq_dim 2048); width 3072 / 12 heads are constructor defaults. A file "
              "with no single layer is detected but cannot run (the last double layer is "
              "built context-pre-only): smallest runnable is one double and one single layer "
              "at full width (about 548M parameters, 2.2 GB in float32)."))
    add(Family(
        "pixart_sigma", "PixArt Sigma", "PixArtSigma", "PixArt",
        {"num_heads": 16, "patch_size": 2, "hidden_size": 1152, "in_channels": 4, "depth": 2,
         "model_max_length": 300, "image_model": "pixart_sigma", "micro_condition": False},
        latent=(1, 4, 2, 64), context=(8, 4096),
        full_config={"num_heads": 16, "patch_size": 2, "hidden_size": 1152, "in_channels": 4,
                     "depth": 28, "model_max_length": 300, "image_model": "pixart_sigma",
                     "micro_condition": False},
        depth_keys=('depth',),
        notes="Width 1152 / 16 heads and the 4096-wide caption projection are hard-coded; "
              "depth is read: two blocks (about 59M parameters). PixArt computes its position "
              "embedding's interpolation as round(((H + W) // 2) / 64), which is 0 (a "
              "division by zero) below H + W = 66: the latent is 2 x 64 (32 tokens)."))
    add(Family(
        "hunyuan_dit", "HunyuanDiT", "HunyuanDiT", "HunyuanDiT",
        {"image_model": "hydit", "depth": 2, "hidden_size": 128},
        latent=(1, 4, 8, 8), context=(77, 1024),
        extras={"conditioning_mt5xl": (1, 256, 2048),
                "attention_mask": torch.ones(1, 77, dtype=torch.long),
                "attention_mask_mt5xl": torch.ones(1, 256, dtype=torch.long)},
        full_config={"image_model": "hydit", "depth": 40, "hidden_size": 1408,
                     "mlp_ratio": 4.3637},
        depth_keys=('depth',),
        notes="Width read (128, 16 heads are fixed); the text side is fixed by the "
              "constructor (CLIP 1024 x 77, mT5 2048 x 256 with its 2048 -> 8192 -> 1024 MLP "
              "and attention pool): about 42M parameters, most of them text projections."))
    add(Family(
        "cascade_c", "Stable Cascade stage C", "Stable_Cascade_C", "StableCascade_C",
        {"stable_cascade_stage": "c", "c_cond": 1536, "c_hidden": [1536, 1536],
         "nhead": [24, 24], "blocks": [[4, 12], [12, 4]]},
        latent=(1, 16, 8, 8), context=(77, 1280), extras={"pooled_output": (1, 1, 1280)},
        tier="min",
        full_config={"stable_cascade_stage": "c", "c_cond": 2048},
        notes="Detection only tells stage C (clip_txt_mapper width 2048: full, 1536: lite); "
              "every other size is a constructor default: the smallest detected file is "
              "stage C lite (about 1.03B parameters, 4.1 GB in float32)."))
    add(Family(
        "cascade_b", "Stable Cascade stage B", "Stable_Cascade_B", "StableCascade_B",
        {"stable_cascade_stage": "b", "c_hidden": [320, 576, 1152, 1152],
         "nhead": [-1, 9, 18, 18], "blocks": [[2, 4, 14, 4], [4, 14, 4, 2]],
         "block_repeat": [[1, 1, 1, 1], [2, 2, 2, 2]]},
        latent=(1, 4, 16, 16), context=(1, 1280), extras={"pooled_output": (1, 1, 1280)},
        tier="min",
        full_config={"stable_cascade_stage": "b", "c_hidden": [320, 640, 1280, 1280],
                     "nhead": [-1, -1, 20, 20], "blocks": [[2, 6, 28, 6], [6, 28, 6, 2]],
                     "block_repeat": [[1, 1, 1, 1], [3, 3, 2, 2]]},
        notes="Detection tells full (channelwise width 640) or lite (576) stage B; any other "
              "width falls back to the constructor defaults (full size). Smallest detected "
              "file is stage B lite (about 700M parameters, 2.8 GB in float32)."))
    add(Family(
        "wan21", "Wan 2.1", "WAN21_T2V", "WAN21",
        dict(_WAN, dim=128, out_dim=16, num_heads=1, ffn_dim=256, num_layers=2, in_dim=16),
        latent=(1, 16, 2, 8, 8), context=(8, 4096),
        full_config=dict(_WAN, dim=5120, out_dim=16, num_heads=40, ffn_dim=13824,
                         num_layers=40, in_dim=16),
        depth_keys=('num_layers',),
        notes="num_heads = dim // 128: width 128, 1 head. text_dim 4096 is a constructor "
              "default (the UMT5 width)."))
    add(Family(
        "wan22_5b", "Wan 2.2 TI2V 5B", "WAN22_T2V", "WAN22",
        dict(_WAN, dim=128, out_dim=48, num_heads=1, ffn_dim=256, num_layers=2, in_dim=48),
        latent=(1, 48, 2, 8, 8), context=(8, 4096),
        full_config=dict(_WAN, dim=3072, out_dim=48, num_heads=24, ffn_dim=14336,
                         num_layers=30, in_dim=48),
        depth_keys=('num_layers',),
        notes="WAN22_T2V matches out_dim 48 (the Wan 2.2 VAE latent)."))
    for expert, seed in (("high", 2201), ("low", 2202)):
        add(Family(
            f"wan22_a14b_{expert}", f"Wan 2.2 A14B ({expert} noise)", "WAN21_T2V", "WAN21",
            dict(_WAN, dim=128, out_dim=16, num_heads=1, ffn_dim=256, num_layers=2, in_dim=16),
            latent=(1, 16, 2, 8, 8), context=(8, 4096), seed=seed, pair="wan22_a14b",
            depth_keys=("num_layers",),
            full_config=dict(_WAN, dim=5120, out_dim=16, num_heads=40, ffn_dim=13824,
                             num_layers=40, in_dim=16),
            notes="Each expert is a Wan 2.1 14B-architecture file (detected as WAN21_T2V); "
                  "the two files differ only in their weights (seed)."))
    add(Family(
        "hunyuan_video", "HunyuanVideo", "HunyuanVideo", "HunyuanVideo",
        dict(_HYV, context_in_dim=64, hidden_size=128, num_heads=1, depth=1,
             depth_single_blocks=1),
        latent=(1, 16, 2, 8, 8), context=(8, 64),
        extras={"pooled_output": (1, 768), "guidance": 6.0},
        full_config=dict(_HYV, context_in_dim=4096, hidden_size=3072, num_heads=24, depth=20,
                         depth_single_blocks=40),
        depth_keys=('depth', 'depth_single_blocks'),
        notes="num_heads = hidden // 128: width 128. vec_in_dim 768 (the CLIP-L pooled "
              "vector) is hard-coded when vector_in exists; without it the file is detected "
              "as HunyuanImage21."))
    add(Family(
        "hunyuan_video15", "HunyuanVideo 1.5", "HunyuanVideo15", "HunyuanVideo15",
        dict(_HYV15, context_in_dim=64, hidden_size=128, num_heads=1, depth=1,
             depth_single_blocks=1),
        latent=(1, 32, 2, 8, 8), context=(8, 64), extras={"pooled_output": (1, 768)},
        full_config=dict(_HYV15, context_in_dim=3584, hidden_size=2048, num_heads=16,
                         depth=54, depth_single_blocks=0),
        depth_keys=('depth', 'depth_single_blocks'),
        notes="HunyuanVideo15 matches vision_in_dim 1152 (the SigLIP width of vision_in); "
              "the ByT5 mapper (1472 -> 2048 -> 2048) is fixed by the constructor: about "
              "10M parameters at width 128."))
    add(Family(
        "ltxv", "LTXV", "LTXV", "LTXV",
        {"image_model": "ltxv", "num_layers": 2, "attention_head_dim": 2,
         "cross_attention_dim": 64},
        latent=(1, 128, 2, 4, 4), context=(8, 4096),
        extras={"attention_mask": torch.ones(1, 8, dtype=torch.long)},
        full_config={"image_model": "ltxv", "num_layers": 28, "attention_head_dim": 64,
                     "cross_attention_dim": 2048},
        depth_keys=('num_layers',),
        notes="Detection reads attention_head_dim = to_k rows // 32 (32 heads fixed): width "
              "64 gives 32 heads of 2. caption_channels 4096 (T5-XXL) is a default. A file "
              "may also carry its whole transformer config in safetensors metadata."))
    add(Family(
        "mochi", "Mochi", "GenmoMochi", "GenmoMochi", dict(_MOCHI),
        latent=(1, 12, 2, 8, 8), context=(8, 4096), tier="meta", full_config=dict(_MOCHI),
        notes="Detection hard-codes the whole architecture (48 blocks, widths 3072/1536): "
              "only the released size (about 10B) is detected. Check on the meta device."))
    add(Family(
        "cogvideox", "CogVideoX", "CogVideoX_T2V", "CogVideoX",
        {"image_model": "cogvideox", "num_attention_heads": 2, "attention_head_dim": 64,
         "time_embed_dim": 64, "num_layers": 2, "in_channels": 16, "patch_size": 2,
         "text_embed_dim": 64, "use_learned_positional_embeddings": False,
         "use_rotary_positional_embeddings": True},
        latent=(1, 16, 2, 8, 8), context=(8, 64),
        full_config={"image_model": "cogvideox", "num_attention_heads": 48,
                     "attention_head_dim": 64, "time_embed_dim": 512, "num_layers": 42,
                     "in_channels": 16, "patch_size": 2, "text_embed_dim": 4096,
                     "use_learned_positional_embeddings": False,
                     "use_rotary_positional_embeddings": True},
        depth_keys=('num_layers',),
        notes="num_attention_heads = width // 64: width 128, 2 heads (CogVideoX 5B layout, "
              "rotary positions)."))
    add(Family(
        "cosmos_predict2", "Cosmos Predict2", "CosmosT2IPredict2", "CosmosPredict2",
        dict(_COSMOS2, model_channels=256),
        latent=(1, 16, 1, 8, 8), context=(8, 1024),
        full_config=dict(_COSMOS2, model_channels=2048, num_blocks=28, num_heads=16),
        notes="Width is read; the block count (10) and 16 heads are constructor defaults "
              "for widths other than 2048/5120, cross-attention width 1024 is hard-coded. "
              "RoPE-3D needs heads wider than 8 (width 128 divides by zero): 10 blocks of "
              "width 256 (about 23M parameters)."))
    add(Family(
        "qwen_image", "Qwen-Image", "QwenImage", "QwenImage",
        {"image_model": "qwen_image", "in_channels": 64, "num_layers": 1},
        latent=(1, 16, 8, 8), context=(8, 3584), tier="min",
        full_config={"image_model": "qwen_image", "in_channels": 64, "num_layers": 60},
        depth_keys=('num_layers',),
        notes="Only in_channels and the layer count are read; width 3072 (24 x 128) and the "
              "3584-wide text input are constructor defaults: smallest accepted is one block "
              "at full width (about 380M parameters)."))
    add(Family(
        "lumina2", "Lumina2", "Lumina2", "Lumina2",
        dict(_LUMINA2, n_layers=1),
        latent=(1, 16, 8, 8), context=(8, 2304), tier="min",
        full_config=dict(_LUMINA2, n_layers=26),
        depth_keys=('n_layers',),
        notes="Heads and RoPE axes are set only for width 2304 (Lumina 2) or 3840 (Z-Image); "
              "any other width gets 32 heads with 128-wide RoPE (width 4096). The two noise "
              "and two context refiner layers are constructor defaults: smallest accepted "
              "is width 2304 with one main layer (about 427M parameters)."))
    add(Family(
        "zimage", "Z-Image", "ZImage", "Lumina2",
        dict(_ZIMAGE, n_layers=1),
        latent=(1, 16, 8, 8), context=(8, 2560), tier="min",
        full_config=dict(_ZIMAGE, n_layers=30),
        depth_keys=('n_layers',),
        notes="ZImage matches width 3840 exactly; with the four fixed refiner layers the "
              "smallest accepted file has one main layer (about 910M parameters, 3.6 GB)."))
    add(Family(
        "kandinsky5", "Kandinsky5", "Kandinsky5", "Kandinsky5",
        {"model_dim": 128, "time_dim": 64, "image_model": "kandinsky5", "ff_dim": 256,
         "visual_embed_dim": 132, "num_text_blocks": 1, "num_visual_blocks": 2},
        latent=(1, 16, 1, 8, 8), context=(8, 3584), extras={"pooled_output": (1, 768)},
        full_config={"model_dim": 1792, "axes_dims": (16, 24, 24), "time_dim": 512,
                     "image_model": "kandinsky5", "ff_dim": 7168, "visual_embed_dim": 132,
                     "num_text_blocks": 2, "num_visual_blocks": 32},
        depth_keys=('num_text_blocks', 'num_visual_blocks'),
        notes="Widths read from the keys; heads are 64 wide (axes 16+24+24 default): width "
              "128, 2 heads. Text inputs fixed at 3584 (Qwen2.5-VL) and 768 (CLIP pooled)."))
    add(Family(
        "omnigen2", "Omnigen2", "Omnigen2", "Omnigen2", dict(_OMNIGEN2),
        latent=(1, 16, 8, 8), context=(8, 2048), tier="meta", full_config=dict(_OMNIGEN2),
        notes="Detection hard-codes the whole architecture (32 layers, width 2520): only "
              "the released size (about 4B) is detected. Check on the meta device."))
    add(Family(
        "ace_step", "ACE-Step", "ACEStep", "ACEStep", dict(_ACE),
        latent=(1, 8, 16, 32), context=(8, 768), tier="meta", full_config=dict(_ACE),
        notes="Detection hard-codes the whole architecture (24 layers, width 2560, lyric "
              "and SSL encoders): only the released size (about 3.3B) is detected. Check "
              "on the meta device."))
    add(Family(
        "hunyuan3d2", "Hunyuan3D 2.0", "Hunyuan3Dv2", "Hunyuan3Dv2",
        {"image_model": "hunyuan3d2", "in_channels": 64, "context_in_dim": 64,
         "hidden_size": 128, "mlp_ratio": 4.0, "num_heads": 16, "depth": 1,
         "depth_single_blocks": 1, "qkv_bias": True, "guidance_embed": False},
        latent=(1, 64, 32), context=(8, 64),
        full_config={"image_model": "hunyuan3d2", "in_channels": 64, "context_in_dim": 1536,
                     "hidden_size": 1024, "mlp_ratio": 4.0, "num_heads": 16, "depth": 16,
                     "depth_single_blocks": 32, "qkv_bias": True, "guidance_embed": False},
        depth_keys=('depth', 'depth_single_blocks'),
        notes="Widths read; 16 heads fixed: width 128 (heads of 8). The latent is a token "
              "sequence (batch, 64, tokens)."))
    add(Family(
        "hunyuan3d21", "Hunyuan3D 2.1", "Hunyuan3Dv2_1", "Hunyuan3Dv2_1",
        {"image_model": "hunyuan3d2_1", "in_channels": 64, "context_dim": 1024,
         "hidden_size": 128, "mlp_ratio": 4.0, "num_heads": 16, "depth": 2,
         "qkv_bias": False, "guidance_cond_proj_dim": None},
        latent=(1, 64, 32), context=(8, 1024),
        full_config={"image_model": "hunyuan3d2_1", "in_channels": 64, "context_dim": 1024,
                     "hidden_size": 2048, "mlp_ratio": 4.0, "num_heads": 16, "depth": 21,
                     "qkv_bias": False, "guidance_cond_proj_dim": None},
        depth_keys=('depth',),
        notes="Width read; 16 heads and the 1024-wide image condition are fixed."))
    return {f.key: f for f in F}


# -- building -----------------------------------------------------------------------
def model_config_for(unet_config, config_class=None):
    """ComfyUI's model config matching `unet_config`; or of the supported_models class
    named `config_class` (a class ComfyUI matches by its released widths alone)."""
    if config_class:
        cfg = getattr(comfy.supported_models, config_class)(dict(unet_config))
    else:
        cfg = comfy.model_detection.model_config_from_unet_config(dict(unet_config))
    if cfg is None:
        raise ValueError(f"no ComfyUI model config matches {unet_config}")
    cfg.set_inference_dtype(torch.float32, None)
    return cfg


def meta_model(unet_config):
    """(model config, model_base instance) with every weight on the meta device: the
    full-size module tree and parameter shapes, no memory."""
    cfg = model_config_for(unet_config)
    return cfg, cfg.get_model({}, "", device=torch.device("meta"))


def _is_norm(module, leaf):
    name = type(module).__name__.lower()
    return "norm" in name or "norm" in leaf.lower() or leaf.lower().startswith("ln")


def random_state_dict(unet_config, seed, config_class=None):
    """The diffusion model ComfyUI would build for `unet_config` (model_config_for),
    with seeded random weights, as a {key: contiguous CPU tensor} dict."""
    cfg = model_config_for(unet_config, config_class)
    # the constructors leave most tensors uninitialised (comfy.ops skip init): under
    # deterministic mode torch.empty fills them with NaN, so any buffer the constructor
    # did not compute is found and filled below
    was_det = torch.are_deterministic_algorithms_enabled()
    fill = torch.utils.deterministic.fill_uninitialized_memory
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    try:
        model = cfg.get_model({}, "", device=torch.device("cpu"))
    finally:
        torch.use_deterministic_algorithms(was_det)
        torch.utils.deterministic.fill_uninitialized_memory = fill
    dm = model.diffusion_model
    g = torch.Generator().manual_seed(seed)
    modules = dict(dm.named_modules())
    params = {name for name, _ in dm.named_parameters()}
    out = {}
    with torch.no_grad():
        for key, t in dm.state_dict(keep_vars=True).items():
            t = t.detach()
            owner, _, leaf = key.rpartition(".")
            module = modules.get(owner, dm)
            if not t.is_floating_point():
                out[key] = t.clone().contiguous()
                continue
            if key in params:
                if _is_norm(module, owner.rpartition(".")[2]) and t.ndim <= 1:
                    value = torch.ones(t.shape) if leaf in ("weight", "scale", "gamma") \
                        else torch.zeros(t.shape)
                else:
                    value = torch.randn(t.shape, generator=g) * STD
            elif not torch.isfinite(t).all():        # a buffer left uninitialised
                value = torch.randn(t.shape, generator=g) * STD
            else:
                value = t.float()
            out[key] = value.to(torch.float32).contiguous()
    del model
    return out


def verify(path):
    """Detection on the saved file, as UNETLoader runs it, and the module ComfyUI builds
    back from it (on the meta device): config class, model class and key agreement."""
    import comfy.utils
    sd, metadata = comfy.utils.load_torch_file(path, return_metadata=True)
    prefix = comfy.model_detection.unet_prefix_from_state_dict(sd)
    stripped = comfy.utils.state_dict_prefix_replace(sd, {prefix: ""}, filter_keys=True)
    if stripped:             # what load_diffusion_model_state_dict does
        sd = stripped
    cfg = comfy.model_detection.model_config_from_unet(sd, "", metadata=metadata)
    if cfg is None:
        return {"config": None}
    cfg.set_inference_dtype(torch.float32, None)
    model = cfg.get_model(sd, "", device=torch.device("meta"))
    want = cfg.process_unet_state_dict(dict(sd))
    have = model.diffusion_model.state_dict()
    return {"config": type(cfg).__name__, "model_class": type(model).__name__,
            "missing": sorted(k for k in have if k not in want),
            "unexpected": sorted(k for k in want if k not in have),
            "shape_mismatch": sorted(k for k in have if k in want
                                     and tuple(have[k].shape) != tuple(want[k].shape))}


def block_lists(diffusion_model):
    """Top-level ModuleLists (and nn.Sequential of blocks) with their lengths."""
    out = {}
    for name, child in diffusion_model.named_children():
        if isinstance(child, torch.nn.ModuleList):
            out[name] = len(child)
    return out


def param_bytes(module):
    return sum(p.numel() * p.element_size() for p in module.parameters())


FAMILIES = _families()
PAIRS = {"wan22_a14b": ("wan22_a14b_high", "wan22_a14b_low")}
TIERS = ("tiny", "min", "meta")


# -- sizes where planned against measured is a percentage ------------------------------
# Planned equals measured within 10% wherever a device holds at least 8 MiB. At the suite's tiny sizes most devices of the placed ways hold a few MiB, where
# a tolerance of a fixed 1 MiB is what gets tested. At these sizes (Family.at_size) every
# device of the ways whose plans carry their own byte model (families_driver: stream_cpu,
# stream_disk, layer, auto_fit) holds at least 8 MiB: the streamed device holds the
# non-block weights, a ring and the working memory, which the latent's size grows; a
# layer split's devices hold their ranges, which depth grows. Each is a small size that
# leaves every device at least AT_8MIB_FLOOR with a margin, measured with
# benchmarks/planned_vs_measured.py (its table is in docs/runtime.md). The latent is at
# least twice as high and wide everywhere (test_families.py checks the working memory's
# growth against the families' own size); the families of hard-coded widths (the UNets,
# PixArt, HunyuanDiT's text side, Cosmos) need nothing more. A larger latent costs less
# time than more blocks here (the simulated device dispatches every operation through
# Python): HunyuanVideo and CogVideoX stay at depth 4. Flux.2's 512-token padded prompt
# and HunyuanVideo 1.5's ByT5 mapper hold enough at depth 4; SD3 has no free depth (its
# width is 64 x depth): a larger latent (its position embedding stops at 4x) and a
# 512-token prompt make its working memory. LTXV's tiny blocks (0.26 MiB at width 64, 32
# heads of 2, whose attention is slow on the CPU at large latents) would need 32 blocks
# and a 6x latent (3 minutes of the run): it is built at width 256 (heads of 8, which
# detection reads from to_k) instead.
AT_8MIB_FLOOR = 8 << 20
AT_8MIB = {
    "sd15": "x2", "sdxl": "x2", "svd": "x2", "sd3": "x4t512",
    "flux1": "d8x4", "flux2": "d4x2", "pixart_sigma": "d4x2", "hunyuan_dit": "d8x2",
    "wan21": "d16x4", "wan22_5b": "d16x4", "wan22_a14b_high": "d16x4",
    "wan22_a14b_low": "d16x4", "hunyuan_video": "d4x4", "hunyuan_video15": "d4x2",
    "ltxv": {"config": {"attention_head_dim": 8, "cross_attention_dim": 256}, "tag": "w256",
             "depth": 4, "latent_scale": 2},
    "cogvideox": "d4x4", "cosmos_predict2": "x2", "kandinsky5": "d8x6",
    "hunyuan3d2": "d6x4t2048", "hunyuan3d21": "d4x2",
}


def parse_size(text):
    """"d8x2t512" (any of the three, in that order) -> at_size's keyword arguments; a
    dict is at_size's keyword arguments already."""
    if isinstance(text, dict):
        return dict(text)
    import re
    m = re.fullmatch(r"(?:d(\d+))?(?:x(\d+))?(?:t(\d+))?", text)
    if not m or not text:
        raise ValueError(f"size {text!r}: expected e.g. d8, x2, d8x2, x4t512")
    depth, scale, tokens = m.groups()
    return {"depth": int(depth or 0), "latent_scale": int(scale or 1),
            "text_tokens": int(tokens or 0)}

