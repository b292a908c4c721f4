"""The main job on an embedded default: no files, no downloads.

A small Flux-architecture transformer (diffusers' FluxTransformer2DModel at a tiny
config, random weights) is planned for a simulated two-GPU machine whose budgets are
smaller than the model, run under the plan, and compared with an all-resident run.
"""
import json
import time

from .placement import Inventory, PlacementError, PlacementSpec, plan
from .placement.units import format_bytes

INVENTORY = "cuda0=1GiB,cuda1=1GiB,cpu=8GiB"
HIDDEN_HEADS, HEAD_DIM = 4, 64


def build_model():
    try:
        import torch
        from diffusers import FluxTransformer2DModel
    except ImportError as exc:
        raise PlacementError(f"the demo needs torch and diffusers ({exc.name} is missing); "
                             f"install the test extra: pip install -e '.[test]'") from None
    torch.manual_seed(0)
    model = FluxTransformer2DModel(
        patch_size=1, in_channels=16, num_layers=2, num_single_layers=6,
        attention_head_dim=HEAD_DIM, num_attention_heads=HIDDEN_HEADS,
        joint_attention_dim=64, pooled_projection_dim=32, axes_dims_rope=(8, 28, 28))
    model.eval().requires_grad_(False)
    side, text = 16, 8
    inputs = dict(
        hidden_states=torch.randn(1, side * side, 16),
        encoder_hidden_states=torch.randn(1, text, 64),
        pooled_projections=torch.randn(1, 32),
        timestep=torch.tensor([0.5]),
        img_ids=torch.stack(torch.meshgrid(torch.zeros(1), torch.arange(side).float(),
                                           torch.arange(side).float(), indexing="ij"),
                            -1).reshape(-1, 3),
        txt_ids=torch.zeros(text, 3))
    return model, inputs


def run_demo(as_json: bool = False) -> int:
    import torch
    from .runtime.place import place

    model, inputs = build_model()
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    budget = weight_bytes * 2 // 5 + (10 << 20)   # each GPU: 40% of the weights + work
    inventory = Inventory.simulated(INVENTORY)
    spec = PlacementSpec(auto_fit=True, stream_layers=True,
                         max_vram=f"cuda0={budget}b,cuda1={budget}b")
    # 16x16 latent tokens of a patch-1 Flux are a 256x256 image: the planner sizes
    # working memory from that, as it would for a real model at a real resolution
    # working memory; a simulated GPU has no cuBLAS workspace, so it is the activations
    # alone (256 tokens x 256 hidden x fp32 x ~40 live tensors = 10 MiB)
    the_plan = plan(spec, inventory, components={"diffusion": model}, resolution=(256, 256),
                    headroom={"diffusion": 10 << 20})
    print(f"model: Flux architecture, {format_bytes(weight_bytes)} of weights; "
          f"simulated GPUs {INVENTORY}, budget {format_bytes(budget)} each\n")
    print(the_plan.report())

    with torch.no_grad():
        t0 = time.perf_counter()
        reference = model(**inputs).sample
        resident_s = time.perf_counter() - t0
        with place(model, the_plan, "diffusion", inventory) as placed:
            t0 = time.perf_counter()
            placed_out = model(**inputs).sample
            placed_s = time.perf_counter() - t0
            stats = placed.stats()
    diff = (placed_out - reference).abs().max().item()
    print(f"\nall-resident run {resident_s * 1000:.1f} ms; placed run {placed_s * 1000:.1f} ms "
          f"(simulated transfers included)")
    for name, s in stats["devices"].items():
        budget_bytes = the_plan.device(name).budget_bytes
        print(f"  {name}: peak {format_bytes(s['peak_bytes'])} of budget "
              f"{format_bytes(budget_bytes)}, copied {format_bytes(s['h2d_bytes'])}")
        if budget_bytes is not None and s["peak_bytes"] > budget_bytes:
            print(f"  ! {name} went over its budget")
            diff = float("inf")
    print(f"  hops {stats['hops']}, hop bytes {format_bytes(stats['hop_bytes'])}")
    print(f"max |placed - resident| = {diff:g} -> "
          f"{'identical' if diff == 0 else 'DIFFERENT'}")
    if as_json:
        print(json.dumps({"plan": the_plan.to_dict(), "stats": stats, "max_abs_diff": diff}))
    return 0 if diff == 0 else 1
