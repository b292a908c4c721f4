"""ComfyUI's LoRA patch lists -> row split lora= entries (runtime/comfy/patchers/row_lora.py), with
stand-ins for ComfyUI's LowVramPatch and weight adapters (no ComfyUI needed).

The row split with the converted LoRA must equal the layer with ComfyUI's fused
weight, W + strength * alpha / rank * up @ down (also for an offset patch on a part of a
fused weight), within the row split's float32 bound (docs/split.md: max |split - fused|
<= 1e-5 * max(1, max |fused|)); kinds it cannot slice exactly are refused in one line;
the layers' patch lists are set aside while the placement opens and put back exactly."""
import importlib
import importlib.util
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from comfyui_placement.placement.devices import Inventory
from comfyui_placement.placement.errors import PlacementError
from comfyui_placement.placement.plan import ComponentPlan, DevicePlan, Plan
from comfyui_placement.runtime.place import place

TOL = 1e-5
NAME = "comfyui_placement.runtime.comfy.patchers.row_lora"


@pytest.fixture(scope="module")
def row_lora():
    """The module; its package's __init__ imports comfy, row_lora itself does not, so
    without ComfyUI it is loaded on its own (kept out of sys.modules)."""
    try:
        return importlib.import_module(NAME)
    except ModuleNotFoundError as exc:
        if not (exc.name or "").startswith("comfy"):
            raise
    import comfyui_placement.runtime as rt
    path = Path(rt.__file__).parent / "comfy" / "patchers" / "row_lora.py"
    spec = importlib.util.spec_from_file_location(NAME, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert "comfy" not in sys.modules      # the conversion itself never imports ComfyUI
    return mod


class Adapter:
    """Stands in for comfy.weight_adapter's adapters (name, weights)."""

    def __init__(self, name, weights):
        self.name = name
        self.weights = weights


class LowVramPatch:
    """Stands in for comfy.model_patcher.LowVramPatch: the patcher's dict and a key."""
    is_lowvram_patch = True

    def __init__(self, key, patches):
        self.key = key
        self.patches = patches


class CastLinear(nn.Linear):
    weight_function = []           # class defaults, as on ComfyUI's cast ops
    bias_function = []


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(nn.ModuleDict({"qkv": CastLinear(256, 768),
                                                   "proj": CastLinear(768, 256),
                                                   "small": CastLinear(256, 64)})
                                    for _ in range(2))

    def forward(self, x):
        for b in self.blocks:
            x = x + b["proj"](torch.relu(b["qkv"](x))) + b["small"](x).sum(-1, keepdim=True)
        return x


def lora(out_f, in_f, rank=4, alpha=2.0, **extra):
    w = {"mid": None, "dora": None, "reshape": None, **extra}
    return Adapter("lora", (torch.randn(out_f, rank) * 0.1, torch.randn(rank, in_f) * 0.1,
                            alpha, w["mid"], w["dora"], w["reshape"]))


def row_cp():
    devices = [DevicePlan(n, "gpu", 256 << 20, 256 << 20, 64 << 20) for n in ("cuda0", "cuda1")]
    comp = ComponentPlan("diffusion", ["cuda0", "cuda1"], "cuda0", split_mode="row")
    return Plan(devices, {"diffusion": comp})


def patch(model, name, entries):
    """What ComfyUI's low-VRAM load leaves on a layer: weight_function = [LowVramPatch]."""
    key = f"diffusion_model.{name}.weight"
    patches = {key: entries}
    model.get_submodule(name).weight_function = [LowVramPatch(key, patches)]


def fused(model, name, entries):
    """ComfyUI's calculate_weight for plain LoRA entries, applied to a copy."""
    lin = model.get_submodule(name)
    w = lin.weight.detach().clone()
    for strength, a, strength_model, offset, function in entries:
        up, down, alpha = a.weights[:3]
        part = w if offset is None else w.narrow(*offset)
        per_rank = 1.0 if alpha is None else alpha / down.shape[0]
        part += strength * per_rank * (up @ down)
    return w


def test_plain_and_offset_lora_equal_fused_weights_and_lists_come_back(row_lora):
    torch.manual_seed(0)
    model = Model().eval()
    x = torch.randn(3, 256)
    qkv0 = [(0.8, lora(768, 256), 1.0, None, None),
            (0.5, lora(256, 256, alpha=None), 1.0, (0, 256, 256), None),   # k of a fused qkv
            (0.0, lora(768, 256), 1.0, None, None)]                       # strength 0: nothing
    proj1 = [(1.3, lora(256, 384, rank=3), 1.0, (1, 384, 384), None)]      # input columns
    small = [(0.7, lora(64, 256), 1.0, None, None)]     # not sharded: ComfyUI's cast op runs it
    patch(model, "blocks.0.qkv", qkv0)
    patch(model, "blocks.1.proj", proj1)
    patch(model, "blocks.0.small", small)
    lists = {n: m.__dict__.get("weight_function") for n, m in model.named_modules()}

    converted, carrying = row_lora.comfy_lora_for_rows(model, "diffusion")
    assert set(converted) == {"blocks.0.qkv", "blocks.1.proj"} and len(carrying) == 2
    assert len(converted["blocks.0.qkv"]) == 2
    up, down, scale = converted["blocks.0.qkv"][1]
    assert up.shape == (768, 4) and scale == 0.5 and not up[:256].any() and not up[512:].any()

    # reference: the patched weights fused into a copy (the small layer fused as well)
    ref = Model().eval()
    ref.load_state_dict(model.state_dict())
    with torch.no_grad():
        ref.blocks[0]["qkv"].weight.copy_(fused(model, "blocks.0.qkv", qkv0))
        ref.blocks[1]["proj"].weight.copy_(fused(model, "blocks.1.proj", proj1))
        ref.blocks[0]["small"].weight.copy_(fused(model, "blocks.0.small", small))
        want = ref(x)

    # the stand-in cast op applies its functions the way ComfyUI's does
    small_lin = model.blocks[0]["small"]
    small_lin.forward = lambda t: nn.functional.linear(
        t, fused(model, "blocks.0.small", small), small_lin.bias)
    plan = row_cp()
    inv = Inventory.simulated("cuda0=256MiB,cuda1=256MiB")
    with row_lora.row_lora_options(model, plan.components["diffusion"]) as options:
        assert model.blocks[0]["qkv"].weight_function == []     # set aside while opening
        placed = place(model, plan, "diffusion", inv, **options)
        placed.__enter__()
    try:
        assert model.blocks[0]["qkv"].__dict__["weight_function"] is lists["blocks.0.qkv"]
        with torch.no_grad():
            got = model(x)
    finally:
        placed.__exit__(None, None, None)
    assert placed.stats()["sharded_linears"] == 4
    assert (got - want).abs().max().item() <= TOL * max(1.0, want.abs().max().item())
    assert {n: m.__dict__.get("weight_function") for n, m in model.named_modules()} == lists
    assert "weight_function" not in model.blocks[1]["qkv"].__dict__


@pytest.mark.parametrize("entry, words", [
    ((1.0, Adapter("loha", (None,) * 6), 1.0, None, None), "loha patch"),
    ((1.0, Adapter("lokr", (None,) * 7), 1.0, None, None), "lokr patch"),
    ((1.0, (torch.zeros(768, 256),), 1.0, None, None), "diff patch"),
    ((1.0, ("set", (torch.zeros(768, 256),)), 1.0, None, None), "set patch"),
    ((1.0, "dora", 1.0, None, None), "DoRA patch"),
    ((1.0, "mid", 1.0, None, None), "LoCon/Tucker"),
    ((1.0, "plain", 0.5, None, None), "strength_model 0.5"),
    ((1.0, "plain", 1.0, None, abs), "weight function"),
    ((1.0, "plain", 1.0, (0, 0, 100), None), "up (768, 4)"),
])
def test_kinds_it_cannot_slice_are_refused_in_one_line(row_lora, entry, words):
    v = entry[1]
    if v == "dora":
        v = lora(768, 256, dora=torch.ones(768, 1))
    elif v == "mid":
        v = lora(768, 256, mid=torch.ones(4, 4, 1, 1))
    elif v == "plain":
        v = lora(768, 256)
    model = Model()
    patch(model, "blocks.0.qkv", [(entry[0], v, *entry[2:])])
    with pytest.raises(PlacementError) as exc:
        with row_lora.row_lora_options(model, row_cp().components["diffusion"]):
            pass
    msg = str(exc.value)
    assert words in msg and "blocks.0.qkv" in msg and "split_mode layer" in msg
    assert "\n" not in msg
    assert len(model.blocks[0]["qkv"].weight_function) == 1        # nothing set aside


def test_bias_patches_and_weight_wrappers_are_refused(row_lora):
    model = Model()
    key = "diffusion_model.blocks.1.proj.bias"
    model.blocks[1]["proj"].bias_function = [
        LowVramPatch(key, {key: [(1.0, (torch.zeros(256),), 1.0, None, None)]})]
    with pytest.raises(PlacementError, match=r"blocks\.1\.proj with its bias diff patch"):
        row_lora.comfy_lora_for_rows(model, "diffusion")
    model = Model()
    model.blocks[0]["proj"].weight_function = [lambda w: w * 2]
    with pytest.raises(PlacementError, match="not one of ComfyUI's patch lists"):
        row_lora.comfy_lora_for_rows(model, "diffusion")


def test_layer_split_leaves_patches_to_comfyui(row_lora):
    """Blocks run whole under layer split, so ComfyUI's cast ops apply every kind."""
    model = Model()
    patch(model, "blocks.0.qkv", [(1.0, Adapter("loha", (None,) * 6), 1.0, None, None)])
    cp = row_cp().components["diffusion"]
    cp.split_mode = "layer"
    with row_lora.row_lora_options(model, cp) as options:
        assert options == {} and len(model.blocks[0]["qkv"].weight_function) == 1
