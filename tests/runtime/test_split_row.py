"""Row split on simulated devices: equal to the unsplit module within float32 tolerance
(max |split - unsplit| <= 1e-5 * max(1, max |unsplit|), docs/split.md), with and
without a runtime LoRA; rows in proportion to budgets; fallback to layer split with a
warning; exact restore."""
import copy

import pytest
import torch

from comfyui_placement.placement.devices import Inventory
from comfyui_placement.placement.errors import PlacementError
from comfyui_placement.placement.plan import ComponentPlan, DevicePlan, Plan, StreamPlan
from comfyui_placement.runtime.split import place_split
from comfyui_placement.runtime.split.row import eligible_linears

INVENTORY = "cuda0=256MiB,cuda1=256MiB,cuda2=256MiB"
TOL = 1e-5


def split_plan(runtime, budgets, mode="row", stream=None):
    devices = [DevicePlan(n, "gpu", 256 << 20, 256 << 20, b) for n, b in zip(runtime, budgets)]
    comp = ComponentPlan("diffusion", list(runtime), runtime[0], split_mode=mode,
                         stream=StreamPlan(*stream) if stream else None)
    return Plan(devices, {"diffusion": comp})


def flux256(seed=0):
    """Hidden size 256 so the block Linears are eligible; one block of each kind."""
    from diffusers import FluxTransformer2DModel
    torch.manual_seed(seed)
    m = FluxTransformer2DModel(patch_size=1, in_channels=8, num_layers=1, num_single_layers=1,
                               attention_head_dim=128, num_attention_heads=2,
                               joint_attention_dim=32, pooled_projection_dim=16,
                               axes_dims_rope=(32, 48, 48)).eval()
    L, T = 16, 8
    inp = dict(hidden_states=torch.randn(1, L, 8), encoder_hidden_states=torch.randn(1, T, 32),
               pooled_projections=torch.randn(1, 16), timestep=torch.tensor([0.5]),
               img_ids=torch.zeros(L, 3), txt_ids=torch.zeros(T, 3), return_dict=False)
    return m, inp


def run(model, inp):
    with torch.no_grad():
        return model(**inp)[0]


def close(a, b):
    return (a - b).abs().max().item() <= TOL * max(1.0, b.abs().max().item())


@pytest.fixture(scope="module")
def model_and_input():
    return flux256()


@pytest.mark.parametrize("budgets", [[64 << 20, 32 << 20], [64 << 20, 32 << 20, 16 << 20]])
def test_row_split_within_tolerance_and_restored(budgets, model_and_input):
    model, inp = model_and_input
    ref = run(model, inp)
    before = {n: (p, p.detach().clone()) for n, p in model.named_parameters()}
    runtime = ["cuda0", "cuda1", "cuda2"][:len(budgets)]
    with place_split(model, split_plan(runtime, budgets), "diffusion",
                     Inventory.simulated(INVENTORY)) as placed:
        out = run(model, inp)
        out2 = run(model, inp)
    assert close(out, ref) and torch.equal(out, out2)
    s = placed.stats()
    assert s["split_mode"] == "row" and s["sharded_linears"] == len(eligible_linears(model))
    assert s["hops"] > 0 and s["hop_bytes"] > 0
    for name, dev in s["devices"].items():
        assert 0 < dev["peak_bytes"] <= dev["capacity_bytes"] and dev["resident_bytes"] == 0
    for n, p in model.named_parameters():
        assert before[n][0] is p and torch.equal(p.detach(), before[n][1])
    assert all("forward" not in m.__dict__ and not m._forward_hooks
               and not m._forward_pre_hooks for m in model.modules())
    assert torch.equal(run(model, inp), ref)


def test_rows_follow_budgets_and_zero_budget_gets_none(model_and_input):
    model, inp = model_and_input
    eligible = sum(l.weight.numel() * 4 + (l.bias.numel() * 4 if l.bias is not None else 0)
                   for _, l in eligible_linears(model))
    budgets = [64 << 20, 0, 24 << 20]
    with place_split(model, split_plan(["cuda0", "cuda1", "cuda2"], budgets), "diffusion",
                     Inventory.simulated(INVENTORY)) as placed:
        out = run(model, inp)
        s = placed.stats()
        resident = {n: d["resident_bytes"] for n, d in s["devices"].items()}
    assert resident["cuda1"] == 0 and s["shards_per_device"]["cuda1"] == 0
    main_rest = resident["cuda0"] + resident["cuda2"] - eligible   # non-eligible on cuda0
    share0 = resident["cuda0"] - main_rest
    room = [(64 << 20) - main_rest, 24 << 20]
    ideal0 = eligible * room[0] / sum(room)
    assert abs(share0 - ideal0) <= 0.01 * eligible        # rounding of rows only
    assert close(out, run(model, inp))


def lora_for(model, rank=4, seed=1):
    g = torch.Generator().manual_seed(seed)
    names = [n for n, _ in eligible_linears(model)][::3]
    names.append("norm_out.linear")                       # a Linear outside the blocks
    named = dict(model.named_modules())
    lora = {}
    for n in names:
        out_f, in_f = named[n].weight.shape
        up = torch.randn(out_f, rank, generator=g) * 0.05
        down = torch.randn(rank, in_f, generator=g) * 0.05
        lora[n] = [(up, down, 0.8)]
    return lora


def fused(model, lora):
    ref = copy.deepcopy(model)
    named = dict(ref.named_modules())
    with torch.no_grad():
        for n, entries in lora.items():
            for up, down, s in entries:
                named[n].weight += s * (up @ down)
    return ref


def test_row_split_with_runtime_lora_matches_fused(model_and_input):
    model, inp = model_and_input
    lora = lora_for(model)
    ref = run(fused(model, lora), inp)
    plain = run(model, inp)
    assert not close(plain, ref)                          # the LoRA changes the output
    with place_split(model, split_plan(["cuda0", "cuda1", "cuda2"],
                                       [64 << 20, 32 << 20, 32 << 20]),
                     "diffusion", Inventory.simulated(INVENTORY), lora=lora):
        out = run(model, inp)
    assert close(out, ref)
    assert torch.equal(run(model, inp), plain)            # the weights never took the patch


def test_lora_shape_mismatch_refused(model_and_input):
    model, _ = model_and_input
    name = eligible_linears(model)[0][0]
    bad = {name: [(torch.zeros(3, 2), torch.zeros(2, 3), 1.0)]}
    with pytest.raises(PlacementError, match="expected up"):
        with place_split(model, split_plan(["cuda0", "cuda1"], [64 << 20] * 2), "diffusion",
                         Inventory.simulated(INVENTORY), lora=bad):
            pass
    with pytest.raises(PlacementError, match="not a Linear"):
        with place_split(model, split_plan(["cuda0", "cuda1"], [64 << 20] * 2), "diffusion",
                         Inventory.simulated(INVENTORY), lora={"nope": []}):
            pass


def test_weight_patch_functions_refused_not_dropped(model_and_input):
    model, _ = model_and_input
    name, lin = eligible_linears(model)[0]
    lin.weight_function = [lambda w: w * 2]               # ComfyUI's runtime patch list
    try:
        with pytest.raises(PlacementError, match="weight patch functions"):
            with place_split(model, split_plan(["cuda0", "cuda1"], [64 << 20] * 2),
                             "diffusion", Inventory.simulated(INVENTORY)):
                pass
    finally:
        del lin.weight_function


def test_no_eligible_weight_falls_back_to_layer_split_with_warning(tiny, run_model):
    model, inp = tiny("wan")                              # hidden size 16: nothing eligible
    ref = run_model(model, inp)
    with pytest.warns(RuntimeWarning, match="using layer split instead"):
        placed = place_split(model, split_plan(["cuda0", "cuda1"], [1 << 20] * 2),
                             "diffusion", Inventory.simulated(INVENTORY))
    with placed:
        assert torch.equal(run_model(model, inp), ref)
    assert placed.stats()["split_mode"] == "layer"


def test_row_split_with_streaming_refused(model_and_input):
    model, _ = model_and_input
    with pytest.raises(PlacementError, match="row split does not stream"):
        place_split(model, split_plan(["cuda0", "cuda1"], [64 << 20] * 2, stream=(0, 1)),
                    "diffusion", Inventory.simulated(INVENTORY))
