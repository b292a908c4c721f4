"""The official-templates harness's prompt handling, without ComfyUI (issue 31): the
workload shrunk through the prompt's own inputs, the pack inserted on loader edges, and
the stand-in table's answers. Prompts here have the shapes the frontend's graphToPrompt
gives the real templates (subgraph ids "128:75", Primitive and switch links)."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import insert  # noqa: E402
import shrink  # noqa: E402
import standins  # noqa: E402

RETURN_TYPES = {"UNETLoader": ["MODEL"], "CLIPLoader": ["CLIP"], "VAELoader": ["VAE"],
                "LoraLoaderModelOnly": ["MODEL"], "CheckpointLoaderSimple": ["MODEL", "CLIP", "VAE"]}


def wan22_pair():
    """Video Wan 2.2 14B t2v as converted: two experts, a LoRA switch, steps and the
    split step from Primitives through switches, frames from a math expression."""
    return {
        "1:1": {"class_type": "UNETLoader", "inputs": {"unet_name": "wan2.2_t2v_high_noise_14B_fp8_scaled.safetensors", "weight_dtype": "default"}},
        "1:2": {"class_type": "UNETLoader", "inputs": {"unet_name": "wan2.2_t2v_low_noise_14B_fp8_scaled.safetensors", "weight_dtype": "default"}},
        "1:3": {"class_type": "LoraLoaderModelOnly", "inputs": {"model": ["1:1", 0], "lora_name": "wan2.2_t2v_lightx2v_4steps_lora_v1.1_high_noise.safetensors", "strength_model": 1.0}},
        "1:4": {"class_type": "PrimitiveBoolean", "inputs": {"value": False}},
        "1:5": {"class_type": "ComfySwitchNode", "inputs": {"switch": ["1:4", 0], "on_true": ["1:3", 0], "on_false": ["1:1", 0]}},
        "1:6": {"class_type": "PrimitiveInt", "inputs": {"value": 20}},
        "1:7": {"class_type": "PrimitiveInt", "inputs": {"value": 10}},
        "1:8": {"class_type": "ComfyMathExpression", "inputs": {"expression": "floor(a * b) + 1", "a": 16.0, "b": 5.0}},
        "1:9": {"class_type": "EmptyHunyuanLatentVideo", "inputs": {"width": 640, "height": 480, "length": ["1:8", 0], "batch_size": 1}},
        "1:10": {"class_type": "CLIPLoader", "inputs": {"clip_name": "umt5_xxl_fp8_e4m3fn_scaled.safetensors", "type": "wan", "device": "default"}},
        "1:11": {"class_type": "CLIPTextEncode", "inputs": {"text": "a fox", "clip": ["1:10", 0]}},
        "1:12": {"class_type": "KSamplerAdvanced", "inputs": {"model": ["1:5", 0], "steps": ["1:6", 0], "start_at_step": 0, "end_at_step": ["1:7", 0], "latent_image": ["1:9", 0], "positive": ["1:11", 0], "negative": ["1:11", 0], "cfg": 3.5, "noise_seed": 1, "add_noise": "enable", "return_with_leftover_noise": "enable", "sampler_name": "euler", "scheduler": "simple"}},
        "1:13": {"class_type": "KSamplerAdvanced", "inputs": {"model": ["1:2", 0], "steps": ["1:6", 0], "start_at_step": ["1:7", 0], "end_at_step": 10000, "latent_image": ["1:12", 0], "positive": ["1:11", 0], "negative": ["1:11", 0], "cfg": 3.5, "noise_seed": 1, "add_noise": "disable", "return_with_leftover_noise": "disable", "sampler_name": "euler", "scheduler": "simple"}},
        "1:14": {"class_type": "VAELoader", "inputs": {"vae_name": "wan_2.1_vae.safetensors"}},
        "1:15": {"class_type": "VAEDecode", "inputs": {"samples": ["1:13", 0], "vae": ["1:14", 0]}},
        "9": {"class_type": "SaveImage", "inputs": {"images": ["1:15", 0], "filename_prefix": "x"}},
    }


def test_shrink_lowers_the_workload_through_each_consumers_inputs():
    prompt = wan22_pair()
    small = shrink.shrink(prompt)
    assert prompt["1:9"]["inputs"]["width"] == 640          # the given prompt untouched
    latent = small["1:9"]["inputs"]
    assert (latent["width"], latent["height"]) == (64, 48)  # the aspect kept, 16-aligned
    assert latent["length"] == shrink.FRAMES["default"]     # a computed length: the literal
    high, low = small["1:12"]["inputs"], small["1:13"]["inputs"]
    # 20 steps split at 10 -> 2 steps split at 1, from the Primitives through the links
    assert high["steps"] == low["steps"] == shrink.STEPS
    assert high["end_at_step"] == 1 and low["start_at_step"] == 1
    assert low["end_at_step"] == 10000                      # "to the end" stays
    assert small["1:5"] == prompt["1:5"] and small["1:6"] == prompt["1:6"]


def test_a_lowered_size_keeps_to_what_its_node_accepts():
    p = {"1": {"class_type": "EmptyLTXVLatentVideo", "inputs": {"width": 768, "height": 512,
                                                                "length": 97, "batch_size": 1}}}
    limits = {("EmptyLTXVLatentVideo", "height"): (64, 32)}
    small = shrink.shrink(p, lambda cls, k: limits.get((cls, k)))["1"]["inputs"]
    assert (small["width"], small["height"]) == (64, 64)     # 48 is under its minimum
    assert shrink.shrink(p)["1"]["inputs"]["height"] == 48


def test_a_computed_size_and_megapixels_keep_to_what_their_node_accepts():
    # Ideogram 4's scheduler takes its size from a math expression (min 256); its
    # resolution selector takes 0.1 megapixels at least
    p = {"1": {"class_type": "ComfyMathExpression", "inputs": {"expression": "a", "values.a": 1024}},
         "2": {"class_type": "Ideogram4Scheduler", "inputs": {"width": ["1", 1], "height": ["1", 1],
                                                              "steps": 20}},
         "3": {"class_type": "ResolutionSelector", "inputs": {"megapixels": 1.0, "multiple": 8}}}
    limits = {("Ideogram4Scheduler", "width"): (256, 16), ("Ideogram4Scheduler", "height"): (256, 16),
              ("ResolutionSelector", "megapixels"): (0.1, 0.1)}
    small = shrink.shrink(p, lambda cls, k: limits.get((cls, k)))
    assert (small["2"]["inputs"]["width"], small["2"]["inputs"]["height"]) == (256, 256)
    assert small["3"]["inputs"]["megapixels"] == 0.1
    plain = shrink.shrink(p)                                 # no limits known: the shrunk ones
    assert plain["2"]["inputs"]["width"] == shrink.SIDE
    assert plain["3"]["inputs"]["megapixels"] == shrink.MEGAPIXELS


def test_value_of_follows_primitives_and_switches_of_known_condition():
    p = wan22_pair()
    assert shrink.value_of(p, ["1:6", 0]) == 20
    assert shrink.value_of(p, ["1:5", 0]) is None           # a model: not a literal
    p["1:20"] = {"class_type": "ComfySwitchNode", "inputs": {"switch": ["1:4", 0], "on_true": 4, "on_false": ["1:6", 0]}}
    assert shrink.value_of(p, ["1:20", 0]) == 20
    assert shrink.value_of(p, ["1:8", 0]) is None           # computed


def test_outpainting_pads_a_few_pixels_not_hundreds():
    p = {"1": {"class_type": "ImagePadForOutpaint", "inputs": {"image": ["2", 0], "left": 400,
                                                               "top": 0, "right": 400, "bottom": 8,
                                                               "feathering": 24}}}
    inputs = shrink.shrink(p)["1"]["inputs"]
    assert (inputs["left"], inputs["top"], inputs["right"], inputs["bottom"]) == (16, 0, 16, 8)


def test_prompts_keep_their_first_words_and_fixed_scales_scale_to_the_shrunk_side():
    long = "a tiny red fox sitting in the snow under a pale winter sky, photo, 35mm, sharp"
    p = {"1": {"class_type": "CLIPTextEncode", "inputs": {"text": long, "clip": ["9", 0]}},
         "2": {"class_type": "CLIPTextEncodeFlux", "inputs": {"clip_l": "short", "t5xxl": long,
                                                             "guidance": 3.5, "clip": ["9", 0]}},
         "3": {"class_type": "SaveText", "inputs": {"text": long}},
         "4": {"class_type": "FluxKontextImageScale", "inputs": {"image": ["5", 0]}}}
    small = shrink.shrink(p)
    assert small["1"]["inputs"]["text"] == " ".join(long.split()[:shrink.WORDS])[:shrink.CHARS]
    assert small["2"]["inputs"]["clip_l"] == "short"
    assert long.startswith(small["2"]["inputs"]["t5xxl"]) and small["2"]["inputs"]["t5xxl"]
    cjk = {"1": {"class_type": "CLIPTextEncode", "inputs": {"text": "色调艳丽，过曝，" * 40}}}
    assert len(shrink.shrink(cjk)["1"]["inputs"]["text"]) == shrink.CHARS
    assert small["3"]["inputs"]["text"] == long             # not a text encoder's input
    assert small["4"] == {"class_type": "ImageScale", "inputs": {
        "image": ["5", 0], "upscale_method": "nearest-exact", "width": shrink.SIDE,
        "height": shrink.SIDE, "crop": "disabled"}}
    assert p["4"]["class_type"] == "FluxKontextImageScale"


def test_ltx_keeps_8n_plus_1_frames():
    p = {"1": {"class_type": "LTXVEmptyLatentAudio", "inputs": {"frames_number": 97}},
         "2": {"class_type": "EmptyLTXVLatentVideo", "inputs": {"width": 768, "height": 512, "length": 97, "batch_size": 1}}}
    small = shrink.shrink(p)
    assert small["2"]["inputs"]["length"] == 9 and small["2"]["inputs"]["width"] == 64


def test_the_pack_goes_on_every_loader_edge_one_apply_per_model():
    small = shrink.shrink(wan22_pair())
    placed, applies = insert.with_placement(small, {"backend": "diffusion=cuda0"}, RETURN_TYPES)
    # the high-noise expert (raw and through its LoRA: two MODEL edges into the switch)
    # and the low-noise one: three models, so three Apply Placements; the CLIP and VAE
    # share the first
    assert len(applies) == 3
    first = placed[applies[0]]["inputs"]
    assert first["model"] == ["1:1", 0] and first["clip"] == ["1:10", 0] and first["vae"] == ["1:14", 0]
    assert placed["1:3"]["inputs"]["model"] == ["1:1", 0]     # loader -> LoRA loader: kept
    assert placed["1:5"]["inputs"]["on_false"] == [applies[0], 0]
    assert placed["1:11"]["inputs"]["clip"] == [applies[0], 1]
    assert placed["1:15"]["inputs"]["vae"] == [applies[0], 2]
    assert placed["1:13"]["inputs"]["model"][0] in applies
    assignment = placed[insert.ASSIGNMENT_ID]
    assert assignment["class_type"] == "PlacementBackendAssignment"
    assert assignment["inputs"]["backend"] == "diffusion=cuda0" and not assignment["inputs"]["auto_fit"]
    for a in applies:
        assert placed[a]["inputs"]["placement"] == [insert.ASSIGNMENT_ID, 0]


def test_a_checkpoint_loader_feeds_one_apply_with_its_three_outputs():
    p = {"4": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "sd_xl_base_1.0.safetensors"}},
         "6": {"class_type": "CLIPTextEncode", "inputs": {"text": "x", "clip": ["4", 1]}},
         "3": {"class_type": "KSampler", "inputs": {"model": ["4", 0], "positive": ["6", 0], "negative": ["6", 0], "latent_image": ["5", 0], "steps": 20}},
         "5": {"class_type": "EmptyLatentImage", "inputs": {"width": 1024, "height": 1024, "batch_size": 1}},
         "8": {"class_type": "VAEDecode", "inputs": {"samples": ["3", 0], "vae": ["4", 2]}}}
    placed, applies = insert.with_placement(p, {"auto_fit": True}, RETURN_TYPES)
    assert len(applies) == 1
    assert placed[applies[0]]["inputs"] == {"placement": [insert.ASSIGNMENT_ID, 0], "model": ["4", 0],
                                           "clip": ["4", 1], "vae": ["4", 2]}
    assert placed["3"]["inputs"]["model"] == [applies[0], 0] and placed["8"]["inputs"]["vae"] == [applies[0], 2]


def test_a_prompt_without_models_gets_nothing():
    p = {"1": {"class_type": "LoadImage", "inputs": {"image": "a.png"}},
         "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0]}}}
    placed, applies = insert.with_placement(p, {}, RETURN_TYPES)
    assert applies == [] and placed == p
    assert shrink.input_files(p) == [("image", "a.png")]


def test_a_drawn_mask_in_the_temp_folder_is_made_as_an_input_file():
    p = {"1": {"class_type": "Painter", "inputs": {"mask": "painter/painter-1.png [temp]",
                                                   "width": 1024, "height": 1024}}}
    assert shrink.input_files(p) == [("image", "painter/painter-1.png")]
    out = shrink.shrink(p)
    assert out["1"]["inputs"]["mask"] == "painter/painter-1.png"
    assert p["1"]["inputs"]["mask"] == "painter/painter-1.png [temp]"


def test_the_table_names_architectures_and_refuses_unknown_names_in_one_line():
    assert standins.architecture("UNETLoader", "flux1-dev.safetensors") == "diffusion:flux"
    assert standins.architecture("DualCLIPLoader", "t5xxl_fp16.safetensors") == "te:t5xxl"
    assert standins.architecture("LoraLoaderModelOnly",
                                 "Qwen-Image-Lightning-4steps-V1.0.safetensors") == "lora:qwen_image"
    assert standins.architecture("LTXVAudioVAELoader",
                                 "ltx-2-19b-dev.safetensors") == "vae:ltxav_audio_vae"
    with pytest.raises(standins.UnknownFile) as e:
        standins.architecture("UNETLoader", "my_own_model.safetensors")
    assert "\n" not in str(e.value) and "my_own_model.safetensors" in str(e.value)
    with pytest.raises(standins.UnknownFile):
        standins.architecture("SomeLoader", "x.safetensors")


def workload_module():
    """runtime/comfy/replan/workload.py on its own (its package's __init__ imports comfy; the
    module reads the prompt alone), kept out of sys.modules."""
    import importlib.util
    path = Path(__file__).resolve().parents[2] / "runtime" / "comfy" / "replan" / "workload.py"
    spec = importlib.util.spec_from_file_location("comfyui_placement.runtime.comfy.replan.workload",
                                                  path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_apply_placement_reads_the_workload_through_switches_pairs_and_decodes():
    """What the official templates showed: the model reaches its sampler through a
    switch (LoRA or not), the second expert's sampler starts from the first one's latent,
    and an Apply Placement may hold only the VAE. Each finds the sampler's real size."""
    workload = workload_module()
    small = shrink.shrink(wan22_pair())
    placed, applies = insert.with_placement(small, {"backend": "diffusion=cuda0"}, RETURN_TYPES)
    for a in applies:
        w = workload.from_prompt(placed, a, None)
        assert (w.resolution, w.frames, w.steps) == ((64, 48), 5, 2), (a, w.source)
    vae_only = {**placed, applies[0]: {"class_type": "PlacementApply", "inputs": {
        "placement": [insert.ASSIGNMENT_ID, 0], "vae": ["1:14", 0]}}}
    w = workload.from_prompt(vae_only, applies[0], None)
    assert (w.resolution, w.frames) == ((64, 48), 5), w.source


def test_a_packed_video_and_audio_latent_is_sized_by_its_video():
    """LTX-2's latent is nested (video, audio); ComfyUI packs it into one row [B, 1, N]
    before OUTER_SAMPLE and hands the shapes beside it: the video one sizes the run."""
    import types
    import torch
    workload = workload_module()
    fmt = types.SimpleNamespace(spacial_downscale_ratio=32, temporal_downscale_ratio=8)
    patcher = types.SimpleNamespace(get_model_object=lambda name: fmt)
    guider = types.SimpleNamespace(model_patcher=patcher, cfg=1.0, conds={})
    video, audio = (1, 128, 2, 2, 3), (1, 8, 26, 16)
    packed = torch.zeros(1, 1, 128 * 2 * 2 * 3 + 8 * 26 * 16)
    w = workload.from_sampling(guider, packed, torch.zeros(3), [video, audio])
    assert (w.resolution, w.frames, w.batch, w.steps) == ((96, 64), 9, 1, 2)
    # one latent: its own shape, packed or not
    assert workload.from_sampling(guider, torch.zeros(video), torch.zeros(3),
                                  [video]).resolution == (96, 64)
