"""VAE tiles inside ComfyUI (issue 10 item 4): a plan whose VAE decodes in tiles runs
through ComfyUI's own decode_tiled when a plain VAEDecode node decodes with the placed
VAE, and the image is close to the full-frame decode. Driver: vae_tiles_driver.py."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from harness import MARKS, run_driver  # noqa: E402

pytestmark = MARKS
DRIVER = Path(__file__).with_name("vae_tiles_driver.py")


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return run_driver(DRIVER, "PLACEMENT_VAE_TILES_RESULTS", tmp_path_factory.mktemp("tiles"))


def test_auto_fit_plans_a_tile_on_the_gpu(results):
    plan = results["plan"]
    assert plan["runtime"] == ["cuda0"] and plan["tile"] == 256 == plan["json_tile"]
    assert any("decoded in 256x256 px tiles" in r for r in plan["reasons"])
    assert any("decodes in 256x256 px tiles" in n for n in results["notes"])


def test_vae_decode_runs_comfyuis_tiled_decode_with_the_plans_tile(results):
    assert results["full_tiler_calls"] == 0          # the loader's VAE decodes full frame
    assert results["tiled_tiler_calls"] == 3          # decode_tiled_'s three passes
    # 256 px at TAESD's 8x: 32 latent; the passes are (16 x 64), (64 x 16), (32 x 32)
    assert sorted(map(tuple, results["tiler_tiles"])) == [(16, 64), (32, 32), (64, 16)]
    assert results["loader_decode_is_class_method"]


def test_tiled_image_close_to_full_frame(results):
    full, tiled = results["shapes"]
    assert full == tiled == [1, 512, 512, 3]
    # blending overlapping tiles differs from the full frame only near seams
    assert results["mean_abs_diff"] < 0.1 * max(results["full_std"], 1e-3)


def test_each_tile_call_is_planned_with_its_rehearsed_working_memory(results):
    """Issue 29 item 2: each decode call of the tiled decode (a tile) is rehearsed on the
    meta device at its shapes; the engine plans that figure, not the metadata's estimate
    of a whole frame, and it is what the simulated device metered for the tile."""
    calls = results["calls"]
    assert len(calls) >= 3 and all(c["method"] == "decode" and c["outcome"] == "ok"
                                   for c in calls), calls
    for c in calls:
        assert c["rehearsed"] and not c["unrehearsed"], c
        assert c["rehearsed"] < c["estimate"], c          # a tile, not the whole frame
        metered, peak, planned = c["metered"]["cuda0"], c["peaks"]["cuda0"], \
            c["planned"]["cuda0"]
        assert abs(metered - c["rehearsed"]) <= c["rehearsed"] // 10, c
        assert peak <= planned, c        # the plan's bytes hold the tile (workspace spare)
