"""ACE-Step 1.5 stand-ins for the official templates (issue 31 item 3), inside ComfyUI's
Python: the diffusion model, its VAE, its language models and the all-in-one checkpoint.

- Diffusion (comfy/ldm/ace/ace_step15.py): detection reads the decoder's and the
  condition encoder's widths and the decoder's layer count, and hard-codes 128-wide
  heads (num_heads = q rows / 128); the stand-in records the heads, the encoders' and
  tokenizer's depths, the FSQ width (the condition encoder's) and the text width
  (constructor default 1024: Qwen3 0.6B's) in its metadata for builders'
  install_unet_hook, and its RoPE caches 512 positions, not 32768 (an init override).
  The text width is what the Qwen3 0.6B stand-in produces (anima.py),
  read through ComfyUI's loader. Its 64 latent channels and 192 inputs are kept.
- VAE (AudioOobleckVAE, 48 kHz: detection reads the stride-6 block's kernel 12): built at
  those strides, 8 channels wide (an init override of the constructor's 128).
- Language models (DualCLIPLoader "ace": Qwen3 0.6B and the 1.7B or 4B LM that writes
  the audio codes): ACE15TEModel gives its models no model_name, so their tiny configs
  travel as init overrides of their config classes (Qwen3_2B_ACE15_lm_Config,
  Qwen3_4B_ACE15_lm_Config). The 4B one is the Qwen3 4B stand-in of the other templates
  (encoders.py), which gets that override here; its 151936-token vocabulary leaves the
  LM 267 audio codes, enough for a stand-in. ACE15TEModel.load_sd tells the 0.6B file
  from the LM by its 1024 width: `install_hook()` routes a stand-in by the TEModel it
  names (encoders.TE_MODEL_KEY) instead.
- Checkpoint (ace_step_1.5_turbo_aio): checkpoints.py writes the three parts (0.6B and
  1.7B LMs) with comfy.sd.save_checkpoint.
"""
import functools
import json

import anima  # noqa: F401  (the Qwen3 0.6B stand-in)
import builders
import checkpoints
import encoders
import families

TINY_KEY = encoders.TINY_KEY
ARCHITECTURES = {"diffusion:ace_step15", "vae:ace15_vae", "checkpoint:ace_step15"}
LLAMA = "comfy.text_encoders.llama."

# -- language models ----------------------------------------------------------------------
QWEN3_17B_TINY = {"vocab_size": 151936, "hidden_size": 16, "intermediate_size": 32,
                  "num_hidden_layers": 2, "num_attention_heads": 1, "num_key_value_heads": 1}
encoders.TE_FILES["qwen3_17b"] = dict(
    file="enc_qwen3_17b_ace15.safetensors", arch="llm", model_name="qwen3_2b",
    cls=LLAMA + "Qwen3_2B_ACE15_lm", config=dict(QWEN3_17B_TINY),
    init_overrides={LLAMA + "Qwen3_2B_ACE15_lm_Config": dict(QWEN3_17B_TINY, head_dim=16)},
    te_model="QWEN3_2B", dtype="bfloat16")
builders.TEXT_ENCODERS["qwen3_17b"] = "qwen3_17b"
_q4 = encoders.TE_FILES["qwen3_4b"]
_q4["init_overrides"] = dict(_q4.get("init_overrides") or {}, **{
    LLAMA + "Qwen3_4B_ACE15_lm_Config": dict(_q4["config"], vocab_size=151936, head_dim=16)})

# -- the diffusion model ----------------------------------------------------------------------
# 16 decoder layers of 8 heads of 8: the blocks most of the weights, as in the released
# models (a streamed or split stand-in keeps its other weights resident)
SIZES = {"hidden_size": 64, "intermediate_size": 128, "encoder_hidden_size": 32,
         "encoder_intermediate_size": 64, "num_dit_layers": 16}
FIXED = {"num_heads": 8, "num_kv_heads": 4, "head_dim": 8, "encoder_num_heads": 4,
         "num_lyric_layers": 1, "num_timbre_layers": 1, "num_tokenizer_layers": 1,
         "fsq_dim": SIZES["encoder_hidden_size"],
         # read by detection too; recorded so that the stand-in's cache key changes with it
         "num_dit_layers": SIZES["num_dit_layers"]}
families.FAMILIES["ace_step15"] = families.Family(
    "ace_step15", "ACE-Step 1.5", "ACEStep15", "ACEStep15",
    dict({"audio_model": "ace1.5", **SIZES, **FIXED}, text_hidden_dim=16),
    latent=(1, 64, 25), context=(8, 16), depth_keys=("num_dit_layers",),
    notes="Widths and the decoder's depth read; 128-wide heads and the rest hard-coded.")
builders.DIFFUSION["ace_step15"] = dict(
    family="ace_step15", fixed=dict(FIXED),
    # the width Qwen3 0.6B gives (ACE15TEModel's qwen3_06b is the same model at the same
    # width as AnimaTEModel's, which a single-file load reads)
    te=(("qwen3_06b",), "stable_diffusion"), widths={"text_hidden_dim": "cond"},
    # every RoPE caches 32768 positions (cos and sin buffers, 1 MiB each at these heads):
    # ten times the stand-in's weights, which the driver sizes the GPUs from; a second
    # of audio and a shrunk prompt take a few hundred (a longer input grows the cache)
    init={"comfy.ldm.ace.ace_step15.RotaryEmbedding": {"max_position_embeddings": 512}})

# -- the VAE --------------------------------------------------------------------------------------
VAE_STRIDES = [2, 4, 4, 6, 10]           # sd.py's 48 kHz config (kernel 12 in block 2)
encoders.VAES["ace15_vae"] = dict(
    file="enc_vae_ace15.safetensors", arch="ace15",
    init_overrides={"comfy.ldm.audio.autoencoder.AudioOobleckVAE": {"channels": 8}},
    latent=[64, 25], dtype="bfloat16", expect_class="AudioOobleckVAE")

checkpoints.CHECKPOINTS["ace_step15"] = dict(
    diffusion="ace_step15", te=(("qwen3_06b", "qwen3_17b"), "ace"), vae="ace15_vae")


def build_vae(work):
    """The VAE stand-in at encoders.vae_file_path, with the metadata build_vae_file
    writes (so that it, as checkpoints.py calls it, finds the file up to date)."""
    from comfy.ldm.audio.autoencoder import AudioOobleckVAE
    spec = encoders.VAES["ace15_vae"]
    path = encoders.vae_file_path(work, "ace15_vae")
    tiny = json.dumps({"name": "ace15_vae", "init_overrides": spec["init_overrides"]},
                      sort_keys=True)
    if not encoders._up_to_date(path, tiny):
        with encoders._overrides(spec["init_overrides"]):
            model = AudioOobleckVAE(strides=VAE_STRIDES)
        sd = encoders._randomize(encoders._state_dict(model), builders.seed_of("ace15_vae"))
        del model
        encoders._save(path, sd, spec["dtype"], encoders._spec_metadata(tiny))
    return path


def build(work, arch, dest):
    """Makes `dest` the stand-in of ACE-Step 1.5 architecture `arch` ("kind:name")."""
    kind, name = arch.split(":", 1)
    if kind == "diffusion":
        return builders.build_diffusion(work, name, dest)
    if kind == "vae":
        return builders._link(build_vae(work), dest)
    if kind == "checkpoint":
        build_vae(work)
        return checkpoints.build(work, name, dest)
    raise builders.NoBuilder(f"no stand-in builder for {arch} (tests/templates/ace_step.py)")


def install_hook():
    """ACE15TEModel.load_sd loads a stand-in that names itself Qwen3 0.6B into its
    qwen3_06b model (it tells the real file by its 1024 width)."""
    import comfy.text_encoders.ace15 as ace15
    cls = ace15.ACE15TEModel
    original = cls.load_sd
    if getattr(original, "_placement_tiny", False):
        return

    @functools.wraps(original)
    def load_sd(self, sd):
        named = sd.get(encoders.TE_MODEL_KEY)
        if named is not None and bytes(named.tolist()).decode() == "QWEN3_06B":
            return self.qwen3_06b.load_sd(sd)
        return original(self, sd)
    load_sd._placement_tiny = True
    cls.load_sd = load_sd
