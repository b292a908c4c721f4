"""`python -m comfyui_placement demo` reads true: both runs warmed up and timed alike,
a prediction for the simulated devices it runs on, only what is loaded in the tables,
every line within a terminal's width, and the placed output identical to the resident."""
import json
import subprocess
import sys

import pytest

pytest.importorskip("diffusers")

from comfyui_placement.demo import pipeline as demo  # noqa: E402
from comfyui_placement.placement.report import WIDTH  # noqa: E402


@pytest.fixture(scope="module")
def run():
    out = subprocess.run([sys.executable, "-m", "comfyui_placement", "demo", "--json"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    return lines[:-1], json.loads(lines[-1])


def test_output_identical_and_within_budgets(run):
    text, data = run
    assert data["max_abs_diff"] == 0 and text[-1].endswith("-> identical")
    assert not any("went over its budget" in x for x in text)
    for name, s in data["stats"]["devices"].items():
        budget = next(d for d in data["plan"]["devices"] if d["name"] == name)["budget_bytes"]
        assert s["peak_bytes"] <= budget


def test_report_fits_a_terminal_and_shows_only_what_is_loaded(run):
    text, _ = run
    assert [x for x in text if len(x) > WIDTH] == []
    assert not any("(not loaded)" in x for x in text)
    start = next(i for i, x in enumerate(text) if x.startswith("component")) + 2
    assert text[start].split()[0] == "diffusion" and text[start + 1] == ""


def test_runs_on_the_simulated_gpus(run):
    _, data = run
    comp = data["plan"]["components"]["diffusion"]
    assert comp["runtime"] == ["cuda0", "cuda1"] and comp["params"] == "cpu"
    assert comp["streamed_bytes"] > 0


def test_timed_alike(run):
    text, data = run
    t = data["timing"]
    assert t["warmup"] >= 1 and t["reps"] >= 3
    assert any(x.startswith("timed alike: ") and f"median of {t['reps']} forwards each" in x
               for x in text)
    # warm runs: neither is a cold first forward many times the other
    assert t["resident_s"] < 5 * t["placed_s"] and t["placed_s"] < 5 * t["resident_s"]


def test_prediction_is_for_the_devices_it_runs_on(run):
    text, data = run
    t = data["timing"]
    model = data["plan"]["fit"]["cost_model"]
    # the planner was given this CPU's measured speed and the simulated links, not a GPU guess
    assert set(model["throughput_flops"].values()) == {t["cpu_flops"]}
    assert t["cpu_flops"] < 5e12
    assert model["bandwidth_bytes_per_s"]["cuda0"] == 25e9
    assert any(x.startswith("assumes: ") for x in text)
    # the same order as measured (generous: timings on a shared machine vary)
    for predicted, measured in ((t["predicted_placed_s"], t["placed_s"]),
                                (t["predicted_resident_s"], t["resident_s"])):
        assert measured / 10 < predicted < measured * 10, t
    # the streamed bytes per forward are as planned
    assert sum(t["streamed_bytes_per_forward"].values()) == \
        data["plan"]["fit"]["predicted"]["streamed_bytes_per_step"]
    row = next(x for x in text if x.strip().startswith("placed forward"))
    assert len(row.split()) == 6           # label, predicted ms, measured ms side by side


def test_timed_alike_takes_turns():
    calls = []
    results = demo.timed_alike([lambda: calls.append("a") or 1, lambda: calls.append("b") or 2],
                               reps=3)
    assert calls == ["a", "b"] * 3
    assert [outs for _, outs in results] == [[1, 1, 1], [2, 2, 2]]
    assert all(seconds >= 0 for seconds, _ in results)


def test_sim_speeds_describe_the_simulated_machine():
    from comfyui_placement.runtime.device.simdevice import Link
    speeds = demo.sim_speeds(1e11, Link(bandwidth=5e9), Link(bandwidth=2e9))
    assert speeds == {"throughput": {"cuda0": 1e11, "cuda1": 1e11, "cpu": 1e11},
                      "bandwidth": {"cuda0": 5e9, "cuda1": 5e9}, "peer_bandwidth": 2e9}
