"""What a layer split must bring across a range boundary, found by ComfyUI's families
under the simulated device's operand check (runtime/simcheck.py):
- Flux.2 hands its blocks the modulation as dataclass objects (ModulationOut) inside a
  tuple, computed once by the parent on the main device: a block on the second device
  must get them brought there, as plain tensors are;
- Kandinsky 5 embeds its latent (a non-block Linear) between its text blocks and its
  visual blocks: that code runs on the main device, where its weight rests, even when
  the block before it ran on the second one.
Each model is split so the cut falls where the pattern bites; the split's output equals
the unplaced one."""
import dataclasses
from typing import NamedTuple

import torch
from torch import nn

from comfyui_placement import PlacementSpec, place, plan
from comfyui_placement.placement.devices import Inventory
from comfyui_placement.runtime.moves import map_tensors

WIDTH = 32


@dataclasses.dataclass
class Mod:
    shift: torch.Tensor
    scale: torch.Tensor


class Pair(NamedTuple):
    a: torch.Tensor
    b: torch.Tensor


class ModBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(WIDTH, WIDTH)

    def forward(self, x, vec):
        mod, pair = vec
        return torch.relu(self.lin(x * (1 + mod.scale) + mod.shift)) + pair.a - pair.b


class ModulatedStack(nn.Module):
    """Modulation made once by the parent, handed to every block as (dataclass, namedtuple)."""

    def __init__(self, n=4):
        super().__init__()
        self.mod = nn.Linear(WIDTH, 4 * WIDTH)
        self.blocks = nn.ModuleList(ModBlock() for _ in range(n))

    def forward(self, x, t):
        shift, scale, a, b = self.mod(t).chunk(4, dim=-1)
        vec = (Mod(shift[:, None], scale[:, None]), Pair(a[:, None], b[:, None]))
        for blk in self.blocks:
            x = blk(x, vec)
        return x


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(WIDTH, WIDTH)

    def forward(self, x, ctx):
        return torch.relu(self.lin(x)) + ctx.mean(dim=1, keepdim=True)


class TextThenVisual(nn.Module):
    """Text blocks, then the latent embedded by the parent (a non-block Linear), then
    visual blocks that read the text blocks' output (Kandinsky 5's forward)."""

    def __init__(self, n_text=4, n_visual=2):
        super().__init__()
        self.text_in = nn.Linear(WIDTH, WIDTH)
        self.text_transformer_blocks = nn.ModuleList(Block() for _ in range(n_text))
        self.visual_in = nn.Linear(WIDTH, WIDTH)
        self.visual_transformer_blocks = nn.ModuleList(Block() for _ in range(n_visual))

    def forward(self, x, context):
        context = self.text_in(context)
        for blk in self.text_transformer_blocks:
            context = blk(context, context)
        h = self.visual_in(x.transpose(1, 2).contiguous())       # a copy made here
        for blk in self.visual_transformer_blocks:
            h = blk(h, context)
        return h


def split(model, *args):
    """The output of `model(*args)` placed as a layer split over two simulated GPUs,
    beside the unplaced output and the plan's block ranges."""
    inv = Inventory.simulated("cuda0=16GiB,cuda1=16GiB")
    spec = PlacementSpec(backend="diffusion=cuda0&cuda1", split_mode="diffusion=layer")
    p = plan(spec, inv, {"diffusion": model})
    with torch.no_grad():
        want = model(*args)
        with place(model, p, "diffusion", inv) as placed:
            got = model(*args)
            stats = placed.stats()
    return want, got, p.components["diffusion"].blocks, stats


def test_dataclass_and_namedtuple_arguments_cross_to_the_blocks_device():
    torch.manual_seed(0)
    model = ModulatedStack().eval()
    want, got, blocks, stats = split(model, torch.randn(2, 8, WIDTH), torch.randn(2, WIDTH))
    assert blocks == stats["ranges"] and "cuda1" in blocks, (blocks, stats)   # as planned
    assert stats["hops"] >= 2, stats
    torch.testing.assert_close(got, want)


def test_the_parents_code_between_blocks_runs_on_the_main_device():
    torch.manual_seed(0)
    model = TextThenVisual().eval()
    want, got, blocks, stats = split(model, torch.randn(2, WIDTH, 6),
                                     torch.randn(2, 5, WIDTH))
    # the cut falls inside the text blocks (0-3): the last of them runs on cuda1, then
    # the parent embeds the latent with its own weight on cuda0
    assert blocks == stats["ranges"] and blocks["cuda1"][0] <= 3, (blocks, stats)
    torch.testing.assert_close(got, want)


def test_map_tensors_rebuilds_without_touching_the_callers_objects():
    t = torch.zeros(2)
    mod, pair = Mod(t, t), Pair(t, t)
    x = {"vec": (mod, pair), "n": 3, "t": [t]}
    out = map_tensors(lambda v: v + 1, x)
    assert out["vec"][0] is not mod and isinstance(out["vec"][0], Mod)
    assert isinstance(out["vec"][1], Pair) and out["n"] == 3
    assert float(out["vec"][0].shift.sum()) == 2 and float(out["t"][0].sum()) == 2
    assert mod.shift is t and pair.a is t and x["t"][0] is t       # the caller's, as given
    assert map_tensors(lambda v: v, x) is x                        # nothing moved: itself
