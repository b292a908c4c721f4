"""Batch parallel inside ComfyUI (issue 13): Apply Placement with backend
diffusion=cuda0&cuda1 and split_mode diffusion=batch runs CFG's cond and uncond (and a
latent batch) on two simulated devices at once, through the engine's wrappers; the image
equals the single-device run within float32 rounding, both devices computed, and the
loader's MODEL is untouched. Driver: batch_parallel_driver.py (real ComfyUI, its own
tiny Flux)."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from harness import MARKS, run_driver  # noqa: E402

pytestmark = MARKS
DRIVER = Path(__file__).with_name("batch_parallel_driver.py")
# The single-device run computes cond and uncond as one batch of 2, the batch-parallel
# run each on its own device as a batch of 1: a GEMM's blocking depends on its row
# count, so the sums round differently (float32, ~1e-7 relative per op, two steps).
ROUNDING = 1e-4


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return run_driver(DRIVER, "PLACEMENT_BATCH_PARALLEL_RESULTS",
                      tmp_path_factory.mktemp("batch_parallel"))


def ran(record):
    assert record["valid"], record
    assert record["success"], record.get("exec_errors")
    return record


@pytest.mark.parametrize("tag,ref,items,mode", [
    ("resident", "single", 2, "resident"),      # CFG: cond on cuda0, uncond on cuda1
    ("streamed", "single_streamed", 2, "stream"),
    ("batch2", "single_batch2", 4, "resident"),  # batch 2 x CFG: 2 items per device
])
def test_cfg_batch_split_over_two_devices_equals_one_device(results, tag, ref, items, mode):
    ran(results[ref])
    r = ran(results[tag])
    assert r["image"]["finite"] and r["image"]["std"] > 0.01
    assert r["image"]["max_abs_diff"] < ROUNDING, r["image"]
    s = r["session"]
    assert s["session"] == "BatchParallelSamplingSession" and not s["open"]
    run = s["runs"][-1]
    steps = run["forwards"]
    assert steps == 2
    assert run["items"] == {"cuda0": items, "cuda1": items}      # per forward: half each
    assert run["threads"] == {"cuda0": 1, "cuda1": 1}             # a thread per device
    assert run["modes"] == {"cuda0": mode, "cuda1": mode}
    assert all(b > 0 for b in run["h2d"].values())
    assert len(s["claim_bytes"]) == 2 and s["claim_bytes"][0] == s["claim_bytes"][1] > 0


def test_streamed_devices_read_one_packed_host_copy(results):
    single = ran(results["single_streamed"])["session"]["runs"][-1]
    both = ran(results["streamed"])["session"]["runs"][-1]
    assert single["host_pack_bytes"] > 0
    # the module's store kept the packed copy: neither device packed it again
    assert both["per_device_pack"] == {"cuda0": 0, "cuda1": 0}


def test_a_batch_of_one_runs_on_one_device(results):
    r = ran(results["cfg1"])
    assert r["image"]["equal"], r["image"]                       # the same computation
    assert r["session"]["runs"][-1]["items"] == {"cuda0": 2, "cuda1": 0}


def test_the_loaders_model_is_untouched(results):
    assert results["loader_weights_same"] and results["loader_state_same"]
    assert results["loader_forward_is_class"]


def test_diffusion_model_wrappers_run_once_per_share_with_its_chunk(results):
    """A DIFFUSION_MODEL wrapper added after Apply Placement sees each share on its own
    thread, with transformer_options cut to the share: cond_or_uncond, uuids and sigmas
    of its one item."""
    calls = ran(results["resident"])["wrapper_calls"]
    assert len(calls) == 4                                   # 2 steps x 2 shares
    assert {c["thread"] for c in calls} == {0, 1}
    for c in calls:
        assert c["batch"] == 1 and c["sigmas"] == 1 and c["uuids"] == 1
        assert len(c["cond_or_uncond"]) == 1
    by_thread = {}
    for c in calls:
        by_thread.setdefault(c["thread"], set()).update(c["cond_or_uncond"])
    assert sorted(by_thread.values(), key=sorted) == [{0}, {1}]   # cond on one, uncond on the other


def test_interrupt_inside_a_share_then_rerun(results):
    rec = results["interrupted"]
    assert rec["valid"] and not rec["success"]
    assert "execution_interrupted" in rec["messages"]
    s = rec["session"]
    assert not s["open"]                                     # every placement was left
    # this run packed the streamed blocks once (the resident runs before it let the
    # module's store go): the first device packed, the second read the same copy
    pack = s["runs"][-1]["per_device_pack"]
    assert pack["cuda0"] > 0 and pack["cuda1"] == 0
    again = ran(results["rerun"])
    assert again["image"]["equal"], again["image"]           # the same shares as "streamed"
    assert again["session"]["runs"][-1]["per_device_pack"] == {"cuda0": 0, "cuda1": 0}
    assert results["loader_weights_same"]


def test_pipelined_split_inside_comfyui_equals_one_device(results):
    """split_mode diffusion=pipeline through Apply Placement: a layer split over cuda0 and
    cuda1 whose stages run CFG's cond and uncond as two shares (on threads of their own,
    transformer_options cut by meaning); the image equals the single-device run within
    float32 rounding, with the plain layer split's ranges and its hops once per share."""
    ran(results["single"])
    plain = ran(results["split"])
    r = ran(results["pipeline"])
    assert r["image"]["finite"] and r["image"]["std"] > 0.01
    assert r["image"]["max_abs_diff"] < ROUNDING, r["image"]
    assert plain["image"]["max_abs_diff"] < ROUNDING, plain["image"]
    run, split_run = r["session"]["runs"][-1], plain["session"]["runs"][-1]
    assert run["pipeline"] == {"shares": 2, "forwards": 2}       # 2 steps, 2 shares each
    assert split_run["pipeline"] is None
    assert run["ranges"] == split_run["ranges"] and len(run["ranges"]) == 2
    assert run["hops"] == 2 * split_run["hops"] > 0              # each share crosses
    assert all(b > 0 for b in run["h2d"].values())
    # a DIFFUSION_MODEL wrapper after Apply Placement sees each share, on a thread of its
    # own (made per forward), with transformer_options cut to its one item
    calls = r["wrapper_calls"]
    assert len(calls) == 4 and len({c["thread"] for c in calls}) >= 2
    for c in calls:
        assert c["batch"] == 1 and c["sigmas"] == 1 and c["uuids"] == 1
    assert sorted(c["cond_or_uncond"] for c in calls) == [[0], [0], [1], [1]]


def test_autofit_picks_batch_parallel_inside_comfyui(results):
    """Apply Placement with auto_fit, no backend, two free simulated GPUs and CFG: auto-fit
    prices batch parallel against the plain placements and picks it (the plan JSON and a
    reason line say so), and the run is the batch-parallel one, equal to one device."""
    ran(results["single"])
    r = ran(results["autofit"])
    cp = r["plan_json"]["components"]["diffusion"]
    assert cp["parallel"] == "batch" and sorted(cp["runtime"]) == ["cuda0", "cuda1"], \
        "\n".join(cp["reasons"])
    assert any("batch parallel" in x for x in cp["reasons"]), cp["reasons"]
    assert r["plan_json"]["workload"]["cond_batch"] == 2
    assert r["image"]["max_abs_diff"] < ROUNDING, r["image"]
    run = r["session"]["runs"][-1]
    assert r["session"]["session"] == "BatchParallelSamplingSession"
    assert run["items"] == {"cuda0": 2, "cuda1": 2}              # 2 steps, 1 item each
