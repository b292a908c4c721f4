"""The auto-fit planner, piece by piece: stream prefix, proportional ranges, presets,
explicit choices, phases, host RAM, cost-model overrides and the errors."""
import json

import pytest

from comfyui_placement.placement import Inventory, PlacementError
from comfyui_placement.placement.components import COMPONENTS
from comfyui_placement.placement.fit import FitOptions, fit, stream_prefix
from comfyui_placement.placement.fit.geometry import Geometry
from comfyui_placement.placement.fit.kinds.layer_split import layer_ranges
from comfyui_placement.placement.metadata.info import BlockInfo, ComponentInfo
from comfyui_placement.placement.resolve import Choice, Request

GiB = 1 << 30
MiB = 1 << 20


def info(comp, n_blocks, block, non_block=0, headroom=0, sizes=None):
    sizes = sizes or [block] * n_blocks
    blocks = tuple(BlockInfo(f"blocks.{i}", s, "blocks", i) for i, s in enumerate(sizes))
    return ComponentInfo(comp, non_block + sum(sizes), blocks, arch="test", dtype="bf16",
                         headroom_bytes=headroom)


def request(budgets=None, **choices):
    full = {c: Choice(None, None, None) for c in COMPONENTS}
    full.update(choices)
    return Request(full, budgets or {}, False, [])


def run(inv, infos, req=None, **options):
    return fit(req or request(), Inventory.simulated(inv), infos, FitOptions(**options))


# -- stream prefix --------------------------------------------------------------------------

def _brute_prefix(sizes, non_block, headroom, budget, depth):
    best = None
    for k in range(len(sizes)):
        rest = sizes[k:]                # the byte ring: most bytes of w cyclic neighbours
        w = min(depth, len(rest) - 1) + 1
        slots = max(sum(rest[(p + i) % len(rest)] for i in range(w)) for p in range(len(rest)))
        if non_block + sum(sizes[:k]) + slots + headroom <= budget:
            best = k
    return best


@pytest.mark.parametrize("budget_gib", [1, 2.5, 3, 5, 7.9, 12])
@pytest.mark.parametrize("depth", [0, 1, 2])
def test_stream_prefix_is_the_largest_that_fits(budget_gib, depth):
    sizes = [700 * MiB] * 6 + [300 * MiB] * 12         # big blocks first, like Flux
    i = info("diffusion", 0, 0, non_block=100 * MiB, headroom=GiB, sizes=sizes)
    budget = int(budget_gib * GiB)
    k, streamed, resident = stream_prefix(i, budget, depth)
    expect = _brute_prefix(sizes, 100 * MiB, GiB, budget, depth)
    assert k == (expect or 0)
    assert resident == 100 * MiB + sum(sizes[:k])
    assert streamed == sum(sizes[k:])
    if expect is not None:
        assert resident + Geometry(i).window(k, depth) + GiB <= budget


def test_stream_prefix_window_uses_only_streamed_blocks():
    # once the big blocks are resident, the slots are sized by the small ones
    sizes = [1000 * MiB] * 2 + [100 * MiB] * 10
    i = info("diffusion", 0, 0, headroom=0, sizes=sizes)
    # 2 big + 7 small resident, 3 streamed through 2 slots of 100 MiB (not 2 x 1000 MiB)
    k, _, _ = stream_prefix(i, 2000 * MiB + 7 * 100 * MiB + 2 * 100 * MiB, 1)
    assert k == 9
    # a single streamed block needs a single slot
    k, _, _ = stream_prefix(i, 2000 * MiB + 9 * 100 * MiB + 100 * MiB, 1)
    assert k == 11


# -- layer ranges -------------------------------------------------------------------------------

def test_layer_ranges_are_proportional_not_fill_first():
    geo = Geometry(info("diffusion", 40, 100 * MiB, non_block=0))
    spans = layer_ranges(geo, [40 * 100 * MiB, 40 * 100 * MiB])     # room for all on either
    assert spans == [(0, 20), (20, 40)]        # half each: stable-diffusion.cpp puts all on 0


def test_layer_ranges_main_device_holds_non_block_weights():
    geo = Geometry(info("diffusion", 10, GiB, non_block=2 * GiB))
    spans = layer_ranges(geo, [6 * GiB, 6 * GiB])
    held0 = 2 * GiB + (spans[0][1] - spans[0][0]) * GiB
    held1 = (spans[1][1] - spans[1][0]) * GiB
    assert held0 == held1 == 6 * GiB


def test_layer_ranges_respect_caps_and_refuse_the_impossible():
    geo = Geometry(info("diffusion", 10, GiB))
    assert layer_ranges(geo, [GiB * 4.5, GiB * 4.5]) is None
    spans = layer_ranges(geo, [8 * GiB, 2 * GiB])
    assert spans == [(0, 8), (8, 10)]
    # a device with no room gets nothing
    spans = layer_ranges(geo, [10 * GiB, 0])
    assert spans[1][0] == spans[1][1]


# -- the planner's passes ------------------------------------------------------------------

def test_all_resident_largest_first_to_the_roomiest_device():
    infos = {"diffusion": info("diffusion", 10, GiB, headroom=GiB),
             "te": info("te", 4, GiB, headroom=GiB), "vae": info("vae", 2, 64 * MiB, headroom=GiB)}
    p = run("cuda0=16GiB,cuda1=12GiB,cpu=64GiB", infos)
    d, t = p.components["diffusion"], p.components["te"]
    assert (d.runtime, d.params, d.stream) == (["cuda0"], "cuda0", None)
    assert (t.runtime, t.params) == (["cuda1"], "cuda1")
    assert p.extra["fit"]["predicted"]["traffic_bytes_per_generation"] == 0
    for dev in p.devices:
        assert dev.planned_bytes <= dev.budget_bytes


def test_phases_take_turns_on_one_device():
    # 9 + 9 GiB with 1 GiB working memory each on an 11.5 GiB budget: not together, and
    # the text encoder's 3 GiB blocks cannot stream beside a resident diffusion model; but
    # encode and sample never run at once, so each gets the whole GPU in its phase
    infos = {"diffusion": info("diffusion", 9, GiB, headroom=GiB),
             "te": info("te", 3, 3 * GiB, headroom=GiB)}
    p = run("cuda0=12GiB,cpu=64GiB", infos)
    table = {row["name"]: row for row in p.extra["device_table"]}
    phases = table["cuda0"]["phases"]
    assert phases["encode"] <= 11.5 * GiB and phases["sample"] <= 11.5 * GiB
    assert phases["encode"] + phases["sample"] > 11.5 * GiB        # would not fit summed
    for comp in ("diffusion", "te"):
        cp = p.components[comp]
        assert cp.runtime == ["cuda0"] and cp.params == "cpu"
    assert "only then" in p.components["diffusion"].reasons[-1]


def test_a_component_stays_resident_when_the_other_phase_can_stream_beside_it():
    # 7 + 7 GiB: keeping the diffusion model (every step) and streaming the text encoder
    # (once) beats loading the diffusion model every generation
    infos = {"diffusion": info("diffusion", 7, GiB, headroom=GiB),
             "te": info("te", 7, GiB, headroom=GiB)}
    p = run("cuda0=12GiB,cpu=64GiB", infos)
    assert p.components["diffusion"].params == "cuda0"
    te = p.components["te"]
    assert te.params == "cpu" and te.stream is not None
    phases = next(r for r in p.extra["device_table"] if r["name"] == "cuda0")["phases"]
    assert phases["encode"] <= 11.5 * GiB


def test_streaming_when_too_big_and_reason_in_words():
    infos = {"diffusion": info("diffusion", 24, 500 * MiB, non_block=200 * MiB, headroom=GiB)}
    p = run("cuda0=8GiB,cpu=64GiB", infos)
    cp = p.components["diffusion"]
    assert cp.stream is not None and cp.params == "cpu" and cp.runtime == ["cuda0"]
    k = cp.stream.resident_blocks
    assert 0 < k < 24
    assert cp.resident_bytes == 200 * MiB + k * 500 * MiB
    assert cp.streamed_bytes == (24 - k) * 500 * MiB
    reason = cp.reasons[-1]
    assert f"{k} of 24 blocks resident" in reason and "streamed on cuda0" in reason
    assert "per step streamed" in reason


def test_split_over_gpus_when_no_single_one_holds_it():
    infos = {"diffusion": info("diffusion", 20, GiB, headroom=GiB)}
    p = run("cuda0=16GiB,cuda1=16GiB,cpu=64GiB", infos)
    cp = p.components["diffusion"]
    assert cp.runtime == ["cuda0", "cuda1"] and cp.params == "cuda0" and cp.stream is None
    assert cp.blocks == {"cuda0": [0, 9], "cuda1": [10, 19]}
    assert p.extra["fit"]["components"]["diffusion"]["hops"] == 2


def test_zero_budget_device_gets_nothing():
    infos = {"diffusion": info("diffusion", 20, GiB, headroom=GiB)}
    p = run("cuda0=16GiB,cuda1=16GiB,cuda2=16GiB,cpu=64GiB", infos,
            request(budgets={"cuda1": 0}))
    assert p.device("cuda1").planned_bytes == 0
    assert "cuda1" not in p.components["diffusion"].runtime


def test_row_split_only_when_asked():
    infos = {"diffusion": info("diffusion", 20, GiB, headroom=GiB)}
    p = run("cuda0=16GiB,cuda1=16GiB,cpu=64GiB", infos,
            request(diffusion=Choice(None, None, "row")))
    cp = p.components["diffusion"]
    assert cp.split_mode == "row" and cp.runtime == ["cuda0", "cuda1"] and cp.blocks == {}
    assert "row split" in cp.reasons[-1]


def test_cpu_is_the_last_resort():
    infos = {"diffusion": info("diffusion", 4, GiB, headroom=GiB)}
    p = run("cuda0=2GiB,cpu=64GiB", infos)
    cp = p.components["diffusion"]
    assert cp.runtime == ["cpu"] and cp.params == "cpu"
    assert "last resort" in cp.reasons[-1]


def test_params_go_to_disk_only_when_host_ram_cannot_hold_them():
    infos = {"diffusion": info("diffusion", 20, GiB, headroom=GiB),
             "te": info("te", 8, GiB, headroom=GiB)}
    roomy = run("cuda0=12GiB,cpu=64GiB", infos)
    assert {cp.params for cp in roomy.components.values() if cp.present} <= {"cpu", "cuda0"}
    tight = run("cuda0=8GiB,cpu=64GiB", infos, host_budget=21 * GiB)
    params = {c: cp.params for c, cp in tight.components.items() if cp.present}
    assert "disk" in params.values()
    # the text encoder runs once per generation, the diffusion model every step: the
    # cheaper one to re-read goes to disk
    assert params["te"] == "disk" and params["diffusion"] == "cpu"
    assert any("host RAM budget" in r for r in tight.components["te"].reasons)
    assert tight.device("cpu").planned_bytes <= 21 * GiB


# -- explicit choices are kept ------------------------------------------------------------------

def test_explicit_choices_are_kept_and_the_rest_decided():
    infos = {"diffusion": info("diffusion", 10, GiB, headroom=GiB),
             "te": info("te", 4, GiB, headroom=GiB), "vae": info("vae", 2, 64 * MiB, headroom=GiB)}
    req = request(te=Choice(["cpu"], None, None), vae=Choice(None, "disk", None))
    p = run("cuda0=24GiB,cpu=64GiB", infos, req)
    assert p.components["te"].runtime == ["cpu"]
    assert p.components["vae"].params == "disk"
    assert p.components["vae"].runtime == ["cuda0"]
    assert p.components["diffusion"].runtime == ["cuda0"]
    assert "(asked)" in p.components["te"].reasons[0]


def test_explicit_split_keeps_its_device_order():
    infos = {"diffusion": info("diffusion", 20, GiB, headroom=GiB)}
    p = run("cuda0=16GiB,cuda1=24GiB,cpu=64GiB", infos,
            request(diffusion=Choice(["cuda0", "cuda1"], None, None)))
    cp = p.components["diffusion"]
    assert cp.runtime == ["cuda0", "cuda1"] and list(cp.blocks) == ["cuda0", "cuda1"]


def test_explicit_placement_that_cannot_fit_is_an_error():
    infos = {"diffusion": info("diffusion", 20, GiB, headroom=GiB)}
    with pytest.raises(PlacementError, match="as asked"):
        run("cuda0=12GiB,cpu=64GiB", infos, request(diffusion=Choice(["cuda0"], "cuda0", None)))


# -- presets ---------------------------------------------------------------------------------

def _set():
    return {"diffusion": info("diffusion", 10, GiB, headroom=GiB),
            "te": info("te", 6, GiB, headroom=GiB), "vae": info("vae", 2, 64 * MiB, headroom=GiB)}


def test_preset_none_is_resident_or_error():
    p = run("cuda0=24GiB,cpu=64GiB", _set(), offload_mode="none")
    assert all(cp.params == "cuda0" and cp.stream is None
               for cp in p.components.values() if cp.present)
    with pytest.raises(PlacementError, match="not together under offload_mode none; it would "
                                             "fit with 5.63 GiB more on the GPU"):
        run("cuda0=12GiB,cpu=64GiB", _set(), offload_mode="none")
    with pytest.raises(PlacementError, match="offload_mode none.*short by"):
        run("cuda0=8GiB,cpu=64GiB", _set(), offload_mode="none")


def test_preset_model_takes_turns_with_whole_components():
    p = run("cuda0=24GiB,cpu=64GiB", _set(), offload_mode="model")
    for cp in (c for c in p.components.values() if c.present):
        assert cp.params == "cpu" and cp.stream is None and cp.runtime == ["cuda0"]
    with pytest.raises(PlacementError, match="offload_mode model"):
        run("cuda0=8GiB,cpu=64GiB", _set(), offload_mode="model")


def test_preset_sequential_streams_every_block():
    p = run("cuda0=24GiB,cpu=64GiB", _set(), offload_mode="sequential")
    for cp in (c for c in p.components.values() if c.present):
        assert cp.stream is not None and cp.stream.resident_blocks == 0
        assert cp.streamed_bytes == cp.total_bytes - cp.resident_bytes


def test_preset_balanced_keeps_planned_use_under_the_threshold():
    p = run("cuda0=24GiB,cpu=64GiB", _set(), offload_mode="balanced")
    assert p.device("cuda0").room_bytes == int(0.75 * 24 * GiB)
    assert p.device("cuda0").planned_bytes <= 0.75 * 24 * GiB
    low = run("cuda0=24GiB,cpu=64GiB", _set(), offload_mode="balanced", balanced_threshold=0.4)
    assert low.device("cuda0").planned_bytes <= 0.4 * 24 * GiB
    # under the threshold nothing is offloaded: the same plan as auto
    small = {"vae": info("vae", 2, 64 * MiB, headroom=GiB)}
    assert run("cuda0=24GiB,cpu=64GiB", small, offload_mode="balanced").components["vae"].params \
        == "cuda0"


# -- cost model ---------------------------------------------------------------------------------

def test_a_slow_link_moves_work_to_the_device_with_the_fast_one():
    infos = {"diffusion": info("diffusion", 30, GiB, headroom=GiB)}     # no split holds it
    fast = run("cuda0=12GiB,cuda1=12GiB,cpu=64GiB", infos, bandwidth={"cuda0": 2e9})
    assert fast.components["diffusion"].runtime == ["cuda1"]
    fast = run("cuda0=12GiB,cuda1=12GiB,cpu=64GiB", infos, bandwidth={"cuda1": 2e9})
    assert fast.components["diffusion"].runtime == ["cuda0"]


def test_faster_gpu_takes_the_main_component_and_time_reflects_it():
    infos = {"diffusion": info("diffusion", 8, GiB, headroom=GiB)}
    p = run("cuda0=16GiB,cuda1=16GiB,cpu=64GiB", infos, throughput={"cuda1": 200e12})
    assert p.components["diffusion"].runtime == ["cuda1"]
    slow = run("cuda0=16GiB,cpu=64GiB", infos, throughput={"gpu": 20e12})
    fastp = run("cuda0=16GiB,cpu=64GiB", infos, throughput={"gpu": 200e12})
    assert slow.extra["fit"]["predicted"]["generation_s"] > \
        fastp.extra["fit"]["predicted"]["generation_s"]


def test_ties_prefer_fewer_hops():
    # fits one GPU whole or split over two at the same compute: no split
    infos = {"diffusion": info("diffusion", 8, GiB, headroom=GiB)}
    p = run("cuda0=16GiB,cuda1=16GiB,cpu=64GiB", infos)
    assert p.components["diffusion"].runtime in (["cuda0"], ["cuda1"])


# -- report, options, errors -----------------------------------------------------------------

def test_device_table_like_llama_fit():
    p = run("cuda0=12GiB,cpu=64GiB", _set())
    row = next(r for r in p.extra["device_table"] if r["name"] == "cuda0")
    assert set(row) >= {"total_bytes", "free_bytes", "budget_bytes", "planned_bytes",
                        "headroom_bytes", "deficit_bytes", "slack_bytes", "phases"}
    assert row["budget_bytes"] == 12 * GiB - 512 * MiB
    assert row["planned_bytes"] == p.device("cuda0").planned_bytes
    assert row["deficit_bytes"] == 0 and row["slack_bytes"] >= 0
    json.loads(p.to_json())                  # the extras are JSON


def test_budget_from_max_vram_and_free_memory():
    p = run("cuda0=24GiB/10GiB,cuda1=24GiB,cpu=64GiB", _set(),
            request(budgets={"cuda1": 6 * GiB}))
    assert p.device("cuda0").room_bytes == 10 * GiB - 512 * MiB
    # a budget keeps the margin inside it too: 512 MiB, at most a sixteenth of it
    assert p.device("cuda1").room_bytes == 6 * GiB - 6 * GiB // 16
    assert p.device("cuda1").budget_bytes == 6 * GiB     # as asked, the margin inside it


def test_nothing_fits_says_by_how_much():
    infos = {"diffusion": info("diffusion", 30, GiB, headroom=GiB),
             "te": info("te", 10, GiB, headroom=GiB)}
    req = request(diffusion=Choice(["cuda0"], "cuda0", None))
    with pytest.raises(PlacementError) as err:
        run("cuda0=24GiB,cpu=64GiB", infos, req)
    text = str(err.value)
    assert "\n" not in text
    assert "diffusion (30.00 GiB) fits nowhere under offload_mode auto as asked" in text
    assert "needs at least 31.00 GiB" in text and "short by 7.50 GiB" in text


def test_components_that_fit_alone_but_not_together():
    # per phase: 10 + 14 GiB of weights + 1 GiB working memory on a 23.5 GiB budget
    infos = {"diffusion": info("diffusion", 10, GiB, headroom=GiB),
             "te": info("te", 14, GiB, headroom=GiB)}
    req = request(diffusion=Choice(["cuda0"], "cuda0", None), te=Choice(["cuda0"], "cuda0", None))
    with pytest.raises(PlacementError,
                       match=r"one at a time but not together.*with 1\.50 GiB more"):
        run("cuda0=24GiB,cpu=64GiB", infos, req)
    run("cuda0=25.5GiB,cpu=64GiB", infos, req)


@pytest.mark.parametrize("mode", ["auto", "none", "model", "balanced", "sequential"])
def test_without_a_gpu_every_preset_computes_on_the_cpu(mode):
    p = run("cpu=64GiB", _set(), offload_mode=mode)
    assert all(cp.runtime == ["cpu"] for cp in p.components.values() if cp.present)


def test_host_ram_too_small_for_cpu_runtime():
    infos = {"diffusion": info("diffusion", 10, GiB, headroom=GiB)}
    with pytest.raises(PlacementError, match="host RAM"):
        run("cpu=8GiB", infos)


@pytest.mark.parametrize("bad", [dict(offload_mode="fast"), dict(balanced_threshold=1.5),
                                 dict(prefetch_depth=-1), dict(steps=0),
                                 dict(resolution=(0, 5)), dict(headroom={"dit2": 1}),
                                 dict(throughput={"gpu": 0})])
def test_bad_options_are_one_line_errors(bad):
    with pytest.raises(PlacementError) as err:
        run("cuda0=24GiB,cpu=64GiB", _set(), **bad)
    assert "\n" not in str(err.value)


def test_empty_set_plans_nothing():
    p = run("cuda0=24GiB,cpu=64GiB", {})
    assert not any(cp.present for cp in p.components.values())
    assert p.device("cuda0").planned_bytes == 0


def test_through_the_public_plan_function():
    from comfyui_placement.placement import PlacementSpec, plan
    p = plan(PlacementSpec(auto_fit=True, backend="te=cpu"),
             Inventory.simulated("cuda0=12GiB,cpu=64GiB"), components=_set())
    assert p.components["te"].runtime == ["cpu"]
    assert p.components["diffusion"].present
    assert "device_table" in p.extra
