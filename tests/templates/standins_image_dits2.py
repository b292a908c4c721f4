"""Image DiT stand-ins for the official templates (issue 31 item 3), inside ComfyUI's
Python: LongCat-Image, OmniGen2, PixelDiT, Lens and JoyImage Edit, and the text encoders
they need beyond encoders.py's (Qwen2.5-VL 3B, GPT-OSS 20B).

- LongCat-Image (supported_models.LongCatImage) is Flux without guidance or pooled input
  whose text input is Qwen2.5-VL 7B's 3584-wide sequence; ComfyUI tells it from Flux by
  that width alone (model_detection.py: context_in_dim 3584), so the stand-in, Flux at
  the Qwen2.5-VL stand-in's width, names its class (`config`) for
  builders.install_unet_hook, with its [1, 2] text position axes.
- OmniGen2: detection finds it by `time_caption_embed.timestep_embedder.linear_1.bias`
  and hard-codes every size (width 2520, 32 layers, Qwen2.5-VL 3B's 2048-wide text):
  the stand-in's tiny ones travel in its metadata (`fixed`) for install_unet_hook. Its
  text encoder, Qwen2.5-VL 3B (te:qwen25_3b), is told from the 7B by
  `k_proj.bias` (256 wide: two kv heads of ComfyUI's fixed head_dim 128), so the stand-in
  has two, 32 wide otherwise.
- PixelDiT (pixel space, no VAE): detection finds it by `core.pixel_embedder.proj.weight`
  and reads nothing else (the constructor's defaults are the released 1024px model): the
  tiny sizes travel in the metadata (`fixed`). The file is in the released layout, which
  PixelDiTT2I.process_unet_state_dict converts: keys under `core.` and each pixel
  block's `adaLN_modulation.0` one Linear (per pixel of a patch: 3 msa then 3 mlp
  chunks), which the stand-in writes back from ComfyUI's own split module.
- Lens: detection reads every width from the keys (heads = img_in rows / 64; the text
  width from `txt_norm.N`, one per GPT-OSS layer the text encoder hands over), so the
  stand-in needs no hook. Its text encoder GPT-OSS 20B (te:gpt_oss_20b) is detected by
  `layers.0.self_attn.sinks` and `layers.0.mlp.experts.gate_up_proj.weight`; its sizes,
  the layers it hands over and the prompt prefix it drops are LensGptOssClipModel's
  model_options (`gpt_oss_config`, `selected_layers`, `txt_offset`), which travel in
  the file's metadata for encoders' load_clip hook. Its tokenizer travels in the file
  (`tokenizer_json`, as the released one): a byte-level BPE trained here on Lens's chat
  template, with the Harmony special tokens; 200064 tokens of embedding, since GPT-OSS
  pads with id 199999.
- JoyImage Edit: detection finds it by its 5-D `img_in` and the double blocks' keys and
  reads the width, heads (q_norm's width) and depth; it hard-codes the 4096-wide text
  input (Qwen3-VL 8B's), and JoyImage's unet_extra_config the RoPE axes of 128-wide
  heads: both travel in the metadata (`fixed`). The text width is what the Qwen3-VL 8B
  stand-in gives (built by whichever standins_*.py module builders.build routes
  te:qwen3vl_8b to), read through ComfyUI's loader.

MOSS-Image (image_moss_image_*_t2i) has no stand-in: ComfyUI 0.29.0 has no such model
(no detection, no "moss_image" CLIPLoader type).
"""
import json
import os
import zlib

import builders
import encoders
import families

TINY_KEY = encoders.TINY_KEY
ARCHITECTURES = {"diffusion:longcat_image", "diffusion:omnigen2", "te:qwen25_3b",
                 "diffusion:pixeldit", "diffusion:lens", "te:gpt_oss_20b",
                 "diffusion:joyimage"}

# -- LongCat-Image ---------------------------------------------------------------------
builders.DIFFUSION["longcat_image"] = dict(
    family="flux1", depth=4, config="LongCatImage",
    fixed={"guidance_embed": False, "vec_in_dim": None, "txt_ids_dims": [1, 2]},
    te=(("qwen25_7b",), "longcat_image"), widths={"context_in_dim": "cond"})

# -- OmniGen2 and Qwen2.5-VL 3B ---------------------------------------------------------
encoders.TE_FILES["qwen25_3b"] = dict(
    file="enc_qwen25_3b_vl.safetensors", arch="llm", model_name="qwen25_3b",
    cls="comfy.text_encoders.llama.Qwen25_3B",
    config=dict(encoders.LLM_TINY, num_attention_heads=2, num_key_value_heads=2),
    dtype="bfloat16")
builders.TEXT_ENCODERS["qwen25_3b"] = "qwen25_3b"
# 64 wide: two heads of 32 (RoPE axes 8+12+12), one kv head; one refiner layer of each
# kind and 4 main layers
builders.DIFFUSION["omnigen2"] = dict(
    family="omnigen2",
    fixed={"hidden_size": 64, "num_attention_heads": 2, "num_kv_heads": 1,
           "axes_dim_rope": [8, 12, 12], "num_layers": 4, "num_refiner_layers": 1,
           "multiple_of": 32},
    te=(("qwen25_3b",), "omnigen2"), widths={"text_feat_dim": "cond"})

# -- PixelDiT --------------------------------------------------------------------------
# 64 wide patch stream (2 heads of 32), 8-pixel patches of 8-wide pixel tokens whose
# attention is 32 wide (2 heads); 4 patch and 2 pixel blocks
families.FAMILIES["pixeldit"] = families.Family(
    "pixeldit", "PixelDiT", "PixelDiTT2I", "PixelDiTT2I",
    {"image_model": "pixeldit_t2i", "hidden_size": 64, "num_groups": 2,
     "pixel_hidden_size": 8, "pixel_attn_hidden_size": 32, "pixel_num_groups": 2,
     "patch_depth": 4, "pixel_depth": 2, "patch_size": 8, "txt_embed_dim": 32},
    latent=(1, 3, 64, 64), context=(8, 32), depth_keys=("patch_depth",),
    notes="Detection reads no size: the whole tiny config travels in the metadata.")
builders.DIFFUSION["pixeldit"] = dict(
    family="pixeldit",
    fixed={k: v for k, v in families.FAMILIES["pixeldit"].unet_config.items()
           if k not in ("image_model", "txt_embed_dim")},
    te=(("gemma2_2b",), "pixeldit"), widths={"txt_embed_dim": "cond"})


def _pixeldit_released_layout(sd):
    """ComfyUI's PixDiT_T2I state dict -> the released file's (the inverse of
    PixelDiTT2I.process_unet_state_dict)."""
    import torch
    pixel_dim = sd["pixel_embedder.proj.weight"].shape[0]
    out = {}
    for k, v in sd.items():
        if ".adaLN_modulation_mlp." in k:
            continue
        if ".adaLN_modulation_msa." in k:
            base, suffix = k.split(".adaLN_modulation_msa.")
            mlp = sd[f"{base}.adaLN_modulation_mlp.{suffix}"]
            p2 = v.shape[0] // (3 * pixel_dim)
            trail = v.shape[1:]
            both = torch.cat([v.view(p2, 3, pixel_dim, *trail),
                              mlp.view(p2, 3, pixel_dim, *trail)], dim=1)
            out[f"core.{base}.adaLN_modulation.0.{suffix}"] = both.reshape(
                6 * p2 * pixel_dim, *trail).contiguous()
        else:
            out[f"core.{k}"] = v
    return out


def build_pixeldit(work, dest):
    import safetensors.torch
    arch = "pixeldit"
    fam, widths = builders.diffusion_family(work, arch)
    seed = builders.seed_of(os.path.basename(dest))
    tiny = json.dumps({"unet_config": widths, "name": arch, "layout": "released"},
                      sort_keys=True)
    built = os.path.join(work, "standins", f"{arch}-{seed}-{zlib.crc32(tiny.encode()):08x}"
                         ".safetensors")
    if not os.path.exists(built):
        os.makedirs(os.path.dirname(built), exist_ok=True)
        sd = _pixeldit_released_layout(families.random_state_dict(fam.unet_config, seed))
        safetensors.torch.save_file(sd, built + ".part", metadata={TINY_KEY: tiny})
        os.replace(built + ".part", built)
    builders._link(built, dest)


# -- Lens and GPT-OSS 20B -----------------------------------------------------------------
GPT_OSS_TINY = {"vocab_size": 200064, "hidden_size": 16, "intermediate_size": 16,
                "num_hidden_layers": 4, "num_attention_heads": 2, "num_key_value_heads": 1,
                "head_dim": 16, "num_local_experts": 4, "num_experts_per_tok": 2,
                "sliding_window": 16}
GPT_OSS_LAYERS = [0, 1, 2, 3]         # every layer handed over (the released: 4 of 24)
HARMONY_SPECIALS = ["<|start|>", "<|message|>", "<|end|>", "<|channel|>", "<|return|>",
                    "<|endoftext|>"]


def _gpt_oss_tokenizer():
    """(tokenizer JSON bytes, tokens of Lens's prompt prefix): a byte-level BPE trained on
    Lens's chat template, the Harmony specials as special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    import comfy.text_encoders.gpt_oss as gpt_oss
    texts = [gpt_oss._lens_render_chat(t) for t in encoders.CORPUS] * 4
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1024, special_tokens=HARMONY_SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer)
    # what LensGptOssClipModel drops: the tokens before the user's prompt
    marker = "\x00"
    prefix = gpt_oss._lens_render_chat(marker).split(marker)[0]
    offset = len(tok.encode(prefix, add_special_tokens=False).ids)
    return tok.to_str().encode(), offset


def build_gpt_oss(work):
    import torch
    import comfy.ops
    from comfy.text_encoders.gpt_oss import GptOss20BConfig, GptOssModel
    path = os.path.join(work, "models", "text_encoders", "enc_gpt_oss_20b.safetensors")
    tok_json, offset = _gpt_oss_tokenizer()
    spec = json.dumps({"name": "gpt_oss_20b", "model_options": {
        "gpt_oss_config": GPT_OSS_TINY, "selected_layers": GPT_OSS_LAYERS,
        "txt_offset": offset}}, sort_keys=True)
    if encoders._up_to_date(path, spec):
        return path
    config = GptOss20BConfig(**GPT_OSS_TINY)
    # plain Linears (weights allocated) beside the mixed-precision ops' expert banks,
    # which only exist in those ops

    class ops(comfy.ops.manual_cast):
        MoEExperts = comfy.ops.mixed_precision_ops({}, torch.float32).MoEExperts
    model = GptOssModel(config, device="cpu", dtype=torch.float32, ops=ops)
    sd = encoders._state_dict(model)
    del model
    # the experts' weight banks exist only once loaded: [experts, out, in]
    e, h, i = config.num_local_experts, config.hidden_size, config.intermediate_size
    for n in range(config.num_hidden_layers):
        sd[f"layers.{n}.mlp.experts.gate_up_proj.weight"] = torch.empty(e, 2 * i, h)
        sd[f"layers.{n}.mlp.experts.down_proj.weight"] = torch.empty(e, h, i)
    sd = encoders._randomize(sd, builders.seed_of("gpt_oss_20b"))
    sd["tokenizer_json"] = torch.frombuffer(bytearray(tok_json), dtype=torch.uint8)
    encoders._save(path, sd, "bfloat16", encoders._spec_metadata(spec))
    return path


def _gpt_oss_width(work):
    """The width of what the GPT-OSS stand-in gives Lens, read as builders.te_widths reads
    it (through ComfyUI's CLIP loader) and left in its cache for diffusion_family (its
    builder is this module's, not encoders.build_te_file)."""
    import comfy.sd
    key = (("gpt_oss_20b",), "lens")
    if key not in builders._WIDTHS:
        clip = comfy.sd.load_clip(ckpt_paths=[build_gpt_oss(work)],
                                  clip_type=comfy.sd.CLIPType.LENS, model_options={})
        enc = clip.encode_from_tokens(clip.tokenize("a red fox"), return_dict=True)
        builders._WIDTHS[key] = {"cond": int(enc["cond"].shape[-1]), "pooled": None}
        del clip
    return builders._WIDTHS[key]["cond"]


def _lens_family(work):
    """Lens at the GPT-OSS stand-in's width: one txt_norm per layer handed over."""
    if "lens" not in families.FAMILIES:
        width = _gpt_oss_width(work)
        layers = len(GPT_OSS_LAYERS)
        families.FAMILIES["lens"] = families.Family(
            "lens", "Lens", "Lens", "Lens",
            {"image_model": "lens", "in_channels": 128, "out_channels": 32, "num_layers": 4,
             "num_attention_heads": 1, "enc_hidden_dim": width // layers,
             "multi_layer_encoder_feature": True,
             "selected_layer_index": tuple(range(layers))},
            latent=(1, 128, 4, 4), context=(8, width), depth_keys=("num_layers",),
            notes="Every size read from the keys: 64-wide heads, one per 64 of width.")
    return families.FAMILIES["lens"]


# the widths are read from the keys: nothing travels in the metadata
builders.DIFFUSION["lens"] = dict(family="lens", te=(("gpt_oss_20b",), "lens"), widths={})


# -- JoyImage Edit ------------------------------------------------------------------------
def _qwen3vl_width(work):
    """What the Qwen3-VL 8B stand-in (another standins_*.py module builds it: the one
    builders.build routes te:qwen3vl_8b to) gives JoyImage, read from that file as
    builders.te_widths reads a width and left in its cache."""
    import comfy.sd
    key = (("qwen3vl_8b",), "joyimage")
    if key not in builders._WIDTHS:
        path = os.path.join(work, "standins", "joyimage_te_qwen3vl_8b.safetensors")
        builders.build(work, "te:qwen3vl_8b", path)
        clip = comfy.sd.load_clip(ckpt_paths=[path],
                                  clip_type=comfy.sd.CLIPType.JOYIMAGE, model_options={})
        enc = clip.encode_from_tokens(clip.tokenize("a red fox"), return_dict=True)
        builders._WIDTHS[key] = {"cond": int(enc["cond"].shape[-1]), "pooled": None}
        del clip
    return builders._WIDTHS[key]["cond"]


# 64 wide, two heads of 32 (RoPE 8+12+12: the constructor's [16, 56, 56] is JoyImage's
# unet_extra_config, which the recorded config replaces), 4 double blocks; detection
# reads the width, heads and depth and hard-codes the 4096-wide text input
families.FAMILIES["joyimage"] = families.Family(
    "joyimage", "JoyImage", "JoyImage", "JoyImage",
    {"image_model": "joyimage", "in_channels": 16, "hidden_size": 64, "patch_size": [1, 2, 2],
     "num_layers": 4, "num_attention_heads": 2, "text_dim": 16,
     "rope_dim_list": [8, 12, 12]},
    latent=(1, 16, 1, 8, 8), context=(8, 16), depth_keys=("num_layers",),
    notes="Width, heads and depth read; the text width hard-coded (4096).")
builders.DIFFUSION["joyimage"] = dict(
    family="joyimage", fixed={"rope_dim_list": [8, 12, 12]},
    te=(("qwen3vl_8b",), "joyimage"), widths={"text_dim": "cond"})


def build(work, arch, dest):
    """Makes `dest` the stand-in of `arch` ("kind:name")."""
    kind, name = arch.split(":", 1)
    if arch == "te:gpt_oss_20b":
        return builders._link(build_gpt_oss(work), dest)
    if name == "joyimage":
        _qwen3vl_width(work)
    if kind == "te":
        return builders._link(encoders.build_te_file(work, name)[0], dest)
    if name == "pixeldit":
        return build_pixeldit(work, dest)
    if name == "lens":
        build_gpt_oss(work)
        _lens_family(work)
    if kind == "diffusion":
        return builders.build_diffusion(work, name, dest)
    raise builders.NoBuilder(f"no stand-in builder for {arch} "
                             f"(tests/templates/standins_image_dits2.py)")
