"""Stand-ins for the official templates (issue 31 item 3), inside ComfyUI's Python:
Lotus depth, Chroma and Chroma Radiance, Kandinsky 5 Lite image, Qwen-Image Layered and
its RGBA VAE, the Z-Image Fun ControlNet and USO model patches and Flux Depth's LoRA. How ComfyUI's detection finds each:

- Lotus-D (supported_models.LotusD) is an SD 2 UNet matched by its released widths
  alone (model_channels 320, 4-wide adm for its task embedding). The stand-in is one
  level of width 64 (one 64-wide head, as LotusD's num_head_channels) whose context is
  the 1024 wide conditioning LotusConditioning inlines; it names its class (`config`)
  and builders.install_unet_hook builds LotusD from its recorded config.
- Chroma: detection reads the width and blocks and hard-codes the modulation
  approximator (64 -> 5120 x 5 layers -> 3072, whose output is the width): the stand-in
  records the tiny approximator (`fixed`) for the hook. Chroma Radiance (no img_in, a
  patch conv and the NeRF head, found by nerf_blocks; x0 prediction by its __x0__
  buffer) likewise, with its NeRF head's hard-coded sizes.
- Kandinsky 5 Lite image is Kandinsky 5 whose class ComfyUI tells apart by width 2560
  alone: the stand-in (Kandinsky 5 at the text encoders' widths, the Flux latent's 64
  patch channels and no concat) names Kandinsky5Image.
- Qwen-Image Layered: Qwen-Image with the additional timestep embedding, found by
  time_text_embed.addition_t_embedding (negative-index references); its VAE is Wan 2.1's
  with RGBA in and out (detection reads the channels from encoder.conv1 and
  decoder.head.2).
- Z-Image Turbo Fun ControlNet Union (ModelPatchLoader: control_all_x_embedder.2-1; six
  control layers, as the released one, since it has control_layers.4 and no .14): built
  with comfy.ldm.lumina.controlnet.ZImage_Control at the Z-Image stand-in's widths and
  written in the released file's key layout (separate to_q/to_k/to_v, to_out.0,
  norm_q/norm_k, which the loader converts); the loader builds the released width 3840,
  so the widths travel as constructor overrides (model_patches.install_hook).
- USO's projector (ModelPatchLoader: feature_embedder.mid_layer_norm): the SigLIP 384
  stand-in's tokens and width (read from that file, whichever module builds it) -> the
  Flux stand-in's width, as constructor overrides.
- Flux Depth's LoRA, in BFL's control-LoRA layout as the released one (ComfyUI converts
  it, finding it by img_in.lora_A and a QK norm's scale): its img_in takes the depth
  image's latent beside the noise, so ComfyUI widens img_in (reshape_weight: the weight
  padded) and the model then concatenates InstructPixToPixConditioning's latent.
"""
import json
import os
import zlib

import builders
import encoders
import families

TINY_KEY = encoders.TINY_KEY

ARCHITECTURES = {"diffusion:lotus_d", "diffusion:chroma", "diffusion:chroma_radiance",
                 "diffusion:kandinsky5_image", "diffusion:qwen_image_layered",
                 "vae:qwen_image_layered_vae", "model_patch:zimage_fun_controlnet",
                 "model_patch:uso_projector", "lora:flux_depth"}

# -- Lotus-D -------------------------------------------------------------------------------
LOTUS_CONTEXT = 1024    # LotusConditioning's inlined prompt embedding (SD 2's text encoder)
families.FAMILIES["lotus_d"] = families.Family(
    "lotus_d", "Lotus-D", "LotusD", "Lotus",
    families._unet([1, 1], [1, 1, 1], [2], num_classes="sequential", adm_in_channels=4,
                   in_channels=4, out_channels=4, model_channels=64, channel_mult=[1],
                   transformer_depth_middle=1, use_linear_in_transformer=True,
                   context_dim=LOTUS_CONTEXT, use_temporal_resblock=False,
                   use_temporal_attention=False),
    latent=(1, 4, 8, 8), context=(77, LOTUS_CONTEXT), extras={},
    notes="LotusD matches model_channels 320 only: width 64, one level, named class.")


def build_lotus(work, dest):
    """Lotus has no text encoder (its node inlines the conditioning), so it is built
    here rather than through builders.diffusion_family, with the same metadata."""
    import safetensors.torch
    fam = families.FAMILIES["lotus_d"]
    seed = builders.seed_of(os.path.basename(dest))
    tiny = json.dumps({"unet_config": fam.unet_config, "name": "lotus_d", "init_overrides": {},
                       "config": fam.config}, sort_keys=True)
    built = os.path.join(work, "standins", f"lotus_d-{seed}-{zlib.crc32(tiny.encode()):08x}"
                         ".safetensors")
    if not os.path.exists(built):
        os.makedirs(os.path.dirname(built), exist_ok=True)
        sd = families.random_state_dict(fam.unet_config, seed, fam.config)
        safetensors.torch.save_file(sd, built + ".part", metadata={TINY_KEY: tiny})
        os.replace(built + ".part", built)
    builders._link(built, dest)


# -- Chroma and Chroma Radiance ------------------------------------------------------------
# the approximator's tiny sizes (its input, 64, is the timestep, guidance and modulation
# index embeddings the model concatenates); its output is the 128 wide stream's modulation
CHROMA_TINY = {"hidden_size": 128, "num_heads": 1, "out_dim": 128, "hidden_dim": 64,
               "n_layers": 2}
families.FAMILIES["chroma_radiance"] = families.Family(
    "chroma_radiance", "Chroma Radiance", "ChromaRadiance", "ChromaRadiance",
    dict(families._CHROMA, image_model="chroma_radiance", in_channels=3, out_channels=3,
         patch_size=16, nerf_hidden_size=64, nerf_mlp_ratio=4, nerf_depth=4,
         nerf_max_freqs=8, nerf_tile_size=512, nerf_final_head_type="conv",
         nerf_embedder_dtype=None, use_x0=True, use_sequential_txt_ids=False,
         depth=1, depth_single_blocks=1),
    latent=(1, 3, 64, 64), context=(8, 4096), extras={"guidance": 0.0},
    depth_keys=("depth", "depth_single_blocks"),
    notes="Chroma in pixel space: a 16x16 patch conv in, the NeRF head out.")
builders.DIFFUSION["chroma"] = dict(family="chroma", depth=4, fixed=dict(CHROMA_TINY),
                                    te=(("t5xxl",), "chroma"),
                                    widths={"context_in_dim": "cond"})
# the NeRF head's hard-coded 64 wide, 4 deep layers generate their weights per patch
# (64 x 64 x 4 x 3 rows each): 16 wide and 2 deep here
builders.DIFFUSION["chroma_radiance"] = dict(family="chroma_radiance", depth=4,
                                             fixed=dict(CHROMA_TINY, nerf_hidden_size=16,
                                                        nerf_depth=2),
                                             te=(("t5xxl",), "chroma"),
                                             widths={"context_in_dim": "cond"})

# -- Kandinsky 5 Lite image ----------------------------------------------------------------
builders.DIFFUSION["kandinsky5_image"] = dict(
    family="kandinsky5", depth=4, config="Kandinsky5Image",
    fixed={"visual_embed_dim": 64},        # the Flux latent's 2x2 patches, no concat
    te=(("clip_l", "qwen25_7b"), "kandinsky5_image"),
    widths={"in_text_dim": "cond", "in_text_dim2": "pooled"})

# -- Qwen-Image Layered --------------------------------------------------------------------
builders.DIFFUSION["qwen_image_layered"] = dict(
    family="qwen_image", depth=4,
    fixed={"num_attention_heads": 1, "use_additional_t_cond": True,
           "default_ref_method": "negative_index"},
    te=(("qwen25_7b",), "qwen_image"), widths={"joint_attention_dim": "cond"})

LAYERED_VAE = dict(dim=8, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=2, attn_scales=[],
                   temperal_downsample=[False, True, True], image_channels=4,
                   conv_out_channels=4, dropout=0.0)


def build_layered_vae(work, dest):
    """Wan 2.1's VAE with RGBA in and out, everything read from its keys (no hook)."""
    import comfy.ldm.wan.vae
    spec = json.dumps({"name": "qwen_image_layered_vae", "config": LAYERED_VAE},
                      sort_keys=True)
    path = os.path.join(work, "standins", "vae_qwen_image_layered.safetensors")
    if not encoders._up_to_date(path, spec):
        model = comfy.ldm.wan.vae.WanVAE(**LAYERED_VAE)
        sd = encoders._randomize(encoders._state_dict(model), 0)
        del model
        encoders._save(path, sd, "bfloat16", encoders._spec_metadata(spec))
    builders._link(path, dest)


# -- Z-Image Fun ControlNet Union -----------------------------------------------------------
ZIMAGE_CONTROL = "comfy.ldm.lumina.controlnet.ZImage_Control"
# ZImage_Control's keys -> the released file's (what nodes_model_patch.z_image_convert undoes)
_RELEASED_KEYS = {".attention.out.": ".attention.to_out.0.",
                  ".attention.q_norm.": ".attention.norm_q.",
                  ".attention.k_norm.": ".attention.norm_k."}


def _released_layout(sd, heads, kv_heads):
    out = {}
    for k, w in sd.items():
        if k.endswith(".attention.qkv.weight"):
            head = w.shape[0] // (heads + 2 * kv_heads)
            q, kk, v = w.split([heads * head, kv_heads * head, kv_heads * head])
            stem = k[:-len("qkv.weight")]
            out.update({stem + "to_q.weight": q, stem + "to_k.weight": kk,
                        stem + "to_v.weight": v})
            continue
        for old, new in _RELEASED_KEYS.items():
            k = k.replace(old, new)
        out[k] = w
    return out


def _save_patch(work, name, qualname, over, layout=None):
    """A model patch built by its class under `over` (constructor overrides, which its
    metadata carries for model_patches.install_hook), random, in `layout`'s keys."""
    import torch
    import comfy.ops
    tiny = json.dumps({"name": name, "init_overrides": over}, sort_keys=True)
    built = os.path.join(work, "standins", f"patch_{name}")
    if not encoders._up_to_date(built, tiny):
        with encoders._overrides(over):
            model = encoders._resolve(qualname)(device="cpu", dtype=torch.float32,
                                                operations=comfy.ops.disable_weight_init)
        sd = encoders._randomize(encoders._state_dict(model), builders.seed_of(name))
        del model
        sd = layout(sd) if layout else sd
        encoders._save(built, sd, "bfloat16", encoders._spec_metadata(tiny))
    return built


def build_zimage_control(work, dest):
    fam, _ = builders.diffusion_family(work, "zimage")
    c = fam.unet_config
    over = {ZIMAGE_CONTROL: {"dim": c["dim"], "n_heads": c["n_heads"],
                             "n_kv_heads": c["n_kv_heads"],
                             "ffn_dim_multiplier": c["ffn_dim_multiplier"]}}
    built = _save_patch(work, os.path.basename(dest), ZIMAGE_CONTROL, over,
                        lambda sd: _released_layout(sd, c["n_heads"], c["n_kv_heads"]))
    builders._link(built, dest)


# -- USO's projector -----------------------------------------------------------------------
USO_PROJECTOR = "comfy_extras.nodes_model_patch.SigLIPMultiFeatProjModel"


def build_uso_projector(work, dest):
    """SigLIP's hidden states (the SigLIP 384 stand-in's tokens and width) -> the Flux
    stand-in's stream width, in the released file's feature_embedder. prefix (which the
    loader strips)."""
    import safetensors
    siglip = os.path.join(work, "standins", "uso_reads_siglip_384.safetensors")
    builders.build(work, "clip_vision:siglip_384", siglip)
    with safetensors.safe_open(siglip, "pt") as fh:
        tokens, width = fh.get_slice("vision_model.embeddings.position_embedding.weight"
                                     ).get_shape()
    fam, _ = builders.diffusion_family(work, "flux")
    over = {USO_PROJECTOR: {"siglip_token_nums": tokens, "style_token_nums": 8,
                            "siglip_token_dims": width,
                            "hidden_size": fam.unet_config["hidden_size"]}}
    built = _save_patch(work, os.path.basename(dest), USO_PROJECTOR, over,
                        lambda sd: {f"feature_embedder.{k}": v for k, v in sd.items()})
    builders._link(built, dest)


def build_flux_depth_lora(work, dest, rank=4):
    """In BFL's control-LoRA layout (comfy/lora_convert.py convert_lora_bfl_control finds
    it by img_in.lora_A and single_blocks.0.norm.key_norm.scale): lora_A/lora_B on every
    Linear of the Flux stand-in, lora_B.bias (a bias difference), the QK norms' scales
    (set outright), and img_in's lora_A twice as wide as its input (the noise's and the
    depth latent's patches), from which ComfyUI derives img_in's reshape_weight."""
    import torch
    import safetensors.torch
    name = os.path.basename(dest)
    seed = builders.seed_of(name)
    fam, _ = builders.diffusion_family(work, "flux")
    shape = zlib.crc32(json.dumps(fam.unet_config, sort_keys=True, default=str).encode())
    built = os.path.join(work, "standins", f"lora_flux_depth-{seed}-{shape:08x}.safetensors")
    if not os.path.exists(built):
        model = families.model_config_for(fam.unet_config).get_model(
            {}, "", device=torch.device("meta"))
        g = torch.Generator().manual_seed(seed)
        sd = {}
        for mod_name, mod in model.diffusion_model.named_modules():
            if isinstance(mod, torch.nn.Linear) and mod_name:
                cin = mod.in_features * (2 if mod_name == "img_in" else 1)
                sd[f"{mod_name}.lora_A.weight"] = torch.randn(rank, cin, generator=g) * 0.1
                sd[f"{mod_name}.lora_B.weight"] = torch.randn(mod.out_features, rank,
                                                              generator=g) * 0.1
                sd[f"{mod_name}.lora_B.bias"] = torch.randn(mod.out_features, generator=g) * 0.01
            elif mod_name.endswith(("query_norm", "key_norm")):
                width = mod.weight.shape[0]
                sd[f"{mod_name}.scale"] = 1 + torch.randn(width, generator=g) * 0.1
        safetensors.torch.save_file(sd, built + ".part")
        os.replace(built + ".part", built)
    builders._link(built, dest)


# architecture -> its builder here (the rest: diffusion models through builders.py)
BUILDERS = {"diffusion:lotus_d": build_lotus, "vae:qwen_image_layered_vae": build_layered_vae,
            "model_patch:zimage_fun_controlnet": build_zimage_control,
            "model_patch:uso_projector": build_uso_projector,
            "lora:flux_depth": build_flux_depth_lora}


def build(work, arch, dest):
    """Makes `dest` the stand-in of `arch` ("kind:name")."""
    if arch in BUILDERS:
        return BUILDERS[arch](work, dest)
    kind, name = arch.split(":", 1)
    if kind == "diffusion":
        return builders.build_diffusion(work, name, dest)
    raise builders.NoBuilder(f"no stand-in builder for {arch} "
                             f"(tests/templates/standins_misc_models.py)")
