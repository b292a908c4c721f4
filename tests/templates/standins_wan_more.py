"""More Wan stand-ins for the official templates (issue 31 item 3), inside ComfyUI's
Python: SCAIL-2, HuMo, Wan 2.2 S2V and WanDancer diffusion models, the InfiniteTalk
model patch, the wav2vec2 and Whisper audio encoders they read, and SeedVR2 (its
diffusion model and VAE).

The Wan variants are Wan 2.1's layout (builders.DIFFUSION's Wan entries are the worked
example); ComfyUI's detection (model_detection.py) tells them apart by one key each
(`patch_embedding_mask`: SCAIL-2, `audio_proj.audio_proj_glob_1`: HuMo,
`casual_audio_encoder...final_linear`: S2V, `patch_embedding_global`: WanDancer) and
reads the width, blocks and input channels. What it does not read, each stand-in records
for builders.install_unet_hook: widths that are constructor arguments (S2V's audio width
and injection blocks, WanDancer's music encoder) in `fixed`, the ones no unet_config key
reaches (the 1280-wide CLIP vision input, HuMo's audio projection, S2V's per-layer audio
weights) as init overrides. The audio widths are those of the audio-encoder stand-ins
here (AUDIO), which the templates feed them.

Audio encoders (AudioEncoderLoader, comfy/audio_encoders): Whisper is detected by a key
and built at its released size: the stand-in records its tiny sizes (init overrides of
WhisperLargeV3). wav2vec2 is matched by its width alone (768 base, 1024 large; any other
raises), so its stand-in names its config, as the SDXL stand-in names its class. The
loader reads no metadata: the spec travels as a uint8 tensor in the file (AUDIO_KEY, as
encoders.TE_MODEL_KEY does), which `install_hook()` takes out before the load.

InfiniteTalk (ModelPatchLoader) reads its widths from the file but builds 40 blocks and
40-head speaker attention: its stand-in records its block count (the diffusion stand-in's)
and heads as init overrides, applied by model_patches.install_hook. Its two-speaker map
averages over half the diffusion model's heads (heads // 2), so its Wan I2V stand-in has
2 heads (detection says dim // 128: recorded in `fixed`).

SeedVR2 (comfy/ldm/seedvr): detection finds the 3B by `blocks.31.mlp.all...` and the 7B
by `blocks.35.mlp.all...` and hard-codes the rest (widths 2560 / 3072): the stand-in has
those 32 / 36 blocks at width 64 and records its widths (unet_config) for the hook. The
text conditioning it carries (positive/negative_conditioning, 5120 wide: fixed in NaDiT)
stays at its released shape. The 7B's own code paths are keyed to width 3072, so the tiny
7B runs the 3B paths with the 7B's layout (RoPE 3D, 36 blocks). The VAE's widths are a
module constant (BYTEDANCE_BLOCK_OUT_CHANNELS): its stand-in records tiny ones as init
overrides of Encoder3D / Decoder3D, applied by encoders.install_hooks' VAE hook.
"""
import functools
import json
import os

import builders
import encoders
import families

TINY_KEY = encoders.TINY_KEY
AUDIO_KEY = "comfyui_placement_audio_encoder"

ARCHITECTURES = {"diffusion:wan21_scail2", "diffusion:wan21_humo", "diffusion:wan22_s2v",
                 "diffusion:wan22_dancer", "diffusion:wan21_i2v_multihead",
                 "model_patch:wan21_infinitetalk",
                 "audio_encoder:wav2vec2_base", "audio_encoder:wav2vec2_large",
                 "audio_encoder:whisper_large_v3",
                 "diffusion:seedvr2_3b", "diffusion:seedvr2_7b", "vae:seedvr2_vae"}

# -- audio encoders ----------------------------------------------------------------------
# architecture -> (the class detection gives the real file, its config here, init
# overrides). wav2vec2's convolution stack is 512 wide (a local in Wav2Vec2Model): 16.
# Whisper keeps its 32 layers (HuMo reads layers 0-32), 128 mel bins and 1500 positions
# (30 s of audio, as the feature extractor pads).
_CONV = {"comfy.audio_encoders.wav2vec2.ConvFeatureEncoder": {"conv_dim": 16},
         "comfy.audio_encoders.wav2vec2.FeatureProjection": {"conv_dim": 16}}
AUDIO = {
    "wav2vec2_base": dict(width=32, layers=2, config={
        "model_type": "wav2vec2", "embed_dim": 32, "num_heads": 2, "num_layers": 2,
        "conv_norm": False, "conv_bias": False, "do_normalize": False,
        "do_stable_layer_norm": False}, init=_CONV, released_width=768),
    "wav2vec2_large": dict(width=32, layers=3, config={
        "model_type": "wav2vec2", "embed_dim": 32, "num_heads": 2, "num_layers": 3,
        "conv_norm": True, "conv_bias": True, "do_normalize": True,
        "do_stable_layer_norm": True}, init=_CONV, released_width=1024),
    "whisper_large_v3": dict(width=32, layers=32, config=None, init={
        "comfy.audio_encoders.whisper.WhisperLargeV3": {
            "n_audio_state": 32, "n_audio_head": 2, "n_audio_layer": 32}}),
}


def build_audio_encoder(work, name, dest):
    import torch
    import comfy.audio_encoders.audio_encoders as ae
    spec = AUDIO[name]
    tiny = {"name": name, "config": spec["config"], "init_overrides": spec["init"]}
    text = json.dumps(tiny, sort_keys=True)
    path = os.path.join(work, "standins", f"audio_{name}.safetensors")
    if not encoders._up_to_date(path, text):
        config = dict(spec["config"] or {"model_type": "whisper3"})
        with encoders._overrides(spec["init"]):
            model = ae.AudioEncoderModel(config).model
        sd = encoders._randomize(encoders._state_dict(model), builders.seed_of(name))
        del model
        if name == "whisper_large_v3":        # the released file's key layout
            sd = {f"model.{k}": v for k, v in sd.items() if k.startswith("encoder.")}
        sd[AUDIO_KEY] = torch.frombuffer(bytearray(text.encode()), dtype=torch.uint8)
        encoders._save(path, sd, "float16", encoders._spec_metadata(text))
    builders._link(path, dest)


def install_hook():
    """load_audio_encoder_from_sd builds a stand-in with the sizes it records: Whisper's
    through ComfyUI's detection with init overrides, wav2vec2's named config."""
    import comfy.audio_encoders.audio_encoders as ae
    original = ae.load_audio_encoder_from_sd
    if getattr(original, "_placement_tiny", False):
        return

    @functools.wraps(original)
    def load_audio_encoder_from_sd(sd, prefix=""):
        raw = sd.pop(AUDIO_KEY, None)
        if raw is None:
            return original(sd, prefix)
        spec = json.loads(bytes(raw.tolist()).decode())
        with encoders._overrides(spec.get("init_overrides")):
            if not spec.get("config"):
                return original(sd, prefix)
            # detection's wav2vec2 branch: its key, then its released widths only
            if "encoder.layer_norm.bias" not in sd:
                raise RuntimeError(f"{spec['name']} stand-in has no encoder.layer_norm.bias")
            encoder = ae.AudioEncoderModel(dict(spec["config"]))
            missing, unexpected = encoder.load_sd(sd)
            if missing or unexpected:
                raise RuntimeError(f"{spec['name']} stand-in: missing {missing}, "
                                   f"unexpected {unexpected}")
            return encoder
    load_audio_encoder_from_sd._placement_tiny = True
    ae.load_audio_encoder_from_sd = load_audio_encoder_from_sd


# -- Wan variants --------------------------------------------------------------------------
WAN_TE = dict(te=(("umt5xxl",), "wan"), widths={"text_dim": "cond"})
_INJECT = [0, 2]         # audio injected after blocks 0 and 2 of 4 (the real: 12 of 40)

builders.DIFFUSION.update({
    # SCAIL-2: the noise and its mask (16 + 4), the pose stream and a 28-channel mask
    # stream beside it, CLIP vision as Wan I2V
    "wan21_scail2": dict(family="wan21", depth=4, fixed={"model_type": "scail2", "in_dim": 20},
                         init=builders.WAN_CLIP_VISION, **WAN_TE),
    # HuMo 17B: the noise, a mask and the reference latent (16 + 4 + 16); Whisper's five
    # layer groups of 8 frames projected to 16 audio tokens per frame
    "wan21_humo": dict(family="wan21", depth=4, fixed={"model_type": "humo", "in_dim": 36},
                       init={"comfy.ldm.wan.model.AudioProjModel": {
                                 "channels": AUDIO["whisper_large_v3"]["width"],
                                 "intermediate_dim": 32, "output_dim": 32},
                             "comfy.ldm.wan.model.AudioCrossAttentionWrapper": {"kv_dim": 32}},
                       **WAN_TE),
    # S2V: wav2vec2 large's layers, weighted (one weight per layer and the embedding)
    "wan22_s2v": dict(family="wan21", depth=4,
                      fixed={"model_type": "s2v", "audio_dim": AUDIO["wav2vec2_large"]["width"],
                             "audio_inject_layers": _INJECT},
                      init={"comfy.ldm.wan.model.CausalAudioEncoder": {
                          "num_layers": AUDIO["wav2vec2_large"]["layers"] + 1}},
                      **WAN_TE),
    # WanDancer: I2V with a second CLIP vision input and a music encoder of its own
    "wan22_dancer": dict(family="wan21", depth=4,
                         fixed={"model_type": "wandancer", "in_dim": 36,
                                "audio_inject_layers": _INJECT, "music_dim": 32,
                                "music_heads": 2, "music_latent_dim": 32},
                         init=dict(builders.WAN_CLIP_VISION, **{
                             "comfy.ldm.wan.model_wandancer.MusicEncoderLayer": {"ffn_dim": 64}}),
                         **WAN_TE),
    "wan21_i2v_multihead": dict(family="wan21", depth=4,
                                fixed={"model_type": "i2v", "in_dim": 36, "num_heads": 2},
                                init=builders.WAN_CLIP_VISION, **WAN_TE),
})

# -- InfiniteTalk ------------------------------------------------------------------------
MULTITALK = "comfy_extras.nodes_model_patch.MultiTalkModelPatch"


def build_infinitetalk(work, dest):
    import torch
    import comfy.ops
    name = os.path.basename(dest)
    fam, _ = builders.diffusion_family(work, "wan21_i2v_multihead")
    audio = AUDIO["wav2vec2_base"]
    # 40 blocks and 40 heads are constructor defaults; the audio projection reads every
    # wav2vec2 layer (12 of 768) but the first
    over = {MULTITALK: {"num_layers": fam.unet_config["num_layers"]},
            "comfy.ldm.wan.model_multitalk.MultiTalkAudioProjModel": {
                "blocks": audio["layers"], "channels": audio["width"]},
            "comfy.ldm.wan.model_multitalk.SingleStreamMultiAttention": {"num_heads": 2}}
    tiny = json.dumps({"name": name, "init_overrides": over}, sort_keys=True)
    path = os.path.join(work, "standins", f"patch_{name}")
    if not encoders._up_to_date(path, tiny):
        with encoders._overrides(over):
            model = encoders._resolve(MULTITALK)(
                audio_window=5, context_tokens=32, vae_scale=4, in_dim=fam.unet_config["dim"],
                intermediate_dim=32, out_dim=32, device="cpu", dtype=torch.float32,
                operations=comfy.ops.disable_weight_init)
        sd = encoders._randomize(encoders._state_dict(model), builders.seed_of(name))
        del model
        encoders._save(path, sd, "float16", encoders._spec_metadata(tiny))
    builders._link(path, dest)


# -- SeedVR2 ---------------------------------------------------------------------------------
# what detection reads for each (model_detection.py), and the tiny widths recorded
SEEDVR2_DETECTED = {
    "seedvr2_3b": {"image_model": "seedvr2", "vid_dim": 2560, "heads": 20, "num_layers": 32,
                   "norm_eps": 1e-5, "mlp_type": "swiglu", "vid_out_norm": True},
    "seedvr2_7b": {"image_model": "seedvr2", "vid_dim": 3072, "heads": 24, "num_layers": 36,
                   "mm_layers": 10, "norm_eps": 1e-5, "rope_type": "rope3d", "rope_dim": 64,
                   "mlp_type": "swiglu"},
}
SEEDVR2_TINY = {"seedvr2_3b": {"vid_dim": 64, "heads": 2, "head_dim": 32, "rope_dim": 32},
                "seedvr2_7b": {"vid_dim": 64, "heads": 2, "head_dim": 32, "rope_dim": 16}}


def build_seedvr2(work, arch, dest):
    import safetensors.torch
    config = dict(SEEDVR2_DETECTED[arch], **SEEDVR2_TINY[arch])
    seed = builders.seed_of(os.path.basename(dest))
    tiny = json.dumps({"unet_config": SEEDVR2_TINY[arch], "name": arch}, sort_keys=True)
    path = os.path.join(work, "standins", f"{arch}-{seed}.safetensors")
    if not encoders._up_to_date(path, tiny):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        sd = families.random_state_dict(config, seed)
        safetensors.torch.save_file(sd, path + ".part", metadata={TINY_KEY: tiny})
        os.replace(path + ".part", path)
    builders._link(path, dest)


# 4 groups of channels 8-16 (the released: 32 groups of 128-512)
SEEDVR2_VAE_INIT = {
    "comfy.ldm.seedvr.vae.VideoAutoencoderKL": {"norm_num_groups": 4},
    "comfy.ldm.seedvr.vae.Encoder3D": {"block_out_channels": [8, 16, 16, 16]},
    "comfy.ldm.seedvr.vae.Decoder3D": {"block_out_channels": [8, 16, 16, 16]}}


def build_seedvr2_vae(work, dest):
    import comfy.ldm.seedvr.vae
    tiny = json.dumps({"name": "seedvr2_vae", "init_overrides": SEEDVR2_VAE_INIT},
                      sort_keys=True)
    path = os.path.join(work, "standins", "vae_seedvr2.safetensors")
    if not encoders._up_to_date(path, tiny):
        with encoders._overrides(SEEDVR2_VAE_INIT):
            model = comfy.ldm.seedvr.vae.VideoAutoencoderKLWrapper()
        sd = encoders._randomize(encoders._state_dict(model), builders.seed_of("seedvr2_vae"))
        del model
        encoders._save(path, sd, "float16", encoders._spec_metadata(tiny))
    builders._link(path, dest)


def build(work, arch, dest):
    """Makes `dest` the stand-in of `arch` ("kind:name")."""
    kind, name = arch.split(":", 1)
    if kind == "audio_encoder":
        return build_audio_encoder(work, name, dest)
    if arch == "model_patch:wan21_infinitetalk":
        return build_infinitetalk(work, dest)
    if name in SEEDVR2_DETECTED:
        return build_seedvr2(work, name, dest)
    if arch == "vae:seedvr2_vae":
        return build_seedvr2_vae(work, dest)
    if kind == "diffusion":
        return builders.build_diffusion(work, name, dest)
    raise builders.NoBuilder(f"no stand-in builder for {arch} "
                             f"(tests/templates/standins_wan_more.py)")
