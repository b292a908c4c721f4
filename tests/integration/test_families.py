"""Every model family ComfyUI ships, inside a real ComfyUI (marked `comfyui`).

families_driver.py builds a tiny random instance of each family's own ComfyUI class
(families.py), loads it through UNETLoader (ComfyUI's detection picks the class), samples
it plain, then placed five ways on simulated GPUs smaller than the model: streamed from
host memory and from the file, layer split and row split over two devices, and auto-fit
under max_vram budgets. Each placed latent must equal the plain one within float32
rounding. Families whose detection only knows full sizes (tier "min": gigabytes; tier
"meta": tens of GB) are checked on the meta device at full size: detection, the blocks
the runtime finds, and a streaming plan.
"""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from harness import MARKS, run_driver  # noqa: E402

pytestmark = MARKS
DRIVER = Path(__file__).with_name("families_driver.py")
WAYS = ("stream_cpu", "stream_disk", "layer", "row", "auto_fit")
# what the issue names, by the keys of families.py (the _d4 variants: 4 blocks per list)
RUN = ["sd15", "sdxl", "svd", "sd3", "flux1_d4", "flux2_d4", "pixart_sigma_d4",
       "hunyuan_dit_d4", "wan21_d4", "wan22_5b_d4", "wan22_a14b_high_d4", "wan22_a14b_low_d4",
       "hunyuan_video_d4", "hunyuan_video15_d4", "ltxv_d4", "cogvideox_d4", "cosmos_predict2",
       "kandinsky5_d4", "hunyuan3d2_d4", "hunyuan3d21_d4"]
UNETS = ["sd15", "sdxl", "svd"]     # blocks entered through their layers (units.py)
META = ["chroma_d4", "auraflow", "cascade_c", "cascade_b", "qwen_image_d4", "lumina2_d4",
        "zimage_d4", "hidream", "mochi", "omnigen2", "ace_step"]


@pytest.fixture(scope="module")
def everything(tmp_path_factory):
    return run_driver(DRIVER, "FAMILIES_RESULTS", tmp_path_factory.mktemp("families"),
                      extra=["--depth", "4", "--ways", "all", "--lora", ",".join(UNETS)])


@pytest.fixture(scope="module")
def results(everything):
    return everything["families"]


@pytest.mark.parametrize("key", RUN)
def test_family_detected_and_sampled_plain(results, key):
    r = results[key]
    assert r["ok"], r.get("error")
    assert r["config_ok"], (r.get("config"), r.get("expected_config"))
    assert r["latent"]["finite"] and r["latent"]["std"] > 0


@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize("key", RUN)
def test_family_placed_equals_plain(results, key, way):
    w = results[key]["ways"][way]
    assert w["ok"], (w.get("error"), w.get("compare"))
    facts = w["facts"]
    assert facts["session"] or facts["runtime"] == ["cpu"], facts
    for name, dev in facts["measured"].items():        # never above the budget
        assert dev["peak_bytes"] <= dev["capacity_bytes"], (name, dev)
    if facts["session"]:
        assert facts["device_check"] == "on", facts
    if way.startswith("stream"):
        # streamed for real on a device smaller than the model
        assert facts["streamed_blocks"] > 0 and facts["mode"] == "stream", facts
    if way == "layer":
        assert facts["hops"] >= 2 and len(facts["measured"]) == 2, facts
        assert all(d["peak_bytes"] > 0 for d in facts["measured"].values()), facts


def test_unet_families_really_split_and_stream(results):
    """The families whose containers never run their own forward (ComfyUI's UNet): the
    layer split crosses devices every step and row split shards their Linears."""
    for key in ("sd15", "sdxl", "svd"):
        ways = results[key]["ways"]
        assert ways["layer"]["facts"]["hops"] >= 2 * 2 * 2, (key, ways["layer"]["facts"])
        assert ways["row"]["facts"]["sharded_linears"], (key, ways["row"]["facts"])
        # every streamed block arrived: the ledger peak is the resident part plus the ring
        stream = ways["stream_cpu"]["facts"]
        dev = stream["measured"]["cuda0"]
        planned, measured = stream["planned"]["cuda0"], dev["peak_bytes"]
        assert planned <= measured <= planned * 1.1 + dev["working_peak_bytes"] + (1 << 20), \
            (key, stream)
        # ComfyUI's UNet never calls its blocks' own forward: they were entered through
        # their layers, and every one of them (the runtime learned that on the first step)
        assert stream["entered_by_units"] == stream["streamed_blocks"], (key, stream)


def test_streamed_plans_match_the_ledger(results):
    """An explicit streaming plan's device bytes are the runtime's (the ring included):
    the ledger's peak is that plus the working memory the simulated device metered (every
    tensor the forward computed, alive: runtime/workmeter.py) and the forward's inputs."""
    for key in RUN:
        stream = results[key]["ways"]["stream_cpu"]["facts"]
        dev = stream["measured"]["cuda0"]
        planned, measured = stream["planned"]["cuda0"], dev["peak_bytes"]
        assert dev["working_peak_bytes"] > 0, (key, dev)
        assert planned <= measured \
            <= planned + dev["working_peak_bytes"] + max(planned // 10, 3 << 20), (key, stream)


@pytest.mark.parametrize("key", RUN)
def test_working_memory_metered_on_every_device(results, key):
    """Each placed way charged working memory to every device that computed (a layer
    split's second device included), and stayed within that device's memory."""
    for way in WAYS:
        facts = results[key]["ways"][way]["facts"]
        if not facts["session"]:
            continue
        for name, dev in facts["measured"].items():
            assert dev["working_peak_bytes"] > 0, (key, way, name, dev)
            assert dev["peak_bytes"] <= dev["capacity_bytes"], (key, way, name, dev)


# full width: 2-4 GB files each (Chroma and Qwen-Image at the smallest size detection
# accepts hold one block: nothing to stream or split; they are checked on meta)
HEAVY = ["cascade_b", "cascade_c", "auraflow", "lumina2", "zimage"]


@pytest.fixture(scope="module")
def heavy(tmp_path_factory):
    return run_driver(DRIVER, "FAMILIES_RESULTS", tmp_path_factory.mktemp("heavy"),
                      extra=["--heavy", "--families", ",".join(HEAVY),
                             "--ways", "stream_cpu,layer"])["families"]


@pytest.mark.parametrize("key", HEAVY)
def test_full_width_families_stream_and_split(heavy, key):
    """Stable Cascade (its stages are ModuleLists of layers the model loops: blocks
    entered through their layers), AuraFlow (double_layers / single_layers), Lumina2 and
    Z-Image (refiners before the main layers), at the smallest size detection accepts,
    streamed and layer split: the plain latent."""
    r = heavy[key]
    assert r["ok"] and r["config_ok"], r.get("error")
    for way in ("stream_cpu", "layer"):
        w = r["ways"][way]
        assert w["ok"], (way, w.get("error"), w.get("compare"))
        facts = w["facts"]
        assert facts["device_check"] == "on", facts
        for dev in facts["measured"].values():
            assert dev["peak_bytes"] <= dev["capacity_bytes"], facts
    assert r["ways"]["stream_cpu"]["facts"]["streamed_blocks"] >= 2
    assert r["ways"]["layer"]["facts"]["hops"] >= 2


@pytest.mark.parametrize("key", UNETS)
def test_comfyui_lora_on_streamed_and_split_unets_equals_comfyui_fused(results, key):
    """ComfyUI's LoraLoaderModelOnly on every block Linear: unplaced, ComfyUI fuses it;
    streamed and layer split, the pack patches the blocks as they arrive. Same latent."""
    lora = results[key]["lora"]
    assert lora["linears"] > 10 and lora["plain"]["ok"], lora
    assert not lora["plain"]["vs_no_lora"]["close"]          # the LoRA changes the result
    for way in ("stream_cpu", "layer"):
        assert lora[way]["ok"], (way, lora[way])


@pytest.mark.parametrize("key", META)
def test_full_size_family_found_and_planned_on_meta(results, key):
    r = results[key]
    assert r["ok"] is None and r["config_ok"], r
    meta = r["meta"]
    assert meta["pack_blocks"] >= 4, meta
    assert "error" not in meta["plan"] and meta["plan"]["streamed_bytes"] > 0, meta["plan"]


def test_wan22_a14b_pair_in_one_workflow(everything):
    """The high-noise and low-noise experts in one workflow (two KSamplerAdvanced), plain
    and then both streamed through one Backend Assignment: the same latent."""
    pair = everything["pairs"]["wan22_a14b"]
    assert pair["ok"], pair
    assert pair["placed"]["ok"], pair["placed"]
