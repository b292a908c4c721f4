"""The text encoders and VAEs ComfyUI ships, inside a real ComfyUI (marked `comfyui`).

encoders_driver.py builds tiny random instances that ComfyUI's own loaders detect
(encoders.py: CLIP-L/G, T5-XXL, UMT5, Qwen2.5-VL, Llama 3.1 and the HunyuanVideo
llava-llama, Gemma 2/3, Mistral 3; the SD/SDXL, Flux, Wan 2.1/2.2, HunyuanVideo and LTXV
VAEs), runs each plain, then placed on simulated GPUs: every text encoder streamed from
host memory and (single-file loaders) from its file, and layer split over two devices;
every VAE plain and with ComfyUI's tiled decode (in time too, for the video VAEs), and
placed on a GPU. Placed outputs must equal the plain ones.
"""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from harness import MARKS, run_driver  # noqa: E402

pytestmark = MARKS
DRIVER = Path(__file__).with_name("encoders_driver.py")
TEXT_ENCODERS = ["clip_l", "sdxl_clip_l_g", "t5xxl_sd3", "flux_clip_l_t5", "umt5xxl_wan",
                 "qwen25_7b_qwen_image", "llama31_8b_hidream", "hunyuan_video_clip_l_llava",
                 "gemma2_2b_lumina2", "gemma3_4b_lumina2", "mistral3_24b_flux2"]
VAES = ["sd_vae", "flux_vae", "wan21_vae", "wan22_vae", "hunyuan_video_vae", "ltxv_vae"]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return run_driver(DRIVER, "ENCODERS_RESULTS", tmp_path_factory.mktemp("encoders"),
                      extra=["--ways", "--no-rebuild"])


@pytest.mark.parametrize("name", TEXT_ENCODERS)
def test_text_encoder_streamed_and_split_equal_plain(results, name):
    r = results["text_encoders"][name]
    assert r["ok"], r.get("error")
    ways = r["ways"]
    assert ways["sizes"]["blocks"] >= 2, ways["sizes"]
    expected = ["stream_cpu", "layer"] + (["stream_disk"] if len(r["files"]) == 1 else [])
    for way in expected:
        w = ways[way]
        assert w["ok"], (way, w.get("error"), w.get("compare"))
        facts = w["facts"]
        assert facts["device_check"] == "on", facts
        assert all(o == "ok" for _, o in facts["calls"]), facts
        for name_, dev in facts["devices"].items():
            assert dev["peak_bytes"] <= dev["capacity_bytes"], (name_, dev)
        if way.startswith("stream"):
            assert facts["mode"] == "stream" and facts["streamed_blocks"] >= 2, facts
        else:
            assert facts["hops"] >= 2 and len(facts["devices"]) == 2, facts


@pytest.mark.parametrize("name", VAES)
def test_vae_plain_tiled_and_placed(results, name):
    r = results["vaes"][name]
    assert r["plain"]["ok"] and r["tiled"]["ok"], (r["plain"], r["tiled"])
    w = r["ways"]["placed"]
    assert w["ok"] and w["compare"]["close"], w
    assert w["facts"]["calls"] and all(o == "ok" for _, o in w["facts"]["calls"]), w["facts"]


def test_video_vae_decodes_in_time_tiles_where_the_plan_says_so(results):
    """LTXV's VAE at 25 frames on a budget below the whole clip: auto-fit plans tiles in
    time (tile_frames), Apply Placement's adapter makes ComfyUI's plain VAEDecode run
    decode_tiled with them, and the frames are exactly what VAE Decode (Tiled) gives with
    the same tile by hand."""
    t = results["time_tiles"]["ltxv_vae"]
    assert "error" not in t, t.get("error")
    assert t["tile_frames"] and t["tile_frames"] < t["frames"], t
    assert any(f"x {t['tile_frames']} frames tiles" in r for r in t["reasons"]), t["reasons"]
    assert t["full_tiler_calls"] == 0 and t["tiles"], t      # the loader's VAE: whole clip
    assert all(len(tile) == 3 for tile in t["tiles"])         # time, height, width
    assert t["equals_vae_decode_tiled_node"] and t["finite"], t
    assert t["shapes"][0] == t["shapes"][1]
