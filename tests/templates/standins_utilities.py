"""Stand-ins of the utility models the official templates load beside (or instead of) a
diffusion model (issue 31 item 3), inside ComfyUI's Python: tiny random files of the
released architectures, each found by the loader that loads the real one.

- upscaler:esrgan_x4 (UpscaleModelLoader): spandrel detects ESRGAN from its keys and
  reads every width from the shapes (filters, blocks, the 4x scale from the upsampler
  layers): spandrel's own ESRGAN class, 8 filters, 1 block. No hook.
- geometry:moge2 / moge3 (LoadMoGeModel): comfy/ldm/moge/model.py reads the whole v2
  layout from the shapes (DINOv2 width and depth, neck and heads' ConvStacks, the
  scale MLP) and the heads from the width (width // 64): a 64-wide, 4-layer DINOv2, 4-8
  channel ConvStacks, saved in the Meta-style DINOv2 keys MoGe ships (fused qkv), which
  the loader remaps. MoGe-3 loads through the same v2 path (a normal head, as v2).
  ComfyUI computes MoGe in the text-encoder dtype, float16 on a CPU, where PyTorch has
  no float16 antialiased resize (MoGe's first step): on this CPU-only harness the hook
  loads a stand-in as ComfyUI's own --fp32-text-enc would (on a GPU it runs in float16).
- geometry:depth_anything_3 (LoadDA3Model, comfy.sd.load_diffusion_model): detection
  reads the DPT head's widths from the shapes but takes the DINOv2 backbone from a
  preset picked by the released widths (384-1536), so a 64-wide backbone is no preset
  and detection answers None: the stand-in names its class (`config`: DepthAnything3)
  with the unet_config ComfyUI's detection gives the same keys at the released width
  (read by running detection on them, out_layers those of a 4-layer backbone), and its
  DINOv2 size as an init override of Dinov2Model's config; builders.install_unet_hook
  applies both.
- background_removal:birefnet (LoadBackgroundRemovalModel): the loader detects BiRefNet
  by a Swin key and builds Swin-L with channel counts written in BiRefNet.__init__
  (no argument reaches them): the stand-in records a Swin of width 16 (one block per
  stage) and `install_hook()` builds BiRefNet's own parts (SwinTransformer, BasicDecBlk,
  Decoder) at that width while such a file loads; arguments its parts take at fixed
  values (ASPP branches, the image-patch convs' width) are init overrides. The loader
  resizes every image to birefnet.json's 1024 pixels: the stand-in's workload is 256,
  an init override of BackgroundRemovalModel's image_size (BiRefNet's patch split is
  relative to the input).
- frame_interpolation:film_net (FrameInterpolationModelLoader): FILM is detected by a
  key and built as FILMNet() at its defaults: the stand-in's widths are init overrides
  of FILMNet, applied by `install_hook()` while the loader loads such a file.
- optical_flow:raft_large (OpticalFlowLoader): torchvision's raft_large() at its fixed
  sizes; the stand-in's encoders, correlation, motion encoder, GRU, flow head and mask
  predictor sizes are init overrides of torchvision's RAFT parts, applied the same way
  (one correlation level, so VOID's half-size shrunk frames are large enough).
- diffusion:cogvideox_fun_inpaint and vae:cogvideox_vae (VOID's two passes and VAE):
  see below; the VAE's widths are init overrides applied by encoders.install_hooks.

Every hook acts only for a file whose metadata (encoders.TINY_KEY) says it is a stand-in;
real files load unchanged.
"""
import contextlib
import contextvars
import functools
import json
import os
import zlib

import builders
import encoders

ARCHITECTURES = {"upscaler:esrgan_x4", "geometry:moge2", "geometry:moge3",
                 "geometry:depth_anything_3", "background_removal:birefnet",
                 "frame_interpolation:film_net", "optical_flow:raft_large",
                 "diffusion:cogvideox_fun_inpaint", "vae:cogvideox_vae"}

# VOID (its two passes) is CogVideoX-Fun V1.5 inpainting (comfy_extras/nodes_void.py):
# detection reads the width, depth, the Linear patch embedding of patch_size_t 2 and
# the 48 input channels (noise, mask and masked-video latents: CogVideoX_Inpaint) and
# the T5 width from the file; the T5 stand-in's width (CLIP type cogvideox) is read
# through ComfyUI's loader. ComfyUI picks CogVideoX 1.5's latent scale by 48 heads or
# more, so the 2-head stand-in gets CogVideoX 1.0's (it only scales the latent).
builders.DIFFUSION["cogvideox_fun_inpaint"] = dict(
    family="cogvideox", depth=4, fixed={"in_channels": 48, "patch_size_t": 2},
    te=(("t5xxl",), "cogvideox"), widths={"text_embed_dim": "cond"})
# the CogVideoX VAE: sd.py reads only the latent channels and builds the released
# widths (128-512, 3 layers a block, 32 groups): those are init overrides
COGVIDEOX_VAE = {"comfy.ldm.cogvideo.vae.AutoencoderKLCogVideoX": {
    "block_out_channels": [8, 8, 16, 16], "layers_per_block": 1, "groups": 4}}

# -- sizes ----------------------------------------------------------------------------------
ESRGAN = {"num_filters": 8, "num_blocks": 1, "scale": 4}

# MoGe v2: DINOv2 of one 64-wide head (the loader takes width // 64 heads), 4 layers (its
# 4 intermediate layers are then every layer). The neck and heads run at 5 levels, the
# finest 16 times the token grid (800 pixels a side for a 512-pixel panorama view): 4
# channels there, residual blocks only at the two coarsest levels, bilinear resamplers
# (a 3x3 conv where a transposed conv would add a second)
MOGE_SIZE = {"hidden": 64, "dim_out": 8, "channels": [8, 4, 4, 4, 4],
             "res_blocks": [1, 1, 0, 0, 0]}
MOGE = {"moge2": MOGE_SIZE, "moge3": MOGE_SIZE}

# Depth Anything 3 (Mono-Large layout: DPT head with a sky head, no camera)
DA3_BACKBONE = {"hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 1}
# the head's last convs run at the full input (504 pixels a side): 8 features
DA3_HEAD = {"features": 8, "out_channels": [8, 8, 16, 16]}
DINOV2 = "comfy.image_encoders.dino2.Dinov2Model"

# BiRefNet: Swin of width 16, one block and one head per stage; its input side
BIREFNET = {"embed_dim": 16, "depths": [1, 1, 1, 1], "num_heads": [1, 1, 1, 1],
            "window_size": 12}
BIREFNET_IMAGE_SIZE = 256
# arguments BiRefNet's parts take at fixed values: its decoder blocks' ASPP at its 1x1
# branch only (the 3x3 and 7x7 deformable branches, 256 channels each) and 8 channels
# inside the image-patch convs (64; the first reads 3072 channels of 32x32 patches)
BIREFNET_OVERRIDES = {
    "comfy.bg_removal_model.BackgroundRemovalModel": {"image_size": BIREFNET_IMAGE_SIZE},
    "comfy.background_removal.birefnet.ASPPDeformable": {"parallel_block_sizes": [1]},
    "comfy.background_removal.birefnet.SimpleConvs": {"inter_channels": 8}}

FILM = {"comfy_extras.frame_interpolation_models.film_net.FILMNet": {
    "filters": 4, "flow_convs": [1, 1, 1, 1], "flow_filters": [4, 4, 8, 8]}}

_RAFT = "torchvision.models.optical_flow.raft."
RAFT = {_RAFT + "FeatureEncoder": {"layers": [8, 8, 8, 16, 32]},  # feature and context
        # one correlation level: RAFT needs feature maps of 2 * 2 ** (levels - 1) (16 for
        # RAFT-large's 4, frames of 128 pixels) and VOID runs it on half the shrunk frames
        _RAFT + "CorrBlock": {"num_levels": 1, "radius": 1},
        _RAFT + "MotionEncoder": {"corr_layers": [16, 16], "flow_layers": [8, 8],
                                  "out_channels": 16},
        # input: the motion features and the context's channels past the hidden state
        _RAFT + "RecurrentBlock": {"input_size": 16 + (32 - 16), "hidden_size": 16},
        _RAFT + "FlowHead": {"in_channels": 16, "hidden_size": 16},
        _RAFT + "MaskPredictor": {"in_channels": 16, "hidden_size": 16}}


# -- helpers --------------------------------------------------------------------------------
def _random(sd, seed):
    """Random weights (encoders._randomize) with the buffers a model computes kept
    (Swin's relative position index) and batch-norm statistics neutral."""
    import torch
    out = encoders._randomize(sd, seed)
    for k, v in sd.items():
        if not v.is_floating_point():
            out[k] = v.clone()
        elif k.endswith("running_mean"):
            out[k] = torch.zeros_like(v)
        elif k.endswith("running_var"):
            out[k] = torch.ones_like(v)
    return out


def _standin(work, arch, dest, tiny, make, dtype="float16"):
    """Builds `make()` (a state dict) into work/standins once per spec `tiny` (recorded in
    the file's metadata) and links `dest` to it."""
    spec_json = json.dumps(dict(tiny, name=arch), sort_keys=True)
    name = arch.split(":")[1]
    path = os.path.join(work, "standins", f"{name}-{zlib.crc32(spec_json.encode()):08x}"
                        ".safetensors")
    if not encoders._up_to_date(path, spec_json):
        sd = _random(make(), builders.seed_of(name))
        encoders._save(path, sd, dtype, encoders._spec_metadata(spec_json))
    builders._link(path, dest)
    return path


# -- ESRGAN -----------------------------------------------------------------------------------
def build_esrgan():
    from spandrel.architectures.ESRGAN import ESRGAN as RRDBNet
    return encoders._state_dict(RRDBNet(in_nc=3, out_nc=3, **ESRGAN))


# -- MoGe -------------------------------------------------------------------------------------
def _convstack(dim_in, dim_res, dim_out, res_blocks):
    return dict(dim_in=dim_in, dim_res_blocks=dim_res, dim_out=dim_out,
                num_res_blocks=res_blocks, resamplers=["bilinear"] * (len(dim_res) - 1),
                res_block_in_norm="layer_norm", res_block_hidden_norm="group_norm")


def _to_meta_dinov2(sd, prefix):
    """ComfyUI's DINOv2 keys back to the Meta-style ones MoGe ships (the inverse of
    comfy/ldm/moge/model.py _remap_state_dict): fused qkv, patch_embed, ls1/ls2."""
    import torch
    from comfy.ldm.moge import model as moge
    top = {v: k for k, v in moge._DINOV2_TOPLEVEL_RENAMES.items()}
    out, qkv = {}, {}
    for k, v in sd.items():
        if not k.startswith(prefix):
            out[k] = v
            continue
        rel = k[len(prefix):]
        if rel in top:
            out[prefix + top[rel]] = v
            continue
        if not rel.startswith("encoder.layer."):
            out[k] = v
            continue
        idx, sub = rel[len("encoder.layer."):].split(".", 1)
        if sub.startswith("attention.attention."):
            part, tail = sub[len("attention.attention."):].split(".")
            qkv.setdefault((idx, tail), {})[part] = v
            continue
        for old, new in moge._DINOV2_BLOCK_RENAMES:
            sub = sub.replace(new, old)
        out[f"{prefix}blocks.{idx}.{sub}"] = v
    for (idx, tail), parts in qkv.items():
        out[f"{prefix}blocks.{idx}.attn.qkv.{tail}"] = torch.cat(
            [parts["query"], parts["key"], parts["value"]], dim=0)
    return out


def build_moge(name):
    import torch
    import comfy.ops
    from comfy.ldm.moge import model as moge
    size = MOGE[name]
    hidden, dim_out, chans, blocks = (size["hidden"], size["dim_out"], size["channels"],
                                      size["res_blocks"])
    backbone = {"hidden_size": hidden, "num_attention_heads": hidden // 64,
                "num_hidden_layers": 4, "layer_norm_eps": 1e-6, "use_swiglu_ffn": False}
    levels = len(chans)

    def out_head(channels):     # reads every level of the neck, answers at the finest
        return _convstack(chans, chans, [None] * (levels - 1) + [channels], blocks)
    model = moge.MoGeModelV2(
        encoder={"backbone": backbone, "intermediate_layers": [0, 1, 2, 3], "dim_out": dim_out},
        # the token features and the view-plane UV at level 0, the UV alone below
        neck=_convstack([dim_out + 2] + [2] * (levels - 1), chans, [None] * levels, blocks),
        points_head=out_head(3), mask_head=out_head(1), normal_head=out_head(3),
        scale_head={"dims": [hidden, 16, 1]},
        dtype=torch.float32, device="cpu", operations=comfy.ops.disable_weight_init)
    sd = _to_meta_dinov2(encoders._state_dict(model), "encoder.backbone.")
    # what the loader rebuilds from these keys is this model
    if set(moge._remap_state_dict(dict(sd))) != set(encoders._state_dict(model)):
        raise RuntimeError("MoGe stand-in: the Meta-style keys do not map back to the model's")
    return sd


# -- Depth Anything 3 -------------------------------------------------------------------------
def _da3_model(unet_config):
    import torch
    import comfy.ops
    from comfy.ldm.depth_anything_3.model import DepthAnything3Net
    config = {k: v for k, v in unet_config.items() if k != "image_model"}
    with encoders._overrides({DINOV2: {"config_dict": DA3_BACKBONE}}):
        return DepthAnything3Net(**config, device="cpu", dtype=torch.float32,
                                 operations=comfy.ops.disable_weight_init)


def da3_unet_config():
    """The unet_config ComfyUI's detection gives the stand-in's keys at a released
    backbone width (vitl, 1024: only the patch embedding's rows say it), with the
    4-layer backbone's out_layers."""
    import torch
    import comfy.model_detection
    head = DA3_HEAD
    guess = {"image_model": "DepthAnything3", "backbone_name": "vitl", "alt_start": -1,
             "rope_start": -1, "qknorm_start": -1, "cat_token": False,
             "head_dim_in": DA3_BACKBONE["hidden_size"], "head_features": head["features"],
             "head_out_channels": head["out_channels"], "head_type": "dpt",
             "head_output_dim": 1, "head_use_sky_head": True, "out_layers": [0, 1, 2, 3],
             "has_cam_enc": False, "has_cam_dec": False}
    with torch.device("meta"):
        shapes = encoders._state_dict(_da3_model(guess))
    w = shapes["backbone.embeddings.patch_embeddings.projection.weight"]
    shapes["backbone.embeddings.patch_embeddings.projection.weight"] = torch.empty(
        (1024,) + tuple(w.shape[1:]), device="meta")
    detected = comfy.model_detection.detect_unet_config(shapes, "")
    if not detected or detected.get("image_model") != "DepthAnything3":
        raise RuntimeError(f"ComfyUI's detection does not take the DA3 stand-in's keys for "
                           f"Depth Anything 3 (it gave {detected})")
    return dict(detected, out_layers=list(range(DA3_BACKBONE["num_hidden_layers"])))


def build_da3(work, arch, dest):
    unet_config = da3_unet_config()
    tiny = {"unet_config": unet_config, "config": "DepthAnything3",
            "init_overrides": {DINOV2: {"config_dict": DA3_BACKBONE}}}
    return _standin(work, arch, dest, tiny, lambda: encoders._state_dict(_da3_model(unet_config)))


# -- BiRefNet ---------------------------------------------------------------------------------
_LOADING = contextvars.ContextVar("comfyui_placement_tiny_utility", default=None)


def _birefnet_init(self, size, dtype, device, operations):
    """BiRefNet.__init__ at a Swin width `size` names: the same parts, the channel counts
    it writes for Swin-L (embed 192) derived from that width instead."""
    import torch
    from comfy.background_removal import birefnet as m
    torch.nn.Module.__init__(self)
    e = size["embed_dim"]
    self.bb = m.SwinTransformer(embed_dim=e, depths=size["depths"], num_heads=size["num_heads"],
                                window_size=size["window_size"], device=device, dtype=dtype,
                                operations=operations)
    channels = [c * 2 for c in (8 * e, 4 * e, 2 * e, e)]
    self.cxt = channels[1:][::-1][-3:]
    self.squeeze_module = torch.nn.Sequential(m.BasicDecBlk(
        channels[0] + sum(self.cxt), channels[0], device=device, dtype=dtype,
        operations=operations))
    self.decoder = m.Decoder(channels, device=device, dtype=dtype, operations=operations)


def build_birefnet():
    import torch
    import comfy.ops
    from comfy.background_removal.birefnet import BiRefNet
    model = BiRefNet.__new__(BiRefNet)
    with encoders._overrides(BIREFNET_OVERRIDES):
        _birefnet_init(model, BIREFNET, torch.float32, "cpu", comfy.ops.disable_weight_init)
    return encoders._state_dict(model)


# -- FILM, RAFT -------------------------------------------------------------------------------
def build_film():
    with encoders._overrides(FILM):
        from comfy_extras.frame_interpolation_models.film_net import FILMNet
        return encoders._state_dict(FILMNet())


def build_raft():
    from torchvision.models.optical_flow import raft_large
    with encoders._overrides(RAFT):
        return encoders._state_dict(raft_large(weights=None, progress=False))


def build_cogvideox_vae():
    with encoders._overrides(COGVIDEOX_VAE):
        from comfy.ldm.cogvideo.vae import AutoencoderKLCogVideoX
        return encoders._state_dict(AutoencoderKLCogVideoX(latent_channels=16))


def build(work, arch, dest):
    """Makes `dest` the stand-in of utility architecture `arch` ("kind:name")."""
    kind, name = arch.split(":", 1)
    if arch == "diffusion:cogvideox_fun_inpaint":
        return builders.build_diffusion(work, name, dest)
    if arch == "vae:cogvideox_vae":   # the VAE hook (encoders.install_hooks) applies them
        return _standin(work, arch, dest, {"init_overrides": COGVIDEOX_VAE},
                        build_cogvideox_vae, dtype="bfloat16")
    if arch == "upscaler:esrgan_x4":
        return _standin(work, arch, dest, {"esrgan": ESRGAN}, build_esrgan)
    if kind == "geometry" and name in MOGE:
        tiny = {"moge": MOGE[name], "fp32_text_enc": True}
        return _standin(work, arch, dest, tiny, lambda: build_moge(name))
    if arch == "geometry:depth_anything_3":
        return build_da3(work, arch, dest)
    if arch == "background_removal:birefnet":
        tiny = {"birefnet": BIREFNET, "init_overrides": BIREFNET_OVERRIDES}
        return _standin(work, arch, dest, tiny, build_birefnet)
    if arch == "frame_interpolation:film_net":
        return _standin(work, arch, dest, {"init_overrides": FILM}, build_film)
    if arch == "optical_flow:raft_large":
        return _standin(work, arch, dest, {"init_overrides": RAFT}, build_raft)
    raise builders.NoBuilder(f"no stand-in builder for {arch} "
                             f"(tests/templates/standins_utilities.py)")


# -- hooks ------------------------------------------------------------------------------------
# loader node -> (its models folder, the input naming the file): loaders that read no
# metadata, so the hook reads the file's
LOADERS = {"LoadMoGeModel": ("geometry_estimation", "model_name"),
           "LoadBackgroundRemovalModel": ("background_removal", "bg_removal_name"),
           "FrameInterpolationModelLoader": ("frame_interpolation", "model_name"),
           "OpticalFlowLoader": ("optical_flow", "model_name")}


@contextlib.contextmanager
def _loading(spec):
    from comfy.cli_args import args
    token = _LOADING.set(spec)
    fp32 = args.fp32_text_enc
    try:
        if (spec or {}).get("fp32_text_enc"):
            args.fp32_text_enc = True
        with encoders._overrides((spec or {}).get("init_overrides")):
            yield
    finally:
        args.fp32_text_enc = fp32
        _LOADING.reset(token)


def install_hook():
    """The loaders in LOADERS build a stand-in with what it records (init overrides, the
    BiRefNet width), only while they load such a file."""
    import folder_paths
    import nodes
    from comfy.background_removal import birefnet
    for node, (folder, arg) in LOADERS.items():
        cls = nodes.NODE_CLASS_MAPPINGS[node]
        execute = cls.__dict__["execute"].__func__
        if getattr(execute, "_placement_tiny", False):
            continue

        @functools.wraps(execute)
        def tiny_execute(c, *args, _execute=execute, _folder=folder, _arg=arg, **kwargs):
            name = kwargs[_arg] if _arg in kwargs else args[0]
            spec = encoders.tiny_spec_of(folder_paths.get_full_path_or_raise(_folder, name))
            with _loading(spec):
                return _execute(c, *args, **kwargs)
        tiny_execute._placement_tiny = True
        cls.execute = classmethod(tiny_execute)

    init = birefnet.BiRefNet.__init__
    if not getattr(init, "_placement_tiny", False):
        @functools.wraps(init)
        def tiny_init(self, config=None, dtype=None, device=None, operations=None):
            size = (_LOADING.get() or {}).get("birefnet")
            if size is None:
                return init(self, config, dtype=dtype, device=device, operations=operations)
            _birefnet_init(self, size, dtype, device, operations)
        tiny_init._placement_tiny = True
        birefnet.BiRefNet.__init__ = tiny_init
