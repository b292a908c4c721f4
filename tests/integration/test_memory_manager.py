"""ComfyUI's memory manager sees the pack's engine (marked `comfyui`; skipped without
COMFYUI_PATH). memory_driver.py runs a headless ComfyUI (through comfy_driver.py) and
records `comfy.model_management` during and after real KSampler runs on simulated
devices; the assertions are here.

What this proves on a CPU-only machine: ComfyUI's sampler loads one share per plan
device with the placed MODEL; each share's size is the plan's figure and equals what the
engine's ledger holds there during the run; ComfyUI's LoadedModel arithmetic asks room
for exactly that share before a run (and nothing for the main patcher); its own
free_memory / model_unload / unload_all_models make the engine give everything back
(ledger 0), and the next model call or run places again with the same image. The same
for a text encoder split over two simulated devices and a VAE on one, which the engine
places per call: their shares ride on ComfyUI's own load_models_gpu([patcher]) before
each encode / decode and are seen from inside the call.
What it cannot prove here: simulated devices all have the torch device 'cpu', and
load_models_gpu never frees memory on 'cpu', so that ComfyUI really evicts other models
from cuda1 before a split run needs only a GPU run (the sizes it would use are checked).

    COMFYUI_PATH=/path/to/ComfyUI [COMFYUI_PYTHON=/path/to/python] pytest -m comfyui
"""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))        # the sibling harness module
from harness import MARKS, run_driver  # noqa: E402

DRIVER = Path(__file__).with_name("memory_driver.py")

pytestmark = MARKS


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return run_driver(DRIVER, "PLACEMENT_MEMORY_RESULTS", tmp_path_factory.mktemp("comfy_memory"))


def ran(record):
    assert record["run"]["valid"], record["run"]
    assert record["run"]["success"], record["run"].get("exec_errors")


def mine(view, session_id):
    """This placement's shares in a current_loaded_models view, by plan device."""
    return {e["plan_device"]: e for e in view
            if e["share"] and e.get("session_id") == session_id}


def main_patcher(view):
    return [e for e in view if e["class"].startswith("Placement")]


def cast_path_fallbacks(record, component):
    """The comfy_cast_path records of the run's measured record (the node's output, sent
    after sampling and again after decode: the last one holds the whole run)."""
    assert record["measured"], "the node sent no measured record"
    last = record["measured"][-1]
    return [f for f in last.get("runtime_fallbacks", [])
            if f["kind"] == "comfy_cast_path" and f["component"] == component]


def test_split_shares_are_loaded_models_with_the_planned_sizes(results):
    r = results["split_view"]
    ran(r)
    probe = r["probe"]
    shares = mine(probe["view"], probe["session_id"])
    assert sorted(shares) == ["cuda0", "cuda1"]
    for name, e in shares.items():
        assert e["component"] == "diffusion"
        assert e["device"] == "cpu"          # a simulated device's torch device
        # the plan's figure is what the engine's ledger holds there while sampling
        assert e["model_size"] == probe["ledger"][name] > 0, (name, e, probe["ledger"])
        assert e["loaded_size"] == e["model_size"]
        assert e["memory_required"] == 0     # all of it loaded: ComfyUI asks nothing more
    # layer split, nothing streamed: the two shares are the whole model
    assert sum(e["model_size"] for e in shares.values()) == results["model_bytes"]
    assert shares["cuda1"]["model_size"] < results["model_bytes"]
    # the placed MODEL's own patcher asks ComfyUI for no device memory: the shares do
    assert main_patcher(probe["view"]) and all(e["model_size"] == 0 and
                                               e["memory_required"] == 0
                                               for e in main_patcher(probe["view"]))
    assert r["session"]["main_model_size"] == 0
    assert r["session"]["shares"] == {n: {"planned": e["model_size"], "device": "cpu"}
                                      for n, e in shares.items()}
    assert r["image"]["equal"], r["image"]


def test_after_a_run_nothing_is_held_and_the_next_run_asks_for_the_shares(results):
    r = results["split_view"]
    after = mine(r["after_run"], r["probe"]["session_id"])
    assert sorted(after) == ["cuda0", "cuda1"]
    for name, e in after.items():
        assert e["loaded_size"] == 0
        # what load_models_gpu adds for this device before the next run
        assert e["memory_required"] == e["model_size"] == r["session"]["shares"][name]["planned"]
    for name, d in r["session"]["devices"].items():
        assert d["resident"] == 0 and d["slots"] == 0, (name, d)
    assert not r["session"]["open"]


def test_free_memory_mid_run_releases_the_engine_and_the_image_is_unchanged(results):
    r = results["split_free"]
    ran(r)
    probe = r["probe"]
    assert probe["open"] and sum(probe["ledger"].values()) > 0
    assert probe["unloaded"] == ["EngineClaim", "EngineClaim"]   # only the shares
    after = probe["after"]
    assert not after["open"] and after["ledger"] == {}
    assert after["releases"], after
    assert mine(after["view"], probe["session_id"]) == {}
    assert main_patcher(after["view"])                  # the sampling model stays loaded
    assert r["session"]["runs"] == probe["runs"] + 1    # placed again at the next call
    for name, d in r["session"]["devices"].items():
        assert d["resident"] == 0 and d["slots"] == 0, (name, d)
    assert r["image"]["equal"], r["image"]
    # the call finished on ComfyUI's cast path: a runtime fallback the node shows
    [fell] = cast_path_fallbacks(r, "diffusion")
    assert fell["device"] in ("cuda0", "cuda1") and fell["device"] in after["releases"]
    assert fell["planned"] == "placed by the pack's engine on cuda0&cuda1"
    assert fell["ran"] == "ComfyUI's cast path from the resting weights"
    assert cast_path_fallbacks(results["split_view"], "diffusion") == []   # none asked


def test_unload_all_models_then_the_same_placement_runs_again(results):
    assert results["after_unload_all"]["view"] == []
    assert not results["after_unload_all"]["session"]["open"]
    r = results["split_rerun"]
    ran(r)
    shares = mine(r["probe"]["view"], r["probe"]["session_id"])
    assert sorted(shares) == ["cuda0", "cuda1"]
    assert all(e["loaded_size"] == e["model_size"] > 0 for e in shares.values())
    assert r["image"]["equal"], r["image"]


def test_streamed_share_partial_unload(results):
    r = results["stream_partial"]
    ran(r)
    probe = r["probe"]
    shares = mine(probe["view"], probe["session_id"])
    assert list(shares) == ["cuda0"]
    share = shares["cuda0"]
    # resident blocks + ring slots: what the ledger holds, at most the model (with no
    # budget the prefix fills what the rehearsed working memory leaves, up to all blocks
    # but the last, whose ring slot then makes the whole model)
    assert share["model_size"] == probe["ledger"]["cuda0"] > 0
    assert share["model_size"] <= results["model_bytes"]
    # ComfyUI's model_unload asking for 1 KiB: freed by the engine, entry kept
    assert probe["model_unload"] == [False]
    after = probe["after"]
    assert mine(after["view"], probe["session_id"])["cuda0"]["loaded_size"] == 0
    assert after["ledger"] == {} and after["releases"] == ["cuda0"]
    assert r["session"]["devices"]["cuda0"]["resident"] == 0
    assert r["session"]["runs"] == probe["runs"] + 1    # placed again at the next call
    assert r["image"]["equal"], r["image"]


def test_row_split_shares_match_the_ledger(results):
    r = results["row_view"]
    ran(r)
    probe = r["probe"]
    shares = mine(probe["view"], probe["session_id"])
    assert sorted(shares) == ["cuda0", "cuda1"]
    for name, e in shares.items():
        assert e["model_size"] == probe["ledger"][name] > 0, (name, e, probe["ledger"])
    assert r["image"]["max_abs_diff"] <= 1e-4, r["image"]


def test_the_given_model_is_unchanged(results):
    assert results["original_unchanged"]
    assert results["original_weights_unchanged"]
    assert results["original_additional_models"] == []


def test_auto_fit_shares_follow_the_planner(results):
    r = results["fit_view"]
    ran(r)
    fit = r["session"]["fit"]
    assert fit and fit["held_bytes"], r["session"]
    probe = r["probe"]
    shares = mine(probe["view"], probe["session_id"])
    assert shares and set(shares) <= set(fit["held_bytes"])
    for name, e in shares.items():
        # the planner's held bytes less its headroom, and what the engine really holds
        assert e["model_size"] == fit["held_bytes"][name] - fit["headroom_bytes"], (e, fit)
        assert e["model_size"] == probe["ledger"][name], (e, probe["ledger"])
    assert r["image"]["equal"], r["image"]


# -- the text encoder and the VAE, placed by the engine per call -----------------------------
def call_shares(r):
    probe = r["probe"]
    assert probe, "the probe saw no engine call with its placement open"
    return probe, mine(probe["view"], probe["session_id"])


def test_te_split_shares_are_listed_per_device_while_an_encode_runs(results):
    r = results["te_view"]
    ran(r)
    probe, shares = call_shares(r)
    assert sorted(shares) == ["cuda0", "cuda1"]
    for name, e in shares.items():
        assert e["component"] == "te" and e["device"] == "cpu"   # simulated: torch cpu
        # the planned share is what the engine's ledger holds there during the call
        assert e["model_size"] == probe["ledger"][name] > 0, (name, e, probe["ledger"])
        assert e["loaded_size"] == e["model_size"]
    # layer split, nothing streamed: the shares are the whole text encoder
    assert sum(e["model_size"] for e in shares.values()) == r["session"]["module_bytes"]
    # the placed CLIP's own patcher, loaded by CLIP.load_model with them, asks for nothing
    main = [e for e in probe["view"] if e["session_id"] == probe["session_id"]
            and not e["share"]]
    assert len(main) == 1 and main[0]["model_size"] == 0 and main[0]["memory_required"] == 0
    assert r["session"]["main_model_size"] == 0
    assert r["session"]["shares"] == {n: {"planned": e["model_size"], "device": "cpu"}
                                      for n, e in shares.items()}
    # between calls the shares stay listed, holding nothing, asking their size again
    after = mine(r["after_run"], probe["session_id"])
    assert sorted(after) == ["cuda0", "cuda1"]
    assert all(e["loaded_size"] == 0 and e["memory_required"] == e["model_size"]
               for e in after.values())
    assert [c["outcome"] for c in r["session"]["calls"]] == ["ok", "ok"]   # two encodes
    assert not r["session"]["open"] and not r["session"]["releases"]
    assert r["image"]["equal"], r["image"]


def test_free_memory_during_an_encode_releases_the_te_and_the_image_is_unchanged(results):
    r = results["te_free"]
    ran(r)
    probe, shares = call_shares(r)
    assert sorted(shares) == ["cuda0", "cuda1"] and sum(probe["ledger"].values()) > 0
    assert probe["unloaded"] == ["EngineClaim", "EngineClaim"]   # only the te shares
    after = probe["after"]
    assert not after["open"] and after["ledger"] == {} and after["releases"], after
    assert mine(after["view"], probe["session_id"]) == {}
    calls = r["session"]["calls"]
    # the released encode finished from the resting weights; the next placed again
    assert [c["outcome"] for c in calls] == ["ok", "ok"]
    assert all(v == 0 for c in calls for v in c["held"].values()), calls
    assert all(c["peak"]["cuda0"] > 0 for c in calls), calls
    assert r["image"]["equal"], r["image"]
    # the released encode is a runtime fallback on the node (the te's calls are read too)
    [fell] = cast_path_fallbacks(r, "te")
    assert fell["device"] in after["releases"] and "encode_token_weights" in fell["why"]
    assert cast_path_fallbacks(results["te_view"], "te") == []


def test_vae_share_and_partial_unload_during_a_decode(results):
    r = results["vae_partial"]
    ran(r)
    probe, shares = call_shares(r)
    assert list(shares) == ["cuda0"]
    share = shares["cuda0"]
    assert share["component"] == "vae"
    # the whole VAE, as the engine's ledger holds it for the decode
    assert share["model_size"] == probe["ledger"]["cuda0"] == r["session"]["module_bytes"]
    assert r["session"]["main_model_size"] == 0
    # VAE.decode sizes its batches after the load and before the engine places the
    # weights: the room they will take is not reported free (the patcher's get_free_memory)
    assert r["session"]["withheld_from_batches"] == share["model_size"]
    # ComfyUI's model_unload asking for 1 KiB: the engine frees it all, the entry stays
    assert probe["model_unload"] == [False]
    after = probe["after"]
    assert after["ledger"] == {} and after["releases"] == ["cuda0"], after
    assert mine(after["view"], probe["session_id"])["cuda0"]["loaded_size"] == 0
    assert r["image"]["equal"], r["image"]
    # the decode finished on ComfyUI's cast path: in the decode's measured record
    [fell] = cast_path_fallbacks(r, "vae")
    assert fell["device"] == "cuda0" and "decode" in fell["why"]


def test_unload_all_models_drops_the_te_and_vae_shares(results):
    r = results["te_vae_unload_all"]
    assert any(e["share"] and e["component"] in ("te", "vae") for e in r["before"])
    assert r["after"] == []


def test_the_given_clip_and_vae_are_unchanged(results):
    assert results["original_clip_unchanged"]
    assert results["original_vae_unchanged"]


def test_auto_fit_te_share_follows_the_planner(results):
    r = results["te_fit"]
    ran(r)
    fit = r["fit"]
    assert fit and fit["held_bytes"], r
    probe, shares = call_shares(r)
    assert shares and set(shares) <= set(fit["held_bytes"])
    for name, e in shares.items():
        assert e["model_size"] == fit["held_bytes"][name] - fit["headroom_bytes"], (e, fit)
        assert e["model_size"] == probe["ledger"][name], (e, probe["ledger"])
    assert r["image"]["equal"], r["image"]


def test_placing_a_placed_clip_again_keeps_only_the_new_plans_shares(results):
    again = results["te_placed_again"]
    plain, engine = again["plain"], again["engine"]
    # ComfyUI's own patcher: no engine class, no shares, nothing loaded along with it
    assert plain["class"] == "ModelPatcher" and plain["shares"] == [] \
        and plain["loaded_with"] == []
    # the engine again: one share, of the new session, loaded with the patcher
    assert engine["session"] != engine["old_session"]
    assert engine["shares"] == [["cuda1", engine["session"]]]
    assert engine["loaded_with"] == ["EngineClaim"]
