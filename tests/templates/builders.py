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
import json
import os
import zlib

import families
import encoders

TINY_KEY = encoders.TINY_KEY


class NoBuilder(LookupError):
    """No stand-in builder for this architecture yet."""


# diffusion architecture -> the families.py family it is built from, the depth of its
# block lists (4: enough to stream and split), `fixed`: tiny widths ComfyUI's detection
# does not read (it builds the released ones: Qwen-Image's 24 heads), and the
# unet_config keys that take the width of what its text encoders produce: (text-encoder
# stand-in keys, CLIP type, which output: "cond" the sequence, "pooled" the vector).
# `fixed` and the widths travel in the file's metadata for install_unet_hook().
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
    # Qwen2.5-VL's sequence and CLIP-L's pooled vector (constructor defaults 3584, 768)
    "kandinsky5": dict(family="kandinsky5", depth=4, te=(("clip_l", "qwen25_7b"), "kandinsky5"),
                       widths={"in_text_dim": "cond", "in_text_dim2": "pooled"}),
    "wan21_t2v": dict(family="wan21", depth=4, te=(("umt5xxl",), "wan"),
                      widths={"text_dim": "cond"}),
    "wan22_a14b_t2v": dict(family="wan22_a14b_high", depth=4, te=(("umt5xxl",), "wan"),
                           widths={"text_dim": "cond"}),
    # Wan 2.2's image-to-video experts take the image latent and mask beside the noise
    # (36 channels) and no CLIP vision (detected as t2v with in_dim 36)
    "wan22_a14b_i2v": dict(family="wan22_a14b_high", depth=4, fixed={"in_dim": 36},
                           te=(("umt5xxl",), "wan"), widths={"text_dim": "cond"}),
    "wan22_5b": dict(family="wan22_5b", depth=4, te=(("umt5xxl",), "wan"),
                     widths={"text_dim": "cond"}),
    "hunyuan_video": dict(family="hunyuan_video", depth=4,
                          te=(("clip_l", "llava_llama3"), "hunyuan_video"),
                          widths={"context_in_dim": "cond", "vec_in_dim": "pooled"}),
}
# text-encoder architecture (standins.TEXT_ENCODERS) -> encoders.TE_FILES key
TEXT_ENCODERS = {"clip_l": "clip_l", "clip_g": "clip_g", "t5xxl": "t5xxl",
                 "umt5xxl": "umt5xxl", "qwen25_7b": "qwen25_7b", "llama31_8b": "llama31_8b",
                 "llava_llama3": "llava_llama3", "gemma2_2b": "gemma2_2b",
                 "gemma3_4b": "gemma3_4b", "mistral3_24b": "mistral3_24b"}
# VAE architecture (standins.VAES) -> encoders.VAES key
VAES = {"sd_vae": "sd_vae", "flux_vae": "flux_vae", "wan21_vae": "wan21_vae",
        "qwen_image_vae": "wan21_vae",      # Qwen-Image's VAE is Wan 2.1's architecture
        "wan22_vae": "wan22_vae", "hunyuan_video_vae": "hunyuan_video_vae"}
# LoRA base (standins.LORAS) -> the diffusion architecture whose stand-in it patches
LORA_BASES = {"flux": "flux", "wan21": "wan21_t2v", "wan22_a14b": "wan22_a14b_t2v",
              "qwen_image": "qwen_image"}

_WIDTHS = {}     # (te keys, type) -> {"cond": width, "pooled": width or None}


def te_widths(work, keys, clip_type):
    """What the text-encoder stand-ins `keys` loaded as `clip_type` produce: the width of
    the conditioning sequence and of the pooled vector (None without one)."""
    import comfy.sd
    key = (tuple(keys), clip_type)
    if key not in _WIDTHS:
        paths = [encoders.build_te_file(work, k)[0] for k in keys]
        kind = getattr(comfy.sd.CLIPType, clip_type.upper())
        clip = comfy.sd.load_clip(ckpt_paths=paths, clip_type=kind,
                                  model_options={})
        enc = clip.encode_from_tokens(clip.tokenize("a red fox"), return_dict=True)
        pooled = enc.get("pooled_output")
        _WIDTHS[key] = {"cond": int(enc["cond"].shape[-1]),
                        "pooled": None if pooled is None else int(pooled.shape[-1])}
        del clip
    return _WIDTHS[key]


def install_unet_hook():
    """After ComfyUI's detection, a stand-in's recorded unet_config widths (metadata)."""
    import comfy.model_detection
    original = comfy.model_detection.model_config_from_unet
    if getattr(original, "_placement_tiny", False):
        return

    def model_config_from_unet(state_dict, unet_key_prefix, use_base_if_no_match=False,
                               metadata=None):
        cfg = original(state_dict, unet_key_prefix, use_base_if_no_match, metadata=metadata)
        tiny = (metadata or {}).get(TINY_KEY)
        if cfg is not None and tiny:
            cfg.unet_config.update(json.loads(tiny).get("unet_config", {}))
        return cfg
    model_config_from_unet._placement_tiny = True
    comfy.model_detection.model_config_from_unet = model_config_from_unet


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
    found = te_widths(work, keys, clip_type)
    widths = {k: found[which] for k, which in spec["widths"].items()}
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
    seed = seed_of(os.path.basename(dest))
    built = os.path.join(work, "standins", f"{arch}-{seed}.safetensors")
    if not os.path.exists(built):
        os.makedirs(os.path.dirname(built), exist_ok=True)
        sd = families.random_state_dict(fam.unet_config, seed)
        meta = {TINY_KEY: json.dumps({"unet_config": widths, "name": arch})}
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
    built = os.path.join(work, "standins", f"lora_{base}-{seed}.safetensors")
    if not os.path.exists(built):
        fam, _ = diffusion_family(work, arch)
        model = families.model_config_for(fam.unet_config).get_model(
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
FILE_BUILDERS = {"te": (TEXT_ENCODERS, encoders.build_te_file, "the text encoder", "TEXT_ENCODERS"),
                 "vae": (VAES, encoders.build_vae_file, "the VAE", "VAES")}


def build(work, architecture, dest):
    """Makes `dest` (a path under models/) the stand-in of `architecture` ("kind:name")."""
    kind, name = architecture.split(":", 1)
    if kind == "diffusion":
        return build_diffusion(work, name, dest)
    if kind == "lora":
        return build_lora(work, name, dest)
    if kind in FILE_BUILDERS:
        table, make, what, where = FILE_BUILDERS[kind]
        if name not in table:
            raise NoBuilder(f"no stand-in builder for {what} {name!r} yet "
                            f"(tests/templates/builders.py {where})")
        return _link(make(work, table[name])[0], dest)
    raise NoBuilder(f"no stand-in builder for {kind} files ({architecture}) yet")
