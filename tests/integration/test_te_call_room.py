"""A text encoder's call that its device cannot hold beside its weights, by the working
memory rehearsed at the call's inputs, is refused in one line before any weight moves,
never an out-of-memory in the middle of the call (runtime/comfy/apply/engine_calls.py); a call
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
    small = results["checked"]["16"]
    assert small["outcome"] == "ok" and small["equal"] and small["placements"] == 1, small
    assert small["planned"]["cuda0"] <= results["room"], (small, results["room"])
    assert small["fallback"] is None


def test_a_call_that_does_not_fit_runs_on_the_host_before_any_weight_moves(results):
    large = results["checked"]["4096"]
    assert large["outcome"] == "ok" and large["equal"], large        # the same result
    assert large["recorded"] == "ok (on the cpu)", large
    assert "ran on the cpu: te: encode_token_weights needs" in large["fallback"]
    assert "short by" in large["fallback"] and "\n" not in large["fallback"]
    assert results["weights_unchanged"]


def test_without_the_check_the_same_call_runs_out_of_memory(results):
    """What a VAE's decode does (ComfyUI retries tiled on it): the ledger's error in the
    middle of the call. The host run above is the check's, not the device's."""
    large = results["not_checked"]["4096"]
    assert large["outcome"] == "OutOfMemoryError", large
