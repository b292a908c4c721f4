"""One byte model (issue 21 item 3): for every kind of placement, the bytes the plan says
each device holds equal what the engine's ledger holds once placed (resident weights +
stream ring), and so does runtime/footprint.py, which sizes the ComfyUI adapter's
shares. Explicit plans: DevicePlan.planned_bytes with no working memory described;
auto-fit plans: ComponentPlan.held_bytes less headroom_bytes."""
import dataclasses
import warnings

import pytest

from comfyui_placement.placement import Inventory, PlacementSpec, plan
from comfyui_placement.placement.layout import row_split_held
from comfyui_placement.placement.metadata import describe
from comfyui_placement.runtime import place
from comfyui_placement.runtime.footprint import footprint, module_sizes
from comfyui_placement.runtime.split.row import eligible_linears, row_shards

KiB = 1024


def _kib(b: int) -> str:
    # sized to the byte model's edges: no margin kept (placement/room.py)
    return f"{b // KiB + 1}KiB@margin=0"


def _place(module, p, inv):
    """Ledger bytes per runtime device once loaded (no forward: weights and rings are
    allocated at entry without the first call's rehearsal), and the ring bytes among them."""
    cp = p.components["diffusion"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with place(module, p, "diffusion", inv, rehearse=False) as placed:
            st = placed.stats()["devices"]
    return ({d: st[d]["resident_bytes"] + st[d]["slot_bytes"] for d in cp.runtime},
            {d: st[d]["slot_bytes"] for d in cp.runtime})


# kind: (arch, spec, inventory from (non-block bytes, block sizes, total))
EXPLICIT = {
    "resident": ("flux", dict(backend="diffusion=cuda0"),
                 lambda nb, bl, t: f"cuda0={_kib(4 * t)}"),
    "streamed": ("flux", dict(backend="diffusion=cuda0", stream_layers=True),
                 lambda nb, bl, t: f"cuda0={_kib(nb + 2 * max(bl) + sum(bl) // 3)}"),
    "layer split": ("flux", dict(backend="diffusion=cuda0&cuda1", split_mode="layer"),
                    lambda nb, bl, t: f"cuda0={_kib(t)},cuda1={_kib(t)}"),
    # both ranges over their budgets: each device keeps a prefix and streams the rest
    "streaming layer split": ("flux", dict(backend="diffusion=cuda0&cuda1",
                                           split_mode="layer", stream_layers=True),
                              lambda nb, bl, t: f"cuda0={_kib(nb + 2 * max(bl) + 10000)},"
                                                f"cuda1={_kib(2 * min(bl) + 14000)}"),
    "row split": ("flux256", dict(backend="diffusion=cuda0&cuda1", split_mode="row"),
                  lambda nb, bl, t: f"cuda0={_kib(t)},cuda1={_kib(t // 2)}"),
    "batch parallel": ("flux", dict(backend="diffusion=cuda0&cuda1",
                                    split_mode="diffusion=batch"),
                       lambda nb, bl, t: f"cuda0={_kib(2 * t)},cuda1={_kib(2 * t)}"),
    "batch parallel streamed": ("flux", dict(backend="diffusion=cuda0&cuda1",
                                             split_mode="diffusion=batch",
                                             stream_layers=True),
                                lambda nb, bl, t: f"cuda0={_kib(nb + 2 * max(bl) + 10000)},"
                                                  f"cuda1={_kib(nb + 2 * max(bl) + 10000)}"),
}


@pytest.mark.parametrize("kind", list(EXPLICIT))
def test_explicit_plan_bytes_equal_ledger(tiny, kind):
    arch, spec, inventory = EXPLICIT[kind]
    module, _ = tiny(arch)
    nb, sizes = module_sizes(module)
    inv = Inventory.simulated(inventory(nb, sizes, nb + sum(sizes)) + ",cpu=64GiB")
    # no working memory described: planned_bytes is the weights and rings alone
    info = dataclasses.replace(describe(module, "diffusion")[0], headroom_bytes=0)
    p = plan(PlacementSpec(**spec), inv, {"diffusion": info}, resolution=(64, 64))
    cp = p.components["diffusion"]
    planned = {d: p.device(d).planned_bytes for d in cp.runtime}
    ledger, rings = _place(module, p, inv)
    assert planned == ledger, (kind, cp.runtime, cp.split_mode, cp.parallel, cp.stream)
    assert footprint(module, p, "diffusion", inv)[0] == ledger
    assert any(rings.values()) == ("stream" in kind), rings


WORK = 128 * KiB
AUTO = {
    "resident": ("flux", dict(backend="diffusion=cuda0"), "cuda0=2MiB"),
    "streamed": ("flux", dict(backend="diffusion=cuda0"), "cuda0=500KiB"),
    "layer split": ("flux", dict(backend="diffusion=cuda0&cuda1", split_mode="layer"),
                    "cuda0=520KiB,cuda1=520KiB"),
    "batch parallel": ("flux", dict(backend="diffusion=cuda0&cuda1",
                                    split_mode="diffusion=batch"),
                       "cuda0=2MiB,cuda1=2MiB"),
    "row split": ("flux256", dict(backend="diffusion=cuda0&cuda1", split_mode="row"),
                  "cuda0=14MiB,cuda1=8MiB"),
}


@pytest.mark.parametrize("kind", list(AUTO))
def test_auto_fit_held_bytes_equal_ledger(tiny, kind):
    arch, spec, inventory = AUTO[kind]
    module, _ = tiny(arch)
    inv = Inventory.simulated(inventory + ",cpu=64GiB")
    p = plan(PlacementSpec(auto_fit=True, **spec), inv, {"diffusion": module},
             resolution=(64, 64), headroom={"diffusion": WORK}, budget_margin=0,
             host_margin=0)
    cp = p.components["diffusion"]
    planned = {d: b - cp.headroom_bytes for d, b in cp.held_bytes.items()}
    ledger, rings = _place(module, p, inv)
    assert planned == ledger, (kind, cp.runtime, cp.split_mode, cp.parallel, cp.stream)
    assert footprint(module, p, "diffusion", inv, headroom=cp.headroom_bytes)[0] == ledger
    assert any(rings.values()) == ("stream" in kind), rings


def test_described_row_shards_are_the_runtimes(tiny):
    """The planner's description of what a row split shards (from names and shapes)
    is what runtime/split/row.py shards in the module, so row_split_held is exact."""
    module, _ = tiny("flux256")
    info = describe(module, "diffusion")[0]
    counted = {}
    for rows, nb, n in row_shards(eligible_linears(module)):
        counted[(rows, nb)] = counted.get((rows, nb), 0) + n
    assert info.row_shards == tuple((r, b, n) for (r, b), n in sorted(counted.items()))
    assert describe(tiny("flux")[0], "diffusion")[0].row_shards == ()   # none of 256x256
    rooms = [9 << 20, 5 << 20]
    from comfyui_placement.runtime.footprint import row_split_footprint
    assert row_split_held(info, rooms) == row_split_footprint(module, rooms)
