"""Auto-fit inside ComfyUI plans the real workload (issue 8): a 64x64 and a 1024x1024
workflow get different plans under the same simulated inventory, sampling re-plans when
the workload differs from the one Apply Placement planned for, and the node shows the
plan that ran. Driver: autofit_driver.py (real ComfyUI, tiny random models)."""
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from harness import MARKS, run_driver  # noqa: E402

pytestmark = MARKS
DRIVER = Path(__file__).with_name("autofit_driver.py")
ROW = re.compile(r"^(diffusion|vae)\s+(\S+)\s+(\S+)\s", re.M)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return run_driver(DRIVER, "PLACEMENT_AUTOFIT_RESULTS", tmp_path_factory.mktemp("autofit"))


def ran(record):
    assert record["valid"], record
    assert record["success"], record.get("exec_errors")
    texts = [t for t in record["texts"] if t.startswith("plan that ran")]
    assert len(texts) == 1, record["texts"]
    return texts[0]


def ran_where(text):
    table = text.split("\n\ndevice")[0]
    return {c: {"runtime": [rt], "params": params} for c, rt, params in ROW.findall(table)}


def json_where(record):
    return {c: {"runtime": v["runtime"], "params": v["params"]}
            for c, v in record["where"].items()}


def test_small_and_large_workflows_get_different_plans(results):
    small, large = results["small"], results["large_fresh"]
    ran(small), ran(large)
    assert small["plan_json"]["workload"]["resolution"] == [64, 64]
    assert large["plan_json"]["workload"]["resolution"] == [1024, 1024]
    assert small["plan_json"]["workload"]["steps"] == 2
    assert small["plan_json"]["workload"]["cond_batch"] == 2
    assert json_where(small) != json_where(large)
    assert small["where"]["diffusion"]["runtime"] == ["cuda0"]      # fits at 64x64
    assert large["image"] == [1, 1024, 1024, 3] and small["image"] == [1, 64, 64, 3]


def test_the_node_shows_the_plan_that_ran_and_plan_json_holds_it(results):
    # (a rehearsal that places the run otherwise: test_families.py,
    # test_a_rehearsal_that_changes_the_plan_samples_with_the_new_one)
    for key in ("small", "large_fresh", "latent_input"):
        text = ran(results[key])
        assert "plan_json holds this plan" in text, (key, text[-300:])
        assert "working memory now rehearsed" in text, (key, text[-300:])
        assert ran_where(text) == json_where(results[key]), key


def test_sampling_plans_again_when_the_node_planned_for_another_workload(results):
    # Apply Placement cached from the 64x64 run: sampling at 1024x1024 plans again, as a
    # node planning that workload runs it (the plan that ran there)
    large = results["large"]
    text = ran(large)
    assert large["plan_json"]["workload"]["resolution"] == [64, 64]
    assert "sampling 1024x1024" in text and "planned again" in text
    assert ran_where(text) == ran_where(ran(results["large_fresh"]))
    assert ran_where(text) != json_where(large)
    assert large["image"] == [1, 1024, 1024, 3]


def test_a_latent_the_prompt_does_not_spell_out(results):
    hidden, given = results["hidden_size"], results["latent_input"]
    text = ran(hidden)
    assert "sampling 256x256" in text
    # with the latent connected the node plans the same thing at node time
    assert given["plan_json"]["workload"]["resolution"] == [256, 256]
    assert given["plan_json"]["workload"]["source"].startswith("LATENT input")
    assert ran_where(text) == json_where(given)
    assert hidden["image"] == given["image"] == [1, 256, 256, 3]


def test_cfg_one_runs_no_uncond_pass(results):
    text = ran(results["cfg1"])
    assert results["cfg1"]["plan_json"]["workload"]["cond_batch"] == 1
    assert "no uncond pass" in text
