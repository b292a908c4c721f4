"""Auto-fit inside ComfyUI plans the real workload (issue 8): runs inside ComfyUI's own
Python like comfy_driver.py (whose models, test nodes and headless server it reuses),
under a simulated inventory, and prints PLACEMENT_AUTOFIT_RESULTS {json}. Asserts
nothing: test_autofit.py does."""
import asyncio
import json
import os
import struct
import sys
import traceback
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import comfy_driver as cd  # noqa: E402  (parses the same arguments, starts nothing)

import execution  # noqa: E402
import nodes  # noqa: E402
import server  # noqa: E402

RESULTS = {"errors": []}
PLANS = cd.PLANS
# cuda0's budget 320 MiB, less its margin (a sixteenth: 20 MiB) leaves 300 MiB: a 64x64 run
# fits the tiny models with their working memory (256 MiB kernel workspace included),
# 1024x1024 not (the diffusion model alone needs about 349 MiB there)
SIMULATE = "cuda0=2GiB,cpu=16GiB"
MAX_VRAM = "cuda0=320MiB"


def prompt(tag, width, height, upscale=None, latent_input=False, steps=2, cfg=2.0,
           max_vram=MAX_VRAM):
    p = cd.pipeline(backend="", tag=tag, auto_fit=True, max_vram=max_vram)
    p["5"]["inputs"].update(width=width, height=height)
    if upscale:                     # a latent size the prompt does not spell out
        p["50"] = {"class_type": "LatentUpscaleBy", "inputs": {
            "samples": ["5", 0], "upscale_method": "nearest-exact", "scale_by": upscale}}
        p["6"]["inputs"]["latent_image"] = ["50", 0]
    if latent_input:
        p["11"]["inputs"]["latent"] = p["6"]["inputs"]["latent_image"]
    p["6"]["inputs"].update(steps=steps, cfg=cfg)
    p["60"] = {"class_type": "PlacementTestPlanSink",
               "inputs": {"plan_json": ["11", 7], "tag": tag}}
    return p


def node_texts(node_id="11"):
    out = []
    for event, data in server.PromptServer.instance.messages:
        if isinstance(data, (bytes, bytearray)) and len(data) > 4:
            n = struct.unpack(">I", data[:4])[0]
            if data[4:4 + n].decode() == node_id:
                out.append(data[4 + n:].decode())
    return out


def where(plan):
    return {c: {"runtime": plan["components"][c]["runtime"],
                "params": plan["components"][c]["params"],
                "stream": plan["components"][c]["stream"]}
            for c in ("diffusion", "vae")}


async def run(executor, tag, **kw):
    record = await cd.run_prompt(executor, prompt(tag, **kw), tag)
    record["texts"] = node_texts()
    record["plan_json"] = PLANS.get(tag)
    record["where"] = where(PLANS[tag]) if tag in PLANS else None
    record["image"] = list(cd.SINK[tag].shape) if tag in cd.SINK else None
    return record


async def main():
    cd.build_models(cd.ARGS.work)
    await cd.start_comfy(cd.ARGS.pack, cd.ARGS.work)
    stub = server.PromptServer.instance
    # ComfyUI's own method, sending through the stub's send_sync
    stub.send_progress_text = types.MethodType(server.PromptServer.send_progress_text, stub)
    executor = execution.PromptExecutor(stub, cache_type=execution.CacheType.CLASSIC,
                                        cache_args={"ram": 16.0, "ram_inactive": 16.0})
    os.environ["COMFYUI_PLACEMENT_SIMULATE"] = SIMULATE
    RESULTS["small"] = await run(executor, "small", width=64, height=64)
    # Apply Placement's inputs unchanged: ComfyUI reuses its cached outputs (plan_json
    # planned for 64x64) and sampling plans again for 1024x1024
    RESULTS["large"] = await run(executor, "large", width=1024, height=1024, steps=1)
    # the same budget written another way: Apply Placement runs again, at node time
    RESULTS["large_fresh"] = await run(executor, "large_fresh", width=1024, height=1024,
                                       steps=1, max_vram="cuda0=0.3125")
    # the prompt does not say the size (x4 upscale of 64): planned at node time for the
    # default, planned again when sampling starts from the real 256x256 latent
    RESULTS["hidden_size"] = await run(executor, "hidden", width=64, height=64, upscale=4)
    # the same, with the latent connected to Apply Placement: planned right at node time
    RESULTS["latent_input"] = await run(executor, "latent_in", width=64, height=64,
                                        upscale=4, latent_input=True)
    # cfg 1: no uncond pass (the workload's batch is not doubled)
    RESULTS["cfg1"] = await run(executor, "cfg1", width=64, height=64, cfg=1.0)


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except Exception:
        RESULTS["errors"].append(traceback.format_exc())
    print("PLACEMENT_AUTOFIT_RESULTS " + json.dumps(cd.jsonable(RESULTS)))
