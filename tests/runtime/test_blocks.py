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


class AnyNames(nn.Module):              # AuraFlow / Kandinsky5-like: lists of new names
    def __init__(self):
        super().__init__()
        self.embed = lin()
        self.front_stack = nn.ModuleList([nn.Linear(8, 8), nn.Linear(8, 8)])
        self.back_stack = nn.ModuleList([nn.Linear(8, 8) for _ in range(3)])
        self.head = lin()


def test_block_lists_of_any_name_are_found_by_shape():
    assert names(AnyNames()) == ["front_stack.0", "front_stack.1", "back_stack.0",
                                 "back_stack.1", "back_stack.2"]
    small = AnyNames()
    small.embed = nn.Linear(64, 64)          # most weights outside the lists: no blocks
    assert names(small) == []


def test_comfy_names_of_auraflow_and_kandinsky5():
    aura = nn.Module()
    aura.double_layers = nn.ModuleList([lin(), lin()])
    aura.single_layers = nn.ModuleList([lin(), lin()])
    assert names(aura) == ["double_layers.0", "double_layers.1", "single_layers.0",
                           "single_layers.1"]
    k5 = nn.Module()
    k5.visual_transformer_blocks = nn.ModuleList([lin(), lin()])
    k5.text_transformer_blocks = nn.ModuleList([lin(), lin()])
    assert names(k5) == ["text_transformer_blocks.0", "text_transformer_blocks.1",
                         "visual_transformer_blocks.0", "visual_transformer_blocks.1"]


def test_levels_of_layers_give_their_layers_as_blocks():
    """Stable Cascade: down_blocks holds levels (ModuleLists the model loops)."""
    m = nn.Module()
    m.down_blocks = nn.ModuleList([nn.ModuleList([lin(), lin()]), nn.ModuleList([lin()])])
    m.up_blocks = nn.ModuleList([nn.ModuleList([lin()]), nn.ModuleList([lin(), lin()])])
    assert names(m) == ["down_blocks.0.0", "down_blocks.0.1", "down_blocks.1.0",
                        "up_blocks.0.0", "up_blocks.1.0", "up_blocks.1.1"]


def test_a_deeper_group_holding_most_of_the_weights_wins_over_a_tiny_shallow_one():
    """SAM 3.1: the shallowest known group is its tracker's 3-layer pointer MLP
    (`tracker.obj_ptr_proj.layers`); its ViT trunk's blocks, one level deeper, hold
    nearly all the weights and are what streams."""
    from torch import nn
    from comfyui_placement.runtime.blocks.find import find_blocks

    class Mlp(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList(nn.Linear(2, 2) for _ in range(3))

    class Trunk(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList(nn.Linear(64, 64) for _ in range(4))

    class Sam(nn.Module):
        def __init__(self):
            super().__init__()
            self.tracker = nn.Module()
            self.tracker.obj_ptr_proj = Mlp()
            self.detector = nn.Module()
            self.detector.backbone = nn.Module()
            self.detector.backbone.trunk = Trunk()

    names = [n for n, _ in find_blocks(Sam())]
    assert names == [f"detector.backbone.trunk.blocks.{i}" for i in range(4)]
    small = Sam()
    small.detector.backbone.trunk = Mlp()          # alike in size: the shallowest stays
    assert [n for n, _ in find_blocks(small)][0] == "tracker.obj_ptr_proj.layers.0"
