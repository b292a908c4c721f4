"""Stand-in model files for the official templates (issue 31 item 3), built inside
ComfyUI's Python (import after `comfy.options.enable_args_parsing()`).

Every file a template names becomes a tiny random model of the architecture
standins.py gives it: diffusion models from tests/integration/families.py, text
encoders and VAEs from tests/integration/encoders.py, LoRAs on the Linears of the
diffusion stand-in they are for. The stand-ins of one template must fit each other: the
diffusion model takes what its text encoders produce. The tiny text encoders are 32
wide, and some widths ComfyUI does not read from a diffusion model's file (Wan's
`text_dim`, a constructor default of 4096): a diffusion stand-in records those in its
metadata (encoders.TINY_KEY, {"unet_config": {...}}) and `install_unet_hook()` applies
them after ComfyUI's detection, only for such files (real files load unchanged), as
encoders.install_hooks() does for text encoders and VAEs. The widths are not written
here by hand: they are read from the text-encoder stand-ins themselves (te_widths),
by encoding a prompt through ComfyUI's own CLIP loader.

An architecture with no builder yet raises NoBuilder, which the driver lists as the
template's failure.
"""
import contextvars
import functools
import json
import os
import zlib

import encoders
import families
import vision

TINY_KEY = encoders.TINY_KEY


class NoBuilder(LookupError):
    """No stand-in builder for this architecture yet."""


# the CLIP vision stand-ins (vision.py): width, and tokens of one 224x224 image (16x16
# patches of 14 and the class token)
CLIP_VISION_WIDTH = 32
CLIP_VISION_TOKENS = 257
WAN_CLIP_VISION = {"comfy.ldm.wan.model.MLPProj": {"in_dim": CLIP_VISION_WIDTH}}

# diffusion architecture -> the families.py family it is built from, the depth of its
# block lists (4: enough to stream and split), `fixed`: tiny widths ComfyUI's detection
# does not read (it builds the released ones: Qwen-Image's 24 heads), and the
# unet_config keys that take the width of what its text encoders produce: (text-encoder
# stand-in keys, CLIP type, which output: "cond" the sequence, "pooled" the vector);
# `init`: constructor arguments no unet_config key reaches (encoders.py init_overrides).
# `fixed`, the widths and `init` travel in the file's metadata for install_unet_hook().
DIFFUSION = {
    "qwen_image": dict(family="qwen_image", depth=4, fixed={"num_attention_heads": 1},
                       te=(("qwen25_7b",), "qwen_image"),
                       widths={"joint_attention_dim": "cond"}),
    "flux": dict(family="flux1", depth=4, te=(("clip_l", "t5xxl"), "flux"),
                 widths={"context_in_dim": "cond", "vec_in_dim": "pooled"}),
    # Schnell has no guidance input; Fill takes the masked image and mask beside the
    # latent (96 channels: FluxInpaint), Canny the control image's latent (32)
    "flux_schnell": dict(family="flux1", depth=4, fixed={"guidance_embed": False},
                         te=(("clip_l", "t5xxl"), "flux"),
                         widths={"context_in_dim": "cond", "vec_in_dim": "pooled"}),
    "flux_inpaint": dict(family="flux1", depth=4, fixed={"in_channels": 96},
                         te=(("clip_l", "t5xxl"), "flux"),
                         widths={"context_in_dim": "cond", "vec_in_dim": "pooled"}),
    "flux_canny": dict(family="flux1", depth=4, fixed={"in_channels": 32},
                       te=(("clip_l", "t5xxl"), "flux"),
                       widths={"context_in_dim": "cond", "vec_in_dim": "pooled"}),
    # HiDream: ComfyUI's detection hard-codes the released sizes (the hook gives the
    # tiny ones): 2 double and 2 single MoE blocks of one 128-wide head, each reading
    # one layer of the 4-layer Llama stand-in (llama_layers), T5's and Llama's 32-wide
    # sequences (caption_channels: encoders.py's T5 d_model and LLM_TINY hidden), and
    # CLIP-L's and CLIP-G's pooled vectors side by side (text_emb_dim)
    "hidream": dict(family="hidream",
                    fixed={"num_layers": 2, "num_single_layers": 2, "num_attention_heads": 1,
                           "llama_layers": [0, 1, 2, 3], "caption_channels": [32, 32]},
                    te=(("clip_l", "clip_g", "t5xxl", "llama31_8b"), "hidream"),
                    widths={"text_emb_dim": "pooled"}),
    # SDXL: ComfyUI matches it by its released widths only (model_channels 320, context
    # 2048, adm 2816), so the stand-in names its class; 64 wide (one head), the context
    # is CLIP-L's and CLIP-G's sequences side by side, adm the pooled vector and six
    # 256-wide size embeddings
    "sdxl": dict(family="sdxl", config="SDXL", fixed={"model_channels": 64},
                 te=(("clip_l", "clip_g"), "sdxl"),
                 widths={"context_dim": "cond", "adm_in_channels": ("pooled", 6 * 256)}),
    # LTXV's T5 width is a constructor default (caption_channels 4096)
    "ltxv": dict(family="ltxv", depth=4, te=(("t5xxl",), "ltxv"),
                 widths={"caption_channels": "cond"}),
    # Qwen2.5-VL's sequence and CLIP-L's pooled vector (constructor defaults 3584, 768)
    # Flux.2 dev reads Mistral 3's three layers; Klein Qwen3's (4B or 8B) three layers,
    # with no guidance input
    "flux2": dict(family="flux2", depth=4, te=(("mistral3_24b",), "flux2"),
                  widths={"context_in_dim": "cond"}),
    "flux2_klein_4b": dict(family="flux2", depth=4, fixed={"guidance_embed": False},
                           te=(("qwen3_4b",), "flux2"), widths={"context_in_dim": "cond"}),
    "flux2_klein_9b": dict(family="flux2", depth=4, fixed={"guidance_embed": False},
                           te=(("qwen3_8b",), "flux2"), widths={"context_in_dim": "cond"}),
    # Z-Image is Lumina 2 at width 3840 (ComfyUI tells ZImage apart by that width alone):
    # the stand-in is 256 wide (its time embedding is 256 wide) with Z-Image's layout
    # and names its class (`config`)
    "zimage": dict(family="zimage", depth=4, config="ZImage",
                   fixed={"dim": 256, "n_heads": 2, "n_kv_heads": 2},
                   te=(("qwen3_4b",), "lumina2"), widths={"cap_feat_dim": "cond"}),
    "kandinsky5": dict(family="kandinsky5", depth=4, te=(("clip_l", "qwen25_7b"), "kandinsky5"),
                       widths={"in_text_dim": "cond", "in_text_dim2": "pooled"}),
    "wan21_t2v": dict(family="wan21", depth=4, te=(("umt5xxl",), "wan"),
                      widths={"text_dim": "cond"}),
    # image-to-video Wan 2.1 takes CLIP vision H's 1280-wide penultimate states
    # (hard-coded in WanModel: MLPProj(1280)), the stand-in's CLIP_VISION_WIDTH here;
    # the image latent and mask beside the noise (in_dim 36), FLF two images' tokens
    "wan21_i2v": dict(family="wan21", depth=4, fixed={"model_type": "i2v", "in_dim": 36},
                      init=WAN_CLIP_VISION, te=(("umt5xxl",), "wan"), widths={"text_dim": "cond"}),
    "wan21_flf2v": dict(family="wan21", depth=4, init=WAN_CLIP_VISION,
                        fixed={"model_type": "i2v", "in_dim": 36,
                               "flf_pos_embed_token_number": 2 * CLIP_VISION_TOKENS},
                        te=(("umt5xxl",), "wan"), widths={"text_dim": "cond"}),
    # Fun InP as i2v; Fun Control: the control latent beside the image latent (16+32)
    "wan21_fun_inp": dict(family="wan21", depth=4, fixed={"model_type": "i2v", "in_dim": 36},
                          init=WAN_CLIP_VISION, te=(("umt5xxl",), "wan"),
                          widths={"text_dim": "cond"}),
    "wan21_fun_control": dict(family="wan21", depth=4, init=WAN_CLIP_VISION,
                              fixed={"model_type": "i2v", "in_dim": 48},
                              te=(("umt5xxl",), "wan"), widths={"text_dim": "cond"}),
    "wan21_camera": dict(family="wan21", depth=4, init=WAN_CLIP_VISION,
                         fixed={"model_type": "camera", "in_dim": 32},
                         te=(("umt5xxl",), "wan"), widths={"text_dim": "cond"}),
    # VACE: its context blocks beside every other block (96 = the control video's
    # latents, reactive and inactive, and the mask's 64 channels)
    "wan21_vace": dict(family="wan21", depth=4,
                       fixed={"model_type": "vace", "vace_in_dim": 96, "vace_layers": 2},
                       te=(("umt5xxl",), "wan"), widths={"text_dim": "cond"}),
    "wan22_a14b_t2v": dict(family="wan22_a14b_high", depth=4, te=(("umt5xxl",), "wan"),
                           widths={"text_dim": "cond"}),
    # Wan 2.2's image-to-video experts take the image latent and mask beside the noise
    # (36 channels) and no CLIP vision (detected as t2v with in_dim 36); so do its Fun
    # InP experts; Fun Control's take the control and reference latents and the mask
    # (16 + 2x16 + 4), its camera experts the camera adapter (camera_2.2)
    "wan22_a14b_i2v": dict(family="wan22_a14b_high", depth=4, fixed={"in_dim": 36},
                           te=(("umt5xxl",), "wan"), widths={"text_dim": "cond"}),
    "wan22_a14b_fun_inp": dict(family="wan22_a14b_high", depth=4, fixed={"in_dim": 36},
                               te=(("umt5xxl",), "wan"), widths={"text_dim": "cond"}),
    "wan22_a14b_fun_control": dict(family="wan22_a14b_high", depth=4, fixed={"in_dim": 52},
                                   te=(("umt5xxl",), "wan"), widths={"text_dim": "cond"}),
    "wan22_camera": dict(family="wan22_a14b_high", depth=4,
                         fixed={"model_type": "camera_2.2", "in_dim": 36},
                         te=(("umt5xxl",), "wan"), widths={"text_dim": "cond"}),
    "wan22_5b": dict(family="wan22_5b", depth=4, te=(("umt5xxl",), "wan"),
                     widths={"text_dim": "cond"}),
    # the 5B Fun models: the control and reference latents of the 48-channel VAE beside
    # the noise, and the mask (48 + 2x48 + 4); inpainting the image latent (48 + 48 + 4)
    "wan22_5b_fun": dict(family="wan22_5b", depth=4, fixed={"in_dim": 148},
                         te=(("umt5xxl",), "wan"), widths={"text_dim": "cond"}),
    "wan22_5b_fun_inp": dict(family="wan22_5b", depth=4, fixed={"in_dim": 100},
                             te=(("umt5xxl",), "wan"), widths={"text_dim": "cond"}),
    "hunyuan_video": dict(family="hunyuan_video", depth=4,
                          te=(("clip_l", "llava_llama3"), "hunyuan_video"),
                          widths={"context_in_dim": "cond", "vec_in_dim": "pooled"}),
}
# text-encoder architecture (standins.TEXT_ENCODERS) -> encoders.TE_FILES key
TEXT_ENCODERS = {"clip_l": "clip_l", "clip_g": "clip_g", "t5xxl": "t5xxl",
                 "umt5xxl": "umt5xxl", "qwen25_7b": "qwen25_7b", "llama31_8b": "llama31_8b",
                 "llava_llama3": "llava_llama3", "gemma2_2b": "gemma2_2b",
                 "gemma3_4b": "gemma3_4b", "mistral3_24b": "mistral3_24b",
                 "qwen3_4b": "qwen3_4b", "qwen3_8b": "qwen3_8b"}
# VAE architecture (standins.VAES) -> encoders.VAES key
VAES = {"sd_vae": "sd_vae", "flux_vae": "flux_vae", "wan21_vae": "wan21_vae",
        "qwen_image_vae": "wan21_vae",      # Qwen-Image's VAE is Wan 2.1's architecture
        "wan22_vae": "wan22_vae", "hunyuan_video_vae": "hunyuan_video_vae",
        "flux2_vae": "flux2_vae", "flux2_vae_small": "flux2_vae"}   # small: a narrower decoder
# LoRA base (standins.LORAS) -> the diffusion architecture whose stand-in it patches
LORA_BASES = {"flux": "flux", "wan21": "wan21_t2v", "wan22_a14b": "wan22_a14b_t2v",
              "qwen_image": "qwen_image", "flux2": "flux2", "zimage": "zimage"}

_WIDTHS = {}     # (te keys, type) -> {"cond": width, "pooled": width or None}


def te_widths(work, keys, clip_type):
    """What the text-encoder stand-ins `keys` loaded as `clip_type` produce: the width of
    the conditioning sequence and of the pooled vector (None without one)."""
    import comfy.sd
    key = (tuple(keys), clip_type)
    if key not in _WIDTHS:
        paths = [encoders.build_te_file(work, k)[0] for k in keys]
        kind = clip_type_of(clip_type)
        clip = comfy.sd.load_clip(ckpt_paths=paths, clip_type=kind,
                                  model_options={})
        enc = clip.encode_from_tokens(clip.tokenize("a red fox"), return_dict=True)
        pooled = enc.get("pooled_output")
        _WIDTHS[key] = {"cond": int(enc["cond"].shape[-1]),
                        "pooled": None if pooled is None else int(pooled.shape[-1])}
        del clip
    return _WIDTHS[key]


# the metadata of the stand-in a loader that reads no metadata is loading (controlnets.py)
LOADING_METADATA = contextvars.ContextVar("comfyui_placement_tiny_loading", default=None)


def clip_type_of(name):
    """comfy.sd.CLIPType of a CLIP loader's type input, as the loaders read it ("sdxl"
    is no CLIPType: CLIP-L and CLIP-G load as stable_diffusion)."""
    import comfy.sd
    return getattr(comfy.sd.CLIPType, name.upper(), comfy.sd.CLIPType.STABLE_DIFFUSION)


def install_unet_hook():
    """After ComfyUI's detection, a stand-in's recorded unet_config widths (metadata)."""
    import comfy.model_detection
    import comfy.supported_models
    original = comfy.model_detection.model_config_from_unet
    if getattr(original, "_placement_tiny", False):
        return

    def model_config_from_unet(state_dict, unet_key_prefix, use_base_if_no_match=False,
                               metadata=None):
        cfg = original(state_dict, unet_key_prefix, use_base_if_no_match, metadata=metadata)
        if metadata is None:            # a loader that reads none (ControlNets): its file's
            metadata = LOADING_METADATA.get()
        tiny = json.loads((metadata or {}).get(TINY_KEY) or "{}")
        if cfg is None and tiny.get("config"):
            # a class ComfyUI matches by its released widths alone: the one it names
            cfg = getattr(comfy.supported_models, tiny["config"])(dict(tiny["unet_config"]))
        elif cfg is not None and tiny:
            cfg.unet_config.update(tiny.get("unet_config", {}))
            named = tiny.get("config")
            if named and type(cfg).__name__ != named:
                cls = getattr(comfy.supported_models, named)
                if not isinstance(cfg, cls.__mro__[1]):
                    raise RuntimeError(f"detection gave {type(cfg).__name__} for a {named} "
                                       f"stand-in, not its base {cls.__mro__[1].__name__}")
                quant = getattr(cfg, "quant_config", None)   # detection's, of a quantized file
                cfg = cls(cfg.unet_config)
                cfg.quant_config = quant
        return cfg
    model_config_from_unet._placement_tiny = True
    comfy.model_detection.model_config_from_unet = model_config_from_unet

    # constructor arguments no unet_config key reaches, while a stand-in's model is built
    import comfy.sd
    load_state_dict = comfy.sd.load_diffusion_model_state_dict

    @functools.wraps(load_state_dict)
    def load_diffusion_model_state_dict(sd, model_options={}, metadata=None, **kw):
        tiny = json.loads((metadata or {}).get(TINY_KEY) or "{}")
        with encoders._overrides(tiny.get("init_overrides")):
            return load_state_dict(sd, model_options=model_options, metadata=metadata, **kw)
    comfy.sd.load_diffusion_model_state_dict = load_diffusion_model_state_dict


MIN_TOKENS = 32      # the stand-in text encoders' padding (the real ones pad to 256-512)


def install_tokenizer_cap(tokens=MIN_TOKENS):
    """The text encoders' workload shrunk as the images are: a tokenizer that pads every
    prompt to 256 or 512 tokens (T5, UMT5, Qwen3) pads to `tokens` at most. A tiny UMT5
    still needs detection's 10240-wide FFN, so its 512 padded tokens were most of a Wan
    template's seconds."""
    import comfy.sd1_clip
    cls = comfy.sd1_clip.SDTokenizer
    original = cls.__init__
    if getattr(original, "_placement_token_cap", False):
        return

    @functools.wraps(original)
    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        if isinstance(self.min_length, int) and self.min_length > tokens:
            self.min_length = tokens
    init._placement_token_cap = True
    cls.__init__ = init


def _link(src, dest):
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    if os.path.lexists(dest):
        os.remove(dest)
    os.symlink(src, dest)


def diffusion_family(work, arch):
    """(families.Family at the template's widths, the unet_config the hook restores)."""
    spec = DIFFUSION.get(arch)
    if spec is None:
        raise NoBuilder(f"no stand-in builder for the diffusion model {arch!r} yet "
                        f"(tests/templates/builders.py DIFFUSION)")
    fam = families.FAMILIES[spec["family"]]
    if spec.get("depth"):
        fam = fam.with_depth(spec["depth"])
    keys, clip_type = spec["te"]
    found = te_widths(work, keys, clip_type) if keys else {}   # none: SVD's image input
    # "cond" / "pooled": that width; ("pooled", n): that width plus n
    widths = {k: (found[w] if isinstance(w, str) else
                  None if found[w[0]] is None else found[w[0]] + w[1])
              for k, w in spec["widths"].items()}
    if None in widths.values():
        raise NoBuilder(f"{arch}: the text encoders {keys} ({clip_type}) give no "
                        f"{[k for k, v in widths.items() if v is None]}")
    widths = {**spec.get("fixed", {}), **widths}
    fam = fam.at_size(config=widths, tag="tpl")
    return fam, widths


def seed_of(name: str) -> int:
    """Each file name its own weights (a Wan 2.2 pair's two experts differ, as the real
    ones do), the same on every run."""
    return zlib.crc32(name.encode()) % 100_000


def build_diffusion(work, arch, dest):
    import safetensors.torch
    fam, widths = diffusion_family(work, arch)
    init = DIFFUSION[arch].get("init") or {}
    seed = seed_of(os.path.basename(dest))
    # a stand-in that names its class gets its whole config back: detection, reading a
    # width it does not know, leaves out what the named class's layout needs
    recorded = dict(fam.unet_config) if DIFFUSION[arch].get("config") else widths
    tiny = json.dumps({"unet_config": recorded, "name": arch, "init_overrides": init,
                       "config": DIFFUSION[arch].get("config")}, sort_keys=True)
    built = os.path.join(work, "standins", f"{arch}-{seed}-{zlib.crc32(tiny.encode()):08x}"
                         ".safetensors")
    if not os.path.exists(built):
        os.makedirs(os.path.dirname(built), exist_ok=True)
        with encoders._overrides(init):
            sd = families.random_state_dict(fam.unet_config, seed,
                                            DIFFUSION[arch].get("config"))
        meta = {TINY_KEY: tiny}
        safetensors.torch.save_file(sd, built + ".part", metadata=meta)
        os.replace(built + ".part", built)
    _link(built, dest)


def build_lora(work, base, dest, rank=4):
    """A random LoRA on every Linear of the base's diffusion stand-in, in ComfyUI's
    key format (diffusion_model.<module>.lora_up/lora_down/alpha)."""
    import safetensors.torch
    import torch
    arch = LORA_BASES.get(base)
    if arch is None:
        raise NoBuilder(f"no stand-in builder for a LoRA of {base!r} yet "
                        f"(tests/templates/builders.py LORA_BASES)")
    seed = seed_of(os.path.basename(dest))
    fam, _ = diffusion_family(work, arch)
    shape = zlib.crc32(json.dumps(fam.unet_config, sort_keys=True, default=str).encode())
    built = os.path.join(work, "standins", f"lora_{base}-{seed}-{shape:08x}.safetensors")
    if not os.path.exists(built):
        with encoders._overrides(DIFFUSION[arch].get("init")):
            model = families.model_config_for(
                fam.unet_config, DIFFUSION[arch].get("config")).get_model(
                {}, "", device=torch.device("meta"))
        g = torch.Generator().manual_seed(seed)
        sd = {}
        for name, mod in model.diffusion_model.named_modules():
            if isinstance(mod, torch.nn.Linear) and name:
                k = f"diffusion_model.{name}"
                sd[f"{k}.lora_down.weight"] = torch.randn(rank, mod.in_features, generator=g) * 0.1
                sd[f"{k}.lora_up.weight"] = torch.randn(mod.out_features, rank, generator=g) * 0.1
                sd[f"{k}.alpha"] = torch.tensor(float(rank))
        safetensors.torch.save_file(sd, built)
    _link(built, dest)


# kind -> (its table here, what the table's key builds, what the error names it)
FILE_BUILDERS = {
    "te": (TEXT_ENCODERS, lambda work, k: encoders.build_te_file(work, k)[0],
           "the text encoder", "TEXT_ENCODERS"),
    "vae": (VAES, lambda work, k: encoders.build_vae_file(work, k)[0], "the VAE", "VAES"),
    "clip_vision": ({k: k for k in vision.CONFIGS}, vision.build, "the CLIP vision model",
                    "vision.py CONFIGS")}


# modules that build on this one, each for the architectures in its ARCHITECTURES (a set
# of "kind:name"): these, and every standins_<topic>.py beside this file
ROUTED = ("ltx2", "anima", "ace_step")


def routed_modules():
    import importlib
    here = os.path.dirname(os.path.abspath(__file__))
    topics = sorted(f[:-3] for f in os.listdir(here)
                    if f.startswith("standins_") and f.endswith(".py"))
    return [importlib.import_module(name) for name in ROUTED + tuple(topics)]


def build(work, architecture, dest):
    """Makes `dest` (a path under models/) the stand-in of `architecture` ("kind:name")."""
    kind, name = architecture.split(":", 1)
    for module in routed_modules():
        if architecture in module.ARCHITECTURES:
            return module.build(work, architecture, dest)
    if kind == "diffusion":
        return build_diffusion(work, name, dest)
    if kind == "lora":
        return build_lora(work, name, dest)
    import model_patches
    if architecture in model_patches.ARCHITECTURES:
        return model_patches.build(work, architecture, dest)
    if kind == "controlnet":
        import controlnets          # it builds on this module
        return controlnets.build(work, name, dest)
    if kind == "checkpoint":
        import checkpoints          # it builds on this module
        return checkpoints.build(work, name, dest)
    if kind in FILE_BUILDERS:
        table, make, what, where = FILE_BUILDERS[kind]
        if name not in table:
            raise NoBuilder(f"no stand-in builder for {what} {name!r} yet "
                            f"(tests/templates/builders.py {where})")
        return _link(make(work, table[name]), dest)
    raise NoBuilder(f"no stand-in builder for {kind} files ({architecture}) yet")
