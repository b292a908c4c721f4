"""GGUF components planned as such (issue 12 item 5): sized by their quantized bytes
(from the file, or from a module loaded by load_gguf), the quant type(s) in the plan
(JSON `quant`, the report's quant column), dequantization scratch in the headroom."""
import json

import pytest
import torch

from comfyui_placement import Inventory, PlacementSpec, plan
from comfyui_placement.placement.metadata.describe import describe_component
from comfyui_placement.placement.metadata.gguf_file import (dequant_scratch_bytes,
                                                             quant_label, read_gguf)
from comfyui_placement.runtime.gguf import GGUFTensors, load_gguf, write_gguf

pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def flux():
    from diffusers import FluxTransformer2DModel
    torch.manual_seed(0)
    return FluxTransformer2DModel(patch_size=1, in_channels=8, num_layers=1,
                                  num_single_layers=2, attention_head_dim=128,
                                  num_attention_heads=2, joint_attention_dim=32,
                                  pooled_projection_dim=16, axes_dims_rope=(32, 48, 48)).eval()


@pytest.fixture(scope="module")
def q4k(flux, tmp_path_factory):
    path = str(tmp_path_factory.mktemp("plan") / "flux-q4_k.gguf")
    write_gguf(path, flux.state_dict(), "Q4_K")
    return path


def file_bytes(path):
    with GGUFTensors(path) as table:
        return sum(t.nbytes for t in table)


@pytest.mark.parametrize("auto_fit", [False, True])
def test_sized_by_quantized_bytes_with_the_type_in_the_plan(flux, q4k, auto_fit):
    inv = Inventory.simulated("cuda0=2GiB")
    spec = PlacementSpec(backend="diffusion=cuda0", auto_fit=auto_fit)
    float_plan = plan(spec, inv, components={"diffusion": flux})
    for source in (q4k, load_gguf(q4k, flux)):
        p = plan(spec, inv, components={"diffusion": source}, resolution=(64, 64))
        cp = p.components["diffusion"]
        assert cp.quant == "Q4_K"
        assert cp.total_bytes == file_bytes(q4k)
        assert cp.total_bytes < float_plan.components["diffusion"].total_bytes / 4
        assert json.loads(p.to_json())["components"]["diffusion"]["quant"] == "Q4_K"
        header = next(line for line in p.report().splitlines() if line.startswith("component"))
        assert header.split()[-1] == "quant"
    assert float_plan.components["diffusion"].quant is None
    assert "quant" not in float_plan.report().split("\n\n")[1].splitlines()[0]


def test_mixed_types_named_most_bytes_first(flux, tmp_path):
    path = tmp_path / "mixed.gguf"
    big = {k for k, v in flux.state_dict().items() if v.dim() == 2 and v.shape[1] == 1024}
    write_gguf(path, flux.state_dict(), "Q8_0",
               choose=lambda n, t, q: ("Q4_0" if n in big else "Q8_0")
               if t.dim() == 2 and t.numel() > 1024 and t.shape[-1] % 32 == 0 else "F32")
    tensors, _ = read_gguf(str(path))
    by = {}
    for t in tensors:
        if t.quant:
            by[t.quant] = by.get(t.quant, 0) + t.nbytes
    first = max(by, key=by.get)
    p = plan(PlacementSpec(backend="diffusion=cpu"), Inventory.simulated("cuda0=2GiB"),
             components={"diffusion": str(path)})
    assert p.components["diffusion"].quant == f"mixed: {first}+{({'Q8_0', 'Q4_0'} - {first}).pop()}"
    assert quant_label({}) is None and quant_label({"Q6_K": 3}) == "Q6_K"


def test_headroom_counts_the_dequantization_scratch(flux, q4k, tmp_path):
    tensors, _ = read_gguf(q4k)
    largest = max(t.shape[0] * t.shape[1] for t in tensors if t.quant)
    assert dequant_scratch_bytes(tensors, 2) == largest * 2
    assert dequant_scratch_bytes([t for t in tensors if not t.quant], 2) == 0
    info = describe_component("diffusion", q4k, resolution=(64, 64))
    assert "dequantization scratch" in info.headroom_basis
    # the same architecture in F32 (nothing quantized): the estimate without the scratch
    plain = tmp_path / "flux-f32.gguf"
    write_gguf(plain, flux.state_dict(), "Q4_K", choose=lambda n, t, q: "F32")
    ref = describe_component("diffusion", str(plain), resolution=(64, 64))
    assert "scratch" not in ref.headroom_basis
    # f32 activations there, 16-bit for quantized weights: compare the shares per byte
    assert info.headroom_bytes >= largest * 2
