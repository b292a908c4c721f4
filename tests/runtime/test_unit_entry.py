"""Blocks whose own forward never runs: ComfyUI's UNet loops a TimestepEmbedSequential's
layers itself (`forward_timestep_embed`), Stable Cascade loops each level's ModuleList.
Streaming, disk residency, the layer split and LoRA must still see every block arrive,
and the simulated device must refuse a weight computed where it rests, as a GPU would.
"""
import copy

import pytest
import safetensors.torch
import torch
import torch.nn.functional as F
from torch import nn

from comfyui_placement.runtime import place
from comfyui_placement.runtime.blocks import entry as units
from comfyui_placement.runtime.blocks.find import find_blocks
from comfyui_placement.runtime.engine.lora import apply_in_place
from comfyui_placement.runtime.device.simcheck import DeviceMismatch
from comfyui_placement.runtime.split import place_split

from conftest import make_plan
from test_split_layer import assert_restored, snapshot, split_plan

C = 8


class TimestepEmbedSequential(nn.Sequential):
    """As ComfyUI's: a Sequential whose forward the UNet never calls."""
    def forward(self, *args):       # pragma: no cover - must never run
        raise AssertionError("the UNet loops the layers itself")


class Res(nn.Module):
    def __init__(self, cin, cout=C):
        super().__init__()
        self.norm = nn.GroupNorm(2, cin)
        self.conv = nn.Conv2d(cin, cout, 3, padding=1)
        self.emb = nn.Linear(16, cout)
        self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x, emb):
        h = self.conv(F.silu(self.norm(x))) + self.emb(emb)[:, :, None, None]
        return self.skip(x) + h


class Attn(nn.Module):
    def __init__(self):
        super().__init__()
        self.q = nn.Linear(C, C)
        self.kv = nn.Linear(12, 2 * C)
        self.out = nn.Linear(C, C)

    def forward(self, x, context):
        b, c, hh, ww = x.shape
        t = x.flatten(2).transpose(1, 2)
        k, v = self.kv(context).chunk(2, dim=-1)
        a = F.scaled_dot_product_attention(self.q(t), k, v)
        return x + self.out(a).transpose(1, 2).reshape(b, c, hh, ww)


def forward_timestep_embed(ts, x, emb, context):
    for layer in ts:                # ComfyUI's loop: the container's forward never runs
        if isinstance(layer, Res):
            x = layer(x, emb)
        elif isinstance(layer, Attn):
            x = layer(x, context)
        else:
            x = layer(x)
    return x


class LoopUNet(nn.Module):
    """ComfyUI's openaimodel shape: input blocks, a middle block, output blocks that
    concatenate the matching input block's output (the skip connection)."""

    def __init__(self):
        super().__init__()
        self.time_embed = nn.Sequential(nn.Linear(1, 16), nn.SiLU(), nn.Linear(16, 16))
        seq = TimestepEmbedSequential
        self.input_blocks = nn.ModuleList([
            seq(nn.Conv2d(4, C, 3, padding=1)), seq(Res(C), Attn()), seq(Res(C)),
            seq(Res(C), Attn())])
        self.middle_block = seq(Res(C), Attn(), Res(C))
        self.output_blocks = nn.ModuleList([seq(Res(2 * C), Attn()) for _ in range(4)])
        self.out = nn.Sequential(nn.GroupNorm(2, C), nn.SiLU(), nn.Conv2d(C, 4, 3, padding=1))
        self.skip_patch = None      # (h, hsp) -> (h, hsp): ComfyUI's output_block_patch

    def forward(self, x, t, context):
        emb = self.time_embed(t[:, None])
        hs, h = [], x
        for block in self.input_blocks:
            h = forward_timestep_embed(block, h, emb, context)
            hs.append(h)
        h = forward_timestep_embed(self.middle_block, h, emb, context)
        for block in self.output_blocks:
            hsp = hs.pop()
            if self.skip_patch is not None:
                h, hsp = self.skip_patch(h, hsp)
            h = forward_timestep_embed(block, torch.cat([h, hsp], dim=1), emb, context)
        return self.out(h)


class LoopLevels(nn.Module):
    """Stable Cascade's shape: blocks are levels (ModuleLists, no forward at all) whose
    layers the model loops."""

    def __init__(self):
        super().__init__()
        self.embedding = nn.Conv2d(4, C, 1)
        self.down_blocks = nn.ModuleList([nn.ModuleList([Res(C), Attn()]),
                                          nn.ModuleList([Res(C), Res(C)])])
        self.up_blocks = nn.ModuleList([nn.ModuleList([Res(C), Attn()]),
                                        nn.ModuleList([Res(C)])])
        self.clf = nn.Conv2d(C, 4, 1)
        self.time = nn.Linear(1, 16)

    def forward(self, x, t, context):
        emb = self.time(t[:, None])
        h = self.embedding(x)
        for level in list(self.down_blocks) + list(self.up_blocks):
            h = forward_timestep_embed(level, h, emb, context)
        return self.clf(h)


def build(cls, seed=0):
    torch.manual_seed(seed)
    m = cls().eval()
    inp = dict(x=torch.randn(1, 4, 8, 8), t=torch.tensor([3.0]), context=torch.randn(1, 5, 12))
    return m, inp


def run(model, inp):
    with torch.no_grad():
        return model(**inp)


def streamed_bytes(model, k):
    blocks = [b for _, b in find_blocks(model)][k:]
    return sum(p.numel() * p.element_size() for b in blocks for p in b.parameters())


@pytest.mark.parametrize("cls", [LoopUNet, LoopLevels])
def test_blocks_are_found(cls):
    model, _ = build(cls)
    names = [n for n, _ in find_blocks(model)]
    assert names[0] in ("input_blocks.0", "down_blocks.0.0") and len(names) >= 4


@pytest.mark.parametrize("cls", [LoopUNet, LoopLevels])
def test_streamed_from_host_equals_plain_and_counts_every_block(cls, sim_inventory):
    model, inp = build(cls)
    ref = run(model, inp)
    snap = snapshot(model)
    with place(model, make_plan("cpu", stream=(1, 1)), "diffusion", sim_inventory) as placed:
        for _ in range(3):
            assert torch.equal(run(model, inp), ref)
        stats = placed.stats()
        dev = stats["devices"]["cuda0"]
        # the resident weights once, then every streamed block once per forward (and
        # what the copy engine already sent for the next forward)
        resident, ahead = stats["resident_weight_bytes"], stats["prefetched_ahead_bytes"]
        assert dev["h2d_bytes"] == resident + 3 * streamed_bytes(model, 1) + ahead
        assert stats["streamed_blocks"] == len(find_blocks(model)) - 1
        # every block was entered through its layers: no container's forward ever ran
        assert stats["blocks_entered_by_units"] == \
            (len(find_blocks(model)) if cls is LoopUNet else 0)
        assert stats["device_check"] == "on"
    assert_restored(model, snap)


def test_streamed_from_disk_equals_plain(sim_inventory, tmp_path):
    model, inp = build(LoopUNet)
    ref = run(model, inp)
    path = tmp_path / "unet.safetensors"
    safetensors.torch.save_file({k: v.contiguous() for k, v in model.state_dict().items()},
                                str(path))
    with place(model, make_plan("disk", stream=(0, 2)), "diffusion", sim_inventory,
               weights_file=str(path)) as placed:
        assert torch.equal(run(model, inp), ref)
        assert torch.equal(run(model, inp), ref)
        assert placed.stats()["disk_read_bytes"] >= 2 * streamed_bytes(model, 0)


def test_old_container_hooks_are_refused_by_the_simulated_device(monkeypatch, sim_inventory):
    """Hooks on the containers alone (before blocks were entered through their units):
    the simulated device must fail where a GPU would, not compute on the host copy."""
    model, inp = build(LoopUNet)
    snap = snapshot(model)
    monkeypatch.setattr(units, "_units", lambda block: [])
    with pytest.raises(DeviceMismatch, match="rests in host memory, not on cuda0"):
        with place(model, make_plan("cpu", stream=(0, 1)), "diffusion", sim_inventory):
            run(model, inp)
    assert_restored(model, snap)


def test_resident_weights_read_through_the_module_are_fine(sim_inventory):
    """Staged (all resident) on the device: non-block code (the skip patch, the top-level
    layers) that reads a weight through the module reads its device copy."""
    model, inp = build(LoopUNet)
    ref = run(model, inp)
    live = model.out[2].bias
    with place(model, make_plan("cpu"), "diffusion", sim_inventory):
        model.skip_patch = lambda h, hsp: (h + live.sum() * 0, hsp)
        try:
            assert torch.equal(run(model, inp), ref)
        finally:
            model.skip_patch = None


def test_resident_weights_never_arrive_without_their_hooks(sim_inventory):
    """Staged (all resident): the check watches every moved tensor, so code inside the
    forward that reads a weight's resting host copy (a reference taken before placing)
    fails as a GPU would, naming the weight; the placement still runs afterwards."""
    model, inp = build(LoopUNet)
    ref = run(model, inp)
    snap = snapshot(model)
    stale = model.out[2].bias.data          # shares the storage that becomes the resting copy
    with place(model, make_plan("cpu"), "diffusion", sim_inventory):
        model.skip_patch = lambda h, hsp: (h + stale.sum() * 0, hsp)
        try:
            with pytest.raises(DeviceMismatch, match=r"out\.2\.bias .*rests in host memory, "
                                                     r"not on cuda0"):
                run(model, inp)
        finally:
            model.skip_patch = None
        assert torch.equal(run(model, inp), ref)
    assert_restored(model, snap)


@pytest.mark.parametrize("stream", [None, (0, 1)])
def test_layer_split_hops_and_equals_plain(stream):
    from comfyui_placement.placement.devices import Inventory
    model, inp = build(LoopUNet)
    ref = run(model, inp)
    snap = snapshot(model)
    inv = Inventory.simulated("cuda0=256MiB,cuda1=256MiB")
    plan = split_plan(["cuda0", "cuda1"], [None, None], params="cpu", stream=stream)
    with place_split(model, plan, "diffusion", inv) as placed:
        model.skip_patch = lambda h, hsp: (h, placed.follow(hsp, h))
        try:
            for _ in range(2):
                assert torch.equal(run(model, inp), ref)
        finally:
            model.skip_patch = None
        stats = placed.stats()
        # into cuda1's range and back out, every forward: the blocks were really entered
        assert stats["hops"] >= 2 * 2
        assert stats["devices"]["cuda1"]["peak_bytes"] > 0
    assert_restored(model, snap)


def test_lora_under_streaming_on_loop_run_blocks(sim_inventory):
    model, inp = build(LoopUNet)
    g = torch.Generator().manual_seed(3)
    names = ["input_blocks.1.1.q.weight", "output_blocks.3.0.emb.weight"]
    params = dict(model.named_parameters())
    patches = {n: [(torch.randn(2, params[n].shape[1], generator=g) * 0.3,
                    torch.randn(params[n].shape[0], 2, generator=g) * 0.3, 2.0, 1.0)]
               for n in names}
    fused = copy.deepcopy(model)
    fp = dict(fused.named_parameters())
    with torch.no_grad():
        for n, p in patches.items():
            apply_in_place(fp[n].data, p)
    ref = run(fused, inp)
    assert not torch.allclose(ref, run(model, inp))
    with place(model, make_plan("cpu", stream=(0, 1)), "diffusion", sim_inventory) as placed:
        placed.set_lora(patches)
        torch.testing.assert_close(run(model, inp), ref)
        torch.testing.assert_close(run(model, inp), ref)
