"""The simulated device checks every operand, as a GPU does: in a layer split, an operation
whose tensors sit on two devices raises DeviceMismatch naming both (a GPU raises "Expected
all tensors to be on the same device"), weights or activations; 0-dim scalars mix freely.
Before, every simulated tensor was host memory and such an operation computed anyway.

The layer split brings the operands of a join (torch.cat) and of an elementwise add,
subtract or multiply in the module's own code to one device (runtime/blocks/crossings.py): the
models here mix their tensors with other operations (a blend, a maximum), which it
leaves to the caller, so a GPU would refuse them."""
import pytest
import torch
from torch import nn

from comfyui_placement import PlacementSpec, place, plan
from comfyui_placement.placement.devices import Inventory
from comfyui_placement.placement.plan import ComponentPlan, DevicePlan, Plan
from comfyui_placement.runtime.device.simcheck import DeviceMismatch

WIDTH = 32


class Stage(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(WIDTH, WIDTH)

    def forward(self, x):
        return torch.relu(self.lin(x))


class UNetLike(nn.Module):
    """A UNet's shape: each down stage's output kept in the parent's own list and blended
    into an up stage's input in the parent's code (outside every block). `bring(skip,
    like)` is where a caller may bring the skip to `like`'s device (ComfyUI's UNet has
    output_block_patch for that; runtime/comfy/sampling/skips.py)."""

    def __init__(self, n=3):
        super().__init__()
        self.inp = nn.Linear(WIDTH, WIDTH)
        self.down_blocks = nn.ModuleList(Stage() for _ in range(n))
        self.up_blocks = nn.ModuleList(Stage() for _ in range(n))
        self.out = nn.Linear(WIDTH, WIDTH)
        self.bring = lambda skip, like: skip

    def forward(self, x):
        h = self.inp(x)
        skips = []
        for b in self.down_blocks:
            h = b(h)
            skips.append(h)
        for b in self.up_blocks:
            h = b(torch.lerp(h, self.bring(skips.pop(), h), 0.5))
        return self.out(h)


def layer_plan(model):
    """The user's words through the Python API: a layer split over two simulated GPUs."""
    inv = Inventory.simulated("cuda0=16GiB,cuda1=16GiB")
    spec = PlacementSpec(backend="diffusion=cuda0&cuda1", split_mode="diffusion=layer")
    return plan(spec, inv, {"diffusion": model}), inv


@pytest.fixture
def unet():
    torch.manual_seed(0)
    return UNetLike().eval(), torch.randn(2, 8, WIDTH)


def run(model, x):
    with torch.no_grad():
        return model(x)


def test_a_skip_kept_in_the_parents_list_raises_as_a_gpu_would(unet):
    model, x = unet
    p, inv = layer_plan(model)
    blocks = p.components["diffusion"].blocks
    # the down stages (0-2) end on cuda0 before the last up stages, which take their skips
    assert blocks["cuda0"][0] == 0 and blocks["cuda0"][1] < 4, blocks
    with pytest.raises(DeviceMismatch, match=r"aten\.lerp\.Scalar .*cuda0 and cuda1|"
                                              r"aten\.lerp\.Scalar .*cuda1 and cuda0"):
        with place(model, p, "diffusion", inv):
            run(model, x)


def test_the_skip_brought_over_runs_and_equals_the_unplaced_run(unet):
    model, x = unet
    ref = run(model, x)
    p, inv = layer_plan(model)
    with place(model, p, "diffusion", inv) as placed:
        model.bring = placed.follow             # the caller brings each skip over
        try:
            outs = [run(model, x) for _ in range(2)]
        finally:
            model.bring = lambda skip, like: skip
        stats = placed.stats()
    assert all(torch.equal(o, ref) for o in outs)
    # every skip that crossed is a hop besides the range boundaries
    assert stats["hops"] > 2 * stats["boundaries"], stats


def test_on_one_device_the_same_module_runs(unet):
    model, x = unet
    ref = run(model, x)
    inv = Inventory.simulated("cuda0=16GiB")
    p = plan(PlacementSpec(backend="diffusion=cuda0", params_backend="diffusion=cpu",
                           stream_layers=True), inv, {"diffusion": model})
    with place(model, p, "diffusion", inv):
        assert torch.equal(run(model, x), ref)


class Gains(nn.Module):
    """Stages with the parent's own code between them: `between(h, i)` after stage i."""

    def __init__(self, between):
        super().__init__()
        self.blocks = nn.ModuleList(Stage() for _ in range(4))
        self.bias = nn.Parameter(torch.randn(WIDTH))     # non-block: on the main device
        self.between = between

    def forward(self, x):
        h = x
        for i, b in enumerate(self.blocks):
            h = self.between(self, b(h), i)
        return h


def fixed_split(budget=64 << 20):
    devices = [DevicePlan(n, "gpu", 256 << 20, 256 << 20, budget) for n in ("cuda0", "cuda1")]
    comp = ComponentPlan("diffusion", ["cuda0", "cuda1"], "cpu", split_mode="layer",
                         blocks={"cuda0": [0, 1], "cuda1": [2, 3]})
    return Plan(devices, {"diffusion": comp}), \
        Inventory.simulated("cuda0=256MiB,cuda1=256MiB")


def test_a_main_device_weight_with_an_activation_of_the_other_device_raises():
    # after stage 2 (on cuda1) the parent clamps by its own bias, a weight on cuda0
    model = Gains(lambda m, h, i: torch.maximum(h, m.bias) if i == 2 else h).eval()
    p, inv = fixed_split()
    with pytest.raises(DeviceMismatch, match=r"cuda1 and cuda0 \(\(2, 8, 32\) on cuda1, "
                                              r"\(32,\) on cuda0\)"):
        with place(model, p, "diffusion", inv):
            run(model, torch.randn(2, 8, WIDTH))


def test_a_weight_used_on_its_own_device_and_a_scalar_anywhere_are_allowed():
    # the bias after stage 1 (cuda0, where it rests); after stage 2 (cuda1) a 0-dim
    # tensor made by the parent's code (a CPU scalar on a GPU, which mixes freely)
    def between(m, h, i):
        if i == 1:
            return h + m.bias
        if i == 2:
            return h * torch.tensor(0.5)
        return h
    model = Gains(between).eval()
    x = torch.randn(2, 8, WIDTH)
    ref = run(model, x)
    p, inv = fixed_split()
    with place(model, p, "diffusion", inv) as placed:
        assert torch.equal(run(model, x), ref)
    assert placed.stats()["device_check"] == "on"


def test_an_output_is_on_its_operands_device_and_charged_there():
    """The parent's code computes from a cuda0 tensor while cuda1's stage ran last: a GPU
    computes (and allocates) that on cuda0, so adding it to a cuda1 activation raises, and
    cuda0's ledger holds its bytes, not cuda1's."""
    big = 4096                                           # 2 x 8 x 4096 float32: 256 KiB
    kept = {}

    def between(m, h, i):
        if i == 1:
            kept["h1"] = h                               # computed on cuda0
        if i == 2:
            kept.pop("h1").repeat(1, 1, big // WIDTH)    # on cuda0: charged there, freed
        return h
    model = Gains(between).eval()
    x = torch.randn(2, 8, WIDTH)
    p, inv = fixed_split()
    with place(model, p, "diffusion", inv) as placed:
        run(model, x)
        s = placed.stats()["devices"]
    wide_bytes = 2 * 8 * big * 4
    assert s["cuda0"]["working_peak_bytes"] >= wide_bytes, s
    assert s["cuda1"]["working_peak_bytes"] < wide_bytes, s

    def mixes(m, h, i):
        if i == 1:
            kept["h1"] = h
        if i == 2:
            return torch.maximum(h, kept.pop("h1") * 2)  # max(cuda1, cuda0 x 2)
        return h
    model.between = mixes
    with pytest.raises(DeviceMismatch, match="cuda1 and cuda0"):
        with place(model, p, "diffusion", inv):
            run(model, x)


def host_split():
    """A split over a simulated GPU and the real host: the host is not simulated, yet a
    tensor computed there is on cpu, and a GPU refuses to mix it with its own."""
    devices = [DevicePlan("cuda0", "gpu", 256 << 20, 256 << 20, 64 << 20),
               DevicePlan("cpu", "cpu", 1 << 30, 1 << 30, None)]
    comp = ComponentPlan("diffusion", ["cuda0", "cpu"], "cpu", split_mode="layer",
                         blocks={"cuda0": [0, 1], "cpu": [2, 3]})
    return Plan(devices, {"diffusion": comp}), Inventory.simulated("cuda0=256MiB,cpu=1GiB")


def test_a_split_with_the_real_host_checks_its_operands_too():
    kept = {}

    def mixes(m, h, i):
        if i == 1:
            kept["h1"] = h                               # computed on cuda0
        if i == 2:
            return torch.maximum(h, kept.pop("h1"))      # max(cpu, cuda0)
        return h
    model = Gains(mixes).eval()
    p, inv = host_split()
    with pytest.raises(DeviceMismatch, match=r"two devices, cpu and cuda0"):
        with place(model, p, "diffusion", inv):
            run(model, torch.randn(2, 8, WIDTH))
    # the same split of a model that keeps its tensors apart runs, and equals the plain run
    model.between = lambda m, h, i: h
    x = torch.randn(2, 8, WIDTH)
    ref = run(model, x)
    with place(model, p, "diffusion", inv) as placed:
        assert torch.equal(run(model, x), ref)
    assert placed.stats()["hops"] == 2
