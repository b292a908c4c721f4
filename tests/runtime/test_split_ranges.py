"""Layer split ranges: contiguous, in runtime order, each device's bytes within one
block of its share of (budget - headroom), nothing for a device with zero budget."""
import torch
from hypothesis import given, settings, strategies as st
from torch import nn

from comfyui_placement.placement.devices import Inventory
from comfyui_placement.placement.errors import PlacementError
from comfyui_placement.placement.plan import ComponentPlan, DevicePlan, Plan
from comfyui_placement.runtime.split import place_split

NAMES = ["cuda0", "cuda1", "cuda2", "cuda3"]


class Toy(nn.Module):
    """Blocks of different weights (a buffer of chosen size), chained."""

    def __init__(self, extra_floats):
        super().__init__()
        self.inp = nn.Linear(4, 4)
        self.layers = nn.ModuleList()
        for n in extra_floats:
            block = nn.Linear(4, 4)
            block.register_buffer("pad", torch.zeros(n))
            self.layers.append(block)

    def forward(self, x):
        x = self.inp(x)
        for b in self.layers:
            x = b(x)
        return x


def block_bytes(model):
    return [sum(t.numel() * t.element_size() for t in list(b.parameters()) + list(b.buffers()))
            for b in model.layers]


@settings(max_examples=40, deadline=None)
@given(extra=st.lists(st.integers(0, 3000), min_size=2, max_size=12),
       budgets=st.lists(st.sampled_from([0, 20_000, 50_000, 90_000, 200_000]),
                        min_size=2, max_size=4))
def test_ranges_within_one_block_of_share(extra, budgets):
    if not any(budgets[1:]) and budgets[0] < 2000:
        budgets[0] = 200_000                          # somewhere must have room
    torch.manual_seed(0)
    model = Toy(extra)
    x = torch.randn(2, 4)
    with torch.no_grad():
        ref = model(x)
    runtime = NAMES[:len(budgets)]
    devices = [DevicePlan(n, "gpu", 1 << 30, 1 << 30, max(b, 1) if b else 0)
               for n, b in zip(runtime, budgets)]
    plan = Plan(devices, {"diffusion": ComponentPlan("diffusion", runtime, runtime[0])})
    inv = Inventory.simulated(",".join(f"{n}=1GiB" for n in runtime))
    nonblock = sum(t.numel() * t.element_size() for t in model.inp.parameters())
    rooms = [max(0, b - (nonblock if i == 0 else 0)) for i, b in enumerate(budgets)]
    sizes = block_bytes(model)
    try:
        placed = place_split(model, plan, "diffusion", inv)
        with placed:
            with torch.no_grad():
                assert torch.equal(model(x), ref)
    except (torch.OutOfMemoryError, PlacementError) as exc:   # over a budget: refused
        assert "need" in str(exc) or "no room" in str(exc) or "out of memory" in str(exc)
        return
    ranges = placed.stats()["ranges"]
    covered = []
    order = [n for n in runtime if n in ranges]
    for n in order:
        a, b = ranges[n]
        covered += list(range(a, b + 1))
    assert covered == list(range(len(sizes)))            # contiguous, in runtime order
    for i, n in enumerate(runtime):
        a, b = ranges.get(n, (0, -1))
        got = sum(sizes[a:b + 1])
        if rooms[i] == 0:
            assert got == 0
        ideal = sum(sizes) * rooms[i] / sum(rooms)
        assert abs(got - ideal) <= max(sizes)


def test_equal_blocks_equal_budgets_split_evenly():
    model = Toy([100] * 8)
    runtime = NAMES[:4]
    devices = [DevicePlan(n, "gpu", 1 << 30, 1 << 30, 1 << 20) for n in runtime]
    plan = Plan(devices, {"diffusion": ComponentPlan("diffusion", runtime, runtime[0])})
    with place_split(model, plan, "diffusion",
                     Inventory.simulated(",".join(f"{n}=1GiB" for n in runtime)),
                     headroom_bytes={"cuda0": 1 << 19}) as placed:
        ranges = placed.stats()["ranges"]
    # cuda0 has half the room of the others (headroom), so about half the blocks
    counts = {n: b - a + 1 for n, (a, b) in ranges.items()}
    assert sum(counts.values()) == 8 and counts["cuda0"] <= counts["cuda1"] - 1
