"""GGUF models loaded by ComfyUI-GGUF's "Unet Loader (GGUF)" through Apply Placement
(issue 12 item 3): streamed from host memory and from the .gguf file, layer split, row
split, with LoRA; Flux's text encoders from DualCLIPLoader (GGUF) (a Q8_0 T5) streamed
and layer split; each image against ComfyUI-GGUF's own run without placement. The driver
(gguf_driver.py) writes tiny Flux and T5 GGUF files with the pack's writer.

ComfyUI-GGUF's GGMLTensors run under the simulated device's check and working-memory
meter like any weight (issue 29 item 6): a double block that never arrives is refused
as a GPU would refuse it, and the bytes each forward copied are the blocks' quantized
bytes, counted from the file's tensor table.

Needs ComfyUI-GGUF in COMFYUI_PATH/custom_nodes (WITH_GGUF=1 comfyui-harness): skipped
without it locally, a failure under COMFYUI_PLACEMENT_REQUIRE_COMFYUI=1 (CI)."""
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from harness import MARKS, require_comfyui_gguf, run_driver  # noqa: E402

pytestmark = MARKS
DRIVER = Path(__file__).with_name("gguf_driver.py")
EXACT = ("stream_cpu", "stream_disk", "split_layer", "split_layer_disk")
EXACT_LORA = ("lora_before_cpu", "lora_after_disk", "split_layer_lora")


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    require_comfyui_gguf()
    return run_driver(DRIVER, "PLACEMENT_GGUF_RESULTS", tmp_path_factory.mktemp("gguf"))


def ran(rec):
    assert rec["valid"], rec.get("node_errors")
    assert rec["success"], [e["exception_message"] for e in rec.get("exec_errors", [])]
    return rec


def test_comfyui_gguf_loads_the_tiny_quantized_files(results):
    assert results["registered"] == {"UnetLoaderGGUF": True, "DualCLIPLoaderGGUF": True,
                                     "PlacementApply": True}
    files = results["files"]
    assert files["tiny_flux_q8_0.gguf"]["types"].keys() == {"F32", "Q8_0"}
    assert files["tiny_flux_wide_q4_k.gguf"]["types"].keys() == {"F32", "Q4_K"}
    for f in files.values():
        assert f["bytes"] < f["float32_bytes"] / 3           # quantized, not float
    assert results["loader_patcher"] == "GGUFModelPatcher"
    ran(results["reference"])
    ran(results["wide_reference"])


@pytest.mark.parametrize("tag", EXACT)
def test_placed_image_equals_comfyui_gguf_own_run(results, tag):
    rec = ran(results[tag])
    assert rec["image"]["equal"], rec["image"]
    assert rec["session"]["session"] and rec["session"]["runs"] >= 1


@pytest.mark.parametrize("tag", EXACT_LORA)
def test_lora_applied_at_dequantization_equals_comfyui_gguf(results, tag):
    assert not results["lora_changes_image"]["equal"]       # the LoRA does something
    rec = ran(results[tag])
    assert rec["image"]["equal"], rec["image"]


def test_streamed_bytes_are_the_quantized_bytes(results):
    # from the file's tensor table: the double and single blocks, and everything else
    table = results["files"]["tiny_flux_q8_0.gguf"]
    blocks, per_block = table["block_bytes"], table["per_block"]
    rest = table["bytes"] - blocks
    assert len(per_block) == 4 and sum(per_block) == blocks
    for tag in ("stream_cpu", "stream_disk"):
        rec = ran(results[tag])
        stats = rec["session"]["stats"]
        # no budget: the first blocks the free memory holds stay, the tail streams
        k = stats["resident_blocks"]
        assert stats["mode"] == "stream" and stats["streamed_blocks"] == 4 - k >= 1
        # every streamed block crosses as its quantized bytes (no dequantized copy)
        assert stats["streamed_bytes_per_forward"] == sum(per_block[k:])
        assert stats["devices"]["cuda0"]["peak_bytes"] <= stats["devices"]["cuda0"]["capacity_bytes"]
        # measured after each of the sampler's two model calls: the first brought the
        # non-block weights and every block, the second the streamed blocks again
        first, second = rec["forward_h2d"]
        assert first >= rest + blocks and second - first == sum(per_block[k:])


@pytest.mark.parametrize("tag", EXACT + EXACT_LORA + ("wide_row", "wide_row_lora"))
def test_checked_and_metered_like_any_model(results, tag):
    stats = ran(results[tag])["session"]["stats"]
    assert stats["device_check"] == "on"
    # every device metered its working memory: at least one dequantized float32 weight
    # (the smallest quantized block Linear of both tiny Flux files is 128 x 128 or more)
    assert all(d["working_peak_bytes"] >= 128 * 128 * 4 for d in stats["devices"].values())
    assert all(d["peak_bytes"] <= d["capacity_bytes"] for d in stats["devices"].values())


def test_a_block_that_never_arrived_is_refused(results):
    """Single block 1 (the last, streamed) run with no hook on or inside it: its
    quantized weights are read where they rest, which a GPU refuses; so must the
    simulated device."""
    rec = results["skip_arrival"]
    assert rec["valid"] and not rec["success"]
    message = " ".join(e["exception_message"] for e in rec["exec_errors"])
    assert re.search(r"diffusion: single_blocks\.1\.\S+ was read by .* rests in host "
                     r"memory, not on cuda0", message), message


def test_layer_split_uses_both_devices(results):
    total = results["files"]["tiny_flux_q8_0.gguf"]["bytes"]
    for tag in ("split_layer", "split_layer_disk"):
        rec = ran(results[tag])
        stats = rec["session"]["stats"]
        assert set(stats["devices"]) == {"cuda0", "cuda1"} and stats["hops"] >= 1
        assert all(d["h2d_bytes"] > 0 for d in stats["devices"].values())
        # each device's range loaded once, as the file's quantized bytes; no forward
        # copies weights again
        assert rec["forward_h2d"] == [total, total]


def test_row_split_of_q4_k_weights(results):
    # shards are row slices of the quantized bytes, dequantized by ComfyUI-GGUF's own
    # get_weight: equal up to float32 summation order of the split
    for tag, ref in (("wide_row", None), ("wide_row_lora", "lora")):
        rec = ran(results[tag])
        assert rec["image"]["max_abs_diff"] < 1e-4, rec["image"]
        stats = rec["session"]["stats"]
        assert set(stats["devices"]) == {"cuda0", "cuda1"} and stats["hops"] > 0
    # the LoRA reached the shards: the image moved off the plain one's
    assert results["wide_row_lora_vs_plain"]["max_abs_diff"] > 1e-3


def test_loader_model_untouched(results):
    assert results["loader_weights_unchanged"] is True


@pytest.mark.parametrize("tag", ["te_stream", "te_split"])
def test_dual_clip_loader_gguf_text_encoders_placed(results, tag):
    t5 = results["t5_file"]
    assert t5["quantized"] >= 8 and t5["block_bytes"] < t5["float16_block_bytes"] * 0.6
    rec = ran(results[tag])
    assert rec["image"]["equal"], rec["image"]
    calls = rec["calls"]
    assert calls and all(c["outcome"] == "ok" for c in calls)
    # checked and metered: the T5's token table (32128 x 32), dequantized, is working
    # memory of the device that embeds the tokens
    for c in rec["checks"]:
        assert c["device_check"] == "on"
        assert all(w is not None for w in c["working_peak_bytes"].values())
        assert max(c["working_peak_bytes"].values()) >= 32128 * 32 * 2
    if tag == "te_stream":
        # the T5's blocks stream as their file bytes (Q8_0 weights; ComfyUI's T5 keeps a
        # few hundred bytes of the file's block tensors outside its blocks: 640 B here)
        assert all(c["mode"] == "stream" and
                   0 <= t5["block_bytes"] - c["streamed_bytes"] <= 1024 for c in calls)
    else:
        assert all(c["split_mode"] == "layer" and c["hops"] > 0 for c in calls)
