"""A text encoder's call that its device cannot hold beside its weights, by the working
memory rehearsed at the call's inputs, is refused in one line before any weight moves,
never an out-of-memory in the middle of the call (runtime/comfy/engine_calls.py); a call
that fits runs. Driver: te_call_room_driver.py."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from harness import MARKS, run_driver  # noqa: E402

pytestmark = MARKS
DRIVER = Path(__file__).with_name("te_call_room_driver.py")


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    r = run_driver(DRIVER, "PLACEMENT_TE_CALL_ROOM_RESULTS", tmp_path_factory.mktemp("room"))
    assert not r["errors"], r["errors"]
    return r


def test_a_call_that_fits_runs_within_the_room(results):
    small = results["refuses"]["16"]
    assert small["outcome"] == "ok" and small["placements"] == 1, small
    assert small["planned"]["cuda0"] <= results["room"], (small, results["room"])


def test_a_call_that_does_not_fit_is_refused_before_it_is_placed(results):
    large = results["refuses"]["4096"]
    assert large["outcome"] == "PlacementError", large
    assert "encode_token_weights needs" in large["error"] and "short by" in large["error"]
    assert large["placements"] == 1            # the small call's only: this one never opened
    assert results["weights_unchanged"]


def test_without_the_check_the_same_call_runs_out_of_memory(results):
    """What a VAE's session does (ComfyUI retries tiled on it): the ledger's error in the
    middle of the call. The refusal above is the check's, not the device's."""
    large = results["does_not_refuse"]["4096"]
    assert large["outcome"] == "OutOfMemoryError", large
