"""Stand-ins for the official templates (issue 31 item 3), inside ComfyUI's Python: the
SD3.5 Large, SDXL Refiner, SVD and NetaYume Lumina checkpoints, NewBie's Lumina 2
diffusion model and its Jina CLIP v2 text encoder, CLIP vision G and the SD3.5 Large
ControlNets. Checkpoints are written by checkpoints.build from the parts named here
(CHECKPOINTS2). How ComfyUI's detection finds each:

- SD3.5 Large: an MMDiT (model_detection reads the width from x_embedder, 64 per head,
  the pooled width from y_embedder, the context width from context_embedder); its
  block count is a constructor argument it does not read (num_blocks = width / 64), so
  the stand-in (width 128, 4 blocks) records it (`fixed`). ComfyUI's SD3 CLIP
  (comfy/text_encoders/sd3_clip.py SD3ClipModel.encode_token_weights) pads CLIP-L's and
  CLIP-G's sequences side by side to 4096 wide (line 129: `pad(lg_out, (0, 4096 - ...))`)
  and concatenates T5's sequence after them along the tokens, so T5 must be 4096 wide
  (the real T5-XXL's d_model); with no text encoder it gives zeros (1, 77, 4096) (line
  145) and, without CLIP-L or CLIP-G, 768 / 1280 zeros for their pooled halves. The
  tiny T5 is 32 wide: `install_hook()` zero-pads its sequence to 4096 while an SD3 CLIP
  with a CLIP part encodes (only a T5 narrower than 4096, so only a stand-in), and the
  MMDiT takes the real 4096-wide context (its context_embedder read from the file).
  (T5XXLTokenizer's embedding_size=4096 sizes textual-inversion embeddings only: none here.)
- SD3.5 Large ControlNets (comfy/controlnet.py load_controlnet_sd35, by
  transformer_blocks.0.adaLN_modulation.1.bias): the width is read from y_embedder, the
  blocks counted; the original pooled width is hard-coded (adm_in_channels=2048), so the
  stand-in records the pooled width of the SD3 stand-in as an init override of
  ControlNetEmbedder (controlnets.install_hook applies it). Its y_embedder is square
  (double_y_emb, the Large layout: the pooled vector's embedder is the main model's,
  ControlNetSD35.pre_run loads it); control_type 0 / 1 / 2 (blur, canny, depth) by name.
  ComfyUI spreads its 2 layers over as many main blocks as the width says (width / 64:
  2, so the main model's blocks 0 and 1 get hints; the released files' 38 = 38 blocks).
- SDXL Refiner: a UNet ComfyUI tells apart by its released widths only (384 channels,
  context 1280, adm 2560), so the stand-in names SDXLRefiner (`config`): 64 wide, CLIP-G's
  sequence as context, its pooled vector and five 256-wide embeddings as adm.
- SDXL's and the Refiner's noise augmentor (model_base.SDXL: CLIPEmbeddingNoiseAugmentation
  timestep_dim 1280, used by unCLIPConditioning: revision) is as wide as the pooled
  vector it augments: an init override of the pooled width on the SDXL stand-ins, and
  `install_hook()` makes sdxl_pooled keep that width where it keeps 1280 (`[:, :1280]`)
  when the augmentor is narrower than 1280 (only a stand-in's).
- CLIP vision G: detected by its 48th layer (clip_vision_config_g.json); the tiny config
  (vision.py) projects to the pooled width of the SDXL stand-in (revision's image
  embeds replace the pooled vector).
- SVD: a video UNet matched by its released widths (320 channels, context 1024): the
  stand-in names SVD_img2vid; its context is the CLIP vision H stand-in's image embeds,
  which the checkpoint holds (under conditioner.embedders.0.open_clip.model.visual.;
  checkpoints.install_hook builds its tiny config as vision.py's hook does). Its VAE is
  SD's encoder with a VideoDecoder (found by decoder.mid.block_1.mix_factor), whose
  width comfy.sd.VAE fixes at 128: an init override makes the stand-in's 32.
- Lumina 2 (NetaYume, NewBie): detection reads the width, caption width and layers, and
  the heads, RoPE axes and NewBie's pooled-text width only at width 2304; the stand-in
  (192 wide, 2 heads of 96) names Lumina2 and records its whole config. NewBie's text
  encoders are Gemma 3 4B (its sequence) and Jina CLIP v2 (its pooled vector,
  clip_text_dim).
- Jina CLIP v2 (XLM-RoBERTa, found by model.encoder.layers.0.mixer.Wqkv): 32 wide, 2
  layers, the vocabulary of its SentencePiece tokenizer, stored in the file
  (spiece_model) with Jina's ids (bos 0, pad 1, eos 2, unk 3). NewBie's TE model builds
  it and Gemma 3 4B with no model name, so both would read model_options["_model_config"]:
  their sizes travel as init overrides of their config dataclasses instead.
"""
import functools
import io
import json
import os

import builders
import checkpoints
import encoders
import families
import vision

TINY_KEY = encoders.TINY_KEY
ARCHITECTURES = {"checkpoint:sd3", "checkpoint:sdxl_refiner", "checkpoint:svd",
                 "checkpoint:lumina2", "diffusion:newbie", "te:jina_clip_v2",
                 "clip_vision:clip_vision_g", "controlnet:sd3_controlnet"}

SD3_CONTEXT = 4096          # what SD3ClipModel pads CLIP-L and CLIP-G to (see above)
SDXL_POOLED = 1280          # what sdxl_pooled keeps of an unCLIP adm

# -- diffusion models -----------------------------------------------------------------
builders.DIFFUSION["sd3"] = dict(
    family="sd3", fixed={"num_blocks": 4}, te=(("clip_l", "clip_g", "t5xxl"), "sd3"),
    widths={"adm_in_channels": "pooled"})
builders.DIFFUSION["sdxl_refiner"] = dict(
    family="sdxl", config="SDXLRefiner",
    fixed={"model_channels": 64, "transformer_depth": [0, 0, 1, 1, 1, 1, 0, 0],
           "transformer_depth_output": [0] * 9, "num_res_blocks": [8]},
    te=(("clip_g",), "stable_diffusion"),
    widths={"context_dim": "cond", "adm_in_channels": ("pooled", 5 * 256)})
builders.DIFFUSION["svd"] = dict(
    family="svd", config="SVD_img2vid",
    fixed={"model_channels": 64,
           "context_dim": vision.CONFIGS["clip_vision_h"][1]["projection_dim"]},
    te=((), None), widths={})
LUMINA2_TINY = {"dim": 192, "n_heads": 2, "n_kv_heads": 1, "n_layers": 4,
                "axes_dims": [32, 32, 32]}
builders.DIFFUSION["lumina2"] = dict(
    family="lumina2", config="Lumina2", fixed=dict(LUMINA2_TINY),
    te=(("gemma2_2b",), "lumina2"), widths={"cap_feat_dim": "cond"})
builders.DIFFUSION["newbie"] = dict(
    family="lumina2", config="Lumina2", fixed=dict(LUMINA2_TINY),
    te=(("gemma3_4b", "jina_clip_v2"), "newbie"),
    widths={"cap_feat_dim": "cond", "clip_text_dim": "pooled"})

# SDXL's pooled vector is CLIP-G's projection (the stand-in's config): the SDXL stand-ins'
# noise augmentor and CLIP vision G's image embeds are that wide. Set on import, as
# builders.build imports this module before it builds any stand-in (checkpoint:sdxl,
# checkpoints.py's, included); checked against what ComfyUI's loader gives (_check_pooled)
SDXL_TINY_POOLED = encoders.TE_FILES["clip_g"]["config"]["projection_dim"]
NOISE_AUG = "comfy.ldm.modules.encoders.noise_aug_modules.CLIPEmbeddingNoiseAugmentation"
for _arch in ("sdxl", "sdxl_refiner"):
    builders.DIFFUSION[_arch]["init"] = dict(builders.DIFFUSION[_arch].get("init") or {}, **{
        NOISE_AUG: {"timestep_dim": SDXL_TINY_POOLED}})
vision.CONFIGS["clip_vision_g"] = ("clip_vision_config_g.json", dict(
    vision.CONFIGS["clip_vision_h"][1], num_hidden_layers=48, projection_dim=SDXL_TINY_POOLED))


def _check_pooled(work):
    """The SDXL stand-ins' pooled width, read through ComfyUI's CLIP loader, is the one
    set above."""
    for arch in ("sdxl", "sdxl_refiner"):
        pooled = builders.te_widths(work, *builders.DIFFUSION[arch]["te"])["pooled"]
        if pooled != SDXL_TINY_POOLED:
            raise RuntimeError(f"the {arch} stand-in's text encoders pool {pooled} wide, "
                               f"not CLIP-G's projection_dim {SDXL_TINY_POOLED}")


def _sd3_context(work):
    """The MMDiT's context_embedder takes what the SD3 CLIP gives (4096 wide)."""
    spec = builders.DIFFUSION["sd3"]
    if "context_embedder_config" not in spec["fixed"]:
        install_hook()
        cond = builders.te_widths(work, *spec["te"])["cond"]
        width = 64 * families.FAMILIES["sd3"].unet_config["depth"]
        spec["fixed"]["context_embedder_config"] = {
            "target": "torch.nn.Linear", "params": {"in_features": cond, "out_features": width}}


# -- Jina CLIP v2 and NewBie's Gemma 3 4B ------------------------------------------------
# NewBieTEModel builds Gemma3_4BModel and JinaClip2TextModel with no model name, so both
# read their config from the one key model_options["_model_config"]: the two stand-ins'
# tiny sizes travel as init overrides of their config classes instead (the Gemma 3 4B
# stand-in's are the values its gemma3_4b_model_config already carries: nothing changes
# where that key is read)
JINA_TINY = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
             "num_attention_heads": 2}
JINA_CONFIG = "comfy.text_encoders.jina_clip_2.XLMRobertaConfig"
encoders.TE_FILES["jina_clip_v2"] = dict(
    file="enc_jina_clip_v2.safetensors", arch="jina", model_name="", config={},
    cls="comfy.text_encoders.jina_clip_2.XLMRobertaModel", init_overrides=None,
    dtype="bfloat16")
_GEMMA3 = encoders.TE_FILES["gemma3_4b"]
_GEMMA3["init_overrides"] = dict(_GEMMA3.get("init_overrides") or {}, **{
    "comfy.text_encoders.llama.Gemma3_4B_Config": dict(_GEMMA3["config"])})
builders.TEXT_ENCODERS["jina_clip_v2"] = "jina_clip_v2"


def _jina_spiece():
    """A SentencePiece model with Jina's (XLM-RoBERTa's) special ids."""
    import sentencepiece as spm
    out = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(encoders.CORPUS * 8), model_writer=out, vocab_size=256,
        model_type="bpe", hard_vocab_limit=False, character_coverage=1.0, minloglevel=2,
        num_threads=1, bos_id=0, pad_id=1, eos_id=2, unk_id=3)
    return out.getvalue()


def build_jina(work):
    """The Jina CLIP v2 stand-in at encoders.te_file_path, with the metadata
    encoders.build_te_file would write (so it finds the file up to date)."""
    import sentencepiece as spm
    import torch
    import comfy.ops
    from comfy.text_encoders.jina_clip_2 import XLMRobertaModel
    spec = encoders.TE_FILES["jina_clip_v2"]
    path = encoders.te_file_path(work, "jina_clip_v2")
    spiece = _jina_spiece()
    vocab = spm.SentencePieceProcessor(model_proto=spiece).get_piece_size()
    config = dict(JINA_TINY, vocab_size=vocab)
    spec["init_overrides"] = {JINA_CONFIG: config}
    tiny = json.dumps({"model_options": {"_model_config": {}}, "name": "jina_clip_v2",
                       "init_overrides": spec["init_overrides"]}, sort_keys=True)
    if encoders._up_to_date(path, tiny):
        return path
    model = XLMRobertaModel(dict(config), torch.float32, "cpu", comfy.ops.manual_cast)
    sd = encoders._randomize(encoders._state_dict(model), builders.seed_of("jina_clip_v2"))
    del model
    sd["spiece_model"] = torch.frombuffer(bytearray(spiece), dtype=torch.uint8)
    encoders._save(path, sd, spec["dtype"], encoders._spec_metadata(tiny))
    return path


# -- SVD's VAE ----------------------------------------------------------------------------
# comfy.sd.VAE detects it by decoder.mid.block_1.mix_factor and builds SD's encoder and a
# VideoDecoder (time-mixing res blocks and output conv) at the released widths (ch 128):
# the stand-in's decoder is 32 wide (an init override, as encoders.py's SD VAE's width)
VIDEO_DECODER = "comfy.ldm.modules.temporal_ae.VideoDecoder"
encoders.VAES["svd_vae"] = dict(file="enc_vae_svd.safetensors", arch="svd", dtype="float16",
                                init_overrides={VIDEO_DECODER: {"ch": 32}})


def build_svd_vae(work):
    """The SVD VAE stand-in at encoders.vae_file_path, with the metadata
    encoders.build_vae_file would write (so it finds the file up to date)."""
    from comfy.ldm.models.autoencoder import AutoencodingEngine
    spec = encoders.VAES["svd_vae"]
    path = encoders.vae_file_path(work, "svd_vae")
    tiny = json.dumps({"name": "svd_vae", "init_overrides": spec["init_overrides"]},
                      sort_keys=True)
    if encoders._up_to_date(path, tiny):
        return path
    enc = {"double_z": True, "z_channels": 4, "resolution": 256, "in_channels": 3,
           "out_ch": 3, "ch": 128, "ch_mult": [1, 2, 4, 4], "num_res_blocks": 2,
           "attn_resolutions": [], "dropout": 0.0}
    dec = dict(enc, video_kernel_size=[3, 1, 1], alpha=0.0)        # as comfy.sd.VAE
    with encoders._overrides(spec["init_overrides"]):
        model = AutoencodingEngine(
            regularizer_config={
                "target": "comfy.ldm.models.autoencoder.DiagonalGaussianRegularizer"},
            encoder_config={"target": "comfy.ldm.modules.diffusionmodules.model.Encoder",
                            "params": enc},
            decoder_config={"target": VIDEO_DECODER, "params": dec})
    sd = encoders._randomize(encoders._state_dict(model), builders.seed_of("svd_vae"))
    del model
    encoders._save(path, sd, spec["dtype"], encoders._spec_metadata(tiny))
    return path


# -- checkpoints --------------------------------------------------------------------------
CHECKPOINTS2 = {
    "sd3": dict(diffusion="sd3", te=(("clip_l", "clip_g", "t5xxl"), "sd3"), vae="flux_vae"),
    "sdxl_refiner": dict(diffusion="sdxl_refiner", te=(("clip_g",), "stable_diffusion"),
                         vae="sd_vae"),
    "svd": dict(diffusion="svd", te=None, vae="svd_vae", clip_vision="clip_vision_h"),
    "lumina2": dict(diffusion="lumina2", te=(("gemma2_2b",), "lumina2"), vae="flux_vae"),
}


# -- the SD3.5 Large ControlNets -----------------------------------------------------------
CONTROL_TYPES = {"blur": 0, "canny": 1, "depth": 2}
CONTROLNET_LAYERS = 2
EMBEDDER = "comfy.cldm.dit_embedder.ControlNetEmbedder"


def build_sd3_controlnet(work, dest):
    import torch
    import comfy.ops
    from comfy.cldm.dit_embedder import ControlNetEmbedder
    name = os.path.basename(dest)
    kind = next((k for k in CONTROL_TYPES if k in name), None)
    if kind is None:
        raise builders.NoBuilder(f"no stand-in builder for the SD3.5 ControlNet {name!r} "
                                 f"(its kind is none of {sorted(CONTROL_TYPES)})")
    _sd3_context(work)
    fam, widths = builders.diffusion_family(work, "sd3")
    width = 64 * fam.unet_config["depth"]
    init = {EMBEDDER: {"adm_in_channels": widths["adm_in_channels"]}}
    seed = builders.seed_of(name)
    tiny = json.dumps({"name": name, "init_overrides": init, "width": width,
                       "layers": CONTROLNET_LAYERS, "seed": seed}, sort_keys=True)
    built = os.path.join(work, "standins", f"controlnet_sd35_{kind}-{seed}.safetensors")
    if not encoders._up_to_date(built, tiny):
        model = ControlNetEmbedder(
            img_size=None, patch_size=2, in_chans=16, attention_head_dim=64,
            num_attention_heads=width // 64, adm_in_channels=widths["adm_in_channels"],
            num_layers=CONTROLNET_LAYERS, main_model_double=fam.unet_config["depth"],
            double_y_emb=True, device="cpu", dtype=torch.float32,
            operations=comfy.ops.disable_weight_init)
        # the pooled vector's own embedder is the main model's, loaded at pre_run
        sd = {k: v for k, v in encoders._state_dict(model).items()
              if not k.startswith("orig_y_embedder.")}
        sd = encoders._randomize(sd, seed)
        del model
        sd["control_type"] = torch.tensor([float(CONTROL_TYPES[kind])])
        encoders._save(built, sd, "float16", encoders._spec_metadata(tiny))
    builders._link(built, dest)


# -- hooks ------------------------------------------------------------------------------
def install_hook():
    """The two places ComfyUI hard-codes a released width the stand-ins are narrower
    than (see above), each only when a part is narrower than that width."""
    import torch
    import comfy.model_base
    import comfy.text_encoders.sd3_clip as sd3_clip
    cls = sd3_clip.SD3ClipModel
    encode = cls.encode_token_weights
    if getattr(encode, "_placement_tiny", False):
        return

    @functools.wraps(encode)
    def encode_token_weights(self, token_weight_pairs):
        t5 = self.t5xxl
        width = None if t5 is None else t5.transformer.shared.embedding_dim
        if width in (None, SD3_CONTEXT) or (self.clip_l is None and self.clip_g is None):
            return encode(self, token_weight_pairs)
        t5_encode = t5.encode_token_weights

        def padded(pairs):        # T5's sequence as wide as the CLIP part is padded
            out = t5_encode(pairs)
            return (torch.nn.functional.pad(out[0], (0, SD3_CONTEXT - width)),) + tuple(out[1:])
        t5.encode_token_weights = padded
        try:
            return encode(self, token_weight_pairs)
        finally:
            del t5.encode_token_weights
    encode_token_weights._placement_tiny = True
    cls.encode_token_weights = encode_token_weights

    sdxl_pooled = comfy.model_base.sdxl_pooled

    @functools.wraps(sdxl_pooled)
    def tiny_sdxl_pooled(args, noise_augmentor):
        out = sdxl_pooled(args, noise_augmentor)
        width = noise_augmentor.time_embed.dim
        if "unclip_conditioning" in args and width < SDXL_POOLED:
            out = out[:, :width]      # the image embeds, not the noise level's embedding
        return out
    tiny_sdxl_pooled._placement_tiny = True
    comfy.model_base.sdxl_pooled = tiny_sdxl_pooled


def build(work, arch, dest):
    """Makes `dest` the stand-in of `arch` ("kind:name")."""
    kind, name = arch.split(":", 1)
    install_hook()              # the SD3 CLIP's width is read while building
    _check_pooled(work)
    if kind == "checkpoint":
        if name == "sd3":
            _sd3_context(work)
        if name == "svd":
            build_svd_vae(work)
        return checkpoints.build(work, name, dest, spec=CHECKPOINTS2[name])
    if arch == "te:jina_clip_v2":
        return builders._link(build_jina(work), dest)
    if arch == "diffusion:newbie":
        build_jina(work)
        return builders.build_diffusion(work, name, dest)
    if arch == "clip_vision:clip_vision_g":
        return builders._link(vision.build(work, "clip_vision_g"), dest)
    if kind == "controlnet":
        return build_sd3_controlnet(work, dest)
    raise builders.NoBuilder(f"no stand-in builder for {arch} "
                             f"(tests/templates/standins_checkpoints2.py)")
