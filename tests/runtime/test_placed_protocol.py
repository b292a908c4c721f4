"""What place() returns is a declared `PlacedEngine` (runtime/placed.py): each engine, in
each mode, answers the whole protocol, and the answers are the engine's own figures."""
import pytest
import torch

from comfyui_placement.placement.devices import Inventory
from comfyui_placement.placement.plan import ComponentPlan, DevicePlan, Plan
from comfyui_placement.runtime import place
from comfyui_placement.runtime.distributed.planned import RemoteStages
from comfyui_placement.runtime.placed import PlacedEngine

from test_split_layer import INVENTORY, T5Like

MODES = {   # name: (runtime, split_mode, parallel, class name, crosses devices)
    "one device": (["cuda0"], "none", "none", "Placed", False),
    "layer split": (["cuda0", "cuda1"], "layer", "none", "LayerSplit", True),
    "pipelined split": (["cuda0", "cuda1"], "layer", "pipeline", "PipelinedSplit", True),
    "row split": (["cuda0", "cuda1"], "row", "none", "RowSplit", False),
    "batch parallel": (["cuda0", "cuda1"], "none", "batch", "BatchPlaced", False),
}


def _plan(runtime, split_mode, parallel):
    devices = [DevicePlan(n, "gpu", 256 << 20, 256 << 20, 64 << 20) for n in runtime]
    comp = ComponentPlan("diffusion", list(runtime), runtime[0],
                         split_mode=split_mode if len(runtime) > 1 else "none",
                         parallel=parallel)
    return Plan(devices, {"diffusion": comp})


@pytest.mark.parametrize("mode", MODES)
def test_every_engine_is_a_placement(mode):
    runtime, split_mode, parallel, cls, crosses = MODES[mode]
    torch.manual_seed(0)
    model, ids = T5Like(n=4, width=256).eval(), torch.randint(0, 20, (4, 6))
    placed = place(model, _plan(runtime, split_mode, parallel), "diffusion",
                   Inventory.simulated(INVENTORY))
    assert type(placed).__name__ == cls and isinstance(placed, PlacedEngine)
    with placed:
        with torch.no_grad():
            model(ids)
        held = {d: placed.held_bytes(d) for d in runtime}
        assert all(held[d] > 0 for d in runtime), held        # every device holds weights
        assert placed.held_bytes("cuda2") == 0
        assert placed.crosses_devices is crosses
        x = torch.ones(2)
        assert placed.follow(x, x) is x                 # on one device: x itself
        assert placed.stats()["devices"].keys() >= set(runtime)
        placed.release()
        assert placed.held_bytes(runtime[0]) == 0
    assert placed.stats()["devices"].keys() >= set(runtime)


def test_worker_ranges_declare_the_protocol_too():
    """RemoteStages needs a running worker to be built (tests/runtime/test_distributed.py
    runs it); its class answers every member."""
    members = [n for n in dir(PlacedEngine) if not n.startswith("_") or n in ("__enter__",
                                                                          "__exit__")]
    assert {"release", "stats", "held_bytes", "crosses_devices", "follow"} <= set(members)
    assert [n for n in members if not hasattr(RemoteStages, n)] == []
