"""The SAM 3.1 checkpoint stand-in for the official templates (issue 31 item 3), inside
ComfyUI's Python: sam3.1_multiplex_fp16.safetensors, which CheckpointLoaderSimple loads
for SAM3_Detect and SAM3_VideoTrack (image and video segmentation, VOID, Wan VACE
inpainting, SCAIL-2 character replacement).

How ComfyUI 0.29.0 finds the real file (comfy/model_detection.py): the keys
`detector.*` and `tracker.*` at top level (unet_prefix_from_state_dict: no prefix), the
ViT trunk's `blocks.0.attn.qkv`, the detector's `query_embed` and, for 3.1 rather than 3,
`propagation_convs` give `{"image_model": "SAM31"}` (supported_models.SAM31) and nothing
else: every size is a constructor default of comfy/ldm/sam3 (ViTDet 1024 wide x 32
blocks, d_model 256, 200 queries, 2048-wide FFNs, 8 heads) and of its own text encoder
(comfy/text_encoders/sam3_clip.py: a CLIP of 1024 x 24 layers, hard-coded). SAM31's
process_unet_state_dict moves the `language_backbone` keys (all but the resizer) aside
and process_clip_state_dict reads them as an OpenCLIP text tower under
`detector.backbone.language_backbone.encoder.`.

The stand-in is ComfyUI's own SAM3Model and SAM3ClipModelWrapper built tiny: 32 wide,
a 2-block ViT, 16 queries, one or two layers per transformer, 2 heads. Its metadata
(encoders.TINY_KEY) records the sizes detection cannot read, applied by hooks that
already exist, only while such a file loads: the unet_config widths SAM3Model passes
to its detector and tracker (builders.install_unet_hook: d_model, embed_dim,
num_queries, mem_dim) and the constructor arguments no config key reaches (init
overrides, applied by checkpoints.install_hook around load_state_dict_guess_config,
the text encoder's config included). What stays at the released size because the
nodes fix it: the 1008-pixel input (SAM3_Detect resizes every image to it, the
tracker's image_size), 14-pixel patches (its 72x72 grid), 16 multiplexed objects.
The text tower keeps CLIP's 49408-token vocabulary (the tokenizer's ids) at width 32.
"""
import json
import os

import builders
import encoders
import families

TINY_KEY = encoders.TINY_KEY
ARCHITECTURES = {"checkpoint:sam31"}

WIDTH = 32
# what SAM3Model(**unet_config) passes on: the detector's and tracker's width, the ViT's
# width (also the text encoder's: the resizer maps it to d_model), the detector's
# queries and the tracker's memory width (SAM 3.1 adds memories to d_model-wide features)
UNET_CONFIG = {"image_model": "SAM31", "d_model": WIDTH, "embed_dim": WIDTH,
               "num_queries": 16, "mem_dim": WIDTH}
_D = "comfy.ldm.sam3.detector."
_T = "comfy.ldm.sam3.tracker."
_S = "comfy.ldm.sam3.sam."
# constructor arguments no unet_config key reaches (SAM3Detector pops num_heads)
INIT_OVERRIDES = {
    # 2 blocks, the second global (the released: 32, every 8th global); 16-wide heads
    # (the 2-D RoPE splits a head in two axes)
    _S + "ViTDet": {"depth": 2, "num_heads": 2, "global_att_blocks": [1]},
    _D + "Transformer": {"num_heads": 2, "dim_ff": 64, "enc_layers": 1, "dec_layers": 2},
    _D + "EncoderLayer": {"dim_ff": 64},           # the geometry encoder's 2048 is a literal
    _D + "GeometryEncoder": {"num_heads": 2, "num_layers": 1},
    _D + "SegmentationHead": {"num_heads": 2},
    _D + "MLPWithNorm": {"hidden_dim": 64},        # the scoring's prompt MLP (2048)
    _T + "DecoupledMemoryTransformer": {"num_heads": 2, "dim_ff": 64, "num_layers": 2},
    _S + "TwoWayTransformer": {"num_heads": 2, "mlp_dim": 64},   # both mask decoders
    # the memory encoder's mask downsampler (16-1024 channels, 4 stride-2 convs from
    # 1152 pixels to the 72x72 grid): 4 stride-2 convs still, narrower
    _T + "MaskDownSampler": {"channels": [4, 8, 16, WIDTH]},
    # the text encoder: SAM3ClipModel passes its hard-coded config dict (merged here
    # into a new one: ComfyUI's own te_model_options would write into that module dict)
    "comfy.sd1_clip.SDClipModel": {"textmodel_json_config": {
        "hidden_size": WIDTH, "intermediate_size": 64, "num_attention_heads": 2,
        "num_hidden_layers": 2, "projection_dim": WIDTH}},
}
CLIP_PREFIX = "detector.backbone.language_backbone.encoder."


def _detector_tracker(seed):
    """SAM3Model's keys (ComfyUI's layout, which its process_unet_state_dict keeps) with
    random weights, its scoring turned to detect (below)."""
    import torch
    with encoders._overrides(INIT_OVERRIDES):
        cfg = families.model_config_for(UNET_CONFIG, "SAM31")
        model = cfg.get_model({}, "", device=torch.device("cpu"))
    sd = encoders._randomize(model.diffusion_model.state_dict(), seed)
    # Random weights score every query alike (a shared offset far from 0, its sign a
    # coin's): negative, SAM3_Detect keeps nothing at its 0.5 threshold, the tracker
    # tracks nothing, and every output is zeros. The scores are linear in the prompt
    # projection, so negating it flips their sign: the stand-in detects, as the real
    # model does for the templates' prompts, and its masks, refinement and tracking run.
    dm = model.diffusion_model
    dm.load_state_dict(sd)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        scores = dm(torch.rand(1, 3, 1008, 1008, generator=g),
                    text_embeddings=torch.randn(1, 8, WIDTH, generator=g),
                    text_mask=torch.ones(1, 8, dtype=torch.bool))["scores"]
    if scores.mean() < 0:
        for leaf in ("weight", "bias"):
            key = f"detector.dot_prod_scoring.prompt_proj.{leaf}"
            sd[key] = -sd[key]
    return sd


def _text_tower(seed):
    """SAM 3's CLIP text tower with random weights, in the OpenCLIP layout SAM3's
    process_clip_state_dict reads (ComfyUI's own HF -> OpenCLIP conversion, which its
    checkpoint saving uses for SD2 / SDXL)."""
    import comfy.diffusers_convert
    import comfy.text_encoders.sam3_clip as sam3_clip
    with encoders._overrides(INIT_OVERRIDES):
        clip = sam3_clip.SAM3ClipModelWrapper(device="meta")
    sd = {k: v for k, v in clip.state_dict().items() if not k.endswith("logit_scale")}
    sd = encoders._randomize(sd, seed + 1)
    sd = comfy.diffusers_convert.convert_text_enc_state_dict_v20(sd, "sam3_clip.")
    return {CLIP_PREFIX + k[len("sam3_clip."):]: v for k, v in sd.items()}


def _verify(path, spec):
    """The file as ComfyUI reads it: detection's class and every key of the model and
    of the text encoder it builds (under the recorded sizes), none left over."""
    import torch
    import comfy.model_detection
    import comfy.utils
    import comfy.text_encoders.sam3_clip as sam3_clip
    sd, metadata = comfy.utils.load_torch_file(path, return_metadata=True)
    prefix = comfy.model_detection.unet_prefix_from_state_dict(sd)
    cfg = comfy.model_detection.model_config_from_unet(sd, prefix, metadata=metadata)
    if type(cfg).__name__ != "SAM31" or prefix != "":
        raise RuntimeError(f"SAM 3.1 stand-in detected as {type(cfg).__name__} "
                           f"(prefix {prefix!r}), not SAM31")
    cfg.unet_config.update(spec["unet_config"])
    cfg.set_inference_dtype(torch.float32, None)
    with encoders._overrides(spec["init_overrides"]):
        model = cfg.get_model(sd, prefix, device=torch.device("meta"))
        clip = sam3_clip.SAM3ClipModelWrapper(device="meta")
    unet = cfg.process_unet_state_dict(dict(sd))
    text = cfg.process_clip_state_dict(sd)
    problems = []
    for what, have, want in (("model", model.diffusion_model.state_dict(), unet),
                             ("text encoder", clip.state_dict(), text)):
        missing = [k for k in have if k not in want and not k.endswith("logit_scale")]
        extra = [k for k in want if k not in have]
        shapes = [k for k in have
                  if k in want and tuple(have[k].shape) != tuple(want[k].shape)]
        if missing or extra or shapes:
            problems.append(f"{what}: missing {missing[:3]}, unexpected {extra[:3]}, "
                            f"shapes {shapes[:3]}")
    if problems:
        raise RuntimeError(f"SAM 3.1 stand-in {path} does not load: {'; '.join(problems)}")


def build(work, arch, dest):
    """Makes `dest` the stand-in of `arch` ("checkpoint:sam31")."""
    if arch not in ARCHITECTURES:
        raise builders.NoBuilder(f"no stand-in builder for {arch} "
                                 f"(tests/templates/standins_sam.py)")
    seed = builders.seed_of(os.path.basename(dest))
    # read by builders.install_unet_hook (unet_config, config) and checkpoints.install_hook
    # (init_overrides, te_model_options)
    spec = {"name": "sam31", "unet_config": UNET_CONFIG, "config": None,
            "init_overrides": INIT_OVERRIDES, "te_model_options": {}, "seed": seed}
    spec_json = json.dumps(spec, sort_keys=True)
    built = os.path.join(work, "standins", f"ckpt_sam31-{seed}.safetensors")
    if not encoders._up_to_date(built, spec_json):
        sd = {**_detector_tracker(seed), **_text_tower(seed)}
        part = built[:-len(".safetensors")] + ".part.safetensors"
        encoders._save(part, sd, "float16", encoders._spec_metadata(spec_json))
        _verify(part, spec)
        os.replace(part, built)
    builders._link(built, dest)
