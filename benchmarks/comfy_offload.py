"""The pack's streaming against ComfyUI core's own offloading, inside ComfyUI, at one
memory budget, seconds per sampling step side by side in one run (issue 19 item 6).

Runs in ComfyUI's Python, in-process and headless (tests/integration/headless.py: the
pack loaded as ComfyUI loads a custom node). The model is ComfyUI's own class for the
family at its released size (families.py `full_config`: Flux.1 12B, Wan 2.1 14B) built
in bf16 with random weights (no download, no file), the conditioning random at the
family's prompt shape. Each way samples the same latent for `--steps` steps; the first
step (loads, warm-up, the pack's rehearsal-free first call) is reported apart, the
rest give the median seconds per step:

- `comfy`: ComfyUI core's offloading. The budget is imposed as ComfyUI's own
  `--reserve-vram` is (model_management.EXTRA_RESERVED_VRAM = total - budget), so its
  memory manager loads what fits and casts the rest per layer from host memory
  (its "lowvram" path; DynamicVRAM when comfy-aimdo is installed and not disabled).
- `pack`: Backend Assignment `diffusion=cuda0`, stream_layers, params cpu,
  max_vram = the budget (the pack's planner sizes the resident prefix and the ring).

Both ways run in the same process, one after the other, with every model unloaded and
the caches emptied between them, same threads, same pinned-memory state for the host
weights (ComfyUI pins its own; the pack packs and pins its own copy: a ratio compares
the whole of each path). Assumes one CUDA GPU (`--cpu` runs the plumbing on the CPU with
the pack on a simulated cuda0 and ComfyUI resident: for CI, no timing meaning).

    python benchmarks/comfy_offload.py --comfyui /path/to/ComfyUI --family flux1 \\
        --budget-gib 12 --steps 4 --out result.json
Prints `COMFY_OFFLOAD {json}` and a table.
"""
import argparse
import asyncio
import gc
import json
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve()
PACK = HERE.parents[1]


def parse_args():
    ap = argparse.ArgumentParser()
    ap.add_argument("--comfyui", required=True)
    ap.add_argument("--work", default="/tmp/comfy_offload")
    ap.add_argument("--family", default="flux1", help="families.py key (flux1, wan21, ...)")
    ap.add_argument("--tiny", action="store_true", help="the family's tiny test config")
    ap.add_argument("--budget-gib", type=float, default=12.0)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--latent", default="", help="latent shape, e.g. 1,16,128,128 "
                    "(default: 1024x1024 for images, 33 frames at 832x480 for Wan)")
    ap.add_argument("--ways", default="comfy,pack")
    ap.add_argument("--cpu", action="store_true", help="plumbing check on the CPU")
    ap.add_argument("--out", default="")
    return ap.parse_args()


ARGS = parse_args()
sys.path.insert(0, ARGS.comfyui)
sys.path.insert(0, str(PACK / "tests" / "integration"))
os.chdir(ARGS.comfyui)
sys.argv = [sys.argv[0], "--use-pytorch-cross-attention",
            "--output-directory", os.path.join(ARGS.work, "output"),
            "--temp-directory", os.path.join(ARGS.work, "tmp")] + \
    (["--cpu", "--disable-dynamic-vram"] if ARGS.cpu else [])

import comfy.options  # noqa: E402

comfy.options.enable_args_parsing()

import torch  # noqa: E402

import comfy.model_management as mm  # noqa: E402
import comfy.model_patcher  # noqa: E402
import comfy.sample  # noqa: E402

from families import FAMILIES, _is_norm, model_config_for  # noqa: E402
from headless import pack_module, start_comfy  # noqa: E402

GiB = 1 << 30
DEFAULT_LATENT = {"flux1": (1, 16, 128, 128), "wan21": (1, 16, 9, 60, 104)}


def build_model(fam, full: bool, dtype):
    """ComfyUI's model for the family in `dtype`, random weights, as a ModelPatcher."""
    cfg = model_config_for(fam.full_config if full else fam.unet_config)
    cfg.set_inference_dtype(dtype, None)
    model = cfg.get_model({}, "", device=torch.device("cpu"))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.diffusion_model.named_parameters():
            owner, _, leaf = name.rpartition(".")
            if _is_norm(model.diffusion_model.get_submodule(owner) if owner else
                        model.diffusion_model, owner.rpartition(".")[2]) and p.ndim <= 1:
                p.fill_(1.0 if leaf in ("weight", "scale", "gamma") else 0.0)
            else:
                p.normal_(0.0, 0.02, generator=g)
        for b in model.diffusion_model.buffers():
            if b.is_floating_point() and not torch.isfinite(b).all():
                b.zero_()
    return comfy.model_patcher.ModelPatcher(model, load_device=mm.get_torch_device(),
                                            offload_device=mm.unet_offload_device())


def sample(model, fam, latent_shape, steps):
    """Seconds of each step (a callback per step) and the output latent."""
    noise = torch.randn(latent_shape, generator=torch.Generator().manual_seed(1))
    positive = fam.conditioning(seed=2)
    negative = fam.conditioning(seed=3)
    stamps = [time.perf_counter()]

    def callback(step, x0, x, total):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        stamps.append(time.perf_counter())
    out = comfy.sample.sample(model, noise, steps, 1.0, "euler", "simple", positive,
                              negative, torch.zeros(latent_shape), callback=callback,
                              disable_pbar=True, seed=1)
    return [b - a for a, b in zip(stamps, stamps[1:])], out


def clean():
    mm.unload_all_models()
    gc.collect()
    mm.soft_empty_cache()
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()


def run_comfy(base, fam, shape, budget):
    saved = mm.EXTRA_RESERVED_VRAM
    if torch.cuda.is_available():
        total = mm.get_total_memory(mm.get_torch_device())
        mm.EXTRA_RESERVED_VRAM = max(0, int(total - budget))
    try:
        times, out = sample(base, fam, shape, ARGS.steps)
    finally:
        mm.EXTRA_RESERVED_VRAM = saved
    return times, out, {}


def run_pack(base, fam, shape, budget):
    spec_mod = pack_module("placement.spec")
    planning = pack_module("nodes.planning")
    place_objects = pack_module("runtime.comfy").place_objects
    common = pack_module("nodes.common")
    if ARGS.cpu:       # a simulated cuda0 of the budget (no kernel workspace there)
        os.environ["COMFYUI_PLACEMENT_SIMULATE"] = f"cuda0={budget / GiB:.6f}@workspace=0"
    inventory = common.node_inventory()
    spec = spec_mod.PlacementSpec(backend="diffusion=cuda0", params_backend="diffusion=cpu",
                                  stream_layers=True, max_vram=f"cuda0={budget / GiB:.6f}")
    plan = planning.make_plan(spec, inventory, {"diffusion": base})
    placed, _ = place_objects(plan, inventory, {"diffusion": base})
    times, out = sample(placed["diffusion"], fam, shape, ARGS.steps)
    session = placed["diffusion"].get_attachment("placement")
    stats = getattr(session, "last_stats", None) or {}
    cp = plan.components["diffusion"]
    return times, out, {"stream": cp.stream and cp.stream.__dict__,
                        "planned_bytes": plan.device("cuda0").planned_bytes,
                        "ledger": {d: {k: v.get(k) for k in ("peak_bytes", "h2d_bytes")}
                                   for d, v in (stats.get("devices") or {}).items()}}


async def main():
    t0 = time.time()
    await start_comfy(str(PACK), ARGS.work, {})
    fam = FAMILIES[ARGS.family]
    dtype = torch.float32 if ARGS.cpu else torch.bfloat16
    shape = tuple(int(x) for x in ARGS.latent.split(",")) if ARGS.latent else \
        (tuple(fam.latent) if ARGS.tiny else DEFAULT_LATENT[ARGS.family])
    base = build_model(fam, not ARGS.tiny, dtype)
    weights = sum(p.numel() * p.element_size() for p in base.model.parameters())
    budget = int(ARGS.budget_gib * GiB)
    result = {"family": ARGS.family, "full_size": not ARGS.tiny, "dtype": str(dtype),
              "weight_bytes": weights, "budget_bytes": budget, "latent": list(shape),
              "steps": ARGS.steps, "device": torch.cuda.get_device_name(0)
              if torch.cuda.is_available() and not ARGS.cpu else "cpu",
              "build_s": round(time.time() - t0, 1),
              "comfy_patcher": type(base).__name__, "comfy_dynamic_vram": bool(
                  getattr(base, "is_dynamic", lambda: False)()), "ways": {}}
    outs = {}
    for way in [w for w in ARGS.ways.split(",") if w]:
        clean()
        run = {"comfy": run_comfy, "pack": run_pack}[way]
        t = time.time()
        times, out, extra = run(base, fam, shape, budget)
        outs[way] = out.float()
        rec = {"first_step_s": round(times[0], 4), "steps_s": [round(x, 4) for x in times],
               "median_step_s": round(statistics.median(times[1:]), 4) if len(times) > 1
               else None, "wall_s": round(time.time() - t, 2), **extra}
        if torch.cuda.is_available() and not ARGS.cpu:
            rec["cuda_peak_bytes"] = torch.cuda.max_memory_allocated()
        result["ways"][way] = rec
    if "comfy" in outs and "pack" in outs:
        a, b = outs["comfy"], outs["pack"]
        result["max_abs_diff"] = float((a - b).abs().max())
        c, p = result["ways"]["comfy"], result["ways"]["pack"]
        if c["median_step_s"] and p["median_step_s"]:
            result["pack_over_comfy"] = round(p["median_step_s"] / c["median_step_s"], 3)
    clean()
    print("COMFY_OFFLOAD " + json.dumps(result), flush=True)
    print(f"\n{ARGS.family} ({weights / GiB:.1f} GiB {dtype}) at a {ARGS.budget_gib:g} GiB "
          f"budget on {result['device']}, latent {shape}")
    print(f"{'way':6} {'first step s':>12} {'median s/step':>14} {'peak GiB':>9}")
    for way, rec in result["ways"].items():
        peak = rec.get("cuda_peak_bytes") or max(
            [d.get("peak_bytes") or 0 for d in (rec.get("ledger") or {}).values()] or [0])
        print(f"{way:6} {rec['first_step_s']:12.3f} {rec['median_step_s'] or 0:14.3f} "
              f"{peak / GiB:9.2f}")
    if ARGS.out:
        Path(ARGS.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    asyncio.run(main())
