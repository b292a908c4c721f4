"""Shared helpers for the runtime benchmarks: a Flux-architecture model and plans."""
import statistics
import sys
import time
from pathlib import Path

import torch

_ROOT = Path(__file__).resolve().parents[1]
try:
    import comfyui_placement  # noqa: F401
except ImportError:            # not installed: import the checkout under its package name
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "comfyui_placement", _ROOT / "__init__.py", submodule_search_locations=[str(_ROOT)])
    module = importlib.util.module_from_spec(spec)
    sys.modules["comfyui_placement"] = module
    spec.loader.exec_module(module)

from comfyui_placement.placement.devices import Inventory  # noqa: E402
from comfyui_placement.placement.plan import (ComponentPlan, DevicePlan, Plan,  # noqa: E402
                                              StreamPlan)


def flux(hidden=1024, heads=8, double=4, single=4, img_tokens=1024, txt_tokens=64, seed=0):
    from diffusers import FluxTransformer2DModel
    torch.manual_seed(seed)
    head_dim = hidden // heads
    rope = (head_dim // 4, 3 * head_dim // 8, 3 * head_dim // 8)
    model = FluxTransformer2DModel(patch_size=1, in_channels=16, num_layers=double,
                                   num_single_layers=single, attention_head_dim=head_dim,
                                   num_attention_heads=heads, joint_attention_dim=256,
                                   pooled_projection_dim=128, axes_dims_rope=rope).eval()
    inp = dict(hidden_states=torch.randn(1, img_tokens, 16),
               encoder_hidden_states=torch.randn(1, txt_tokens, 256),
               pooled_projections=torch.randn(1, 128), timestep=torch.tensor([0.5]),
               img_ids=torch.zeros(img_tokens, 3), txt_ids=torch.zeros(txt_tokens, 3),
               return_dict=False)
    return model, inp


def plan(params, stream=None, device="cuda0", budget=None, total=64 << 30):
    return Plan([DevicePlan(device, "gpu", total, total, budget)],
                {"diffusion": ComponentPlan("diffusion", [device], params,
                                            stream=StreamPlan(*stream) if stream else None)})


def inventory(text="cuda0=64GiB"):
    return Inventory.simulated(text)


def timed(fn, n):
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def med(xs):
    return statistics.median(xs)
