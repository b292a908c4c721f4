"""Budget edges: exactly at capacity passes, one byte over fails, for the ledger, the
planner's room (stream prefix, layer ranges, a range's prefix) and the runtimes that
enforce them (a streamed placement, a layer split)."""
import pytest
import torch

from comfyui_placement.placement.devices import Inventory
from comfyui_placement.placement.fit.geometry import Geometry
from comfyui_placement.placement.fit.kinds.layer_split import layer_ranges
from comfyui_placement.placement.metadata.info import BlockInfo, ComponentInfo
from comfyui_placement.placement.plan import ComponentPlan, DevicePlan, Plan
from comfyui_placement.runtime import place
from comfyui_placement.runtime.device.ledger import Ledger
from comfyui_placement.runtime.split import place_split

SIZES = [700, 300, 500, 900, 400, 600]
NON_BLOCK = 250


def geometry(sizes=SIZES, non_block=NON_BLOCK):
    blocks = tuple(BlockInfo(f"blocks.{i}", s, "blocks", i) for i, s in enumerate(sizes))
    info = ComponentInfo("diffusion", non_block + sum(sizes), blocks, headroom_bytes=0)
    return Geometry(info)


@pytest.mark.parametrize("category", ["resident", "slots", "activations"])
def test_ledger_exactly_at_capacity_passes_one_byte_over_fails(category):
    ledger = Ledger("cuda0", 1000)
    ledger.reserve("resident", 400, "weights")
    if category == "activations":
        ledger.set_activations(600)               # exactly full
        with pytest.raises(torch.OutOfMemoryError):
            ledger.set_activations(601)
    else:
        ledger.reserve(category, 600, "x")        # exactly full
        with pytest.raises(torch.OutOfMemoryError):
            ledger.reserve(category, 1, "one byte more")
    assert ledger.total == 1000 and ledger.peak_bytes == 1000


@pytest.mark.parametrize("depth", [0, 1, 2])
def test_stream_prefix_room_edge(depth):
    geo = geometry()
    for k in range(geo.n):
        need = geo.stream_weights(k, depth)
        # the prefix chosen for exactly `need` streams at most n-1 blocks and fits it
        got = geo.best_prefix(need, depth)
        assert got is not None and got >= k and geo.stream_weights(got, depth) <= need
        below = geo.best_prefix(need - 1, depth)
        assert below is None or geo.stream_weights(below, depth) <= need - 1
    least = min(geo.stream_weights(k, depth) for k in range(geo.n))
    assert geo.best_prefix(least, depth) is not None
    assert geo.best_prefix(least - 1, depth) is None


@pytest.mark.parametrize("depth", [0, 1, 3])
def test_range_prefix_room_edge(depth):
    geo = geometry()
    start, end = 1, 5
    whole = geo.prefix[end] - geo.prefix[start]
    assert geo.range_prefix(start, end, whole, depth) == end - start   # all resident
    short = geo.range_prefix(start, end, whole - 1, depth)
    assert short is None or short < end - start
    for k in range(end - start):
        room = geo.prefix[start + k] - geo.prefix[start] + geo.range_window(start + k, end, depth)
        got = geo.range_prefix(start, end, room, depth)
        assert got is not None and got >= k
        below = geo.range_prefix(start, end, room - 1, depth)
        if below is not None:
            assert (geo.prefix[start + below] - geo.prefix[start]
                    + geo.range_window(start + below, end, depth)) <= room - 1


def test_layer_ranges_caps_edge():
    geo = geometry()
    total = NON_BLOCK + sum(SIZES)
    for cut in range(1, len(SIZES)):
        first = NON_BLOCK + sum(SIZES[:cut])      # exactly what each side needs
        second = sum(SIZES[cut:])
        ranges = layer_ranges(geo, [first, second])
        assert ranges == [(0, cut), (cut, len(SIZES))]
        assert layer_ranges(geo, [first - 1, second]) != [(0, cut), (cut, len(SIZES))]
        assert layer_ranges(geo, [first, second - 1]) != [(0, cut), (cut, len(SIZES))]
    assert layer_ranges(geo, [total]) == [(0, len(SIZES))]
    assert layer_ranges(geo, [total - 1]) is None


def run_steps(model, inp, steps=2):
    with torch.no_grad():
        for _ in range(steps):
            out = model(**inp)[0]
    return out


@pytest.mark.parametrize("stream", [None, (0, 1), (2, 1)])
def test_placement_at_its_peak_passes_one_byte_less_fails(stream, tiny, plan_for,
                                                          sim_inventory):
    model, inp = tiny("flux")
    ref = run_steps(model, inp)
    with place(model, plan_for("cpu", stream=stream), "diffusion", sim_inventory) as placed:
        run_steps(model, inp)
    peak = placed.stats()["devices"]["cuda0"]["peak_bytes"]
    with place(model, plan_for("cpu", stream=stream, budget=peak), "diffusion",
               sim_inventory) as placed:
        assert torch.equal(run_steps(model, inp), ref)
    assert placed.stats()["devices"]["cuda0"]["peak_bytes"] == peak
    with pytest.raises(torch.OutOfMemoryError, match="cuda0: out of memory"):
        with place(model, plan_for("cpu", stream=stream, budget=peak - 1), "diffusion",
                   sim_inventory):
            run_steps(model, inp)


@pytest.mark.xfail(strict=True, reason=(
    "open: since the rehearsal keeps a call's few scalar inputs (the timesteps) on the host "
    "(runtime/measure/rehearse.py input_like), its first-call figure for cuda0 of this tiny Flux "
    "split is 2.5 KiB more than the run's metered peak, so a budget of exactly that peak is "
    "refused in one line (conservative: the budget is kept). strict: it fails once fixed"))
def test_layer_split_at_its_peaks_passes_one_byte_less_fails(tiny, sim_inventory):
    model, inp = tiny("flux")
    ref = run_steps(model, inp)

    def split_plan(budgets):
        devices = [DevicePlan(n, "gpu", 256 << 20, 256 << 20, b)
                   for n, b in zip(["cuda0", "cuda1"], budgets)]
        return Plan(devices, {"diffusion": ComponentPlan("diffusion", ["cuda0", "cuda1"],
                                                         "cpu")})

    with place_split(model, split_plan([None, None]), "diffusion", sim_inventory,
                     headroom_bytes=0) as placed:
        run_steps(model, inp)
    stats = placed.stats()
    ranges = stats["ranges"]
    peaks = [stats["devices"][n]["peak_bytes"] for n in ("cuda0", "cuda1")]
    with place_split(model, split_plan(peaks), "diffusion", sim_inventory,
                     headroom_bytes=0) as placed:
        out = run_steps(model, inp)
    assert placed.stats()["ranges"] == ranges
    assert torch.allclose(out, ref, atol=1e-5)
    for i in range(2):
        less = list(peaks)
        less[i] -= 1
        try:
            with place_split(model, split_plan(less), "diffusion", sim_inventory,
                             headroom_bytes=0) as placed:
                run_steps(model, inp)
        except (torch.OutOfMemoryError, ValueError):
            continue                              # refused or out of memory: the edge holds
        # it ran: then the split moved, and every device stayed within its budget
        after = placed.stats()
        assert after["ranges"] != ranges
        for n, b in zip(("cuda0", "cuda1"), less):
            assert after["devices"][n]["peak_bytes"] <= b
