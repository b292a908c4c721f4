"""Stand-ins for the templates whose text encoder is a recent LLM (issue 31 item 3), inside
ComfyUI's Python: Ministral 3 3B, Ovis 2.5, Qwen3.5 4B and Gemma 4 E4B, the diffusion
models they feed (Ideogram 4, ERNIE-Image, Ovis-Image) and HiDream-O1's checkpoint.
Ideogram 4's Qwen3-VL 8B (and the Qwen3-VL 4B of the text generation template) are
standins_image_dits.py's.

Text encoders (CLIPLoader finds them with comfy.sd.detect_te_model; what it reads as a
released width too large to build tiny, the file names: encoders.TE_MODEL_KEY; sizes
ComfyUI hard-codes travel in the metadata for encoders.install_hooks):

- Ministral 3 3B (te:ministral3_3b: ERNIE-Image's encoder and prompt enhancer): detected
  by a 3072-wide `post_attention_layernorm`; Mistral's tekken tokenizer travels in the
  file, encoders.py's tiny one (288 tokens).
- Ovis 2.5 (te:ovis25): Qwen3 2B to detection (2048 wide, with q_norm).
- Qwen3.5 4B (te:qwen35_4b): detected by `model.language_model.layers.0.linear_attn.A_log`,
  the size by the input norm's width (2560); written in the released layout, which the
  loader renames (Qwen35Released). The shipped tokenizer folder lacks vocab.json:
  install_hook() points it at a byte-level stand-in with the real special-token ids.
- Gemma 4 E4B (te:gemma4_e4b): detected by its 42 layers' `q_norm`; the head widths,
  attention pattern, vision tower and audio conformer are class attributes of
  Gemma4Config (init overrides). Its tokenizer travels in the file (`tokenizer_json`,
  as released): a byte-level one with the ids ComfyUI's Gemma 4 code uses.

Diffusion models (builders.DIFFUSION entries at the width their encoder's stand-in
produces, read through ComfyUI's loader by builders.te_widths):

- Ideogram 4: detection reads the input channels and layer count; the released widths
  are the config class's unet_extra_config, which ComfyUI applies after detection, so
  the tiny ones (`fixed`, and the 13 taps' width) travel in the metadata for
  builders.install_unet_hook, and win over unet_extra_config while the stand-in is built
  here too (_recorded_widths_win).
- ERNIE-Image: detection reads nothing but `layers.0.mlp.linear_fc2.weight`: every size
  travels in the metadata.
- Ovis-Image: Flux with a gated ("yak") MLP and a text norm, both read from the keys
  like every width.
- HiDream-O1 (checkpoint:hidream_o1): a pixel-space Qwen3-VL found by
  `t_embedder1.mlp.0.weight`; its text and vision configs are constructor arguments
  (unet_config keys) in the metadata. The checkpoint holds the model alone.
"""
import contextlib
import json
import os

import builders
import encoders
import families
import standins_image_dits       # the Qwen3-VL stand-ins (Ideogram 4's encoder)

TINY_KEY = encoders.TINY_KEY
ARCHITECTURES = {"te:ministral3_3b", "te:ovis25", "te:qwen35_4b", "te:gemma4_e4b",
                 "diffusion:ideogram4", "diffusion:ernie_image", "diffusion:ovis_image",
                 "checkpoint:hidream_o1"}

# -- Ministral 3 3B ------------------------------------------------------------------------
encoders.TE_FILES["ministral3_3b"] = dict(
    file="enc_ministral3_3b.safetensors", arch="llm", model_name="ministral3_3b",
    cls="comfy.text_encoders.llama.Ministral3_3B",
    config=dict(encoders.LLM_TINY, vocab_size=288),       # the tiny tekken vocabulary
    init_overrides={"comfy.text_encoders.llama.Ministral3_3BConfig": {"head_dim": 16}},
    te_model="MINISTRAL_3_3B", dtype="bfloat16", tokenizer="tekken")

# -- Ovis 2.5 (Qwen3 2B) ------------------------------------------------------------------
encoders.TE_FILES["ovis25"] = dict(
    file="enc_ovis25.safetensors", arch="llm", model_name="qwen3_2b",
    cls="comfy.text_encoders.llama.Ovis25_2B", config=dict(encoders.LLM_TINY, num_hidden_layers=2),
    init_overrides={"comfy.text_encoders.llama.Ovis25_2BConfig": {"head_dim": 16}},
    te_model="QWEN3_2B", dtype="bfloat16")

# -- Qwen3.5 4B -------------------------------------------------------------------------
QWEN35 = "comfy.text_encoders.qwen35"
# 4 layers, three linear-attention (Gated DeltaNet) and one full as released (every 4th);
# the 248k-token embedding stays (the tokenizer's special ids are 248044 and up). Full
# attention: one 32-wide head, a quarter of it rotary (8 dims: M-RoPE sections 2+1+1)
QWEN35_TINY = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 4,
               "layer_types": ["linear_attention"] * 3 + ["full_attention"],
               "num_attention_heads": 1, "num_key_value_heads": 1, "head_dim": 32,
               "mrope_section": [2, 1, 1], "linear_num_key_heads": 1,
               "linear_num_value_heads": 1, "linear_key_head_dim": 16,
               "linear_value_head_dim": 16}
QWEN35_VISION_TINY = {"hidden_size": 32, "num_heads": 2, "intermediate_size": 64, "depth": 2}


class Qwen35Released:
    """ComfyUI's Qwen3.5 model (`model_type`), its weights under the released file's names
    (`model.language_model.`, `model.visual.`), which comfy.sd's loader renames back."""

    def __init__(self, model_type):
        self.model_type = model_type

    def __call__(self, config, dtype, device, ops):
        import torch
        import comfy.text_encoders.qwen35 as qwen35
        cls = type("Qwen35_", (qwen35.Qwen35,), {"model_type": self.model_type})
        inner = cls(config, dtype, device, ops)
        outer = torch.nn.Module()
        outer.model = torch.nn.Module()
        outer.model.language_model = inner.model
        outer.model.visual = inner.visual
        return outer


QWEN35_4B_RELEASED = Qwen35Released("qwen35_4b")
# detection reads the 2560-wide input norm (the 4B): named (encoders.TE_MODEL_KEY)
encoders.TE_FILES["qwen35_4b"] = dict(
    file="enc_qwen35_4b.safetensors", arch="llm", model_name="qwen35_4b",
    cls=f"{__name__}.QWEN35_4B_RELEASED", config=dict(QWEN35_TINY),
    init_overrides={f"{QWEN35}.Qwen35VisionModel": {"config": dict(QWEN35_VISION_TINY)}},
    te_model="QWEN35_4B", dtype="bfloat16")

# these three are built by encoders.build_te_file (builders' text-encoder route)
for _key in ("ministral3_3b", "ovis25", "qwen35_4b"):
    builders.TEXT_ENCODERS[_key] = _key


def build_qwen35_tokenizer_standin(dest, shipped):
    """The shipped Qwen3.5 tokenizer lacks vocab.json (merges.txt and tokenizer_config.json
    are there): a byte-level vocabulary (256 byte tokens, no merges) with the config's
    special tokens at their real ids (248044...), the ids ComfyUI's Qwen3.5 code reads."""
    with open(os.path.join(shipped, "tokenizer_config.json")) as fh:
        config = json.load(fh)
    from tokenizers import pre_tokenizers
    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    for i, token in config["added_tokens_decoder"].items():
        vocab[token["content"]] = int(i)
    os.makedirs(dest, exist_ok=True)
    with open(os.path.join(dest, "vocab.json"), "w") as fh:
        json.dump(vocab, fh)
    with open(os.path.join(dest, "merges.txt"), "w") as fh:
        fh.write("#version: 0.2\n")
    with open(os.path.join(dest, "tokenizer_config.json"), "w") as fh:
        json.dump(config, fh)
    return dest


def install_hook(work):
    """Qwen3.5's tokenizer, whose vocab.json the ComfyUI tarball lacks, from a stand-in
    (only when it is absent; recorded in encoders.HOOK_LOG)."""
    import functools
    import comfy.sd1_clip
    import comfy.text_encoders.qwen35 as qwen35
    shipped = os.path.realpath(os.path.join(os.path.dirname(qwen35.__file__), "qwen35_tokenizer"))
    if os.path.isfile(os.path.join(shipped, "vocab.json")):
        return
    cls = comfy.sd1_clip.SDTokenizer
    if getattr(cls.__init__, "_placement_qwen35", False):
        return
    standin = build_qwen35_tokenizer_standin(os.path.join(work, "qwen35_tokenizer_standin"),
                                             shipped)
    original = cls.__init__

    @functools.wraps(original)
    def init(self, tokenizer_path=None, *args, **kwargs):
        if isinstance(tokenizer_path, str) and os.path.realpath(tokenizer_path) == shipped:
            tokenizer_path = standin
            encoders.HOOK_LOG.append(("qwen35_tokenizer_standin", standin))
        original(self, tokenizer_path, *args, **kwargs)
    init._placement_qwen35 = True
    cls.__init__ = init


# -- Gemma 4 E4B ------------------------------------------------------------------------
GEMMA4 = "comfy.text_encoders.gemma4"
# 4 layers of 16 (one head): sliding and global attention alternate, the last two share
# the KV of the first two (as the released 42 share their last 18); 4-wide per-layer inputs
GEMMA4_TINY = {"vocab_size": 456, "hidden_size": 16, "intermediate_size": 32,
               "num_hidden_layers": 4, "num_attention_heads": 1, "num_key_value_heads": 1,
               "hidden_size_per_layer_input": 4, "num_kv_shared_layers": 2}
# what the config class hard-codes: head widths, the attention pattern, the vision tower
# (16-pixel patches and 3x3 pooling stay: the tokenizer sizes images by them) and the
# audio conformer
GEMMA4_INIT = {f"{GEMMA4}.Gemma4Config": {
    "head_dim": 16, "global_head_dim": 16, "sliding_attention": [512, False],
    "vision_config": {"hidden_size": 16, "image_size": 896, "intermediate_size": 32,
                      "num_attention_heads": 1, "num_hidden_layers": 1, "patch_size": 16,
                      "head_dim": 16, "rms_norm_eps": 1e-6, "position_embedding_size": 64,
                      "pooling_kernel_size": 3},
    "audio_config": {"hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 1,
                     "intermediate_size": 32, "conv_kernel_size": 5, "attention_chunk_size": 12,
                     "attention_context_left": 13, "attention_context_right": 0,
                     "attention_logit_cap": 50.0, "output_proj_dims": 16, "rms_norm_eps": 1e-6,
                     "residual_weight": 0.5}}}
# the ids ComfyUI's Gemma 4 code uses (start 2, pad 0, stops 1 and 106; the image, audio
# and video placeholders it replaces by their embeddings); the template's other markers
# and the 256 bytes take ids below the tiny vocabulary's size
GEMMA4_SPECIALS = {0: "<pad>", 1: "<eos>", 2: "<bos>", 3: "<unk>", 106: "<turn|>",
                   258880: "<|image|>", 258881: "<|audio|>", 258884: "<|video|>"}
GEMMA4_MARKERS = ["<|turn>", "<|channel>", "<channel|>", "<|think|>", "<|image>", "<image|>",
                  "<|audio>", "<audio|>"]
GEMMA4_BYTES = 200                    # the byte tokens' first id


def gemma4_tokenizer_json():
    """A byte-level BPE (no merges) with Gemma 4's special tokens at the ids above; every
    id below the vocabulary size has a token (generated ids decode)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    specials = dict(GEMMA4_SPECIALS)
    free = (i for i in range(4, GEMMA4_BYTES) if i not in specials)
    for marker in GEMMA4_MARKERS:
        specials[next(free)] = marker
    for i in free:
        specials[i] = f"<unused{i}>"
    vocab = {c: GEMMA4_BYTES + i
             for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    if GEMMA4_BYTES + len(vocab) != GEMMA4_TINY["vocab_size"]:
        raise ValueError("the Gemma 4 stand-in's vocabulary does not match its embedding")
    vocab.update({c: i for i, c in specials.items()})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    data = json.loads(tok.to_str())
    data["added_tokens"] = [{"id": i, "content": c, "single_word": False, "lstrip": False,
                             "rstrip": False, "normalized": False, "special": True}
                            for i, c in sorted(specials.items())]
    return json.dumps(data).encode()


def build_gemma4(work):
    """The Gemma 4 E4B stand-in (comfy's layout is the released one); returns its path."""
    import torch
    import comfy.ops
    path = os.path.join(work, "models", "text_encoders", "enc_gemma4_e4b.safetensors")
    spec = json.dumps({"name": "gemma4_e4b", "te_model": "GEMMA_4_E4B",
                       "model_options": {"gemma4_model_config": GEMMA4_TINY},
                       "init_overrides": GEMMA4_INIT, "tokenizer": "byte-level, Gemma 4 ids"},
                      sort_keys=True)
    if encoders._up_to_date(path, spec):
        return path
    with encoders._overrides(GEMMA4_INIT):
        model = encoders._resolve(f"{GEMMA4}.Gemma4_E4B")(dict(GEMMA4_TINY), torch.float32,
                                                         "cpu", comfy.ops.manual_cast)
    sd = encoders._randomize(encoders._state_dict(model), builders.seed_of("gemma4_e4b"))
    del model
    for k in sd:                       # each layer's output scale (a buffer): 1, not noise
        if k.endswith("layer_scalar"):
            sd[k] = torch.ones_like(sd[k])
    sd["tokenizer_json"] = torch.frombuffer(bytearray(gemma4_tokenizer_json()), dtype=torch.uint8)
    # 42 layers tell the E4B from the other Gemma 4 sizes: named
    sd[encoders.TE_MODEL_KEY] = torch.frombuffer(bytearray(b"GEMMA_4_E4B"), dtype=torch.uint8)
    encoders._save(path, sd, "bfloat16", encoders._spec_metadata(spec))
    return path


# -- Ideogram 4 ---------------------------------------------------------------------------
# one head of 32 (its M-RoPE sections 6+5+5 = 16, half the head), 4 layers
IDEOGRAM4_FIXED = {"num_attention_heads": 1, "attention_head_dim": 32, "intermediate_size": 64,
                   "adaln_dim": 32, "mrope_section": [6, 5, 5]}
families.FAMILIES["ideogram4"] = families.Family(
    "ideogram4", "Ideogram 4", "Ideogram4", "Ideogram4",
    dict({"image_model": "ideogram4", "in_channels": 128, "num_layers": 4}, **IDEOGRAM4_FIXED),
    latent=(1, 128, 4, 4), context=(8, 13 * 32), depth_keys=("num_layers",),
    notes="Widths are unet_extra_config (applied after detection): recorded, hooked.")
builders.DIFFUSION["ideogram4"] = dict(
    family="ideogram4", depth=4, fixed=dict(IDEOGRAM4_FIXED),
    te=(("qwen3vl_8b",), "ideogram4"), widths={"llm_features_dim": "cond"})

# -- ERNIE-Image ----------------------------------------------------------------------------
# 64 wide: two heads of 32 (RoPE axes 8+12+12), 4 layers; the Flux.2 latent's 128 channels
ERNIE_FIXED = {"hidden_size": 64, "num_attention_heads": 2, "num_layers": 4,
               "ffn_hidden_size": 128, "rope_axes_dim": [8, 12, 12]}
families.FAMILIES["ernie_image"] = families.Family(
    "ernie_image", "ERNIE-Image", "ErnieImage", "ErnieImage",
    dict({"image_model": "ernie"}, **ERNIE_FIXED),
    latent=(1, 128, 4, 4), context=(8, 32), depth_keys=("num_layers",),
    notes="Detection reads no size: the whole tiny config travels in the metadata.")
builders.DIFFUSION["ernie_image"] = dict(
    family="ernie_image", depth=4, fixed=dict(ERNIE_FIXED),
    te=(("ministral3_3b",), "flux2"), widths={"text_in_dim": "cond"})

# -- Ovis-Image -----------------------------------------------------------------------------
# Flux with the yak MLP and text norm (which detection reads), no guidance or pooled input
builders.DIFFUSION["ovis_image"] = dict(
    family="flux1", depth=4,
    fixed={"yak_mlp": True, "txt_norm": True, "txt_ids_dims": [1, 2], "guidance_embed": False,
           "vec_in_dim": None},
    te=(("ovis25",), "ovis"), widths={"context_in_dim": "cond"})


# -- HiDream-O1 (checkpoint) --------------------------------------------------------------
# a pixel-space Qwen3-VL: detection finds it by `t_embedder1.mlp.0.weight` and
# `x_embedder.proj1.weight` and reads no size; its constructor takes the text and vision
# configs as unet_config keys, which travel in the metadata. The Qwen vocabulary stays
# (the tokenizer's <|tms_token|> is id 151673), so the embedding is 8 wide (one head:
# M-RoPE sections of its 4 frequencies) and the 16 layers' MLPs are wide enough that
# the blocks outweigh it, as the released model's do (else a GPU sized from half the
# model cannot hold the embedding beside a streamed block); a one-block vision tower
HIDREAM_O1_FIXED = {
    "text_config_overrides": {"hidden_size": 8, "intermediate_size": 8192,
                              "num_hidden_layers": 16, "num_attention_heads": 1,
                              "num_key_value_heads": 1, "head_dim": 8, "rope_dims": [2, 1, 1]},
    "vision_config_overrides": {"hidden_size": 32, "num_heads": 2, "intermediate_size": 64,
                                "depth": 1, "deepstack_visual_indexes": []}}
families.FAMILIES["hidream_o1"] = families.Family(
    "hidream_o1", "HiDream-O1", "HiDreamO1", "HiDreamO1",
    dict({"image_model": "hidream_o1"}, **HIDREAM_O1_FIXED),
    latent=(1, 3, 64, 64), context=(8, 1),
    notes="Detection reads no size: the text and vision configs travel in the metadata.")
builders.DIFFUSION["hidream_o1"] = dict(family="hidream_o1", fixed=dict(HIDREAM_O1_FIXED),
                                       te=((), None), widths={})


def build_hidream_o1_checkpoint(work, dest):
    """The checkpoint as CheckpointSave writes it: the diffusion stand-in loaded by
    ComfyUI and saved by comfy.sd.save_checkpoint. Its text encoder is a tokenizer only
    and its VAE the pixel-space conversion (ComfyUI makes both from no weights), so the
    model is all it holds; its metadata carries the model's sizes (checkpoints.py's
    install_hook and builders.install_unet_hook apply them)."""
    import comfy.sd
    import comfy.utils
    seed = builders.seed_of(os.path.basename(dest))
    unet = os.path.join(work, "standins", f"ckpt_unet_hidream_o1-{seed}.safetensors")
    builders.build_diffusion(work, "hidream_o1", unet)
    _, model_meta = comfy.utils.load_torch_file(unet, return_metadata=True)
    unet_tiny = json.loads(model_meta[TINY_KEY])
    tiny_json = json.dumps({"name": "hidream_o1", "unet_config": unet_tiny["unet_config"],
                            "init_overrides": {}, "te_model_options": {}}, sort_keys=True)
    built = os.path.join(work, "standins", f"ckpt_hidream_o1-{seed}.safetensors")
    if not encoders._up_to_date(built, tiny_json):
        model = comfy.sd.load_diffusion_model(unet)
        comfy.sd.save_checkpoint(built + ".part", model, metadata={TINY_KEY: tiny_json})
        os.replace(built + ".part", built)
        del model
    builders._link(built, dest)


@contextlib.contextmanager
def _recorded_widths_win():
    """While a stand-in is built: its recorded widths over the config class's
    unet_extra_config (the released sizes), as install_unet_hook does at load."""
    original = families.model_config_for

    def model_config_for(unet_config, config_class=None):
        cfg = original(unet_config, config_class)
        cfg.unet_config.update(unet_config)
        return cfg
    families.model_config_for = model_config_for
    try:
        yield
    finally:
        families.model_config_for = original


def build(work, arch, dest):
    """Makes `dest` the stand-in of `arch` ("kind:name")."""
    kind, name = arch.split(":", 1)
    if arch == "te:gemma4_e4b":
        return builders._link(build_gemma4(work), dest)
    if arch == "checkpoint:hidream_o1":
        return build_hidream_o1_checkpoint(work, dest)
    if kind == "te":
        return builders._link(encoders.build_te_file(work, builders.TEXT_ENCODERS[name])[0], dest)
    if name == "ideogram4":          # its encoder first, in its released layout
        standins_image_dits.build_qwen3vl(work, "qwen3vl_8b")
    if kind == "diffusion":
        with _recorded_widths_win():
            return builders.build_diffusion(work, name, dest)
    raise builders.NoBuilder(f"no stand-in builder for {arch} (tests/templates/standins_llm.py)")
