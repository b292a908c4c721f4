"""ComfyUI's own models with a block range on a worker started with --comfyui (issue 22
item 3), inside a real ComfyUI (marked `comfyui`).

remote_models_driver.py writes tiny random Flux.1 and Wan 2.1 diffusion-model files, an
SD1.5 checkpoint (model.diffusion_model. prefix) and a Q8_0 GGUF of the Flux, loads them
with ComfyUI's loaders (ComfyUI-GGUF's Unet Loader for the GGUF), starts two real worker
processes with --comfyui (one with ComfyUI's models-folder layout, one with the GGUF under
unet/ and the rest bare), and runs a range of each model there with remote_options():
the worker builds the model with ComfyUI's detection on the meta device from the file's
header and reads only its range. Every output must equal the all-local run bit for bit,
GGUF included (the worker dequantizes with ComfyUI-GGUF's own layers), and the model be
restored exactly.
"""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from harness import MARKS, require_comfyui_gguf, run_driver  # noqa: E402

pytestmark = MARKS
DRIVER = Path(__file__).with_name("remote_models_driver.py")
SAFETENSORS = {"flux1": ("diffusion_models/tiny_flux1.safetensors", "Flux"),
               "wan21": ("diffusion_models/tiny_wan21.safetensors", "WAN21_T2V"),
               "sd15_ckpt": ("checkpoints/tiny_sd15_ckpt.safetensors", "SD15")}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return run_driver(DRIVER, "REMOTE_MODELS_RESULTS", tmp_path_factory.mktemp("remote"))


def ran(rec):
    assert "exception" not in rec, rec["exception"]
    assert "error" not in rec, rec["error"]
    return rec


def same_as_local(rec):
    assert rec["released"]                       # the range's weights left this process
    assert rec["equal"] and rec["max_abs_diff"] == 0.0, rec
    assert rec["finite"] and rec["std"] > 0
    assert rec["stats"]["forwards"] == 2 and rec["stats"]["round_trips"] >= 2
    assert rec["restored"] and rec["local_again"]


@pytest.mark.parametrize("key", sorted(SAFETENSORS))
def test_safetensors_range_equals_the_local_run(results, key):
    rec = ran(results[key])
    remote_file, config = SAFETENSORS[key]
    assert rec["remote_file"] == remote_file and rec["builder"]["config"] == config
    assert rec["diffusion_file"].endswith(remote_file)
    same_as_local(rec)


def test_the_unet_runs_its_layers_remotely(results):
    # ComfyUI's UNet calls the layers of its input/output blocks itself: those are the
    # range's blocks, across the middle block into the output blocks
    assert ran(results["sd15_ckpt"])["blocks"] == ["middle_block.0", "output_blocks.0.0"]


def test_gguf_range_equals_comfyui_gguf_local_run(results):
    require_comfyui_gguf()
    rec = ran(results["flux1_gguf"])
    assert rec["remote_file"] == "diffusion_models/tiny_flux1_q8_0.gguf"   # w2: unet/...
    assert rec["builder"]["operations"] == {"gguf": {"dequant_dtype": None,
                                                     "patch_dtype": None}}
    same_as_local(rec)


def test_gguf_comparison_sees_another_dequantization(results):
    """The worker told to dequantize Q8_0 in float32 (ComfyUI-GGUF's default computes the
    scale products in float16) gives another output: bit equality is a real check."""
    require_comfyui_gguf()
    rec = ran(results["gguf_other_dequant"])
    assert not rec["equal"] and 0 < rec["max_abs_diff"] < 1e-3
    assert rec["restored"]


def test_a_builder_that_differs_is_refused_in_one_line(results):
    rec = results["wrong_dtype"]
    assert "has dtype='torch.float16', the main process's 'torch.float32'" in rec["error"]
    assert "\n" not in rec["error"] and rec["restored"] and rec["local_again"]


def test_place_runs_the_worker_stage_from_remote_options(results):
    rec = ran(results["place_flux1"])
    assert rec["stats"]["remote_ranges"] == {"w1.cpu": [1, 2]}
    assert rec["equal"] and rec["restored"]


def test_place_runs_a_unets_blocks_as_the_layers_its_loop_calls(results):
    """ComfyUI's UNet calls each block's layers itself: the plan's blocks 1-2 run on the
    worker as their layers (remote_options' units), equal to the local run."""
    rec = ran(results["place_sd15"])
    assert rec["stats"]["remote_ranges"] == {"w1.cpu": [1, 2]}
    assert rec["stats"]["round_trips"] > 0
    assert rec["equal"] and rec["restored"]


def test_worker_builds_on_the_meta_device(results):
    assert results["built_on_meta"] is True


def test_remote_file_relative_to_a_given_models_root(results):
    assert results["below_models_root"] == ["diffusion_models/tiny_flux1.safetensors",
                                            "tiny_flux1.safetensors"]
