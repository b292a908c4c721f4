"""The simulated device meters working memory as a GPU allocates it: every tensor a placed
forward computes, alive, on the device that computed it; past the budget it raises the
out-of-memory error a card raises (before, the simulated device computed anyway)."""
import pytest
import torch
from torch import nn

from comfyui_placement.placement.devices import Inventory
from comfyui_placement.placement.errors import PlacementError
from comfyui_placement.placement.plan import ComponentPlan, DevicePlan, Plan, StreamPlan
from comfyui_placement.runtime import place

HIDDEN, WIDE, TOKENS = 64, 1024, 256
WIDE_BYTES = TOKENS * WIDE * 4          # the widest activation: 1 MiB
BLOCK_BYTES = 2 * HIDDEN * WIDE * 4 + (WIDE + HIDDEN) * 4


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(HIDDEN, WIDE)
        self.down = nn.Linear(WIDE, HIDDEN)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(x)))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(4))

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x


def plan(budgets, stream=None, blocks=None):
    names = list(budgets)
    devices = [DevicePlan(n, "gpu", 256 << 20, 256 << 20, b) for n, b in budgets.items()]
    comp = ComponentPlan("diffusion", names, "cpu", split_mode="layer",
                         stream=StreamPlan(*stream) if stream else None, blocks=blocks or {})
    return Plan(devices, {"diffusion": comp})


@pytest.fixture
def net():
    torch.manual_seed(0)
    return Net().eval(), torch.randn(1, TOKENS, HIDDEN)


def run(model, x):
    with torch.no_grad():
        return model(x)


def test_working_memory_is_metered_and_given_back(net):
    model, x = net
    ref = run(model, x)
    inv = Inventory.simulated("cuda0=256MiB")
    with place(model, plan({"cuda0": 64 << 20}, stream=(0, 1)), "diffusion", inv) as placed:
        outs = [run(model, x) for _ in range(3)]
        s = placed.stats()["devices"]["cuda0"]
    assert all(torch.equal(o, ref) for o in outs)
    # the widest activation, its relu and the block's own output were alive at once;
    # three forwards peak no higher than one (freed storages are given back)
    assert WIDE_BYTES * 2 <= s["working_peak_bytes"] <= WIDE_BYTES * 2 + 8 * TOKENS * HIDDEN * 4
    assert s["peak_bytes"] >= s["resident_bytes"] + s["slot_bytes"] + s["working_peak_bytes"]


def test_a_budget_without_room_to_compute_is_refused_as_a_gpu_would(net):
    """Weights fit, the working memory does not: the old simulated device ran this."""
    model, x = net
    ref = run(model, x)
    snap = {n: t.detach().clone() for n, t in model.state_dict().items()}
    inv = Inventory.simulated("cuda0=256MiB")
    tight = plan({"cuda0": 2 * BLOCK_BYTES + WIDE_BYTES}, stream=(0, 1))   # ring + 1 MiB
    # the first call's rehearsal sees it before any weight moves: one line
    with pytest.raises(PlacementError, match=r"cuda0 needs .* of working memory "
                                             r"\(rehearsed from the first call\)"):
        with place(model, tight, "diffusion", inv):
            run(model, x)
    assert all(torch.equal(model.state_dict()[n], t) for n, t in snap.items())
    # without the rehearsal (loaded at entry) the meter refuses it mid-forward, as a GPU
    with pytest.raises(torch.OutOfMemoryError, match=r"cuda0: out of memory .* computed there"):
        with place(model, tight, "diffusion", inv, rehearse=False):
            run(model, x)
    assert all(torch.equal(model.state_dict()[n], t) for n, t in snap.items())
    # with room for two wide activations it runs, and equals the plain run
    roomy = plan({"cuda0": 2 * BLOCK_BYTES + 3 * WIDE_BYTES}, stream=(0, 1))
    with place(model, roomy, "diffusion", inv, headroom_bytes=3 * WIDE_BYTES):
        assert torch.equal(run(model, x), ref)


def test_each_device_is_charged_what_it_computes(net):
    model, x = net
    ref = run(model, x)
    inv = Inventory.simulated("cuda0=256MiB,cuda1=256MiB")
    p = plan({"cuda0": 64 << 20, "cuda1": 64 << 20}, blocks={"cuda0": [0, 0], "cuda1": [1, 3]})
    with place(model, p, "diffusion", inv) as placed:
        assert torch.equal(run(model, x), ref)
        s = placed.stats()["devices"]
    for name in ("cuda0", "cuda1"):
        assert s[name]["working_peak_bytes"] >= 2 * WIDE_BYTES, (name, s[name])


def test_unmetered_where_the_check_is_off(net):
    model, x = net
    inv = Inventory.simulated("cuda0=256MiB")
    with place(model, plan({"cuda0": 64 << 20}, stream=(0, 1)), "diffusion", inv,
               device_check=False) as placed:
        run(model, x)
        s = placed.stats()["devices"]["cuda0"]
    assert "working_peak_bytes" not in s
