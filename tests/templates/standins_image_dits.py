"""Image DiT stand-ins for the official templates (issue 31 item 3), inside ComfyUI's
Python: Mage-Flow and its VAE, Krea 2 and its LoRAs, Boogu-Image, and the Qwen3-VL text
encoders (4B, 8B) they condition on. How ComfyUI's detection finds each:

- Qwen3-VL (te:qwen3vl_4b, te:qwen3vl_8b): comfy.sd.detect_te_model finds it by the
  DeepStack merger (`model.visual.deepstack_merger_list.0.norm.weight`, keys in the
  released Hugging Face layout, which the loader renames) and tells 4B from 8B by the
  merger's output width (2560 for 4B, the text width). The stand-ins are 32 wide, so
  the 8B is found as the 8B by that rule and the 4B names its TEModel
  (encoders.TE_MODEL_KEY). Sizes ComfyUI hard-codes travel in the metadata
  (encoders.install_hooks applies them): the text config through
  `qwen3vl_{4b,8b}_model_config`, head_dim and the M-RoPE sections ([24, 20, 20] for
  128-wide heads) on the config class, the vision tower's widths and DeepStack layers
  on Qwen3VLVisionModel. 36 layers as released: Krea 2 reads layers 2, 5, ... 35.
- Mage-Flow: Qwen-Image's double-stream blocks on the 128-channel Flux.2 latent;
  detection tells it from Qwen-Image by txt_norm 2560 wide (Qwen3-VL 4B's width) and
  proj_out 128, so the stand-in (txt_norm at the Qwen3-VL stand-in's width) is found as
  Qwen-Image and names its class (`config`: MageFlow) for builders.install_unet_hook.
- Mage-VAE (vae:mage_flow_vae): found by `student.dconv_encoder.proj_out.weight`; the
  file is in the released layout (`student.dconv_encoder.`, `pipeline.`), and
  MageVAE() takes no sizes: the encoder's and denoiser's tiny widths and depths are init
  overrides in its metadata. Its 128 latent channels stay (the diffusion model's input).
- Krea 2: detection reads the width (heads fixed at 128 wide: one head, width 128),
  depth, the text layers (`txtfusion.projector`: 12) and the text width; the text
  fusion's 20 heads are a constructor default: the stand-in records 2 (`fixed`).
  Its text input is Qwen3-VL 4B's 12 tapped layers side by side, so txtdim is the
  encoder stand-in's output width / 12. LoRAs (lora:krea2) patch its Linears.
- Boogu-Image: found by `double_stream_layers.0.img_instruct_attn...`; detection reads
  the width, depths and the instruction width, the heads (28, kv 7), RoPE axes and FFN
  rounding are OmniGen2's defaults: the stand-in records tiny ones (`fixed`).
"""
import json
import os

import builders
import encoders
import families

TINY_KEY = encoders.TINY_KEY

ARCHITECTURES = {"te:qwen3vl_4b", "te:qwen3vl_8b", "diffusion:mage_flow", "vae:mage_flow_vae",
                 "diffusion:krea2", "lora:krea2", "diffusion:boogu"}

# -- Qwen3-VL 4B / 8B ----------------------------------------------------------------------


def _qwen3vl(model_type):
    import comfy.text_encoders.qwen3vl as qwen3vl
    return qwen3vl._make_qwen3vl_model(model_type)


Qwen3VL_4B = _qwen3vl("qwen3vl_4b")   # the classes ComfyUI builds (model_type picks the config)
Qwen3VL_8B = _qwen3vl("qwen3vl_8b")

# vision tower: 2 blocks of 32 (2 heads), both feeding DeepStack
QWEN3VL_VISION_TINY = {"hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "depth": 2,
                       "deepstack_visual_indexes": [0, 1]}


def _qwen3vl_spec(size):
    config = "Qwen3VL_4BConfig" if size == "4b" else "Qwen3VL_8BConfig"
    spec = dict(
        file=f"enc_qwen3vl_{size}.safetensors", arch="llm", model_name=f"qwen3vl_{size}",
        cls=f"standins_image_dits.Qwen3VL_{size.upper()}",
        config=dict(encoders.LLM_TINY, num_hidden_layers=36),
        # 16-wide heads: M-RoPE sections of its 8 frequencies (t, h, w interleaved)
        init_overrides={f"comfy.text_encoders.llama.{config}": {"head_dim": 16,
                                                                "rope_dims": [4, 2, 2]},
                        "comfy.text_encoders.qwen3vl.Qwen3VLVisionModel": {
                            "config": dict(QWEN3VL_VISION_TINY)}},
        dtype="bfloat16")
    if size == "4b":
        spec["te_model"] = "QWEN3VL_4B"       # detection's 2560 is too wide to build tiny
    return spec


for _size in ("4b", "8b"):
    encoders.TE_FILES[f"qwen3vl_{_size}"] = _qwen3vl_spec(_size)
    builders.TEXT_ENCODERS[f"qwen3vl_{_size}"] = f"qwen3vl_{_size}"

# ComfyUI's module layout -> the released (Hugging Face) one the loader renames back
_HF_LAYOUT = (("model.lm_head.", "lm_head."), ("model.", "model.language_model."),
              ("visual.", "model.visual."))


def build_qwen3vl(work, key):
    """encoders.build_te_file's file, its keys in the released layout."""
    import safetensors
    import safetensors.torch
    path, built = encoders.build_te_file(work, key)
    with safetensors.safe_open(path, framework="pt") as fh:
        released = any(k.startswith("model.language_model.") for k in fh.keys())
        metadata = fh.metadata()
    if built or not released:
        sd = safetensors.torch.load_file(path)
        out = {}
        for k, v in sd.items():
            for old, new in _HF_LAYOUT:
                if k.startswith(old):
                    k = new + k[len(old):]
                    break
            out[k] = v
        safetensors.torch.save_file(out, path + ".tmp", metadata=metadata)
        os.replace(path + ".tmp", path)
    return path


# -- Mage-Flow -----------------------------------------------------------------------------
# one 32-wide head, RoPE axes (frame, h, w) summing to it; 128 latent channels (Flux.2's)
families.FAMILIES["mage_flow"] = families.Family(
    "mage_flow", "Mage-Flow", "MageFlow", "MageFlow",
    {"image_model": "mage_flow", "in_channels": 128, "out_channels": 128, "num_layers": 4,
     "attention_head_dim": 32, "num_attention_heads": 1, "joint_attention_dim": 32,
     "axes_dims_rope": [8, 12, 12]},
    latent=(1, 128, 4, 4), context=(8, 32), depth_keys=("num_layers",),
    notes="Found as Qwen-Image unless txt_norm is 2560 wide: named class.")
builders.DIFFUSION["mage_flow"] = dict(
    family="mage_flow", config="MageFlow", te=(("qwen3vl_4b",), "mage"),
    widths={"joint_attention_dim": "cond"})

# encoder and denoiser 32 wide (GroupNorm's 32 groups), one block each; the latent stays
# 128 channels (the denoiser's bottleneck is that latent)
MAGE_VAE_INIT = {
    "comfy.ldm.mage_flow.vae.DConvEncoder": {"hidden_size": 32, "num_blocks": 1,
                                             "head_size": 32, "num_head_blocks": 1},
    "comfy.ldm.mage_flow.vae.DConvDenoiser": {"hidden_size": 32, "hidden_size_x": 8,
                                              "num_blocks": 2, "num_cond_blocks": 1}}


def build_mage_vae(work, dest):
    import comfy.ldm.mage_flow.vae as mage_vae
    spec = json.dumps({"name": "mage_flow_vae", "init_overrides": MAGE_VAE_INIT},
                      sort_keys=True)
    path = os.path.join(work, "standins", "vae_mage_flow.safetensors")
    if not encoders._up_to_date(path, spec):
        with encoders._overrides(MAGE_VAE_INIT):
            model = mage_vae.MageVAE()
        sd = encoders._randomize(encoders._state_dict(model), 0)
        del model
        # the released layout (sd.py renames it back)
        sd = {("student." + k if k.startswith("dconv_encoder.") else
               "pipeline." + k[len("decoder_model."):]): v for k, v in sd.items()}
        encoders._save(path, sd, "bfloat16", encoders._spec_metadata(spec))
    builders._link(path, dest)


# -- Krea 2 --------------------------------------------------------------------------------
KREA2_TAPS = 12       # Qwen3-VL 4B layers side by side in its conditioning
families.FAMILIES["krea2"] = families.Family(
    "krea2", "Krea 2", "Krea2", "Krea2",
    {"image_model": "krea2", "features": 128, "channels": 16, "patch": 2, "layers": 4,
     "heads": 1, "kvheads": 1, "txtlayers": KREA2_TAPS, "txtdim": 32, "txtheads": 2,
     "txtkvheads": 2},
    latent=(1, 16, 8, 8), context=(8, KREA2_TAPS * 32), depth_keys=("layers",),
    notes="Heads are 128 wide (detection's head_dim): one head; text fusion heads fixed.")


def _krea2_spec(work):
    """Krea 2 at the width of each tapped layer of the Qwen3-VL 4B stand-in."""
    if "krea2" not in builders.DIFFUSION:
        build_qwen3vl(work, "qwen3vl_4b")
        cond = builders.te_widths(work, ("qwen3vl_4b",), "krea2")["cond"]
        if cond % KREA2_TAPS:
            raise RuntimeError(f"krea2: the Qwen3-VL stand-in gives {cond} wide conditioning, "
                               f"not {KREA2_TAPS} layers side by side")
        builders.DIFFUSION["krea2"] = dict(
            family="krea2", te=(("qwen3vl_4b",), "krea2"), widths={},
            fixed={"txtdim": cond // KREA2_TAPS, "txtheads": 2, "txtkvheads": 2})
        builders.LORA_BASES["krea2"] = "krea2"
    return builders.DIFFUSION["krea2"]


# -- Boogu-Image ---------------------------------------------------------------------------
# 64 wide: two 32-wide heads (RoPE axes 8+12+12), one kv head; 1 refiner layer of each
# kind, 2 double-stream and 4 single-stream layers
BOOGU_TINY = {"hidden_size": 64, "num_attention_heads": 2, "num_kv_heads": 1,
              "axes_dim_rope": [8, 12, 12], "multiple_of": 32, "num_layers": 4,
              "num_double_stream_layers": 2, "num_refiner_layers": 1}
families.FAMILIES["boogu"] = families.Family(
    "boogu", "Boogu-Image", "Boogu", "Boogu",
    dict(BOOGU_TINY, image_model="boogu", instruction_feat_dim=32),
    latent=(1, 16, 8, 8), context=(8, 32),
    notes="Heads, RoPE axes and FFN rounding are OmniGen2's defaults: fixed tiny ones.")
builders.DIFFUSION["boogu"] = dict(family="boogu", fixed=dict(BOOGU_TINY),
                                   te=(("qwen3vl_8b",), "boogu"),
                                   widths={"instruction_feat_dim": "cond"})


# -- the int8 ConvRot files ----------------------------------------------------------------
# The loader needs no quantized file (a float file of the same keys loads through the same
# classes), and the stand-ins of the other quantized names (fp8_scaled...) are float, so
# these are float by default. With PLACEMENT_STANDINS_INT8=1 they are built in the
# released format, which the pack's placement does not handle yet (runtime/engine/shadow.py
# aliases tensor storage; a QuantizedTensor keeps its int8 data and scales inside).
# That format: the blocks' Linears as ComfyUI's int8_tensorwise with ConvRot (a per-group
# Hadamard rotation before row-wise int8), per layer the int8 weight, its per-row
# `weight_scale` and a `comfy_quant` JSON, which comfy.utils.detect_layer_quantization
# finds and comfy.ops' mixed-precision Linear loads as a QuantizedTensor. The rotation
# groups are 16 wide (a power of 4, as the Hadamard needs; the released 256 are wider
# than the stand-ins' Linears); the group size travels in comfy_quant.
INT8_GROUP = 16
INT8_CONF = {"format": "int8_tensorwise", "convrot": True, "convrot_groupsize": INT8_GROUP}


def is_int8_convrot(dest):
    return (os.environ.get("PLACEMENT_STANDINS_INT8") == "1"
            and "int8_convrot" in os.path.basename(dest))


def int8_convrot(sd):
    """The blocks' Linear weights of a float state dict quantized as ComfyUI writes them
    (QuantizedTensor.state_dict); the other tensors as they are."""
    import re
    import torch
    from comfy.quant_ops import QuantizedTensor
    conf = torch.tensor(list(json.dumps(INT8_CONF).encode()), dtype=torch.uint8)
    out = {}
    for key, w in sd.items():
        # a Linear inside a block list whose input splits into whole rotation groups
        if (key.endswith(".weight") and w.ndim == 2 and re.search(r"\.\d+\.", key)
                and w.shape[1] % INT8_GROUP == 0):
            base = key[:-len("weight")]
            q = QuantizedTensor.from_float(w.to(torch.bfloat16), "TensorWiseINT8Layout",
                                           per_channel=True, convrot=True,
                                           convrot_groupsize=INT8_GROUP)
            out.update({k: v.contiguous() for k, v in q.state_dict(key).items()})
            out[base + "comfy_quant"] = conf.clone()
        else:
            out[key] = w
    return out


def build_int8_diffusion(work, name, dest):
    """builders.build_diffusion's stand-in, its blocks' Linears in the int8 ConvRot format."""
    import safetensors
    import safetensors.torch
    float_dest = dest + ".float"
    builders.build_diffusion(work, name, float_dest)
    src = os.path.realpath(float_dest)
    os.remove(float_dest)
    built = src[:-len(".safetensors")] + "-int8_convrot.safetensors"
    if not os.path.exists(built):
        with safetensors.safe_open(src, framework="pt") as fh:
            metadata = fh.metadata()
        sd = int8_convrot(safetensors.torch.load_file(src))
        safetensors.torch.save_file(sd, built + ".part", metadata=metadata)
        os.replace(built + ".part", built)
    builders._link(built, dest)


def build(work, arch, dest):
    """Makes `dest` the stand-in of `arch` ("kind:name")."""
    kind, name = arch.split(":", 1)
    if kind == "te":
        return builders._link(build_qwen3vl(work, name), dest)
    if arch == "vae:mage_flow_vae":
        return build_mage_vae(work, dest)
    # the text encoders first, in their released layout (te_widths loads them)
    if name == "mage_flow":
        build_qwen3vl(work, "qwen3vl_4b")
    if name == "boogu":
        build_qwen3vl(work, "qwen3vl_8b")
    if name == "krea2":
        _krea2_spec(work)
    if kind == "diffusion" and is_int8_convrot(dest):
        return build_int8_diffusion(work, name, dest)
    if kind == "diffusion":
        return builders.build_diffusion(work, name, dest)
    if kind == "lora":
        return builders.build_lora(work, name, dest)
    raise builders.NoBuilder(f"no stand-in builder for {arch} "
                             f"(tests/templates/standins_image_dits.py)")

