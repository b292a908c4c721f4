"""Stand-ins for the official templates (issue 31 item 3), inside ComfyUI's Python: the
SDPose checkpoint and the RT-DETR v4 detector its multi-person templates crop with, the
Hunyuan3D 2 (multiview) checkpoints, and TripoSplat's diffusion model, gaussian decoder
and DINOv3 image encoder. How ComfyUI's detection finds each:

- SDPose (CheckpointLoaderSimple): Lotus-D's SD 2 UNet (supported_models.LotusD, matched
  by its released widths alone: 320 channels) with a heatmap head, found by
  heatmap_head.conv_layers.0.weight (model_detection: heatmap_head=True). The stand-in
  is two levels of 64 and 128 channels and names LotusD (`config`); its VAE is SD's.
  The head (comfy/ldm/modules/sdpose.py HeatmapHead) takes no argument from detection:
  its deconv/conv widths and input size (the crop the node resizes to, 768x1024) are
  init overrides. SDPoseKeypointExtractor captures the UNet feature that is 640 channels
  wide (`h.shape[1] == 640`, the released 2 x 320 level, at the latent's size): the
  stand-in's is 2 x 64 = 128 wide, recorded on the head (`feature_width`), and
  `install_hook()` shows that feature zero-padded to the head's 640 input channels to
  the UNet's output-block patches, only for a UNet whose head records it.
- RT-DETR v4 (UNETLoader): detection reads only the encoder width (enc_h, from
  encoder.pan_blocks.1.cv4.conv); the decoder width, feed-forward widths and queries are
  RTv4 arguments (the recorded unet_config, builders.install_unet_hook), the decoder's
  layers an init override of DFINETransformer and the HybridEncoder's input widths an
  init override; HGNetv2's stage table is a class attribute no argument reaches, so
  `install_hook()` builds a stand-in's tiny table (recorded in its init overrides as
  `stages`, set on the instance before HGNetv2.__init__ reads it).
- Hunyuan3D 2 multiview (ImageOnlyCheckpointLoader): detection reads the DiT's widths
  and blocks from latent_in / cond_in and the double/single blocks (16 heads fixed); the
  checkpoint holds its DINOv2 image encoder (conditioner.main_image_encoder.model.,
  detected as dino2_giant.json by its 40th layer: vision.py's hook builds the tiny
  config) and its ShapeVAE (found by geo_decoder.cross_attn_decoder.ln_1.bias, built as
  ShapeVAE() at the released widths: an init override makes it 32 wide, 1 layer).
- TripoSplat (UNETLoader): found by cam_out_layer and repo_layers.0.final_map, and
  nothing else is read: the stand-in records its whole unet_config (32 wide, 2 blocks;
  the latent's 8192 tokens stay, the node makes that latent). Its VAE (VAELoader, found
  by gs.base_offset_scale and octree.out_proj) is OctreeGaussianDecoder() with no
  argument: its two decoders' sizes are init overrides. DINOv3 ViT-H (CLIPVisionLoader,
  found by layer.31.norm1 and a gated MLP) is a config dict in ComfyUI, not a JSON file:
  the stand-in records that dict's name and the tiny config, `install_hook()` builds it
  (after checking detection picked DINOV3_VITH_CONFIG).

Every hook acts only for a file whose metadata (encoders.TINY_KEY) says it is a stand-in;
real files load unchanged.
"""
import functools
import json
import os
import zlib

import builders
import checkpoints
import encoders
import families
import vision

TINY_KEY = encoders.TINY_KEY
ARCHITECTURES = {"checkpoint:sdpose", "checkpoint:hunyuan3d2", "diffusion:rt_detr_v4",
                 "diffusion:triposplat", "vae:triposplat_vae", "clip_vision:dino_v3_h"}

# -- SDPose ----------------------------------------------------------------------------------
SDPOSE_CONTEXT = 1024       # LotusConditioning's inlined prompt embedding (SD 2's width)
SDPOSE_CHANNELS = 64
HEATMAP_HEAD = "comfy.ldm.modules.sdpose.HeatmapHead"
families.FAMILIES["sdpose"] = families.Family(
    "sdpose", "SDPose", "LotusD", "Lotus",
    families._unet([1, 1], [1, 1, 1, 1], [1, 1], num_classes="sequential", adm_in_channels=4,
                   in_channels=4, out_channels=4, model_channels=SDPOSE_CHANNELS,
                   channel_mult=[1, 2], transformer_depth_middle=1,
                   use_linear_in_transformer=True, context_dim=SDPOSE_CONTEXT,
                   use_temporal_resblock=False, use_temporal_attention=False,
                   heatmap_head=True),
    latent=(1, 4, 8, 8), context=(77, SDPOSE_CONTEXT), extras={},
    notes="LotusD matches model_channels 320 only: 64/128 wide, named class, a heatmap head.")
builders.DIFFUSION["sdpose"] = dict(
    family="sdpose", config="LotusD", te=((), None), widths={},
    init={HEATMAP_HEAD: {
        "deconv_out_channels": [16], "conv_out_channels": [16],
        # (width, height): the node resizes each crop to it, the head's heatmap is 1/4
        "input_size": [48, 64],
        # the feature the stand-in gives where the released UNet gives 640 channels
        "feature_width": 2 * SDPOSE_CHANNELS}})

# -- Hunyuan3D 2 -----------------------------------------------------------------------------
# DINOv2 giant's layout (detection: its 40th layer; SwiGLU, layer scale) at width 32,
# encoding 224 pixels (257 tokens) where the released one encodes 518 (1370): two views'
# tokens are the DiT's context, beside the latent's 3072
DINOV2_TINY = {"attention_probs_dropout_prob": 0.0, "drop_path_rate": 0.0, "hidden_act": "gelu",
               "hidden_dropout_prob": 0.0, "hidden_size": 32, "image_size": 224,
               "initializer_range": 0.02, "layer_norm_eps": 1e-06, "layerscale_value": 1.0,
               "mlp_ratio": 4, "model_type": "dinov2", "num_attention_heads": 2,
               "num_channels": 3, "num_hidden_layers": 40, "patch_size": 14, "qkv_bias": True,
               "use_swiglu_ffn": True, "image_mean": [0.485, 0.456, 0.406],
               "image_std": [0.229, 0.224, 0.225]}
vision.CONFIGS["dinov2_giant"] = ("dino2_giant.json", DINOV2_TINY)
builders.DIFFUSION["hunyuan3d2"] = dict(
    family="hunyuan3d2", depth=2, fixed={"context_in_dim": DINOV2_TINY["hidden_size"]},
    te=((), None), widths={})
# the turbo (guidance-distilled) DiT has a guidance embedding (guidance_in: detection's
# guidance_embed), which its template's FluxGuidance feeds
builders.DIFFUSION["hunyuan3d2_turbo"] = dict(
    builders.DIFFUSION["hunyuan3d2"],
    fixed=dict(builders.DIFFUSION["hunyuan3d2"]["fixed"], guidance_embed=True))
SHAPE_VAE = "comfy.ldm.hunyuan3d.vae.ShapeVAE"
encoders.VAES["hunyuan3d2_vae"] = dict(
    file="enc_vae_hunyuan3d2.safetensors", arch="hunyuan3d2", dtype="float16",
    init_overrides={SHAPE_VAE: {"width": 32, "heads": 2, "num_decoder_layers": 1,
                                "num_encoder_layers": 1}})

CHECKPOINTS = {
    "sdpose": dict(diffusion="sdpose", te=None, vae="sd_vae"),
    "hunyuan3d2": dict(diffusion="hunyuan3d2", te=None, vae="hunyuan3d2_vae",
                       clip_vision="dinov2_giant"),
    "hunyuan3d2_turbo": dict(diffusion="hunyuan3d2_turbo", te=None, vae="hunyuan3d2_vae",
                             clip_vision="dinov2_giant"),
}

# -- RT-DETR v4 ------------------------------------------------------------------------------
RTDETR = "comfy.ldm.rt_detr.rtdetr_v4."
# HGNetv2's stage table ([ic, mc, oc, blocks, downsample, light, kernel, layers]): the
# stem's 64 channels in, one block of one layer a stage
HGNET_STAGES = [[64, 8, 16, 1, False, False, 3, 1], [16, 8, 32, 1, True, False, 3, 1],
                [32, 8, 32, 1, True, True, 5, 1], [32, 8, 32, 1, True, True, 5, 1]]
RTDETR_UNET = {"image_model": "RT_DETR_v4", "enc_h": 32, "dec_h": 32, "enc_ff": 64,
               "dec_ff": 64}
RTDETR_INIT = {RTDETR + "HGNetv2": {"stages": HGNET_STAGES},
               RTDETR + "HybridEncoder": {"in_channels": [c[2] for c in HGNET_STAGES[1:]]},
               RTDETR + "DFINETransformer": {"num_layers": 1}}

# -- TripoSplat ------------------------------------------------------------------------------
# DINOv3 ViT-H/16+'s layout (detection: its 32nd layer, the gated MLP) at width 32
DINOV3_TINY = {"model_type": "dinov3", "num_hidden_layers": 32, "hidden_size": 32,
               "num_attention_heads": 2, "num_register_tokens": 4, "intermediate_size": 64,
               "layer_norm_eps": 1e-5, "num_channels": 3, "patch_size": 16,
               "rope_theta": 100.0, "use_gated_mlp": True, "gated_mlp_act": "silu",
               "image_size": 1024, "image_mean": [0.485, 0.456, 0.406],
               "image_std": [0.229, 0.224, 0.225]}
# the flow model: its 8192 latent tokens (the node's fixed latent) and the context
# widths (DINOv3's tokens, the Flux 2 VAE latent's 128 channels) as released
TRIPOSPLAT_UNET = {"image_model": "triposplat", "model_channels": 32, "num_blocks": 2,
                   "num_refiner_blocks": 1, "num_head_channels": 16,
                   "cond_channels": DINOV3_TINY["hidden_size"]}
_TRIPO = "comfy.ldm.triposplat.vae."
encoders.VAES["triposplat_vae"] = dict(
    file="enc_vae_triposplat.safetensors", arch="triposplat", dtype="float16",
    init_overrides={_TRIPO + "OctreeProbabilityFixedlenDecoder": {
                        "model_channels": 32, "num_blocks": 1, "num_heads": 2},
                    _TRIPO + "ElasticGaussianFixedlenDecoder": {
                        "model_channels": 32, "num_blocks": 1, "num_heads": 2}})


def _vae_file(work, name, make):
    """A VAE stand-in at encoders.vae_file_path with the metadata encoders.build_vae_file
    writes (so it finds the file up to date); `make()` gives its state dict."""
    spec = encoders.VAES[name]
    path = encoders.vae_file_path(work, name)
    tiny = json.dumps({"name": name, "init_overrides": spec["init_overrides"]}, sort_keys=True)
    if encoders._up_to_date(path, tiny):
        return path
    with encoders._overrides(spec["init_overrides"]):
        module = make()
    encoders._save(path, _random(module, builders.seed_of(name)), spec["dtype"],
                   encoders._spec_metadata(tiny))
    return path


def _random(module, seed):
    """The module's state dict with its trained parameters random (encoders._randomize);
    what its constructor computes (buffers such as RT-DETR's anchors and the gaussian
    decoder's perturbation, fixed parameters such as RT-DETR's reg_scale) kept, and
    batch-norm statistics neutral."""
    import torch
    sd = encoders._state_dict(module)
    trained = {n for n, p in module.named_parameters() if p.requires_grad}
    out = dict(sd)
    out.update(encoders._randomize({k: sd[k] for k in trained}, seed))
    for k, v in sd.items():
        if k.endswith("running_mean"):
            out[k] = torch.zeros_like(v)
        elif k.endswith("running_var"):
            out[k] = torch.ones_like(v)
    return {k: v.detach().clone().contiguous() for k, v in out.items()}


def _shape_vae():
    from comfy.ldm.hunyuan3d.vae import ShapeVAE
    return ShapeVAE()


def _triposplat_vae():
    from comfy.ldm.triposplat.vae import OctreeGaussianDecoder
    return OctreeGaussianDecoder()


def _diffusion_file(work, arch, dest, unet_config, init=None):
    """A diffusion stand-in detection finds the class of: its model built at
    `unet_config` (recorded whole: builders.install_unet_hook puts it over what detection
    reads) with the constructor overrides `init` (recorded too)."""
    import torch
    import safetensors.torch
    seed = builders.seed_of(os.path.basename(dest))
    tiny = json.dumps({"unet_config": unet_config, "name": arch, "init_overrides": init or {},
                       "config": None}, sort_keys=True)
    built = os.path.join(work, "standins", f"{arch}-{seed}-{zlib.crc32(tiny.encode()):08x}"
                         ".safetensors")
    if not os.path.exists(built):
        os.makedirs(os.path.dirname(built), exist_ok=True)
        with encoders._overrides(init):
            cfg = families.model_config_for(unet_config)
            model = cfg.get_model({}, "", device=torch.device("cpu"))
        sd = _random(model.diffusion_model, seed)
        del model
        safetensors.torch.save_file(sd, built + ".part", metadata={TINY_KEY: tiny})
        os.replace(built + ".part", built)
    builders._link(built, dest)


def _dinov3_file(work):
    """The DINOv3 stand-in: the tiny config's image encoder, recorded with the config
    ComfyUI's detection picks (named by its variable in comfy.image_encoders.dino3)."""
    import comfy.clip_vision
    spec_json = json.dumps({"name": "dino_v3_h",
                            "clip_vision_dict": ["DINOV3_VITH_CONFIG", DINOV3_TINY]},
                           sort_keys=True)
    path = os.path.join(work, "standins", "clip_vision_dino_v3_h.safetensors")
    if encoders._up_to_date(path, spec_json):
        return path
    model = comfy.clip_vision.ClipVisionModel(dict(DINOV3_TINY))
    sd = _random(model.model, builders.seed_of("dino_v3_h"))
    del model
    encoders._save(path, sd, "float16", encoders._spec_metadata(spec_json))
    return path


# -- hooks -------------------------------------------------------------------------------------
def install_hook():
    """SDPose's captured feature (see above), only for a UNet whose heatmap head records
    the stand-in's feature width."""
    import torch
    from comfy.ldm.modules.diffusionmodules import openaimodel
    forward = openaimodel.UNetModel._forward
    if getattr(forward, "_placement_tiny", False):
        return

    def widened(patch, width, released):
        def call(h, hsp, transformer_options):
            if h.shape[1] != width:
                return patch(h, hsp, transformer_options)
            # the patch sees the feature as wide as the released one; the UNet goes on
            # with its own
            wide = torch.nn.functional.pad(h, (0, 0, 0, 0, 0, released - width))
            _, hsp = patch(wide, hsp, transformer_options)
            return h, hsp
        return call

    @functools.wraps(forward)
    def tiny_forward(self, x, timesteps=None, context=None, y=None, control=None,
                     transformer_options={}, **kwargs):
        head = getattr(self, "heatmap_head", None)
        width = getattr(head, "feature_width", None)
        patches = transformer_options.get("patches", {})
        original = patches.get("output_block_patch")
        if width is None or not original:
            return forward(self, x, timesteps, context, y, control, transformer_options, **kwargs)
        released = head.deconv_layers[0].in_channels
        patches["output_block_patch"] = [widened(p, width, released) for p in original]
        try:
            return forward(self, x, timesteps, context, y, control, transformer_options, **kwargs)
        finally:
            patches["output_block_patch"] = original
    tiny_forward._placement_tiny = True
    openaimodel.UNetModel._forward = tiny_forward

    # HGNetv2 reads its stage table from the class: a stand-in's (its init overrides'
    # `stages`) is set on the instance before __init__ reads it. Marked as wrapped, so
    # encoders' init-override wrapper leaves this class to this one.
    from comfy.ldm.rt_detr import rtdetr_v4
    hg_init = rtdetr_v4.HGNetv2.__init__

    @functools.wraps(hg_init)
    def tiny_hg_init(self, *args, **kwargs):
        over = (encoders._ACTIVE.get() or {}).get(RTDETR + "HGNetv2") or {}
        if "stages" in over:
            object.__setattr__(self, "_STAGE_CFGS", [list(s) for s in over["stages"]])
        hg_init(self, *args, **kwargs)
    tiny_hg_init._placement_tiny = True
    rtdetr_v4.HGNetv2.__init__ = tiny_hg_init

    # DINOv3's config is a dict in ComfyUI (no JSON file for vision.py's check): a
    # stand-in names it, and its tiny config is built instead
    import comfy.clip_vision
    import comfy.image_encoders.dino3 as dino3
    cv_init = comfy.clip_vision.ClipVisionModel.__init__

    @functools.wraps(cv_init)
    def tiny_cv_init(self, json_config):
        spec = vision._LOADING.get()
        if spec and "clip_vision_dict" in spec:
            name, config = spec["clip_vision_dict"]
            if json_config is not getattr(dino3, name):
                raise RuntimeError(f"ComfyUI's detection picked {json_config!r} for a "
                                   f"{spec.get('name')} stand-in, not dino3.{name}")
            json_config = dict(config)
        cv_init(self, json_config)
    tiny_cv_init._placement_tiny = True
    comfy.clip_vision.ClipVisionModel.__init__ = tiny_cv_init


def build(work, arch, dest):
    """Makes `dest` the stand-in of `arch` ("kind:name")."""
    kind, name = arch.split(":", 1)
    install_hook()              # HGNetv2's stage table is read while building
    if kind == "checkpoint":
        if name == "hunyuan3d2":
            _vae_file(work, "hunyuan3d2_vae", _shape_vae)
            if "turbo" in os.path.basename(dest):
                name = "hunyuan3d2_turbo"
        return checkpoints.build(work, name, dest, spec=CHECKPOINTS[name])
    if arch == "diffusion:rt_detr_v4":
        return _diffusion_file(work, name, dest, RTDETR_UNET, RTDETR_INIT)
    if arch == "diffusion:triposplat":
        return _diffusion_file(work, name, dest, TRIPOSPLAT_UNET)
    if arch == "vae:triposplat_vae":
        return builders._link(_vae_file(work, name, _triposplat_vae), dest)
    if arch == "clip_vision:dino_v3_h":
        return builders._link(_dinov3_file(work), dest)
    raise builders.NoBuilder(f"no stand-in builder for {arch} "
                             f"(tests/templates/standins_pose3d.py)")
