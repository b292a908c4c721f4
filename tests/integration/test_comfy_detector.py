"""stable-diffusion.cpp's `detector` module inside ComfyUI (issue 34): Apply Placement
places an Impact-Pack-shaped detector (a stand-in: the Impact Pack is not installed),
leaves the given one as it was, and says an entry for `detector` that has nothing to
place. Driver: detector_driver.py."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from harness import MARKS, run_driver  # noqa: E402

pytestmark = MARKS
DRIVER = Path(__file__).with_name("detector_driver.py")


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return run_driver(DRIVER, "PLACEMENT_DETECTOR_RESULTS", tmp_path_factory.mktemp("det"))


def test_detector_inputs_and_outputs_come_after_the_older_ones(results):
    inputs = results["apply_inputs"]
    assert inputs[-2:] == ["bbox_detector", "segm_detector"], inputs
    types = results["apply_output_types"]
    # plan_json stays output 7: saved workflows keep their links
    assert types[7] == "STRING" and types[8:] == ["BBOX_DETECTOR", "SEGM_DETECTOR"], types


def test_a_connected_detector_is_placed_and_planned(results):
    rec = results["placed"]
    assert rec["valid"] and rec["success"], rec
    got = results["detect"]["run"]
    assert not got["bbox_is_provider"]                  # a placed copy, not the input
    assert got["bbox_model_type"] == "PlacedModel"
    # both detectors of one provider ran one model, on the plan's device, told so
    assert [c["device"] for c in got["calls"]] == ["cpu", "cpu"], got["calls"]
    assert {c["model_id"] for c in got["calls"]} == {results["provider_ids"]["placed"]}
    assert [c["conf"] for c in got["calls"]] == [0.4, 0.5]
    plan = results["plans"]["run"]
    assert plan["present"] and plan["runtime"] == ["cpu"] and plan["total_bytes"] > 0
    assert "detector: runs on cpu" in rec["text"]


def test_a_bbox_only_provider_passes_its_empty_segm_output_through(results):
    rec = results["bbox_only"]
    assert rec["valid"] and rec["success"], rec
    got = results["detect"]["bbox_only"]
    assert got["segm_type"] == "NoSegmDetector" and len(got["calls"]) == 1
    assert got["calls"][0]["device"] == "cpu"


def test_an_entry_for_an_absent_detector_is_said_once(results):
    rec = results["absent"]
    assert rec["valid"] and rec["success"], rec
    assert rec["text"].count("no detector in this workflow") == 1, rec["text"]
    assert "backend detector=cpu places nothing" in rec["text"]
    # the input the consumer got straight from the provider ran as it was
    assert results["detect"]["absent"]["calls"][0]["device"] == ""
    # a default entry is no entry for the detector: nothing to say
    assert "no detector" not in results["default_only"]["text"]


def test_what_comfyui_cannot_run_for_a_detector_is_one_error(results):
    rec = results["disk"]
    errors = rec["exec_errors"] or [str(rec.get("node_errors") or rec.get("error"))]
    text = " ".join(errors)
    assert "detector" in text and "params disk" in text, rec
    assert not rec["success"]
