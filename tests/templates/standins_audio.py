"""Audio stand-ins for the official templates (issue 31 item 3), inside ComfyUI's Python:
ACE-Step 1 (3.5B), Stable Audio Open 1.0 and Stable Audio 3 checkpoints, and the text
encoders the Stable Audio templates load beside them (T5 base, T5Gemma, and the Qwen3.5
2B that writes Stable Audio 3's prompt). How ComfyUI's detection finds each:

- ACE-Step 1 (checkpoint:ace_step): found by `genre_embedder.weight`; detection
  (model_detection.py) hard-codes the whole config (24 layers of 20 heads of 128, the
  lyric and SSL widths), so the stand-in records its tiny one in its metadata for
  builders.install_unet_hook; the lyric encoder's Conformer sizes are constructor
  defaults (init overrides). Kept: the 8x16 latent, the 512-wide speaker vector
  (model_base.ACEStep gives zeros that wide) and the lyric tokenizer's 6693 ids. Its
  text encoder is UMT5 base with its SentencePiece model (AceT5Model: detection reads
  T5 base from `SelfAttention.k`; the widths travel as `_model_config`, the key
  UMT5BaseModel reads, having no model name); its VAE MusicDCAE (found by
  `vocoder.backbone.channel_layers.0.0.bias`, built by sd.py with default configs:
  the tiny DC-AE and vocoder configs are init overrides). The mel front end (128 mels,
  the DC-AE's 8x compression to 16 rows) is kept.
- Stable Audio Open 1.0 (checkpoint:stable_audio) and Stable Audio 3
  (checkpoint:stable_audio3): an AudioDiffusionTransformer found by
  `transformer.rotary_pos_emb.inv_freq`; detection reads the widths, depth, the
  timestep features, SA3's shared global embedder (which makes it StableAudio3), its
  local conditioning and its heads (from the RMS q_norm). It reads neither the token
  width (constructor default 768: T5's) nor SA1's heads: recorded in the metadata. The
  seconds conditioners are NumberConditioner(768) in model_base: an init override gives
  the text encoder's width. These checkpoints are written with comfy.sd.save_checkpoint
  as checkpoints.py does (StableAudio1 saves its seconds conditioners itself; StableAudio3
  does not, so they and its padding embedding travel as save_checkpoint's extra_keys,
  where the released file holds them). Their VAEs: SA1's Oobleck (44.1 kHz strides,
  8 channels wide: an init override) and SA3's (found by
  `decoder.layers.3.transformers.0.pre_norm.alpha`, its 256 latent channels and 256x16
  patching kept, 32 channels of width 6x wide: an init override).
- T5 base (te:t5_base): T5_BASE to detection, SAT5Model without a SentencePiece model
  (the shipped T5 tokenizer: the 32128-token vocabulary stays).
- T5Gemma (te:t5gemma): found by `model.encoder.layers.0.pre_self_attn_layernorm`; its
  config is a class (T5GemmaEncoderConfig) ComfyUI builds with no arguments: an init
  override. Its SentencePiece model travels in the file.
- Qwen3.5 2B (te:qwen35_2b): standins_llm.py's Qwen3.5 stand-in, named QWEN35_2B.
"""
import json
import os

import builders
import checkpoints
import encoders
import families
import standins_llm

TINY_KEY = encoders.TINY_KEY
ARCHITECTURES = {"checkpoint:ace_step", "checkpoint:stable_audio", "checkpoint:stable_audio3",
                 "te:t5_base", "te:t5gemma", "te:qwen35_2b"}

# -- text encoders ----------------------------------------------------------------------
T5_TINY = {"d_model": 32, "d_kv": 16, "num_heads": 2, "d_ff": 64, "num_layers": 2}
encoders.TE_FILES["t5_base"] = dict(
    file="enc_t5_base.safetensors", arch="t5", model_name="t5base",
    base_json="text_encoders/t5_config_base.json", config=dict(T5_TINY), dtype="float16")
# ACE-Step 1's UMT5 base: its SentencePiece model in the file, a vocabulary that fits it
encoders.TE_FILES["umt5_base_ace"] = dict(
    file="enc_umt5_base_ace.safetensors", arch="t5", model_name="",
    base_json="text_encoders/umt5_config_base.json", config=dict(T5_TINY, vocab_size=256),
    dtype="bfloat16", tokenizer="spiece_t5")
SA3 = "comfy.text_encoders.sa3"
T5GEMMA_TINY = {"vocab_size": 256, "hidden_size": 32, "intermediate_size": 64,
                "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 2,
                "head_dim": 16, "query_pre_attn_scalar": 16,
                "layer_types": ["sliding_attention", "full_attention"]}
encoders.TE_FILES["t5gemma"] = dict(
    file="enc_t5gemma_b.safetensors", arch="llm", model_name="t5gemma",
    cls=f"{SA3}.T5GemmaModel", config={},
    init_overrides={f"{SA3}.T5GemmaEncoderConfig": dict(T5GEMMA_TINY)},
    dtype="bfloat16", tokenizer="spiece_gemma")
QWEN35_2B_RELEASED = standins_llm.Qwen35Released("qwen35_2b")
encoders.TE_FILES["qwen35_2b"] = dict(
    encoders.TE_FILES["qwen35_4b"], file="enc_qwen35_2b.safetensors", model_name="qwen35_2b",
    cls=f"{__name__}.QWEN35_2B_RELEASED", te_model="QWEN35_2B")
for _key in ("t5_base", "t5gemma", "qwen35_2b", "umt5_base_ace"):
    builders.TEXT_ENCODERS[_key] = _key

# -- ACE-Step 1 -------------------------------------------------------------------------
ACE_TINY = {"attention_head_dim": 16, "num_attention_heads": 2, "inner_dim": 32,
            "num_layers": 4, "mlp_ratio": 2.5, "lyric_hidden_size": 32,
            "ssl_latent_dims": [16, 16],
            # the RoPE caches this many positions (32768 released, grown on a longer input):
            # a second of latent and the templates' lyrics (161 tokens) take a few hundred
            "max_position": 512}
LYRIC_ENCODER = "comfy.ldm.ace.lyric_encoder.ConformerEncoder"
builders.DIFFUSION["ace_step"] = dict(
    family="ace_step", fixed=dict(ACE_TINY), te=(("umt5_base_ace",), "ace"),
    widths={"text_embedding_dim": "cond"},
    init={LYRIC_ENCODER: {"output_size": ACE_TINY["lyric_hidden_size"], "attention_heads": 2,
                          "linear_units": 64, "num_blocks": 1}})
MUSIC_DCAE = "comfy.ldm.ace.vae.music_dcae_pipeline.MusicDCAE"
encoders.VAES["ace_vae"] = dict(
    file="enc_vae_ace.safetensors", arch="ace", dtype="bfloat16",
    init_overrides={MUSIC_DCAE: {
        "dcae_config": {"attention_head_dim": 8,
                        "encoder_block_out_channels": [16, 16, 32, 32],
                        "decoder_block_out_channels": [16, 16, 32, 32],
                        "encoder_layers_per_block": [1, 1, 1, 1],
                        "decoder_layers_per_block": [1, 1, 1, 1]},
        # 128 mels in; the head's seven upsamplings halve 128 channels down to 1
        "vocoder_config": {"depths": [1, 1, 1, 1], "dims": [16, 16, 16, 32], "num_mels": 32,
                           "upsample_initial_channel": 128,
                           "resblock_kernel_sizes": [3], "resblock_dilation_sizes": [[1, 3, 5]]}}})
checkpoints.CHECKPOINTS["ace_step"] = dict(diffusion="ace_step", te=(("umt5_base_ace",), "ace"),
                                           vae="ace_vae")

# -- Stable Audio -------------------------------------------------------------------------
NUMBER_CONDITIONER = "comfy.ldm.audio.embedders.NumberConditioner"
OOBLECK = "comfy.ldm.audio.autoencoder.AudioOobleckVAE"
SA3_VAE = "comfy.ldm.audio.vae_sa3.SA3AudioVAE"
encoders.VAES["sa1_vae"] = dict(file="enc_vae_sa1.safetensors", arch="oobleck", dtype="float16",
                                init_overrides={OOBLECK: {"channels": 8}})
encoders.VAES["sa3_vae"] = dict(file="enc_vae_sa3.safetensors", arch="sa3", dtype="bfloat16",
                                init_overrides={SA3_VAE: {"channels": 32,
                                                          "transformer_depths": 1}})
# what detection reads from the file (the unet_config it derives), at tiny widths; the
# token width (`cond_token_dim`) is the text encoder's, set at build
STABLE_AUDIO = {
    # SA1: 2 heads of 32 (the rotary part is 32 wide), seconds_start and seconds_total
    # side by side as the global vector, prepended
    "stable_audio": dict(
        te="t5_base", vae="sa1_vae", config="StableAudio",
        unet_config={"audio_model": "dit1.0", "project_cond_tokens": False, "embed_dim": 64,
                     "timestep_features_type": "learned", "io_channels": 64,
                     "input_concat_dim": 0, "depth": 4, "num_heads": 2},
        global_cond=2, recorded=("cond_token_dim", "num_heads"),
        seconds={"seconds_start": {"min_val": 0, "max_val": 512},
                 "seconds_total": {"min_val": 0, "max_val": 512}}),
    # SA3: RMS q/k norms (detection reads 2 heads from their width), the shared adaLN
    # embedder of seconds_total, the inpainting mask and latent added per block (1 + 256),
    # 256 latent channels (the VAE's), projected text tokens padded by a learned embedding
    "stable_audio3": dict(
        te="t5gemma", vae="sa3_vae", config="StableAudio3",
        unet_config={"audio_model": "dit1.0", "project_cond_tokens": True, "embed_dim": 64,
                     "attn_kwargs": {"qk_norm": "rms", "differential": False},
                     "norm_type": "rms_norm", "num_heads": 2, "timestep_features_type": "expo",
                     "io_channels": 256, "input_concat_dim": 0, "local_add_cond_dim": 257,
                     "global_cond_shared_embed": True, "global_cond_type": "adaLN",
                     "depth": 4},
        global_cond=1, recorded=("cond_token_dim",),
        seconds={"seconds_total": {"min_val": 0, "max_val": 384,
                                   "fourier_features_type": "expo"}}),
}


def _randomize_params(module, seed):
    """Seeded random parameters (encoders._randomize's draw); buffers stay as the
    constructor computed them (the mel filters, the Hann window)."""
    import torch
    params = dict(module.named_parameters())
    drawn = encoders._randomize({k: p.detach() for k, p in params.items()}, seed)
    with torch.no_grad():
        for k, p in params.items():
            p.copy_(drawn[k].to(p.dtype))


def build_vae(work, name):
    """The VAE stand-in `name` at encoders.vae_file_path, with the metadata
    encoders.build_vae_file writes (so that checkpoints.build finds it up to date)."""
    import torch
    spec = encoders.VAES[name]
    path = encoders.vae_file_path(work, name)
    tiny = json.dumps({"name": name, "init_overrides": spec["init_overrides"]}, sort_keys=True)
    if encoders._up_to_date(path, tiny):
        return path
    with encoders._overrides(spec["init_overrides"]):
        if spec["arch"] == "ace":
            from comfy.ldm.ace.vae.music_dcae_pipeline import MusicDCAE
            model = MusicDCAE(source_sample_rate=44100)            # as sd.py builds it
        elif spec["arch"] == "oobleck":
            from comfy.ldm.audio.autoencoder import AudioOobleckVAE
            model = AudioOobleckVAE()                              # 44.1 kHz: sd.py's default
        elif spec["arch"] == "sa3":
            from comfy.ldm.audio.vae_sa3 import SA3AudioVAE
            model = SA3AudioVAE(        # sd.py's config for a file without a 12th transformer
                channels=128, transformer_depths=6, sinusoidal_blocks=0, sliding_window=None,
                decoder_conv_mapping=True, chunk_size=32, chunk_midpoint_shift=True)
        else:
            raise ValueError(spec["arch"])
    _randomize_params(model, builders.seed_of(name))
    if spec["arch"] == "sa3":            # the bottleneck's scale: a unit running std
        with torch.no_grad():
            model.bottleneck.running_std.fill_(1.0)
    sd = {k: v for k, v in model.state_dict().items()}
    del model
    encoders._save(path, sd, spec["dtype"], encoders._spec_metadata(tiny))
    return path


def _sa_config(work, arch):
    """(unet_config to build, what the metadata records, init overrides) of a Stable
    Audio stand-in at its text encoder's width."""
    spec = STABLE_AUDIO[arch]
    cond = builders.te_widths(work, (spec["te"],), "stable_audio")["cond"]
    unet_config = dict(spec["unet_config"], cond_token_dim=cond,
                       global_cond_dim=spec["global_cond"] * cond)
    recorded = {k: unet_config[k] for k in spec["recorded"]}
    init = {NUMBER_CONDITIONER: {"output_dim": cond}}
    return unet_config, recorded, init


def build_stable_audio(work, arch, dest):
    """A Stable Audio checkpoint stand-in, written by comfy.sd.save_checkpoint: its
    diffusion model (seeded random), the seconds conditioners and the VAE stand-in."""
    import torch
    import comfy.model_patcher
    import comfy.sd
    import comfy.utils
    from comfy.ldm.audio.embedders import NumberConditioner
    spec = STABLE_AUDIO[arch]
    unet_config, recorded, init = _sa_config(work, arch)
    vae_path = build_vae(work, spec["vae"])
    vae_sd, vae_meta = comfy.utils.load_torch_file(vae_path, return_metadata=True)
    overrides = dict(init, **encoders.VAES[spec["vae"]]["init_overrides"])
    seed = builders.seed_of(os.path.basename(dest))
    tiny = {"name": arch, "unet_config": recorded, "config": None, "init_overrides": overrides,
            "te_model_options": {}}
    tiny_json = json.dumps(tiny, sort_keys=True)
    built = os.path.join(work, "standins", f"ckpt_{arch}-{seed}.safetensors")
    if not encoders._up_to_date(built, tiny_json):
        os.makedirs(os.path.dirname(built), exist_ok=True)
        g = torch.Generator().manual_seed(seed)
        conditioners, extra = {}, {}
        with encoders._overrides(overrides):
            for name, kwargs in spec["seconds"].items():
                cond = NumberConditioner(**kwargs)
                _randomize_params(cond, seed + len(conditioners))
                conditioners[name] = cond.state_dict()
            cfg = families.model_config_for(unet_config)       # detection's table
            if type(cfg).__name__ != spec["config"]:
                raise RuntimeError(f"{arch}: ComfyUI matches {type(cfg).__name__} to its "
                                   f"config, not {spec['config']}")
            given = {f"conditioner.conditioners.{n}.{k}": v
                     for n, sd in conditioners.items() for k, v in sd.items()}
            if arch == "stable_audio3":
                given["conditioner.conditioners.prompt.padding_embedding"] = torch.randn(
                    unet_config["cond_token_dim"], generator=g)
            model = cfg.get_model(given, "", device=torch.device("cpu"))
        dm = model.diffusion_model
        _randomize_params(dm, seed)
        rotary = dm.transformer.rotary_pos_emb        # its buffer: as the released file holds
        dim = rotary.inv_freq.shape[0] * 2
        rotary.inv_freq.copy_(1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim)))
        if arch == "stable_audio3":     # StableAudio3 saves neither (see above)
            extra = given
        patcher = comfy.model_patcher.ModelPatcher(model, load_device=torch.device("cpu"),
                                                   offload_device=torch.device("cpu"))
        vae = comfy.sd.VAE(sd=vae_sd, metadata=vae_meta)
        metadata = {TINY_KEY: tiny_json}
        comfy.sd.save_checkpoint(built + ".part", patcher, None, vae, metadata=metadata,
                                 extra_keys=extra)
        os.replace(built + ".part", built)
        del model, patcher, vae
    builders._link(built, dest)


def build(work, arch, dest):
    """Makes `dest` the stand-in of `arch` ("kind:name")."""
    kind, name = arch.split(":", 1)
    if kind == "te":
        return builders._link(encoders.build_te_file(work, name)[0], dest)
    if arch == "checkpoint:ace_step":
        build_vae(work, "ace_vae")
        return checkpoints.build(work, name, dest)
    if kind == "checkpoint" and name in STABLE_AUDIO:
        return build_stable_audio(work, name, dest)
    raise builders.NoBuilder(f"no stand-in builder for {arch} (tests/templates/standins_audio.py)")
