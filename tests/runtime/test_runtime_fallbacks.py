"""Nothing falls back in silence: every runtime fallback is a structured record in
`stats()["fallbacks"]` (runtime/engine/fallbacks.py), said once per placement, and the stats
count what moved, never what the plan said."""
import json
import warnings

import pytest
import torch

from comfyui_placement.placement.devices import Inventory
from comfyui_placement.placement.plan import ComponentPlan, DevicePlan, Plan, StreamPlan
from comfyui_placement.runtime.place import place

from conftest import make_plan

LINEAR_BYTES = 16 * 16 * 4 + 16 * 4
BLOCK_BYTES = 2 * LINEAR_BYTES          # a block of the stack: two Linears


class LoopStack(torch.nn.Module):
    """Eight blocks of two Linears whose forward loops over each block's layers itself
    (as ComfyUI's UNet does: the blocks' own forward never runs) and never calls the
    blocks named in `skip`."""

    def __init__(self, skip=(5,)):
        super().__init__()
        self.inp = torch.nn.Linear(16, 16)
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Linear(16, 16))
            for _ in range(8))
        self.head = torch.nn.Linear(16, 16)
        self.skip = set(skip)

    def forward(self, x):
        x = self.inp(x)
        for i, block in enumerate(self.blocks):
            if i in self.skip:
                continue
            for layer in block:
                x = torch.tanh(layer(x))
        return self.head(x)


class Ordered(torch.nn.Module):
    """Four Linear blocks run in `orders[min(forward, last)]`: a block twice, or another
    order after the first forward."""

    def __init__(self, *orders):
        super().__init__()
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(16, 16) for _ in range(4))
        self.head = torch.nn.Linear(16, 16)
        self.orders = orders
        self.calls = 0

    def forward(self, x):
        order = self.orders[min(self.calls, len(self.orders) - 1)]
        self.calls += 1
        for i in order:
            x = torch.tanh(self.blocks[i](x))
        return self.head(x)


def forwards(model, x, n):
    with torch.no_grad():
        return [model(x) for _ in range(n)]


def of_kind(stats, kind):
    return [f for f in stats["fallbacks"] if f["kind"] == kind]


def said(caught, kind_words):
    return [w for w in caught if issubclass(w.category, RuntimeWarning)
            and kind_words in str(w.message)]


@pytest.mark.parametrize("stream", [(0, 1), (2, 2)])
def test_a_block_that_never_runs_is_named_once_and_counted_nowhere(stream, sim_inventory):
    torch.manual_seed(0)
    model = LoopStack().eval()
    x = torch.randn(3, 16)
    ref = forwards(model, x, 1)[0]
    resident = stream[0]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with place(model, make_plan("cpu", stream=stream), "diffusion", sim_inventory) as placed:
            assert placed.stats()["fallbacks"] == []       # nothing has run yet
            outs = forwards(model, x, 2)
            h0 = placed.stats()["devices"]["cuda0"]["h2d_bytes"]
            outs += forwards(model, x, 1)
            placed.streamer.drain()
            stats = placed.stats()
            moved = stats["devices"]["cuda0"]["h2d_bytes"] - h0
    assert all(torch.equal(o, ref) for o in outs)
    assert stats["blocks_never_ran"] == ["blocks.5"]
    [record] = of_kind(stats, "block_never_ran")           # three forwards, said once
    assert record["blocks"] == ["blocks.5"] and record["component"] == "diffusion"
    assert record["planned"] == "8 blocks per forward"
    assert record["ran"] == "7 blocks per forward"
    assert len(said(caught, "blocks that never ran")) == 1
    # the streamed blocks that ran, and only they, moved: 8 - resident - 1 of them
    streamed_ran = 8 - resident - 1
    assert stats["streamed_bytes_per_forward"] == streamed_ran * BLOCK_BYTES
    assert moved == streamed_ran * BLOCK_BYTES
    # entered through their layers: every block that ran, not the one that did not
    assert stats["blocks_entered_by_units"] == 7
    json.dumps(stats["fallbacks"])                          # plain JSON


def test_a_block_that_never_runs_on_a_resident_placement_is_named(sim_inventory):
    torch.manual_seed(0)
    model = LoopStack(skip=(0, 7)).eval()
    x = torch.randn(3, 16)
    ref = forwards(model, x, 1)[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with place(model, make_plan("cpu"), "diffusion", sim_inventory) as placed:
            outs = forwards(model, x, 2)
    stats = placed.stats()                                  # kept after leaving
    assert all(torch.equal(o, ref) for o in outs)
    assert stats["blocks_never_ran"] == ["blocks.0", "blocks.7"]
    assert [f["blocks"] for f in of_kind(stats, "block_never_ran")] == [["blocks.0", "blocks.7"]]
    assert stats["streamed_bytes_per_forward"] == 0         # nothing streams


def test_every_block_runs_no_fallback(sim_inventory):
    torch.manual_seed(0)
    model = LoopStack(skip=()).eval()
    x = torch.randn(3, 16)
    with place(model, make_plan("cpu", stream=(0, 1)), "diffusion", sim_inventory) as placed:
        forwards(model, x, 2)
        stats = placed.stats()
    assert stats["fallbacks"] == [] and stats["blocks_never_ran"] == []
    assert stats["streamed_bytes_per_forward"] == 8 * BLOCK_BYTES
    assert stats["blocks_entered_by_units"] == 8


def test_a_block_run_twice_reports_synchronous_streaming(sim_inventory):
    torch.manual_seed(0)
    model = Ordered([0, 1, 2, 1, 3]).eval()
    x = torch.randn(3, 16)
    ref = forwards(model, x, 1)[0]
    with pytest.warns(RuntimeWarning, match="more than once per forward") as caught:
        with place(model, make_plan("cpu", stream=(0, 2)), "diffusion", sim_inventory) as placed:
            outs = forwards(model, x, 3)
            stats = placed.stats()
    assert all(torch.equal(o, ref) for o in outs)
    [record] = of_kind(stats, "synchronous_streaming")
    assert record["planned"] == "prefetch 2 blocks ahead in the ring"
    assert record["ran"] == "synchronous loads"
    assert record["device"] == "cuda0" and record["blocks"] == ["blocks.1"]
    assert len(said(caught, "streaming ran synchronously")) == 1
    # bytes that moved: block 1 arrives twice per forward
    assert stats["streamed_bytes_per_forward"] == 5 * LINEAR_BYTES


def test_a_later_forward_in_another_order_reports_synchronous_streaming(sim_inventory):
    torch.manual_seed(0)
    model = Ordered([0, 1, 2, 3], [3, 2, 1, 0]).eval()
    x = torch.randn(3, 16)
    with torch.no_grad():
        ref = [model(x) for _ in range(2)]
    model.calls = 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with place(model, make_plan("cpu", stream=(0, 1)), "diffusion", sim_inventory) as placed:
            first = forwards(model, x, 1)
            assert placed.stats()["fallbacks"] == []      # the first forward sets the order
            later = forwards(model, x, 3)
            stats = placed.stats()
    assert torch.equal(first[0], ref[0]) and all(torch.equal(o, ref[1]) for o in later)
    [record] = of_kind(stats, "synchronous_streaming")     # three forwards, said once
    assert record["blocks"] == ["blocks.3"] and "out of the order" in record["why"]
    assert len(said(caught, "streaming ran synchronously")) == 1


def split_plan(runtime, mode="layer", blocks=None, stream=None, budget=None):
    devices = [DevicePlan(n, "gpu", 256 << 20, 256 << 20, budget) for n in runtime]
    comp = ComponentPlan("diffusion", list(runtime), "cpu", split_mode=mode,
                         blocks=blocks or {},
                         stream=StreamPlan(*stream) if stream else None)
    return Plan(devices, {"diffusion": comp})


def test_a_row_split_of_small_matrices_reports_row_to_layer(tiny, run_model):
    model, inp = tiny("wan")                     # hidden size 16: no Linear to shard
    ref = run_model(model, inp)
    inv = Inventory.simulated("cuda0=256MiB,cuda1=256MiB")
    with pytest.warns(RuntimeWarning, match="using layer split instead"):
        placed = place(model, split_plan(["cuda0", "cuda1"], mode="row"), "diffusion", inv)
    with placed:
        assert torch.equal(run_model(model, inp), ref)
        assert torch.equal(run_model(model, inp), ref)
    stats = placed.stats()
    assert stats["split_mode"] == "layer"
    [record] = stats["fallbacks"]
    assert record["kind"] == "row_to_layer" and record["component"] == "diffusion"
    assert (record["planned"], record["ran"]) == ("row", "layer")
    assert "WanTransformer3DModel" in record["why"]


def test_a_row_split_that_shards_reports_nothing(tiny, run_model):
    model, inp = tiny("flux256")
    inv = Inventory.simulated("cuda0=256MiB,cuda1=256MiB")
    with place(model, split_plan(["cuda0", "cuda1"], mode="row"), "diffusion", inv) as placed:
        run_model(model, inp)
        stats = placed.stats()
    assert stats["split_mode"] == "row" and stats["fallbacks"] == []


def test_plan_ranges_that_do_not_match_the_module_report_plan_rederived(tiny, run_model):
    model, inp = tiny("sd3")                     # three blocks
    ref = run_model(model, inp)
    inv = Inventory.simulated("cuda0=256MiB,cuda1=256MiB")
    asked = {"cuda0": [0, 3], "cuda1": [4, 9]}
    with pytest.warns(RuntimeWarning, match="do not match the module's 3 blocks"):
        with place(model, split_plan(["cuda0", "cuda1"], blocks=asked), "diffusion",
                   inv) as placed:
            assert torch.equal(run_model(model, inp), ref)
    stats = placed.stats()
    [record] = of_kind(stats, "plan_rederived")
    assert record["field"] == "blocks"
    assert record["planned"] == asked
    assert record["ran"] == stats["ranges"]      # what ran, as the stats say it ran
    assert sum(b - a + 1 for a, b in record["ran"].values()) == 3


def test_plan_ranges_that_match_report_nothing(tiny, run_model):
    model, inp = tiny("sd3")
    inv = Inventory.simulated("cuda0=256MiB,cuda1=256MiB")
    with place(model, split_plan(["cuda0", "cuda1"], blocks={"cuda0": [0, 1],
                                                             "cuda1": [2, 2]}),
               "diffusion", inv) as placed:
        run_model(model, inp)
    assert placed.stats()["fallbacks"] == []


def test_a_split_stream_prefix_that_does_not_match_reports_plan_rederived(tiny, run_model):
    model, inp = tiny("flux")                    # five blocks
    ref = run_model(model, inp)
    plan = split_plan(["cuda0", "cuda1"], blocks={"cuda0": [0, 0], "cuda1": [1, 4]},
                      stream=(1, 1))
    plan.components["diffusion"].stream.per_device = {"cuda0": [1, 1], "cuda1": [1, 7]}
    with pytest.warns(RuntimeWarning, match="does not match a range of 4 blocks"):
        with place(model, plan, "diffusion",
                   Inventory.simulated("cuda0=256MiB,cuda1=256MiB")) as placed:
            assert torch.equal(run_model(model, inp), ref)
    [record] = of_kind(placed.stats(), "plan_rederived")
    assert record["field"] == "stream.per_device" and record["device"] == "cuda1"
    assert record["planned"] == {"resident": 1, "of": 7}
    assert record["ran"] == {"resident": 4, "of": 4}       # all fits: sized here


def test_a_one_device_stream_prefix_that_does_not_match_reports_plan_rederived(
        tiny, run_model, sim_inventory):
    model, inp = tiny("flux")                    # five blocks
    ref = run_model(model, inp)
    plan = make_plan("cpu", stream=(2, 1))
    plan.components["diffusion"].stream.per_device = {"cuda0": [1, 9]}
    with pytest.warns(RuntimeWarning, match="plan re-derived at run time"):
        with place(model, plan, "diffusion", sim_inventory) as placed:
            assert torch.equal(run_model(model, inp), ref)
            stats = placed.stats()
    [record] = of_kind(stats, "plan_rederived")
    assert record["planned"] == {"resident": 1, "of": 9}
    assert record["ran"] == {"resident": 2, "of": 5}
    assert stats["resident_blocks"] == 2


def test_batch_parallel_stats_carry_each_devices_fallbacks_once(sim_inventory):
    torch.manual_seed(0)
    model = LoopStack().eval()
    x = torch.randn(4, 16)
    ref = forwards(model, x, 1)[0]
    devices = [DevicePlan(d, "gpu", 256 << 20, 256 << 20, None) for d in ("cuda0", "cuda1")]
    plan = Plan(devices, {"diffusion": ComponentPlan("diffusion", ["cuda0", "cuda1"], "cpu",
                                                     parallel="batch",
                                                     stream=StreamPlan(0, 1))})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with place(model, plan, "diffusion", sim_inventory) as placed:
            out = forwards(model, x, 2)[-1]
    stats = placed.stats()
    assert torch.allclose(out, ref, atol=1e-6)
    assert all(s["blocks_never_ran"] == ["blocks.5"] for s in stats["per_device"].values())
    assert [f["blocks"] for f in of_kind(stats, "block_never_ran")] == [["blocks.5"]]
