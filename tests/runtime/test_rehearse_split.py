"""A layer split's working memory per device, rehearsed on the meta device
(runtime/rehearse.rehearse_split), against what the simulated devices meter on a real
split run: equal, device by device. The model loops over its blocks' layers itself, as
ComfyUI's UNet does, so the blocks are entered through their layers (runtime/blocks/entry.py)
and tensors made inside a block between two layers stay on the block's device: before
the mover asked the meter where such a tensor was computed, the simulated split copied
each of them to the block's own device again and held the copies for the whole
forward, metering on cuda1 several times what a GPU holds."""
import torch
import torch.nn.functional as F
from torch import nn

from comfyui_placement.placement.devices import Inventory
from comfyui_placement.placement.plan import ComponentPlan, DevicePlan, Plan
from comfyui_placement.runtime import place
from comfyui_placement.runtime.blocks.find import find_blocks
from comfyui_placement.runtime.measure.rehearse import rehearse, rehearse_split

WIDTH, TOKENS, BLOCKS = 64, 48, 6


class Block(nn.Module):
    """Its forward is never called: the model runs its layers (ComfyUI's
    TimestepEmbedSequential under forward_timestep_embed)."""

    def __init__(self):
        super().__init__()
        self.up = nn.Linear(WIDTH, 4 * WIDTH)
        self.down = nn.Linear(4 * WIDTH, WIDTH)


class Looped(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(WIDTH, WIDTH)
        self.blocks = nn.ModuleList(Block() for _ in range(BLOCKS))
        self.out = nn.Linear(WIDTH, WIDTH)

    def forward(self, x, context, follow=None):
        # follow(t, like): t brought to like's device (the placement's `follow`, as
        # ComfyUI's skip patch does): what the model's own code mixes across a range
        # boundary must cross it, or a GPU (and the simulated device) refuses it
        follow = follow or (lambda t, like: t)
        h = self.embed(x)
        skips = []
        for i, block in enumerate(self.blocks):
            a = F.gelu(block.up(h + follow(context, h)))     # made between the layers
            d = block.down(a * 0.5)         # the last block's comes back to device 0
            h = follow(h, d) + d
            if i < BLOCKS // 2:
                skips.append(h)
            else:
                h = h + follow(skips.pop(), h)
        return self.out(h)


def _plan(first_on_cuda1: int) -> Plan:
    devices = [DevicePlan(d, "gpu", 256 << 20, 256 << 20, None) for d in ("cuda0", "cuda1")]
    comp = ComponentPlan("diffusion", ["cuda0", "cuda1"], "cpu", split_mode="layer",
                         blocks={"cuda0": [0, first_on_cuda1 - 1],
                                 "cuda1": [first_on_cuda1, BLOCKS - 1]})
    return Plan(devices, {"diffusion": comp})


def _inputs():
    torch.manual_seed(0)
    return torch.randn(2, TOKENS, WIDTH), torch.randn(2, TOKENS, WIDTH)


def test_split_rehearsal_equals_each_device_metered():
    torch.manual_seed(0)
    model = Looped().eval()
    x, context = _inputs()
    blocks = [b for _, b in find_blocks(model)]
    assert len(blocks) == BLOCKS
    first = 2
    owner = [0] * first + [1] * (BLOCKS - first)
    rehearsed = rehearse_split(model, (x, context), {}, blocks, owner, 2,
                               prepare=lambda follow, a, k: (a, {**k, "follow": follow}))
    with place(model, _plan(first), "diffusion",
               Inventory.simulated("cuda0=256MiB,cuda1=256MiB")) as placed:
        with torch.no_grad():
            model(x, context, follow=placed.follow)
        stats = placed.stats()
    metered = [stats["devices"][d]["working_peak_bytes"] for d in ("cuda0", "cuda1")]
    assert stats["hops"] > 0
    assert metered == rehearsed
    # one device's whole forward is no bound for the other: the split holds the skips'
    # and the context's copies on cuda1 beside its own activations
    whole = rehearse(model, (x, context))
    assert rehearsed[1] > 0 and max(rehearsed) >= whole // 2


def test_split_rehearsal_leaves_the_model_alone():
    model = Looped().eval()
    before = {n: t.clone() for n, t in model.state_dict().items()}
    hooks = sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in model.modules())
    x, context = _inputs()
    blocks = [b for _, b in find_blocks(model)]
    rehearse_split(model, (x, context), {}, blocks, [0, 0, 0, 1, 1, 1], 2)
    assert all(torch.equal(t, before[n]) for n, t in model.state_dict().items())
    assert hooks == sum(len(m._forward_pre_hooks) + len(m._forward_hooks)
                        for m in model.modules())
