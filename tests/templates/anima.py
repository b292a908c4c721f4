"""Anima stand-ins for the official templates (issue 31 item 3), inside ComfyUI's Python:
the diffusion model, its Qwen3 0.6B text encoder, its LoRA and its LLLite model patches.

Anima is Cosmos Predict2's MiniTrainDIT with an LLM adapter (comfy/ldm/anima/model.py);
ComfyUI detects it under cosmos_predict2 by `llm_adapter.blocks.0.cross_attn.q_proj`
and reads only the width (model_channels) and input channels from the file. What it
hard-codes, the stand-in records in its metadata (encoders.TINY_KEY) for builders'
install_unet_hook (real files load unchanged):

- the block count and heads (constructor defaults 10 and 16 for widths other than 2048
  and 5120), the 1024-wide cross-attention input and the AdaLN-LoRA width: `fixed`;
- the LLM adapter (LLMAdapter: Qwen3 0.6B's 1024-wide states -> 1024, 6 layers of 16
  heads), which no unet_config key reaches: init overrides; its source width is what
  the Qwen3 0.6B stand-in produces (builders.te_widths, through ComfyUI's loader).

The Qwen3 0.6B stand-in (te:qwen3_06b) serves Anima (CLIPLoader "stable_diffusion":
AnimaTEModel, config through model_options qwen3_06b_model_config) and ACE-Step 1.5
(ACE15TEModel builds Qwen3_06B_ACE15 with no model_name, so its config travels as an
init override of Qwen3_06B_ACE15_Config). It is 16 wide with the ACE 1.5 vocabulary
(151669 tokens: every id the Qwen tokenizer gives these prompts) and names the TEModel
detection would give the real 1024-wide file (encoders.TE_MODEL_KEY).

LLLite (ModelPatchLoader): every width is read from the file (comfy/ldm/anima/lllite.py);
the stand-in's modules are as wide as the diffusion stand-in (model_channels), one per
block and target; the inpainting one takes the image and mask (4 channels) and says so
in its "lllite.inpaint_masked_input" metadata, as the released one.
"""
import json
import os

import builders
import encoders
import families

TINY_KEY = encoders.TINY_KEY
ARCHITECTURES = {"diffusion:anima", "lora:anima", "model_patch:anima_lllite"}

# -- Qwen3 0.6B (Anima and ACE-Step 1.5) ---------------------------------------------
QWEN3_06B_TINY = {"vocab_size": 151669, "hidden_size": 16, "intermediate_size": 32,
                  "num_hidden_layers": 2, "num_attention_heads": 1, "num_key_value_heads": 1}
encoders.TE_FILES["qwen3_06b"] = dict(
    file="enc_qwen3_06b.safetensors", arch="llm", model_name="qwen3_06b",
    cls="comfy.text_encoders.llama.Qwen3_06B", config=dict(QWEN3_06B_TINY),
    init_overrides={"comfy.text_encoders.llama.Qwen3_06BConfig": {"head_dim": 16},
                    "comfy.text_encoders.llama.Qwen3_06B_ACE15_Config":
                        dict(QWEN3_06B_TINY, head_dim=16)},
    te_model="QWEN3_06B", dtype="bfloat16")
builders.TEXT_ENCODERS["qwen3_06b"] = "qwen3_06b"

# -- the diffusion model ---------------------------------------------------------------
WIDTH = 64             # model_channels: 2 heads of 32 (RoPE-3D splits a head in three)
CROSS = 16             # the cross-attention input: the LLM adapter's output
ADAPTER = "comfy.ldm.anima.model.LLMAdapter"
families.FAMILIES["anima"] = families.Family(
    "anima", "Anima", "Anima", "Anima",
    dict(families._COSMOS2, image_model="anima", model_channels=WIDTH, num_blocks=4,
         num_heads=2, crossattn_emb_channels=CROSS, adaln_lora_dim=32),
    latent=(1, 16, 1, 8, 8), context=(8, CROSS),
    notes="Cosmos Predict2 with an LLM adapter: width read, blocks/heads/cross width fixed.")
builders.DIFFUSION["anima"] = dict(
    family="anima",
    fixed={"num_blocks": 4, "num_heads": 2, "crossattn_emb_channels": CROSS,
           "adaln_lora_dim": 32},
    te=(("qwen3_06b",), "stable_diffusion"), widths={}, init=None)
builders.LORA_BASES["anima"] = "anima"


def _adapter_init(work):
    """The LLM adapter's tiny sizes, its source the Qwen3 0.6B stand-in's output width
    (read through ComfyUI's loader); set on the DIFFUSION entry before anything is built
    from it (the diffusion stand-in, the LoRA)."""
    spec = builders.DIFFUSION["anima"]
    if spec.get("init") is None:
        keys, clip_type = spec["te"]
        width = builders.te_widths(work, keys, clip_type)["cond"]
        spec["init"] = {ADAPTER: {"source_dim": width, "target_dim": CROSS, "model_dim": 16,
                                  "num_layers": 1, "num_heads": 1}}
    return spec["init"]


# -- LLLite ------------------------------------------------------------------------------
LLLITE_TARGETS = ("self_attn_q_proj", "self_attn_k_proj", "self_attn_v_proj",
                  "cross_attn_q_proj", "mlp_layer1")
LLLITE = {"cond_dim": 16, "cond_emb_dim": 16, "mlp_dim": 16, "resblocks": 1}


def build_lllite(work, dest):
    import torch
    import comfy.ops
    from comfy.ldm.anima.lllite import AnimaLLLite
    name = os.path.basename(dest)
    inpaint = "inpaint" in name
    seed = builders.seed_of(name)
    blocks = families.FAMILIES["anima"].unet_config["num_blocks"]
    cin = 4 if inpaint else 3
    metadata = {"lllite.version": "2",
                "lllite.inpaint_masked_input": "true" if inpaint else "false"}
    spec = json.dumps({"name": "anima_lllite", "seed": seed, "cond_in": cin, "blocks": blocks,
                       "model_dim": WIDTH, **LLLITE, "metadata": metadata}, sort_keys=True)
    path = os.path.join(work, "standins", f"anima_lllite-{'inpaint' if inpaint else 'image'}"
                        f"-{seed}.safetensors")
    if not encoders._up_to_date(path, spec):
        c, e, m = LLLITE["cond_dim"], LLLITE["cond_emb_dim"], LLLITE["mlp_dim"]
        # the shapes AnimaLLLite reads its sizes from
        shapes = {"lllite_conditioning1.conv1.weight": (c // 2, cin, 4, 4),
                  "lllite_conditioning1.conv3.weight": (c, c // 2, 4, 4),
                  "lllite_conditioning1.proj.weight": (e, c, 1, 1)}
        for r in range(LLLITE["resblocks"]):
            shapes[f"lllite_conditioning1.resblocks.{r}.conv1.weight"] = (c, c, 3, 3)
        for b in range(blocks):
            for target in LLLITE_TARGETS:
                shapes[f"lllite_dit_blocks_{b}_{target}.down.weight"] = (m, WIDTH)
                shapes[f"lllite_dit_blocks_{b}_{target}.cond_to_film.weight"] = (2 * m, e)
        skeleton = {k: torch.empty(s, device="meta") for k, s in shapes.items()}
        model = AnimaLLLite(skeleton, metadata, device="cpu", dtype=torch.float32,
                            operations=comfy.ops.disable_weight_init)
        sd = encoders._randomize(encoders._state_dict(model), seed)
        del model
        encoders._save(path, sd, "bfloat16", encoders._spec_metadata(spec, metadata))
    builders._link(path, dest)


def build(work, arch, dest):
    """Makes `dest` the stand-in of Anima architecture `arch` ("kind:name")."""
    kind, name = arch.split(":", 1)
    if kind == "diffusion":
        _adapter_init(work)
        return builders.build_diffusion(work, name, dest)
    if kind == "lora":
        _adapter_init(work)
        return builders.build_lora(work, name, dest)
    if kind == "model_patch":
        return build_lllite(work, dest)
    raise builders.NoBuilder(f"no stand-in builder for {arch} (tests/templates/anima.py)")
