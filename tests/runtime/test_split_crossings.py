"""What a layer split must bring across a range boundary, found by ComfyUI's families
under the simulated device's operand check (runtime/device/simcheck.py):
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

import pytest
import torch
from torch import nn

from comfyui_placement import PlacementSpec, place, plan
from comfyui_placement.placement.devices import Inventory
from comfyui_placement.placement.plan import ComponentPlan, DevicePlan, Plan
from comfyui_placement.runtime.blocks.find import find_blocks
from comfyui_placement.runtime.blocks.moves import map_tensors
from comfyui_placement.runtime.measure.rehearse import rehearse_split

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


class Compressed:
    """LTX-2's CompressedTimestep (comfy/ldm/lightricks/av_model.py): a value object with
    __slots__, its tensor in .data, handed to every block."""
    __slots__ = ("data", "num_frames")

    def __init__(self, data, num_frames):
        self.data, self.num_frames = data, num_frames


def test_map_tensors_goes_through_slotted_value_objects():
    t = torch.zeros(2)
    c = Compressed(t, 5)
    out = map_tensors(lambda v: v + 1, (c,))
    assert isinstance(out[0], Compressed) and out[0] is not c and out[0].num_frames == 5
    assert float(out[0].data.sum()) == 2 and c.data is t            # the caller's, as given
    assert map_tensors(lambda v: v, c) is c


# -- the module's own code between blocks of two devices (runtime/blocks/crossings.py) -------------
BATCH, CAP, IMG = 2, 5, 12          # batch, caption tokens, image tokens


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(WIDTH, WIDTH)

    def forward(self, x, skip=None):
        out = torch.relu(self.lin(x)) + x
        return out if skip is None else out + skip


class Refiners(nn.Module):
    """Lumina2 / Z-Image's forward (comfy/ldm/lumina/model.py): the context refiner runs
    first, then the noise refiner (registered, so found, before it); the parent joins their
    outputs with torch.cat, and the main layers follow."""

    def __init__(self, n=2):
        super().__init__()
        self.x_embedder = nn.Linear(WIDTH, WIDTH)
        self.cap_embedder = nn.Linear(WIDTH, WIDTH)
        self.noise_refiner = nn.ModuleList(Layer() for _ in range(n))
        self.context_refiner = nn.ModuleList(Layer() for _ in range(n))
        self.layers = nn.ModuleList(Layer() for _ in range(n))
        self.final_layer = nn.Linear(WIDTH, WIDTH)

    def forward(self, x, cap):
        cap = self.cap_embedder(cap)
        for layer in self.context_refiner:
            cap = layer(cap)
        x = self.x_embedder(x)
        for layer in self.noise_refiner:
            x = layer(x)
        h = torch.cat((cap, x), dim=1)
        for layer in self.layers:
            h = layer(h)
        return self.final_layer(h[:, cap.shape[1]:])


class Levels(nn.Module):
    """Stable Cascade's forward (comfy/ldm/cascade/stage_b.py, stage_c.py): each level a
    ModuleList of layers the parent loops (no forward of its own), a downscaler or upscaler
    between levels and a repeat mapper between a level's repeats (non-block modules with
    their own weights), the down levels' outputs handed to the up levels as skips."""

    def __init__(self):
        super().__init__()
        pair = lambda: nn.ModuleList([Layer(), Layer()])         # noqa: E731
        scaler = lambda: nn.Sequential(nn.LayerNorm(WIDTH, elementwise_affine=False),  # noqa
                                       nn.Linear(WIDTH, WIDTH))
        self.embedding = nn.Linear(WIDTH, WIDTH)
        self.down_blocks = nn.ModuleList([pair(), pair()])
        self.down_downscalers = nn.ModuleList([nn.Identity(), scaler()])
        self.down_repeat_mappers = nn.ModuleList([nn.ModuleList(),
                                                  nn.ModuleList([nn.Linear(WIDTH, WIDTH)])])
        self.up_blocks = nn.ModuleList([pair(), pair()])
        self.up_upscalers = nn.ModuleList([scaler(), nn.Identity()])
        self.up_repeat_mappers = nn.ModuleList([nn.ModuleList([nn.Linear(WIDTH, WIDTH)]),
                                                nn.ModuleList()])
        self.clf = nn.Linear(WIDTH, WIDTH)

    def forward(self, x):
        x = self.embedding(x)
        levels = []
        for blocks, downscaler, repmap in zip(self.down_blocks, self.down_downscalers,
                                              self.down_repeat_mappers):
            x = downscaler(x)
            for i in range(len(repmap) + 1):
                for block in blocks:
                    x = block(x)
                if i < len(repmap):
                    x = repmap[i](x)
            levels.insert(0, x)
        x = levels[0]
        for i, (blocks, upscaler, repmap) in enumerate(zip(self.up_blocks, self.up_upscalers,
                                                          self.up_repeat_mappers)):
            for j in range(len(repmap) + 1):
                for k, block in enumerate(blocks):
                    x = block(x, levels[i] if k == 0 and i > 0 else None)
                if j < len(repmap):
                    x = repmap[j](x)
            x = upscaler(x)
        return self.clf(x)


class Hints(nn.Module):
    """Wan VACE's forward (comfy/ldm/wan/model.py VaceWanModel): a second block list (the
    hint blocks) runs beside the main one, each after the main block it rides with, and
    the parent adds its output to the main stream in place (`x += c_skip * strength`)."""

    def __init__(self, n=4):
        super().__init__()
        self.embed = nn.Linear(WIDTH, WIDTH)
        self.hint_embed = nn.Linear(WIDTH, WIDTH)
        self.blocks = nn.ModuleList(Layer() for _ in range(n))
        self.vace_blocks = nn.ModuleList(Layer() for _ in range(n // 2))
        self.mapping = {i: i // 2 for i in range(0, n, 2)}
        self.head = nn.Linear(WIDTH, WIDTH)

    def forward(self, x, hint):
        x, c = self.embed(x), self.hint_embed(hint)
        for i, block in enumerate(self.blocks):
            x = block(x)
            if i in self.mapping:
                c = self.vace_blocks[self.mapping[i]](c)
                x += c * 0.5
        return self.head(x)


def _ranged_plan(n_blocks: int, first_on_cuda1: int) -> Plan:
    devices = [DevicePlan(d, "gpu", 256 << 20, 256 << 20, None) for d in ("cuda0", "cuda1")]
    comp = ComponentPlan("diffusion", ["cuda0", "cuda1"], "cpu", split_mode="layer",
                         blocks={"cuda0": [0, first_on_cuda1 - 1],
                                 "cuda1": [first_on_cuda1, n_blocks - 1]})
    return Plan(devices, {"diffusion": comp})


def _split_at(model, first_on_cuda1, *args):
    """(whether each of two forwards of a layer split over two simulated GPUs, the second
    device running blocks first_on_cuda1.., equals the unplaced output; its stats; the
    rehearsed working memory per device)."""
    blocks = [b for _, b in find_blocks(model)]
    owner = [0] * first_on_cuda1 + [1] * (len(blocks) - first_on_cuda1)
    with torch.no_grad():
        want = model(*args)
        rehearsed = rehearse_split(model, args, {}, blocks, owner, 2)
        with place(model, _ranged_plan(len(blocks), first_on_cuda1), "diffusion",
                   Inventory.simulated("cuda0=256MiB,cuda1=256MiB")) as placed:
            # each output compared as it comes: one kept alive through the next forward
            # would be metered as that forward's working memory
            equal = [torch.equal(model(*args), want) for _ in range(2)]
            stats = placed.stats()
    return equal, stats, rehearsed


def _add_up(stats):
    """The crossings' hops and bytes add up to the split's hops and hop_bytes."""
    crossings = stats["crossings"]
    assert sum(c["hops"] for c in crossings.values()) == stats["hops"], stats
    assert sum(c["bytes"] for c in crossings.values()) == stats["hop_bytes"], stats


def test_a_join_of_two_devices_outputs_crosses_to_one_device():
    torch.manual_seed(0)
    model = Refiners().eval()
    names = [n for n, _ in find_blocks(model)]
    assert names[:2] == ["noise_refiner.0", "noise_refiner.1"]      # found before it runs
    x, cap = torch.randn(BATCH, IMG, WIDTH), torch.randn(BATCH, CAP, WIDTH)
    # cuda1 from context_refiner.1 on: the context refiner ends on cuda1, the noise
    # refiner runs on cuda0, and the parent concatenates their outputs
    equal, stats, rehearsed = _split_at(model, 3, x, cap)
    assert stats["device_check"] == "on" and stats["ranges"] == {"cuda0": [0, 2],
                                                                  "cuda1": [3, 5]}
    assert equal == [True, True]
    row = 4 * BATCH * WIDTH                                          # one token's bytes
    # per forward: the caption into context_refiner.1 (cuda1), the noise refiner's output
    # to the caption's device by the join, the last layer's output back to cuda0
    assert stats["crossings"]["joins"] == {"hops": 2, "bytes": 2 * IMG * row}, stats
    assert stats["crossings"]["boundaries"] == {
        "hops": 4, "bytes": 2 * (CAP + (CAP + IMG)) * row}, stats
    assert stats["hops"] == 6 and "non_block_modules" not in stats["crossings"], stats
    assert stats["joins_watched"] is True       # a join crossed: its mode stays on
    _add_up(stats)
    metered = [stats["devices"][d]["working_peak_bytes"] for d in ("cuda0", "cuda1")]
    assert metered == rehearsed and min(metered) > 0


def test_a_residual_added_across_devices_crosses_to_the_main_streams_device():
    torch.manual_seed(0)
    model = Hints().eval()
    # the hint blocks are not the split's: they run where the non-block weights rest
    assert [n for n, _ in find_blocks(model)] == [f"blocks.{i}" for i in range(4)]
    x, hint = torch.randn(BATCH, IMG, WIDTH), torch.randn(BATCH, IMG, WIDTH)
    # cuda1 from blocks.2 on: the second hint block runs on cuda0 after blocks.2 (cuda1),
    # and the parent adds its output to the main stream, on cuda1
    equal, stats, rehearsed = _split_at(model, 2, x, hint)
    assert stats["device_check"] == "on" and equal == [True, True]
    row = 4 * BATCH * IMG * WIDTH
    # per forward: the hint to cuda1 for the add (scaled on cuda0 first: `c * 0.5` mixes
    # a tensor with a Python number only)
    assert stats["crossings"]["joins"] == {"hops": 2, "bytes": 2 * row}, stats
    assert stats["joins_watched"] is True
    _add_up(stats)
    metered = [stats["devices"][d]["working_peak_bytes"] for d in ("cuda0", "cuda1")]
    assert metered == rehearsed and min(metered) > 0


def test_non_block_modules_between_levels_get_their_arguments_on_the_main_device():
    torch.manual_seed(0)
    model = Levels().eval()
    assert len(find_blocks(model)) == 8                  # the levels' layers are the blocks
    x = torch.randn(BATCH, IMG, WIDTH)
    # cuda1 from down_blocks.1.1 on: the down level's repeat mapper, the upscaler and the
    # final layer (cuda0's weights) read what a layer on cuda1 made
    equal, stats, rehearsed = _split_at(model, 3, x)
    assert stats["device_check"] == "on"
    assert equal == [True, True]
    home = stats["crossings"]["non_block_modules"]
    # per forward: the repeat mapper of down level 1, the repeat mapper and the upscaler
    # of up level 0 (the final layer gets the last block's output, already back on cuda0)
    assert home == {"hops": 2 * 3, "bytes": 2 * 3 * 4 * BATCH * IMG * WIDTH}, stats
    # no join crossed in the first forward: the second ran without the joins' mode
    assert "joins" not in stats["crossings"] and stats["joins_watched"] is False, stats
    _add_up(stats)
    metered = [stats["devices"][d]["working_peak_bytes"] for d in ("cuda0", "cuda1")]
    assert metered == rehearsed and min(metered) > 0


def test_without_the_crossings_the_simulated_device_refuses_both(monkeypatch):
    """What the two tests above need is what a GPU refuses: with the crossings taken out
    the simulated device raises its device mismatch, naming both devices."""
    from comfyui_placement.runtime.engine import stages
    from comfyui_placement.runtime.device.simcheck import DeviceMismatch
    monkeypatch.setattr(stages.StagedEngine, "_joins", lambda self: None)
    monkeypatch.setattr(stages, "home_modules", lambda *a, **k: [])
    torch.manual_seed(0)
    for model, at, args in ((Refiners().eval(), 3, (torch.randn(BATCH, IMG, WIDTH),
                                                    torch.randn(BATCH, CAP, WIDTH))),
                             (Hints().eval(), 2, (torch.randn(BATCH, IMG, WIDTH),
                                                  torch.randn(BATCH, IMG, WIDTH))),
                             (Levels().eval(), 3, (torch.randn(BATCH, IMG, WIDTH),))):
        with pytest.raises(DeviceMismatch, match=r"two devices, (cuda0 and cuda1|cuda1 and "
                                                 r"cuda0)"):
            _split_at(model, at, *args)


def test_the_crossings_hooks_leave_with_the_placement():
    model = Levels().eval()
    hooks = [(len(m._forward_pre_hooks), len(m._forward_hooks)) for m in model.modules()]
    _split_at(model, 3, torch.randn(BATCH, IMG, WIDTH))
    assert hooks == [(len(m._forward_pre_hooks), len(m._forward_hooks))
                     for m in model.modules()]
    assert "forward" not in model.__dict__


# -- what blocks keep or share between calls ---------------------------------------------
class CachedLayer(nn.Module):
    """Causal-Wan's attention block (comfy/ldm/wan/ar_model.py): its own KV cache dict,
    written in place at each call (`k[:, end:new] = ...`, `end = new`), read whole."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(WIDTH, WIDTH)

    def forward(self, x, kv_cache):
        end, new = kv_cache["end"], kv_cache["end"] + x.shape[1]
        kv_cache["k"][:, end:new] = self.lin(x)
        kv_cache["end"] = new
        return x + kv_cache["k"][:, :new].mean(dim=1, keepdim=True)


class Autoregressive(nn.Module):
    def __init__(self, n=4):
        super().__init__()
        self.blocks = nn.ModuleList(CachedLayer() for _ in range(n))

    def forward(self, x, caches):
        for blk, cache in zip(self.blocks, caches):
            x = blk(x, kv_cache=cache)
        return x


def test_a_blocks_own_state_dict_moves_with_it_and_keeps_its_writes():
    torch.manual_seed(0)
    model = Autoregressive().eval()
    frames = [torch.randn(1, 2, WIDTH) for _ in range(3)]

    def caches():
        return [{"k": torch.zeros(1, 6, WIDTH), "end": 0} for _ in model.blocks]

    with torch.no_grad():
        mine = caches()
        want = [model(f, mine) for f in frames]
    inv = Inventory.simulated("cuda0=16GiB,cuda1=16GiB")
    spec = PlacementSpec(backend="diffusion=cuda0&cuda1", split_mode="diffusion=layer")
    p = plan(spec, inv, {"diffusion": model})
    theirs = caches()
    with torch.no_grad(), place(model, p, "diffusion", inv) as placed:
        got = [model(f, theirs) for f in frames]
        stats = placed.stats()
    assert "cuda1" in stats["ranges"]
    for g, w in zip(got, want):            # each step reads what the earlier ones wrote
        torch.testing.assert_close(g, w)
    assert [c["end"] for c in theirs] == [6] * 4                   # the caller's dicts
    for c, m in zip(theirs, mine):
        torch.testing.assert_close(c["k"], m["k"])


class Memo:
    """SeedVR2's Cache (comfy/ldm/seedvr/model.py): a per-forward memo its blocks share,
    filled by the first block that asks, holding tensors and functions over tensors."""

    def __init__(self, store=None):
        self.store = {} if store is None else store

    def __call__(self, key, fn):
        if key not in self.store:
            self.store[key] = fn()
        return self.store[key]


class MemoBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(WIDTH, WIDTH)

    def forward(self, x, emb, memo):
        rep = memo("emb", lambda: emb.repeat(1, x.shape[1], 1))      # made by the first block
        idx = torch.arange(x.shape[1] - 1, -1, -1, device=x.device)
        flip = memo("flip", lambda: (lambda h: torch.index_select(h, 1, idx)))
        return flip(torch.relu(self.lin(x)) + rep)


class MemoStack(nn.Module):
    def __init__(self, n=4):
        super().__init__()
        self.emb = nn.Linear(WIDTH, WIDTH)
        self.blocks = nn.ModuleList(MemoBlock() for _ in range(n))

    def forward(self, x, t):
        memo, emb = Memo(), self.emb(t)[:, None]
        for blk in self.blocks:
            x = blk(x, emb, memo)
        return x


def _memo_traverse(map_one, memo):
    brought, moved = {}, False
    for k, v in memo.store.items():
        if callable(v):
            continue                      # a function over another device's tensors
        brought[k] = map_one(v)
        moved = moved or brought[k] is not v
    return Memo(brought) if moved else memo


def test_a_registered_container_is_brought_into_each_block(monkeypatch):
    from comfyui_placement.runtime.blocks import moves
    torch.manual_seed(0)
    model = MemoStack().eval()
    x, t = torch.randn(2, 5, WIDTH), torch.randn(2, WIDTH)
    with pytest.raises(Exception, match="two devices"):   # unregistered: a GPU refuses it
        split(model, x, t)
    monkeypatch.setitem(moves.CONTAINERS, Memo, _memo_traverse)
    want, got, blocks, stats = split(model, x, t)
    assert "cuda1" in blocks
    torch.testing.assert_close(got, want)
