"""Recognition, block structure and headroom from files with ComfyUI's key layouts."""
import pytest

from comfyui_placement.placement.errors import PlacementError
from comfyui_placement.placement.metadata import ComponentInfo, describe, describe_component
from comfyui_placement.placement.metadata import headroom as hr
from comfyui_placement.placement.units import GiB, MiB

from helpers import tiny_files as tf


@pytest.fixture
def write(tmp_path):
    def _write(name, layout, **meta):
        return tf.write_header_file(tmp_path / name, layout, **meta)
    return _write


def names(info):
    return [b.name for b in info.blocks]


# -- diffusion models -----------------------------------------------------------------
def test_flux_dev_real_size(write):
    layout = tf.flux()                                  # Flux.1-dev shapes, bf16, sparse file
    info, = describe(write("flux1-dev.safetensors", layout))
    assert (info.component, info.arch, info.dtype) == ("diffusion", "flux", "bf16")
    assert info.total_bytes == tf.total(layout)
    assert 23.7e9 < info.total_bytes < 23.9e9            # the published file is 23.8 GB
    assert names(info) == [f"double_blocks.{i}" for i in range(19)] + \
        [f"single_blocks.{i}" for i in range(38)]
    block_sum = lambda p: sum(tf.nbytes(*v) for k, v in layout.items() if k.startswith(p))
    assert info.blocks[0].nbytes == block_sum("double_blocks.0.")
    assert info.blocks[-1].nbytes == block_sum("single_blocks.37.")
    assert info.non_block_bytes == tf.total(layout) - block_sum("double_blocks.") - block_sum("single_blocks.")
    assert info.irregular_groups == () and info.warnings == ()
    assert info.blocks[0].group == "double_blocks" and info.blocks[20].index == 1


def test_block_order_is_numeric_not_lexical(write):
    info, = describe(write("f.safetensors", tf.flux(hidden=32, double=12, single=3)))
    assert names(info)[:12] == [f"double_blocks.{i}" for i in range(12)]


@pytest.mark.parametrize("layout,arch,groups", [
    (tf.flux(hidden=32, double=2, single=2, chroma=True), "chroma", ["double_blocks", "single_blocks"]),
    (tf.sd3(), "sd3", ["joint_blocks"]),
    (tf.wan(), "wan", ["blocks"]),
    (tf.unet(), "sd1_unet", ["input_blocks", "middle_block", "output_blocks"]),
    (tf.unet(ctx=1024), "sd2_unet", ["input_blocks", "middle_block", "output_blocks"]),
    (tf.unet(sdxl=True, ctx=2048), "sdxl_unet", ["input_blocks", "middle_block", "output_blocks"]),
])
def test_diffusion_families(write, layout, arch, groups):
    info, = describe(write("d.safetensors", layout))
    assert info.component == "diffusion" and info.arch == arch
    assert list(dict.fromkeys(b.group for b in info.blocks)) == groups


def test_unet_stage_order(write):
    info, = describe(write("u.safetensors", tf.unet()))
    assert names(info) == ["input_blocks.0", "input_blocks.1", "input_blocks.2", "input_blocks.3",
                           "middle_block", "output_blocks.0", "output_blocks.1",
                           "output_blocks.2", "output_blocks.3"]


def test_irregular_group_is_reported(write):
    info, = describe(write("sd3.safetensors", tf.sd3(depth=4)))
    assert len(info.irregular_groups) == 1
    assert "joint_blocks: 1 of 4" in info.irregular_groups[0] and "joint_blocks.3" in info.irregular_groups[0]


# -- checkpoints ----------------------------------------------------------------------
def _sd_checkpoint():
    return {**tf.prefixed("model.diffusion_model.", tf.unet()),
            **tf.prefixed("first_stage_model.", tf.vae()),
            **tf.prefixed("cond_stage_model.transformer.", tf.clip_text(depth=2)),
            "alphas_cumprod": ("F32", (1000,)),
            "model_ema.decay": ("F32", (600_000,))}


def test_single_file_checkpoint_splits_into_components(write):
    layout = _sd_checkpoint()
    infos = describe(write("sd15.safetensors", layout))
    by = {i.component: i for i in infos}
    assert set(by) == {"diffusion", "vae", "te"}
    assert by["diffusion"].arch == "sd1_unet" and by["diffusion"].root == "model.diffusion_model."
    assert by["vae"].arch == "vae" and by["te"].arch == "clip_l"
    assert by["diffusion"].total_bytes == tf.total(tf.unet())
    assert by["vae"].total_bytes == tf.total(tf.vae())
    assert names(by["te"]) == ["transformer.text_model.encoder.layers.0",
                               "transformer.text_model.encoder.layers.1"]
    assert by["te"].blocks[0].root == "cond_stage_model."
    assert sum(i.total_bytes for i in infos) == tf.total(layout) - 4000 - 2_400_000
    assert any("model_ema.decay" in w or "alphas_cumprod" in w for w in infos[0].warnings)


def test_checkpoint_part_by_name(write):
    path = write("sd15.safetensors", _sd_checkpoint())
    vae, = describe(path, "vae")
    assert vae.component == "vae" and vae.total_bytes == tf.total(tf.vae())
    assert describe_component("te", [path]).arch == "clip_l"
    with pytest.raises(PlacementError, match="holds diffusion, vae, te; it has no controlnet"):
        describe(path, "controlnet")


def test_sdxl_checkpoint_has_two_text_encoders(write):
    layout = {**tf.prefixed("model.diffusion_model.", tf.unet(sdxl=True, ctx=2048)),
              **tf.prefixed("conditioner.embedders.0.transformer.", tf.clip_text(depth=2)),
              **tf.prefixed("conditioner.embedders.1.", tf.open_clip(depth=3)),
              **tf.prefixed("first_stage_model.", tf.vae())}
    te = {i.component: i for i in describe(write("sdxl.safetensors", layout))}["te"]
    assert te.arch == "clip_l+clip_g"
    assert len(te.blocks) == 5 and te.blocks[2].group == "embedders.1.model.transformer.resblocks"


def test_sd3_style_text_encoders_prefix(write):
    layout = {**tf.prefixed("text_encoders.clip_l.transformer.", tf.clip_text(depth=1)),
              **tf.prefixed("text_encoders.t5xxl.transformer.", tf.t5(depth=2)),
              **tf.prefixed("model.diffusion_model.", tf.sd3())}
    te, = describe(write("sd3.safetensors", layout), "te")
    assert te.arch == "clip_l+t5" and te.root == "text_encoders."
    assert names(te) == ["clip_l.transformer.text_model.encoder.layers.0",
                         "t5xxl.transformer.encoder.block.0", "t5xxl.transformer.encoder.block.1"]


# -- other components -----------------------------------------------------------------
@pytest.mark.parametrize("layout,component,arch,first,last", [
    (tf.t5(), "te", "t5", "encoder.block.0", "encoder.block.2"),
    (tf.t5(umt5=True), "te", "umt5", "encoder.block.0", "encoder.block.2"),
    (tf.clip_text(depth=2), "te", "clip_l", "text_model.encoder.layers.0", "text_model.encoder.layers.1"),
    (tf.llm(), "te", "llm", "model.layers.0", "model.layers.2"),
    (tf.vae(), "vae", "vae", "encoder.down.0", "decoder.up.0"),
    (tf.taesd(), "vae", "taesd", "encoder.layers.0", "decoder.layers.3"),
    (tf.clip_vision(), "clip_vision", "clip_vision", "vision_model.encoder.layers.0",
     "vision_model.encoder.layers.1"),
    (tf.controlnet(), "controlnet", "controlnet", "input_blocks.0", "middle_block"),
    (tf.esrgan(), "upscaler", "esrgan", "RRDB_trunk.0", "RRDB_trunk.2"),
])
def test_component_files(write, layout, component, arch, first, last):
    info, = describe(write("c.safetensors", layout))
    assert (info.component, info.arch) == (component, arch)
    assert names(info)[0] == first and names(info)[-1] == last
    assert info.total_bytes == tf.total(layout)


def test_vae_decoder_runs_up_stages_backwards(write):
    info, = describe(write("vae.safetensors", tf.vae(levels=4)))
    assert names(info) == ["encoder.down.0", "encoder.down.1", "encoder.down.2", "encoder.down.3",
                           "encoder.mid", "decoder.mid", "decoder.up.3", "decoder.up.2",
                           "decoder.up.1", "decoder.up.0"]


def test_t5_first_block_is_the_odd_one(write):
    info, = describe(write("t5.safetensors", tf.t5(depth=4)))
    assert info.irregular_groups == ("encoder.block: 1 of 4 blocks differ from the rest (encoder.block.0)",)


def test_bare_taesd_decoder(write):
    layout = {f"{i}.conv.{j}.weight": ("F16", (8, 8, 3, 3)) for i in (1, 3, 5) for j in (0, 2)}
    info, = describe(write("taesd_decoder.safetensors", layout), "vae")
    assert info.arch == "taesd" and names(info) == ["1", "3", "5"]


# -- expected component, contradictions, unknowns --------------------------------------
def test_given_component_wins_with_a_warning(write):
    path = write("odd.safetensors", tf.flux(hidden=32, double=1, single=1))
    info, = describe(path, "te")
    assert info.component == "te" and info.arch == "flux"
    assert any("looks like a diffusion (flux); described as te as given" in w for w in info.warnings)


def test_given_component_resolves_ambiguity_silently(write):
    layout = tf.clip_vision()
    info, = describe(write("v.safetensors", layout), "clip_vision")
    assert info.warnings == ()
    # an unrecognisable file is whatever the caller says it is
    info, = describe(write("x.safetensors", {"weird.weight": ("F16", (4, 4))}), "photomaker")
    assert info.component == "photomaker"


def test_unknown_architecture_is_one_block(write):
    layout = {"foo.weight": ("F16", (64, 64)), "bar.0.w": ("F16", (64, 64)), "bar.1.w": ("F16", (64, 64))}
    info, = describe(write("mystery.safetensors", layout), "diffusion")
    assert info.arch == "unknown"
    assert len(info.blocks) == 1 and info.blocks[0].nbytes == info.total_bytes == tf.total(layout)
    assert any("architecture not recognised" in w for w in info.warnings)
    assert info.headroom_bytes == 2 * GiB and "fixed reserve" in info.headroom_basis


def test_unknown_without_a_name_is_an_error(write):
    with pytest.raises(PlacementError, match="cannot tell which component"):
        describe(write("mystery.safetensors", {"foo.weight": ("F16", (4, 4))}))


def test_known_groups_in_an_unknown_model_still_give_blocks(write):
    layout = {"blocks.0.w": ("F16", (8, 8)), "blocks.1.w": ("F16", (8, 8)), "head.w": ("F16", (8,))}
    info, = describe(write("m.safetensors", layout), "diffusion")
    assert names(info) == ["blocks.0", "blocks.1"]
    assert any("blocks taken from the known group names" in w for w in info.warnings)


def test_component_info_is_returned_as_is():
    ci = ComponentInfo("vae", 123)
    assert describe(ci) == [ci] and describe_component("vae", ci) is ci


def test_component_info_for_another_component_is_refused():
    with pytest.raises(PlacementError, match="given as te"):
        describe_component("te", [ComponentInfo("vae", 1)])


# -- merging several files into one component -------------------------------------------
def test_flux_text_encoders_merge(write):
    clip = write("clip_l.safetensors", tf.clip_text(depth=12))
    t5 = write("t5xxl.safetensors", tf.t5(hidden=4096, ffn=10240, depth=24, vocab=32128))
    a, b = describe(clip)[0], describe(t5)[0]
    te = describe_component("te", [clip, t5])
    assert te.arch == "clip_l+t5"
    assert te.total_bytes == a.total_bytes + b.total_bytes
    assert te.blocks == a.blocks + b.blocks and len(te.blocks) == 36
    assert te.sources == (clip, t5) and te.blocks[12].source == t5
    assert te.headroom_bytes == max(a.headroom_bytes, b.headroom_bytes) == b.headroom_bytes
    assert 9.0e9 < b.total_bytes < 9.6e9                 # T5-XXL encoder in bf16


def test_describe_component_needs_a_source():
    with pytest.raises(PlacementError, match="no source given"):
        describe_component("te", [])


# -- headroom --------------------------------------------------------------------------
def test_dit_headroom_formula(write):
    info, = describe(write("flux.safetensors", tf.flux(hidden=3072, double=1, single=1)))
    tokens = (1024 // 16) * (1024 // 16) + 512
    c = hr.DIT["flux"].c
    assert info.headroom_bytes == hr.WORKSPACE + c * tokens * 3072 * 2
    bigger, = describe(write("flux.safetensors", tf.flux(hidden=3072, double=1, single=1)),
                       resolution=(2048, 1024), batch=2)
    assert bigger.headroom_bytes == hr.WORKSPACE + c * (2 * (128 * 64 + 512)) * 3072 * 2


def test_video_headroom_grows_with_frames(write):
    path = write("wan.safetensors", tf.wan(hidden=512))
    one, = describe(path, resolution=(832, 480), frames=1)
    many, = describe(path, resolution=(832, 480), frames=81)
    lat = 1 + 80 // 4
    tokens = ((832 // 16) * (480 // 16) * lat + 512) * 2
    assert many.headroom_bytes == hr.WORKSPACE + hr.DIT["wan"].c * tokens * 512 * 2
    assert many.headroom_bytes > 10 * (one.headroom_bytes - hr.WORKSPACE)


def test_unet_vae_te_headroom(write):
    unet, = describe(write("u.safetensors", tf.unet(ch=320)), resolution=(512, 512))
    assert unet.headroom_bytes == hr.WORKSPACE + 36 * (64 * 64 * 2) * 320 * 2
    vae, = describe(write("v.safetensors", tf.vae(ch=128)), resolution=(1024, 1024))
    assert vae.headroom_bytes == hr.WORKSPACE + 17 * 128 * 1024 * 1024 * 2
    te, = describe(write("t.safetensors", tf.t5(hidden=256, ffn=512)))
    assert te.headroom_bytes == hr.WORKSPACE + 512 * (8 * 256 + 4 * 512) * 2 + 4 * 512 * 512 * 8


def test_headroom_override(write):
    path = write("flux.safetensors", tf.flux(hidden=64, double=1, single=1))
    assert describe(path, headroom=3 * GiB)[0].headroom_bytes == 3 * GiB
    assert describe(path, headroom="512MiB")[0].headroom_bytes == 512 * MiB
    assert describe(path, headroom={"model": "1GiB"})[0].headroom_bytes == GiB   # alias of diffusion
    estimate = describe(path)[0].headroom_bytes
    assert describe(path, headroom={"vae": 1})[0].headroom_bytes == estimate     # other component
    assert describe(path, headroom=0)[0].headroom_bytes == 0
    for bad in (-1, "lots", True, [1]):
        with pytest.raises(PlacementError, match="headroom"):
            describe(path, headroom=bad)


@pytest.mark.parametrize("kw", [dict(resolution=(0, 512)), dict(resolution="big"), dict(frames=0),
                                dict(batch=-1), dict(resolution=(512,))])
def test_bad_latent_shape(write, kw):
    path = write("flux.safetensors", tf.flux(hidden=64, double=1, single=1))
    with pytest.raises(PlacementError, match="invalid"):
        describe(path, **kw)


def test_fallbacks_are_seed_003_reserves():
    assert hr.fallback("diffusion")[0] == 2 * GiB
    assert hr.fallback("te")[0] == 2 * GiB
    assert hr.fallback("vae")[0] == 1 * GiB


@pytest.mark.parametrize("groups,extra,arch,order", [
    ({"single_stream_blocks": 2, "double_stream_blocks": 2}, ("x_embedder", "caption_projection"),
     "hidream", ["double_stream_blocks.0", "double_stream_blocks.1", "single_stream_blocks.0",
                 "single_stream_blocks.1"]),
    ({"layers": 2, "noise_refiner": 1, "context_refiner": 1}, ("x_embedder", "cap_embedder"),
     "lumina2", ["noise_refiner.0", "context_refiner.0", "layers.0", "layers.1"]),
    ({"transformer_blocks": 2}, ("img_in", "txt_norm", "txt_in"), "qwen_image",
     ["transformer_blocks.0", "transformer_blocks.1"]),
    ({"transformer_blocks": 2}, ("patchify_proj", "adaln_single"), "ltxv",
     ["transformer_blocks.0", "transformer_blocks.1"]),
    ({"single_layers": 1, "double_layers": 2}, ("init_x_linear",), "auraflow",
     ["double_layers.0", "double_layers.1", "single_layers.0"]),
    ({"blocks": 2, "vace_blocks": 1}, ("patch_embedding", "text_embedding"), "wan",
     ["vace_blocks.0", "blocks.0", "blocks.1"]),
    ({"transformer_blocks": 2, "single_transformer_blocks": 1}, ("x_embedder", "context_embedder"),
     "flux", ["transformer_blocks.0", "transformer_blocks.1", "single_transformer_blocks.0"]),
    ({"blocks": 2}, ("x_embedder", "t_embedder"), "dit", ["blocks.0", "blocks.1"]),
    # HiDream-O1: a language model's layers are its DiT blocks (not a text encoder)
    ({"language_model.layers": 2}, ("t_embedder1.mlp.0", "x_embedder.proj1"), "hidream_o1",
     ["language_model.layers.0", "language_model.layers.1"]),
])
def test_more_diffusion_layouts(write, groups, extra, arch, order):
    info, = describe(write("d.safetensors", tf.repeated(groups, extra)))
    assert info.component == "diffusion" and info.arch == arch
    assert names(info) == order


@pytest.mark.parametrize("layout,arch", [
    ({"decoder.middle.0.residual.0.gamma": ("F16", (8,)), "decoder.upsamples.0.residual.0.weight":
      ("F16", (8, 8, 3, 3, 3)), "decoder.upsamples.1.residual.0.weight": ("F16", (8, 8, 3, 3, 3)),
      "encoder.downsamples.0.residual.0.weight": ("F16", (8, 8, 3, 3, 3))}, "wan_vae"),
    ({"decoder.up_blocks.0.res_blocks.0.conv1.conv.weight": ("F16", (8, 8, 3, 3, 3)),
      "decoder.mid_block.res_blocks.0.conv1.conv.weight": ("F16", (8, 8, 3, 3, 3))}, "ltxv_vae"),
    ({"taesd_decoder.1.weight": ("F16", (8, 4, 3, 3)), "taesd_encoder.0.weight": ("F16", (8, 3, 3, 3))},
     "taesd"),
])
def test_more_vae_layouts(write, layout, arch):
    info, = describe(write("v.safetensors", layout))
    assert info.component == "vae" and info.arch == arch and info.blocks
    assert info.headroom_basis != "" and "fixed reserve" not in info.headroom_basis


def test_wan_vae_decoder_order(write):
    layout = {f"decoder.upsamples.{i}.w": ("F16", (4, 4)) for i in range(3)}
    layout.update({"decoder.middle.0.residual.0.gamma": ("F16", (4,)), "encoder.downsamples.0.w": ("F16", (4,))})
    info, = describe(write("wanvae.safetensors", layout))
    assert names(info) == ["encoder.downsamples.0", "decoder.middle", "decoder.upsamples.0",
                           "decoder.upsamples.1", "decoder.upsamples.2"]


def test_comfy_text_encoder_modules_layout(write):
    # ComfyUI's Flux CLIP object names its encoders clip_l / t5xxl
    layout = {**tf.prefixed("t5xxl.transformer.", tf.t5(depth=2)),
              **tf.prefixed("clip_l.transformer.", tf.clip_text(depth=1))}
    info, = describe(write("te.safetensors", layout))
    assert info.component == "te" and info.arch == "clip_l+t5"
    assert names(info) == ["clip_l.transformer.text_model.encoder.layers.0",
                           "t5xxl.transformer.encoder.block.0", "t5xxl.transformer.encoder.block.1"]


def test_sharded_checkpoint_is_read_as_one(write):
    layout = tf.flux(hidden=32, double=2, single=2)
    keys = list(layout)
    # cut inside double_blocks.1: its tensors land in two shards
    cut = keys.index("double_blocks.1.txt_attn.qkv.weight")
    a = write("model-00001-of-00002.safetensors", {k: layout[k] for k in keys[:cut]})
    b = write("model-00002-of-00002.safetensors", {k: layout[k] for k in keys[cut:]})
    whole, = describe(write("whole.safetensors", layout))
    info = describe_component("diffusion", [b, a])
    assert info.sources == (a, b)
    assert [(x.name, x.nbytes) for x in info.blocks] == [(x.name, x.nbytes) for x in whole.blocks]
    assert info.total_bytes == whole.total_bytes and info.arch == "flux"


def test_a_text_encoder_computed_in_another_dtype_holds_a_cast_copy_of_its_largest_weight(
        write):
    """ComfyUI's manual cast copies each layer's weight into the compute dtype while the
    layer computes; a token embedding is gathered without one (a generating text
    encoder's logits add it at node time: nodes/planning.with_generation)."""
    layers = tf.repeated({"model.layers": 2}, hidden=32)     # largest: 128 x 32 (the MLP)
    embedding = {"model.embed_tokens.weight": ("BF16", (4096, 32))}
    path = write("te.safetensors", dict(layers, **embedding))
    as_stored = describe_component("te", [path])
    per_token_f32 = 2 * (as_stored.headroom_bytes - hr.WORKSPACE)
    cast = describe_component("te", [path], compute_dtype="f32")
    assert cast.total_bytes == as_stored.total_bytes
    assert cast.headroom_bytes - hr.WORKSPACE == per_token_f32 + 128 * 32 * 4
    assert "copy of its largest cast weight" in cast.headroom_basis
    diffusion = describe_component("diffusion", [write("d.safetensors", tf.repeated(
        {"double_blocks": 2, "single_blocks": 1}))], compute_dtype="f32")
    assert "cast weight" not in diffusion.headroom_basis     # rehearsed, not estimated


def test_a_diffusion_model_with_no_root_group_finds_its_nested_blocks(write):
    """SAM 3.1: a detector and a tracker, each with its blocks under its own prefix; no
    known group at the root. Found under any prefix, it streams block by block instead
    of as one block that must fit whole."""
    layout = dict(tf.repeated({"detector.backbone.trunk.blocks": 3}),
                  **tf.repeated({"tracker.obj_ptr_proj.layers": 2}, hidden=8),
                  **{"detector.query_embed.weight": ("BF16", (16, 32))})
    info, = describe(write("sam.safetensors", layout), "diffusion")
    assert names(info) == ["detector.backbone.trunk.blocks.0", "detector.backbone.trunk.blocks.1",
                           "detector.backbone.trunk.blocks.2", "tracker.obj_ptr_proj.layers.0",
                           "tracker.obj_ptr_proj.layers.1"]
    flux, = describe(write("f.safetensors", tf.repeated({"double_blocks": 2})), "diffusion")
    assert names(flux) == ["double_blocks.0", "double_blocks.1"]     # root groups as before
