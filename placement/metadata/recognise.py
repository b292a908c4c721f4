"""Which components a set of tensors holds, and what architecture each one is.

Single-file checkpoints are split by ComfyUI's key prefixes; a file without them is one
component, recognised from the names at its top level (and a few tell-tale keys).
"""
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

from .tensors import TensorInfo

# Key prefix -> component, for checkpoints (and a ComfyUI BaseModel: 'diffusion_model.').
CHECKPOINT_PREFIXES = (
    ("model.diffusion_model.", "diffusion"),
    ("diffusion_model.", "diffusion"),
    ("first_stage_model.", "vae"),
    ("cond_stage_model.", "te"),
    ("conditioner.", "te"),
    ("text_encoders.", "te"),
    ("control_model.", "controlnet"),
)
_FIRST_SEGMENTS = {p.split(".", 1)[0] for p, _ in CHECKPOINT_PREFIXES}


class Part(NamedTuple):
    component: Optional[str]    # from a checkpoint prefix; None: recognise from the keys
    root: str                   # the prefix stripped from the names in `tensors`
    tensors: List[TensorInfo]


class Recognised(NamedTuple):
    family: str     # which block table applies: diffusion, te, vae, taesd_raw, clip_vision, upscaler
    component: str  # what the keys look like: diffusion, te, vae, controlnet, clip_vision, upscaler
    arch: str       # 'flux', 'sdxl_unet', 't5', 'vae', ... or 'unknown'


def split_checkpoint(tensors: Sequence[TensorInfo]) -> Tuple[List[Part], List[TensorInfo], set]:
    """(parts, leftover tensors, top-level names). A file with no checkpoint prefix is
    one Part with component None and nothing left over; the top-level names are those
    of that whole part (they are what recognise() looks at first)."""
    tops = set()
    add = tops.add
    for t in tensors:
        add(t.name.partition(".")[0])
    if not (tops & _FIRST_SEGMENTS):
        return [Part(None, "", tensors)], [], tops
    buckets: Dict[str, list] = {}
    leftover = []
    for t in tensors:
        name = t.name
        for prefix, _ in CHECKPOINT_PREFIXES:
            if name.startswith(prefix):
                buckets.setdefault(prefix, []).append(t)
                break
        else:
            leftover.append(t)
    if not buckets:
        return [Part(None, "", tensors)], [], tops
    parts = []
    for prefix, comp in CHECKPOINT_PREFIXES:
        found = buckets.get(prefix)
        if found:
            n = len(prefix)
            parts.append(Part(comp, prefix, [t._replace(name=t.name[n:]) for t in found]))
    return parts, leftover, None


def recognise(tensors: Sequence[TensorInfo], hint: Optional[str] = None,
              tops: Optional[set] = None) -> Recognised:
    """What `tensors` (names relative to the component root) are. `hint` is the
    component a checkpoint prefix or the caller named; it picks among look-alikes
    (a diffusion-shaped ControlNet) and decides when nothing else does."""
    if tops is None:
        tops = {t.name.partition(".")[0] for t in tensors}
    names = _LazyNames(tensors)

    def has_prefix(prefix):
        return any(t.name.startswith(prefix) for t in tensors)

    found = (_controlnet(tops, hint) or _diffusion(tops, names, has_prefix)
             or _vae(tops, names, has_prefix) or _clip_vision(tops, names, has_prefix, hint)
             or _text_encoder(tops, names, has_prefix) or _upscaler(tops, names, has_prefix))
    if found is None and tops and all(t.isdigit() for t in tops) and hint in (None, "vae"):
        found = Recognised("taesd_raw", "vae", "taesd")     # a bare taesd_decoder/encoder file
    if found is None:
        family = {"te": "te", "clip_vision": "clip_vision", "vae": "vae",
                  "upscaler": "upscaler", "detector": "detector"}.get(hint, "diffusion")
        found = Recognised(family, hint or "unknown", "unknown")
    return found


class _LazyNames:
    """name -> TensorInfo, built on the first lookup (most files never need it)."""

    def __init__(self, tensors):
        self._tensors = tensors
        self._map = None

    def _get(self):
        if self._map is None:
            self._map = {t.name: t for t in self._tensors}
        return self._map

    def __contains__(self, name):
        return name in self._get()

    def get(self, name, default=None):
        return self._get().get(name, default)

    def items(self):
        return self._get().items()

    def __iter__(self):
        return iter(self._get())


def _controlnet(tops, hint):
    marks = {"input_hint_block", "zero_convs", "controlnet_blocks", "controlnet_cond_embedding",
             "controlnet_down_blocks", "controlnet_x_embedder", "controlnet_mid_block",
             "controlnet_single_blocks", "middle_block_out"}
    if tops & marks:
        return Recognised("diffusion", "controlnet", "controlnet")
    return None


def _diffusion(tops, names, has_prefix):
    R = lambda arch: Recognised("diffusion", "diffusion", arch)
    if "double_blocks" in tops and "single_blocks" in tops:
        if "latent_in" in tops:                 # Hunyuan3D 2.0: shape tokens, image tokens
            return R("hunyuan3d")
        if "distilled_guidance_layer" in tops:
            return R("chroma")
        if "double_stream_modulation_img" in tops:
            return R("flux2")
        if has_prefix("txt_in.individual_token_refiner"):
            return R("hunyuan_video")
        return R("flux")
    if "double_blocks" in tops and has_prefix("txt_in.individual_token_refiner"):
        return R("hunyuan_video")               # HunyuanVideo 1.5: no single blocks
    if "joint_blocks" in tops:
        return R("sd3")
    if "t_embedder1" in tops and "x_embedder" in tops and "language_model" in tops:
        return R("hidream_o1")                  # a Qwen3-VL language model as the DiT
    if "double_stream_blocks" in tops:
        return R("hidream")
    if "double_layers" in tops:
        return R("auraflow")
    if "visual_transformer_blocks" in tops and "text_transformer_blocks" in tops:
        return R("kandinsky5")
    if "input_blocks" in tops and "output_blocks" in tops:
        if "label_emb" in tops and any(".time_stack." in n for n in names):
            return R("svd_unet")                # SVD: SDXL-like with temporal layers
        if "label_emb" in tops:
            return R("sdxl_unet")
        return R("sd2_unet" if _context_dim(names) == 1024 else "sd1_unet")
    if "down_blocks" in tops and "up_blocks" in tops and "time_embedding" in tops:
        if "add_embedding" in tops:
            return R("sdxl_unet")
        return R("sd2_unet" if _context_dim(names) == 1024 else "sd1_unet")
    if "layers" in tops and "noise_refiner" in tops:
        x = names.get("x_embedder.weight")
        return R("z_image" if x is not None and x.shape[0] == 3840 else "lumina2")
    if "blocks" in tops and "patch_embedding" in tops:
        return R("wan")
    if "transformer_blocks" in tops and "lyric_encoder" in tops:
        return R("ace_step")                    # ACE-Step: audio
    if "transformer_blocks" in tops:
        if "single_transformer_blocks" in tops:
            return R("flux")
        if "audio_patchify_proj" in tops:
            return R("ltxav")                   # LTX-2: video and audio streams
        if "patchify_proj" in tops:
            return R("ltxv")
        if "txt_norm" in tops and "img_in" in tops:
            return R("qwen_image")
        if "context_embedder" in tops and "pos_embed" in tops:
            return R("sd3")
        if {"x_embedder", "context_embedder", "time_text_embed"} <= tops:
            return R("flux")        # diffusers' Flux with no single blocks
        return R("dit")
    if "down_blocks" in tops and "up_blocks" in tops and "clip_txt_mapper" in tops:
        return R("cascade_c")                   # Stable Cascade stage C
    if "down_blocks" in tops and "up_blocks" in tops and "effnet_mapper" in tops:
        return R("cascade_b")                   # Stable Cascade stage B
    if "blocks" in tops:
        # ComfyUI's own layouts of these, told as its model detection tells them
        if "t5_y_embedder" in tops:
            return R("mochi")
        if "mlp_t5" in tops:
            return R("hunyuan_dit")
        if {"t_block", "y_embedder"} <= tops:
            return R("pixart")
        if "t_embedding_norm" in tops or "blocks.0.mlp.layer1.weight" in names:
            return R("cosmos")
        if "patch_embed" in tops and "blocks.0.norm1.linear.weight" in names:
            return R("cogvideox")
        if "t_embedder.mlp.2.weight" in names and "blocks.0.attn1.k_norm.weight" in names:
            return R("hunyuan3d21")
    if "blocks" in tops and ({"x_embedder", "t_embedder", "t_block", "patch_embed",
                              "pos_embed", "time_embed", "adaln_single"} & tops):
        return R("dit")
    return None


def _context_dim(names) -> int:
    for name, t in names.items():
        if name.endswith("attn2.to_k.weight") and len(t.shape) == 2:
            return int(t.shape[1])
    return 0


def _vae(tops, names, has_prefix):
    R = lambda arch, family="vae": Recognised(family, "vae", arch)
    if "taesd_decoder" in tops or "taesd_encoder" in tops:
        return R("taesd")
    if not ({"encoder", "decoder"} & tops):
        return None
    if has_prefix("decoder.upsamples") or has_prefix("decoder.middle.0.residual"):
        return R("wan_vae")
    if has_prefix("decoder.up_blocks.0.res_blocks"):
        return R("ltxv_vae")
    if has_prefix("decoder.conv_in.conv."):
        return R("hunyuan_vae")
    if has_prefix("decoder.layers.") or has_prefix("encoder.layers."):
        return R("taesd")       # diffusers AutoencoderTiny
    if has_prefix("decoder.up.") or has_prefix("decoder.up_blocks.") or \
            has_prefix("encoder.down.") or has_prefix("encoder.down_blocks."):
        return R("vae")
    return None


def _clip_vision(tops, names, has_prefix, hint):
    if "vision_model" in tops and "text_model" not in tops:
        if hint == "te":       # a vision tower inside a text encoder file is the TE's business
            return None
        return Recognised("clip_vision", "clip_vision", "clip_vision")
    if "visual" in tops and has_prefix("visual.transformer.resblocks") and "transformer" not in tops:
        return Recognised("clip_vision", "clip_vision", "clip_vision")
    return None


def _text_encoder(tops, names, has_prefix):
    if any(".encoder.block." in n or n.startswith("encoder.block.") or "text_model.encoder.layers." in n
           or "transformer.resblocks." in n or n.startswith("model.layers.")
           or ".model.layers." in n or "language_model.layers." in n
           or n.startswith("enc.blk.") or n.startswith("blk.") for n in names):
        return Recognised("te", "te", "te")     # the sub-encoders name the arch (describe)
    return None


def _upscaler(tops, names, has_prefix):
    R = lambda arch: Recognised("upscaler", "upscaler", arch)
    if "conv_first" in tops and ("RRDB_trunk" in tops or "body" in tops):
        return R("esrgan")
    if "conv_body" in tops and "body" in tops:
        return R("esrgan")
    if "model.1.sub.0.RDB1.conv1.0.weight" in names or has_prefix("model.1.sub.") and "model.0.weight" in names:
        return R("esrgan")
    if "conv_first" in tops and "layers" in tops and "patch_embed" in tops:
        return R("swinir")
    return None


# -- text encoder sub-models ---------------------------------------------------------
def te_sub_arch(tail: str, hidden: int, has_rel_bias_each_block: bool) -> str:
    """Arch of one encoder in a text-encoder component, from its block group's tail and
    width."""
    if tail in ("text_model.encoder.layers", "transformer.resblocks"):
        return {768: "clip_l", 1280: "clip_g", 1024: "clip_h"}.get(hidden, "clip")
    if tail in ("encoder.block", "enc.blk"):
        return "umt5" if has_rel_bias_each_block else "t5"
    if tail == "visual.blocks":
        return "vision"
    return "llm"
