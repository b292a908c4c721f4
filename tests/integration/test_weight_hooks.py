"""ComfyUI's weight hooks (Create Hook LoRA, hook keyframes, Set CLIP Hooks) on models the
pack's engine places give ComfyUI's own image, bit for bit: before, the engine computed
with its own copies of the weights and the hook's in-place write never reached them (a
hook LoRA on a model streamed from disk came out within 1e-5 of the run without it).
Where the engine cannot apply a hook (a row split) it refuses in one line.
Driver: hooks_driver.py; the mechanism: runtime/comfy/patchers/weight_hooks.py."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from harness import MARKS, run_driver  # noqa: E402

pytestmark = MARKS
DRIVER = Path(__file__).with_name("hooks_driver.py")


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    r = run_driver(DRIVER, "PLACEMENT_HOOKS_RESULTS", tmp_path_factory.mktemp("hooks"))
    assert not r["errors"], r["errors"]
    return r


def test_comfyuis_own_hooked_runs_differ_from_the_plain_one(results):
    """What makes the comparisons below worth making."""
    for tag in ("hook_ref", "keyframes_ref"):
        assert results[tag]["success"], results[tag]
        assert not results[tag]["image"]["equal"], results[tag]
        assert results[tag]["image"]["max_abs_diff"] > 1e-3, results[tag]
    assert not results["clip_ref"]["image"]["equal"], results["clip_ref"]


@pytest.mark.parametrize("tag", ["stream_cpu", "stream_disk", "keyframes_disk", "resident",
                                 "layer_split", "batch_parallel", "on_cpu"])
def test_a_hook_lora_on_an_engine_placement_gives_comfyuis_image(results, tag):
    got = results[tag]
    assert got["success"], got
    assert got["image"]["equal"], got


def test_a_hook_over_a_lora_gives_comfyuis_image_within_rounding(results):
    """ComfyUI fuses the LoRA and writes the hook over it; the engine applies the hook and
    then the LoRA as the layer computes: the same sum in another order (exactly equal on
    this CPU; the bound allows for another machine's order of float additions)."""
    assert not results["lora_hook_ref"]["image"]["equal"], results["lora_hook_ref"]
    got = results["lora_hook_split"]
    assert got["success"], got
    assert got["image"]["max_abs_diff"] < 1e-5, got


@pytest.mark.parametrize("tag", ["clip_placed", "clip_scheduled"])
def test_a_hook_on_an_engine_placed_text_encoder_gives_comfyuis_image(results, tag):
    """Set CLIP Hooks, plain and scheduled (keyframes: one encode per keyframe, each
    after ComfyUI patches the hook at that strength)."""
    assert not results["clip_scheduled_ref"]["image"]["equal"]     # keyframes count
    got = results[tag]
    assert got["success"] and got["image"]["equal"], got


def test_after_hooked_runs_a_plain_run_is_plain_and_the_loaders_model_untouched(results):
    assert results["plain_after"]["success"] and results["plain_after"]["image"]["equal"]
    assert results["loader_weights_unchanged"] is True


def test_a_hook_under_a_row_split_is_refused_in_one_line(results):
    got = results["row_split"]
    assert got["success"] is False and len(got["errors"]) == 1, got
    message = got["errors"][0]
    assert "\n" not in message, message
    assert message.startswith("diffusion: a weight hook (Create Hook LoRA, Set CLIP Hooks) "
                              "patches diffusion_model."), message
    assert "row split" in message and "Load LoRA" in message, message


def test_a_hook_on_a_block_a_worker_runs_is_refused_in_one_line(results):
    message = results["refusals"]["worker"]
    assert message and message.startswith("PlacementError: diffusion: a weight hook"), message
    assert "\n" not in message and "a worker runs" in message, message
    assert "Load LoRA" in message, message
    assert "row split" in results["refusals"]["row"], results["refusals"]


def test_a_hook_on_a_quantized_gguf_weight_is_refused_in_one_line(results):
    """ComfyUI-GGUF's layer dequantizes a quantized weight without running the weight
    functions the engine applies a hook with: the hook would be lost, so it is refused."""
    message = results["refusals"]["gguf"]
    assert message and message.startswith("PlacementError: diffusion: a weight hook"), message
    assert "\n" not in message and "quantized weight (GGUF)" in message, message
