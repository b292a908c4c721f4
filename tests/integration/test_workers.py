"""Workers from the graph (issue 22): a real ComfyUI and real worker processes on
loopback. Backend Assignment's `workers` input joins them once per session; their devices
appear in Placement Devices and the picker's route; an explicit split and an auto-fit
plan give the image of the local run; a worker killed mid-run is one error and the next
prompt runs; a wrong secret and an unreachable address are one line (strict off: planned
without the worker; strict on: refused), in bounded time. Driver: workers_driver.py."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from harness import MARKS, run_driver  # noqa: E402

pytestmark = MARKS
DRIVER = Path(__file__).with_name("workers_driver.py")


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return run_driver(DRIVER, "PLACEMENT_WORKERS_RESULTS", tmp_path_factory.mktemp("workers"))


def ok(record):
    assert record["valid"], record.get("node_errors") or record.get("error")
    assert record["success"], [(e["exception_type"], e["exception_message"],
                                "".join(e.get("traceback", [])[-3:]))
                               for e in record.get("exec_errors", [])]
    return record


def same_image(record):
    assert record["image"]["equal"], record["image"]
    assert record["image"]["finite"] and record["image"]["std"] > 0


def node_error(record, node="10"):
    return " ".join(e["details"] for e in record["node_errors"].get(node, {}).get("errors", []))


def test_worker_devices_listed_in_the_node_and_the_route(results):
    devices = ok(results["devices"])
    shown = "\n".join(devices["ui"]["1"]["text"])
    address = results["w1_address"]
    assert f"worker w1 ({address}) joined: w1.cpu" in shown
    assert "w1.cpu" in shown.split("worker w1")[0]              # in the device table too
    route = results["route"]
    names = [d["name"] for d in route["devices"]]
    assert "w1.cpu" in names and names.index("w1.cpu") > names.index("cpu")
    assert "cpu&w1.cpu" in route["runtime"]
    assert "w1.cpu" not in route["params"]                      # weights rest locally
    assert route["workers"] == [f"worker w1 ({address}) joined: w1.cpu"]


def test_explicit_split_over_a_worker_equals_the_local_run(results):
    rec = ok(results["explicit"])
    same_image(rec)
    stats = rec["session"]["stats"]
    # in proportion to room (the same machine's memory on both sides): the last blocks
    (first, last), = stats["remote_ranges"].values()
    assert list(stats["remote_ranges"]) == ["w1.cpu"] and 1 <= first <= last == 3
    assert stats["links"]["cpu->w1.cpu"]["hops"] > 0
    assert any(f"blocks {first}..3 on w1.cpu" in t for t in rec["texts"])
    same_image(ok(results["explicit_again"]))
    log = results["w1_log_after_explicit"]
    assert log.count("joined; rank 1") == 1          # one join for the session, not per prompt
    assert log.count("loaded ") >= 2


def test_the_second_prompt_keeps_the_workers_range_loaded(results):
    """Issue 33: the same MODEL sampled again moves no weight and hashes nothing, on
    either side; the worker's log and the run's stats both say so."""
    first = ok(results["explicit"])["session"]["stats"]["worker_loading"]["w1.cpu"]
    assert first["kept"] is False and first["moved_bytes"] > 0
    rec = ok(results["explicit_kept"])
    loading = rec["session"]["stats"]["worker_loading"]["w1.cpu"]
    assert loading == {"kept": True, "nbytes": first["nbytes"], "compared_bytes": 0,
                       "read_bytes": 0, "hashed_bytes": 0, "moved_bytes": 0,
                       "main_hashed_bytes": 0}
    log = results["w1_log_kept"]
    assert "no weight moved, nothing hashed" in log and "loaded " not in log
    lines = results["kept_measured"]["lines"]
    assert any(t.startswith("w1.cpu: blocks ") and "kept loaded from the last run" in t
               for t in lines), lines
    # ComfyUI unloading the model frees the worker's range
    freed = results["w1_log_after_unload"][len(log):]
    assert freed.count("freed ") == 1, freed


def test_the_workers_own_peak_comes_back_beside_the_planned_bytes(results):
    """After the explicit split, the record the node draws its bars from holds the peak
    the worker measured of w1.cpu (the bytes of the range it held: a cpu has no allocator
    peak), said as such, beside the plan's bytes for it."""
    records = [r for r in results["explicit_measured"] if r.get("sample")]
    assert records, results["explicit_measured"]
    rec = records[-1]
    peak = rec["peaks"]["w1.cpu"]["sample"]
    planned = rec["planned_bytes"]["w1.cpu"]
    assert 0 < peak <= planned.get("sample", planned.get("any")), (peak, planned)
    assert "ranges held" in rec["peaks_measured"]["w1.cpu"]
    assert any(line.startswith("w1.cpu peak measured on its worker: ")
               for line in rec["lines"])
    assert any("w1.cpu sample" in line for line in rec["lines"])


def diffusion(record):
    return record["plan"]["components"]["diffusion"]


def generation_s(record):
    return record["plan"]["fit"]["predicted"]["generation_s"]


def test_autofit_gives_a_worker_a_range_only_when_it_pays(results):
    # a worker whose cpu is no faster than this machine's: no range there
    rec = ok(results["autofit"])
    same_image(rec)
    assert diffusion(rec)["runtime"] == ["cpu"]
    # a fast GPU on the worker beside slow devices here: the worker gets a range, the
    # plan that ran used it, and the plan says the link it assumed
    rec, alone = ok(results["autofit_worker"]), ok(results["autofit_alone"])
    same_image(rec)
    same_image(alone)
    cp = diffusion(rec)
    assert cp["runtime"][0] == "cuda0" and "w2.cuda0" in cp["runtime"], cp
    assert cp["blocks"]["w2.cuda0"], cp
    assert rec["session"]["stats"]["links"]["cuda0->w2.cuda0"]["hops"] > 0
    assert generation_s(rec) < generation_s(alone)
    assert not any(d.startswith("w2.") for d in diffusion(alone)["runtime"])
    reasons = " ".join(" ".join(rec["texts"]).split())
    assert "network cuda0->w2.cuda0 1.10 GB/s (default)" in reasons
    assert "for simulated cuda0" in results["w2_log"]


def test_killed_worker_is_one_error_and_comfyui_keeps_serving(results):
    rec = results["killed"]
    assert rec["valid"] and not rec["success"]
    (error,) = rec["exec_errors"]
    msg = error["exception_message"].strip()
    assert "worker w1" in msg and "lost" in msg and "\n" not in msg, msg
    assert results["loader_state_after_kill"] == results["loader_state_before"]
    same_image(ok(results["after_kill_local"]))
    fell = ok(results["after_kill_fallback"])
    same_image(fell)
    assert any("worker w1" in n and "planned without it" in n for n in fell["notices"])
    strict = results["after_kill_strict"]
    assert not strict["valid"]
    assert "placement error in workers: worker w1" in node_error(strict)


def test_wrong_secret_is_one_line_both_ways(results):
    fell = ok(results["wrong_secret"])
    same_image(fell)
    assert any("wrong secret" in n for n in fell["notices"]), fell["notices"]
    strict = results["wrong_secret_strict"]
    assert not strict["valid"] and "wrong secret" in node_error(strict)
    assert "\n" not in node_error(strict)
    assert "refused 127.0.0.1:" in results["w3_log"]


def test_unreachable_address_is_one_line_in_bounded_time(results):
    fell = ok(results["unreachable"])
    same_image(fell)
    assert any("cannot connect" in n for n in fell["notices"]), fell["notices"]
    assert fell["seconds"] < 60
    strict = results["unreachable_strict"]
    assert not strict["valid"] and "cannot connect" in node_error(strict)
    assert strict["seconds"] < 30


def test_a_new_worker_on_the_same_alias_joins_and_runs(results):
    rec = ok(results["rejoined"])
    same_image(rec)
    assert "joined; rank 1" in results["w1b_log"]
