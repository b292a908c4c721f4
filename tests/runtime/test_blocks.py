"""Blocks found from the module structure, in execution order; explicit lists."""
import pytest
import torch
from torch import nn

from comfyui_placement.placement.errors import PlacementError
from comfyui_placement.placement.metadata.info import BlockInfo
from comfyui_placement.runtime import find_blocks


def lin():
    return nn.Linear(2, 2)


class LdmUNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.output_blocks = nn.ModuleList([lin(), lin()])   # declared out of order
        self.input_blocks = nn.ModuleList([lin(), lin()])
        self.middle_block = lin()
        self.out = lin()


class LdmFlux(nn.Module):
    def __init__(self):
        super().__init__()
        self.img_in = lin()
        self.single_blocks = nn.ModuleList([lin(), lin(), lin()])
        self.double_blocks = nn.ModuleList([lin(), lin()])
        self.final_layer = lin()


class Wrapped(nn.Module):                   # an LLM: model.layers under a wrapper
    def __init__(self):
        super().__init__()
        self.model = nn.Module()
        self.model.embed = nn.Embedding(4, 2)
        self.model.layers = nn.ModuleList([lin(), lin(), lin()])
        self.lm_head = lin()


def names(module, **kw):
    return [n for n, _ in find_blocks(module, **kw)]


def test_known_structures_in_execution_order(tiny):
    assert names(LdmUNet()) == ["input_blocks.0", "input_blocks.1", "middle_block",
                                "output_blocks.0", "output_blocks.1"]
    assert names(LdmFlux()) == ["double_blocks.0", "double_blocks.1", "single_blocks.0",
                                "single_blocks.1", "single_blocks.2"]
    assert names(Wrapped()) == ["model.layers.0", "model.layers.1", "model.layers.2"]
    flux, _ = tiny("flux")
    assert names(flux) == ["transformer_blocks.0", "transformer_blocks.1",
                           "single_transformer_blocks.0", "single_transformer_blocks.1",
                           "single_transformer_blocks.2"]
    unet, _ = tiny("unet")
    assert names(unet) == ["down_blocks.0", "down_blocks.1", "mid_block", "up_blocks.0",
                           "up_blocks.1"]
    assert find_blocks(nn.Sequential(lin(), lin())) == []


def test_explicit_block_lists():
    m = LdmFlux()
    got = find_blocks(m, ["single_blocks.1", "double_blocks.0"])
    assert [n for n, _ in got] == ["single_blocks.1", "double_blocks.0"]
    assert got[1][1] is m.double_blocks[0]
    infos = [BlockInfo("double_blocks.1", 24)]
    assert names(m, names=[i.name for i in infos]) == ["double_blocks.1"]
    with pytest.raises(PlacementError, match="not a submodule"):
        find_blocks(m, ["double_blocks.7"])
    with pytest.raises(PlacementError, match="overlap"):
        find_blocks(Wrapped(), ["model", "model.layers.0"])


def test_place_accepts_block_infos(tiny, run_model, plan_for, sim_inventory):
    from comfyui_placement.runtime import place
    model, inp = tiny("sd3")
    ref = run_model(model, inp)
    blocks = [BlockInfo(f"transformer_blocks.{i}", 0) for i in (0, 1)]   # the last stays
    with place(model, plan_for("cpu", stream=(0, 1)), "diffusion", sim_inventory,
               blocks=blocks) as placed:
        assert torch.equal(run_model(model, inp), ref)
    assert placed.stats()["streamed_blocks"] == 2
