"""VAE tiles inside ComfyUI (issue 10 item 4): auto-fit plans a tiled decode for a VAE
whose full-frame working memory does not fit the (simulated) GPU's budget, Apply
Placement's adapter places the VAE, and ComfyUI's own VAEDecode node then decodes
through ComfyUI's decode_tiled with the plan's tile. Runs inside ComfyUI's Python like
comfy_driver.py (its tiny random TAESD) and prints PLACEMENT_VAE_TILES_RESULTS {json}.
Asserts nothing: test_vae_tiles.py does."""
import asyncio
import json
import os
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import comfy_driver as cd  # noqa: E402  (parses the same arguments, sets ComfyUI up)

import torch  # noqa: E402

import comfy.utils  # noqa: E402
import folder_paths  # noqa: E402
import nodes  # noqa: E402

RESULTS = {"errors": []}
SIMULATE = "cuda0=2GiB,cpu=16GiB"
# TAESD at 512x512 needs about 590 MB of working memory full frame; 400 MiB holds a
# 256 px tile but not a 384 px one
MAX_VRAM = "cuda0=400MiB"
RESOLUTION = (512, 512)


def count_tiler():
    """Count calls of ComfyUI's tiler (decode_tiled_ runs three passes through it)."""
    calls = {"n": 0, "tiles": []}
    original = comfy.utils.tiled_scale

    def tiled_scale(samples, function, tile_x=64, tile_y=64, *a, **k):
        calls["n"] += 1
        calls["tiles"].append([tile_x, tile_y])
        return original(samples, function, tile_x, tile_y, *a, **k)
    comfy.utils.tiled_scale = tiled_scale
    return calls


async def main():
    cd.build_models(cd.ARGS.work)
    await cd.start_comfy(cd.ARGS.pack, cd.ARGS.work)
    placement = cd.pack_module("placement")
    place_objects = cd.pack_module("runtime.comfy.apply.apply_plan").place_objects
    vae = nodes.VAELoader().load_vae("tiny_taesd.safetensors")[0]
    path = folder_paths.get_full_path("vae", "tiny_taesd.safetensors")
    inv = placement.Inventory.simulated(SIMULATE)
    spec = placement.PlacementSpec(auto_fit=True, max_vram=MAX_VRAM)
    plan = placement.plan(spec, inv, {"vae": path}, resolution=RESOLUTION, executor="comfyui")
    cp = plan.components["vae"]
    RESULTS["plan"] = {"runtime": cp.runtime, "params": cp.params, "tile": cp.tile,
                       "reasons": cp.reasons, "json_tile": json.loads(plan.to_json())
                       ["components"]["vae"]["tile"]}
    placed, notes = place_objects(plan, inv, {"vae": vae})
    RESULTS["notes"] = notes
    torch.manual_seed(0)
    latent = {"samples": torch.randn(1, 16, RESOLUTION[1] // 8, RESOLUTION[0] // 8) * 0.5}
    calls = count_tiler()
    full = nodes.VAEDecode().decode(vae, latent)[0]            # the loader's VAE: untouched
    RESULTS["full_tiler_calls"] = calls["n"]
    tiled = nodes.VAEDecode().decode(placed["vae"], latent)[0]  # the placed copy
    RESULTS["tiled_tiler_calls"] = calls["n"] - RESULTS["full_tiler_calls"]
    RESULTS["tiler_tiles"] = calls["tiles"]
    RESULTS["shapes"] = [list(full.shape), list(tiled.shape)]
    diff = (full.float() - tiled.float()).abs()
    RESULTS["mean_abs_diff"] = float(diff.mean())
    RESULTS["max_abs_diff"] = float(diff.max())
    RESULTS["full_std"] = float(full.float().std())
    RESULTS["loader_decode_is_class_method"] = "decode" not in vars(vae)
    # each tile's decode call, rehearsed on meta at its shapes and metered on the
    # simulated device (runtime/comfy/apply/engine_calls.py)
    session = placed["vae"].patcher.get_attachment("placement")
    RESULTS["calls"] = [{
        "method": c["method"], "outcome": c["outcome"], "unrehearsed": c.get("unrehearsed"),
        "rehearsed": (c.get("rehearsal") or {}).get("working_bytes"),
        "estimate": (c.get("rehearsal") or {}).get("estimate_bytes"),
        "planned": c.get("planned"),
        "metered": {n: d.get("working_peak_bytes")
                    for n, d in (c.get("stats") or {}).get("devices", {}).items()},
        "peaks": {n: d.get("peak_bytes")
                  for n, d in (c.get("stats") or {}).get("devices", {}).items()}}
        for c in getattr(session, "calls", [])]


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except Exception:
        RESULTS["errors"].append(traceback.format_exc())
    print("PLACEMENT_VAE_TILES_RESULTS " + json.dumps(cd.jsonable(RESULTS)))
