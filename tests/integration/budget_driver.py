"""Issue 29's three ComfyUI cases, and a refusal: explicit plans keep the working memory
inside a device's whole memory (no max_vram). Runs inside ComfyUI's own Python like
comfy_driver.py (whose tiny Flux, test nodes and headless server it reuses) and prints
PLACEMENT_BUDGET_RESULTS {json}. Asserts nothing: test_comfy_budgets.py does.

The simulated devices are sized here from the model's bytes (its blocks, read from the
file) and the working memory the node's plan keeps (its plan on roomy devices), never
from constants: a device where the weights the plan used to put there fit but leave the
working memory no room."""
import asyncio
import json
import os
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import comfy_driver as cd  # noqa: E402  (parses the same arguments, starts nothing)

import safetensors.torch  # noqa: E402

RESULTS = {"errors": []}
SLACK = 64 * 1024     # bytes above the least a plan needs: the tests sit near the edge
STREAM = {"backend": "diffusion=cuda0,vae=cpu", "stream_layers": True}
SPLIT = {"backend": "diffusion=cuda0&cuda1,vae=cpu", "params_backend": "diffusion=cpu"}


def flux_blocks():
    """(non-block bytes, block bytes in execution order) of the tiny Flux's file."""
    path = os.path.join(cd.ARGS.work, "models", "diffusion_models", "tiny_flux.safetensors")
    blocks, total = {}, 0
    for key, t in safetensors.torch.load_file(path).items():
        n = t.numel() * t.element_size()
        total += n
        parts = key.split(".")
        if parts[0] in ("double_blocks", "single_blocks"):
            order = (parts[0] == "single_blocks", int(parts[1]))
            blocks[order] = blocks.get(order, 0) + n
    sizes = [blocks[k] for k in sorted(blocks)]
    return total - sum(sizes), sizes


def ring(sizes, depth):
    """Streamed blocks on the device at once with no resident prefix: the block that
    computes and `depth` ahead (the largest run of them, cyclically)."""
    w = min(depth, len(sizes) - 1) + 1
    return max(sum(sizes[(i + j) % len(sizes)] for j in range(w)) for i in range(len(sizes)))


def best_split(non_block, sizes):
    """The two contiguous ranges (cuda0 first, with the non-block weights) whose larger
    side is least: (bytes on cuda0, bytes on cuda1)."""
    cuts = [(non_block + sum(sizes[:c]), sum(sizes[c:])) for c in range(1, len(sizes))]
    return min(cuts, key=max)


def ran_stats(tag):
    """The engine stats of the placement sampling ran: Apply Placement's MODEL's, or,
    where sampling planned again with the rehearsed working memory (another plan), the
    re-placed copy's (runtime/comfy/replan/workload.py's replanner)."""
    model = cd.KEPT.get(tag, {}).get("model")
    if model is None:
        return None
    replanner = model.get_attachment("placement_autofit")
    candidates = [model] + ([p for _, _, p in replanner.models] if replanner else [])
    ran = [s for s in (c.get_attachment("placement") for c in candidates)
           if s is not None and s.runs]
    return {"sessions_ran": len(ran), "replaced": bool(ran) and ran[-1] is not
            model.get_attachment("placement"),
            "stats": cd.jsonable(ran[-1].last_stats) if ran else None}


def facts(tag):
    """The engine's stats of the run kept under `tag`, and the node's records."""
    measured = [d for e, d in cd.server.PromptServer.instance.messages
                if e == "placement.measured"]
    return {"ran": ran_stats(tag), "plan": cd.PLANS.get(tag),
            "measured": measured[-1] if measured else None,
            "image": cd.compare(tag, "reference"),
            "oom": "out of memory" in json.dumps(RESULTS.get(tag, {})).lower()}


async def run(executor, tag, inventory, **kw):
    prompt = cd.pipeline(tag=tag, keep_placed=True, **kw)
    prompt["60"] = {"class_type": "PlacementTestPlanSink",
                    "inputs": {"plan_json": ["11", 7], "tag": tag}}
    os.environ["COMFYUI_PLACEMENT_SIMULATE"] = inventory
    try:
        RESULTS[tag] = await cd.run_prompt(executor, prompt, tag)
    finally:
        del os.environ["COMFYUI_PLACEMENT_SIMULATE"]
    RESULTS[tag + "_facts"] = facts(tag)


def measured_plan():
    """The plan that ran in the last prompt (the node's measured message)."""
    measured = [d for e, d in cd.server.PromptServer.instance.messages
                if e == "placement.measured"]
    return measured[-1]["plan"]


async def rehearsed_on_roomy(executor, tag, devices, **kw):
    """(node-time plan, plan that ran) of pipeline(**kw) on roomy devices: the working
    memory the node estimated, and the one the first model call rehearsed."""
    _, node = await cd.planned_on(executor, tag, devices, **kw)
    return node, measured_plan()


async def main():
    cd.build_models(cd.ARGS.work)
    await cd.start_comfy(cd.ARGS.pack, cd.ARGS.work)
    executor = cd.headless.new_executor()
    RESULTS["reference"] = await cd.run_prompt(executor, cd.pipeline(placed=False,
                                                                      tag="reference"),
                                               "reference")
    non_block, sizes = flux_blocks()
    # the working memory the node estimates for the diffusion model (its metadata's
    # figure at this prompt's workload) and the one sampling rehearses at its first model
    # call (what the run is planned with), streamed on one device and split over two
    node, ran = await rehearsed_on_roomy(executor, "wm_stream", ["cuda0"],
                                         params_backend="diffusion=cpu", **STREAM)
    estimate, work = cd.working_memory(node), cd.working_memory(ran)
    node, ran = await rehearsed_on_roomy(executor, "wm_split", ["cuda0", "cuda1"], **SPLIT)
    split_work = max(cd.working_memory(ran),
                     *(ran["components"]["diffusion"].get("headroom_per_device") or {0: 0}
                       ).values())
    # streamed (no budget: no resident prefix): the weights plans put there before they
    # kept working memory, the non-block ones and a ring of two blocks (prefetch depth
    # 1), fit, and the working memory beside them does not; one block at a time does
    least = non_block + ring(sizes, 0) + work
    old = non_block + ring(sizes, 1)
    stream_room = max(least, old + work // 2)
    stream_size = cd.device_size(stream_room)
    # split: each device its range and the working memory, neither the whole model
    # beside it
    split_size = cd.device_size(max(best_split(non_block, sizes)) + split_work + SLACK)
    # refused at the first model call: the weights of one block at a time fit, beside
    # them the working memory it rehearsed does not
    small_size = cd.device_size(non_block + ring(sizes, 0) + work // 2)
    # refused at queue time: not even the weights of one block at a time fit
    tiny_size = cd.device_size(non_block + ring(sizes, 0) - SLACK)
    RESULTS["sizes"] = {"non_block": non_block, "blocks": sizes, "work": work,
                        "estimate": estimate, "split_work": split_work,
                        "stream_device": stream_size, "split_device": split_size,
                        "small_device": small_size, "tiny_device": tiny_size,
                        "old_stream_weights": old, "least_stream": least,
                        "split_ranges": list(best_split(non_block, sizes))}
    stream_inv = cd.simulated({"cuda0": stream_size})
    for residency in ("cpu", "disk"):
        await run(executor, f"stream_{residency}", stream_inv,
                  params_backend=f"diffusion={residency}", **STREAM)
    await run(executor, "split", cd.simulated({"cuda0": split_size, "cuda1": split_size}),
              **SPLIT)
    # the issue's own sizes: a 7 MiB device streamed (params cpu, then disk), a layer
    # split over two 6 MiB devices
    for residency in ("cpu", "disk"):
        await run(executor, f"issue_stream_{residency}", "cuda0=7MiB@workspace=0",
                  params_backend=f"diffusion={residency}", **STREAM)
    await run(executor, "issue_split", "cuda0=6MiB@workspace=0,cuda1=6MiB@workspace=0",
              **SPLIT)
    # a layer split that streams, no budget: each device keeps resident what its free
    # memory holds beside the ring and the working memory, and streams the rest
    await run(executor, "split_stream", "cuda0=4MiB@workspace=0,cuda1=4MiB@workspace=0",
              stream_layers=True, **SPLIT)
    # the README's diagnostic as written: simulated GPUs with no @workspace= (they compute
    # on this CPU: no kernel workspace is planned) and a margin that fits their size
    diagnostic = "cuda0=64MiB,cuda1=64MiB"
    await run(executor, "diagnostic_stream", diagnostic, params_backend="diffusion=cpu",
              **STREAM)
    await run(executor, "diagnostic_auto_fit", diagnostic, backend="vae=cpu", auto_fit=True)
    # (in this order: ComfyUI's cache would hand the second the first's Apply Placement
    # output, planned for the other device, were that one not refused at queue time)
    await run(executor, "too_small_weights", cd.simulated({"cuda0": tiny_size}),
              params_backend="diffusion=cpu", **STREAM)
    await run(executor, "too_small", cd.simulated({"cuda0": small_size}),
              params_backend="diffusion=cpu", **STREAM)
    RESULTS["too_small_sampled"] = "too_small" in cd.SINK


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except Exception:
        RESULTS["errors"].append(traceback.format_exc())
    print("PLACEMENT_BUDGET_RESULTS " + json.dumps(cd.jsonable(RESULTS)))
