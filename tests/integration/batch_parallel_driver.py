"""Batch parallel inside ComfyUI's sampling (issue 13): runs inside ComfyUI's own Python
like comfy_driver.py (whose tiny Flux, test nodes and headless server it reuses), on a
simulated cuda0 + cuda1, and prints PLACEMENT_BATCH_PARALLEL_RESULTS {json}. Asserts
nothing: test_comfy_batch_parallel.py does."""
import asyncio
import json
import os
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import comfy_driver as cd  # noqa: E402  (parses the same arguments, starts nothing)

import comfy.model_management  # noqa: E402
import execution  # noqa: E402
import nodes  # noqa: E402
import server  # noqa: E402

RESULTS = {"errors": []}
SHARES_SEEN = []
PLANS = cd.PLANS


class PlacementTestRecordShares:
    """A clone of MODEL with a DIFFUSION_MODEL wrapper recording, per call, the thread,
    the batch it got and its transformer_options' per-item and per-chunk entries."""
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"model": ("MODEL",)}}
    RETURN_TYPES = ("MODEL",)
    FUNCTION = "run"
    CATEGORY = "testing"

    def run(self, model):
        import threading
        import comfy.patcher_extension as ext

        def record(executor, *args, **kwargs):
            to = next((a for a in args if isinstance(a, dict) and "cond_or_uncond" in a),
                      kwargs.get("transformer_options", {}))
            SHARES_SEEN.append({"thread": threading.get_ident(), "batch": int(args[0].shape[0]),
                                "cond_or_uncond": list(to.get("cond_or_uncond", [])),
                                "uuids": len(to.get("uuids", [])),
                                "sigmas": int(to["sigmas"].shape[0]) if "sigmas" in to else None})
            return executor(*args, **kwargs)
        m = model.clone()
        m.add_wrapper_with_key(ext.WrappersMP.DIFFUSION_MODEL, "placement_test", record)
        return (m,)
# the simulated devices are sized in main() from what the plans hold there (weights,
# ring and working memory: comfy_driver.planned_on): WHOLE holds the tiny Flux whole
# with a latent batch of 2 on each device, SMALL only its ring or block range
BASE = {"backend": "diffusion=cuda0,vae=cpu"}
BATCH = {"backend": "diffusion=cuda0&cuda1,vae=cpu", "split_mode": "diffusion=batch"}
# the same two devices as a layer split, plain and pipelined (CFG's cond and uncond as
# two shares through the two stages)
SPLIT = {"backend": "diffusion=cuda0&cuda1,vae=cpu", "split_mode": "diffusion=layer"}
PIPE = {"backend": "diffusion=cuda0&cuda1,vae=cpu", "split_mode": "diffusion=pipeline"}
# auto-fit's budgets keep 512 MiB free on each GPU, and the GPUs are given a modest speed
# (50 GFLOP/s, the host 5) so that the tiny model's compute, not the fixed cost of a hop,
# decides
AUTOFIT = "cuda0=2GiB@50G,cuda1=2GiB@50G,cpu=16GiB@5G"


def session_facts(tag):
    model = cd.KEPT.get(tag, {}).get("model")
    session = None if model is None else model.get_attachment("placement")
    if session is None:
        return None
    runs = [{"items": s.get("items"), "threads": s.get("threads"),
             "forwards": s.get("forwards"), "host_pack_bytes": s.get("host_pack_bytes"),
             "per_device_pack": {d: v.get("host_pack_bytes") for d, v in
                                 (s.get("per_device") or {}).items()},
             "h2d": {d: v.get("h2d_bytes") for d, v in (s.get("devices") or {}).items()},
             "modes": {d: v.get("mode") for d, v in (s.get("per_device") or {}).items()},
             "pipeline": s.get("pipeline"), "ranges": s.get("ranges"), "hops": s.get("hops")}
            for s in session.run_stats]
    return {"session": type(session).__name__, "runs": runs,
            "open": session.placed is not None,
            "claim_bytes": [m.model_size() for m in
                            model.get_additional_models_with_key("placement_claims")]}


async def run(executor, tag, inventory, ref=None, cfg=2.0, record=False, plan_sink=False,
              **flags):
    os.environ["COMFYUI_PLACEMENT_SIMULATE"] = inventory
    prompt = cd.pipeline(tag=tag, keep_placed=True, **flags)
    prompt["6"]["inputs"]["cfg"] = cfg
    if plan_sink:               # Apply Placement's plan_json output, recorded
        prompt["61"] = {"class_type": "PlacementTestPlanSink",
                        "inputs": {"plan_json": ["11", 7], "tag": tag}}
    if record:                  # a DIFFUSION_MODEL wrapper between placement and sampler
        prompt["33"] = {"class_type": "PlacementTestRecordShares",
                        "inputs": {"model": prompt["6"]["inputs"]["model"]}}
        prompt["6"]["inputs"]["model"] = ["33", 0]
        SHARES_SEEN.clear()
    record = await cd.run_prompt(executor, prompt, tag)
    record["session"] = session_facts(tag)
    if ref is not None:
        record["image"] = cd.compare(tag, ref)
    record["messages"] = [e for e, _ in server.PromptServer.instance.messages
                          if e.startswith("execution_")]
    if record_calls := (list(SHARES_SEEN) if prompt.get("33") else None):
        threads = sorted({c["thread"] for c in record_calls})
        for c in record_calls:
            c["thread"] = threads.index(c["thread"])     # 0, 1: distinct threads
        record["wrapper_calls"] = record_calls
    return record


async def sized(executor, placements):
    """Two equal simulated devices just big enough for the most any of `placements`
    ({tag: pipeline flags}) plans on either of them."""
    most = 0
    for tag, flags in placements.items():
        planned, _ = await cd.planned_on(executor, tag, ["cuda0", "cuda1"], **flags)
        most = max([most, *planned.values()])
    size = cd.device_size(most + 256 * 1024)
    return cd.simulated({"cuda0": size, "cuda1": size})


async def main():
    cd.build_models(cd.ARGS.work)
    await cd.start_comfy(cd.ARGS.pack, cd.ARGS.work)
    nodes.NODE_CLASS_MAPPINGS["PlacementTestRecordShares"] = PlacementTestRecordShares
    executor = execution.PromptExecutor(server.PromptServer.instance,
                                        cache_type=execution.CacheType.CLASSIC,
                                        cache_args={"ram": 16.0, "ram_inactive": 16.0})
    RESULTS["reference"] = await cd.run_prompt(
        executor, cd.pipeline(placed=False, tag="reference", keep=True), "reference")
    WHOLE = await sized(executor, {"size_whole": dict(batch=2, **BASE),
                                   "size_whole_batch": dict(batch=2, **BATCH)})
    SMALL = await sized(executor, {"size_stream": dict(stream_layers=True, **BASE),
                                   "size_stream_batch": dict(stream_layers=True, **BATCH),
                                   "size_split": SPLIT, "size_pipeline": PIPE})
    RESULTS["inventories"] = {"whole": WHOLE, "small": SMALL}
    comfy.model_management.unload_all_models()
    loader_model = cd.KEPT["reference"]["model"]
    weights_before = cd.module_weights(loader_model)
    state_before = cd.model_state(loader_model)
    # one device (the engine on simulated cuda0): the single-device run to equal
    RESULTS["single"] = await run(executor, "single", WHOLE, "reference", **BASE)
    # CFG (cond + uncond, batch 2): one share per device, resident on each
    RESULTS["resident"] = await run(executor, "resident", WHOLE, "single", record=True,
                                    **BATCH)
    # streamed on each device from one packed host copy
    RESULTS["single_streamed"] = await run(executor, "single_streamed", SMALL, "reference",
                                           stream_layers=True, **BASE)
    RESULTS["streamed"] = await run(executor, "streamed", SMALL, "single_streamed",
                                    stream_layers=True, **BATCH)
    # a latent batch of 2 with CFG: 4 items, 2 per device
    RESULTS["single_batch2"] = await run(executor, "single_batch2", WHOLE, None, batch=2,
                                         **BASE)
    RESULTS["batch2"] = await run(executor, "batch2", WHOLE, "single_batch2", batch=2,
                                  **BATCH)
    # cfg 1: no uncond pass, a batch of 1 runs on one device
    RESULTS["single_cfg1"] = await run(executor, "single_cfg1", WHOLE, None, cfg=1.0, **BASE)
    RESULTS["cfg1"] = await run(executor, "cfg1", WHOLE, "single_cfg1", cfg=1.0, **BATCH)
    # an interrupt inside a share (ComfyUI's flag and check in a block, as the UI's
    # cancel), streamed blocks in flight on both devices; then the same prompt again
    RESULTS["interrupted"] = await run(executor, "interrupted", SMALL, None, interrupt_at=3,
                                       stream_layers=True, **BATCH)
    RESULTS["rerun"] = await run(executor, "rerun", SMALL, "streamed", stream_layers=True,
                                 **BATCH)
    # a layer split over the two devices, then pipelined: stage 2 computes cond while
    # stage 1 computes uncond (runtime/split/pipeline.py through the engine's cut)
    RESULTS["split"] = await run(executor, "split", SMALL, "single", **SPLIT)
    RESULTS["pipeline"] = await run(executor, "pipeline", SMALL, "single", record=True,
                                    **PIPE)
    # auto-fit with both GPUs free and CFG: its cost model picks batch parallel itself
    # (issue 13 item 1); the plan JSON says so and the run is the batch-parallel one
    RESULTS["autofit"] = await run(executor, "autofit", AUTOFIT, "single", backend="",
                                   auto_fit=True, plan_sink=True)
    RESULTS["autofit"]["plan_json"] = PLANS.get("autofit")
    # the loader's MODEL is untouched by all of it
    RESULTS["loader_weights_same"] = cd.same_weights(weights_before,
                                                     cd.module_weights(loader_model))
    RESULTS["loader_state_same"] = state_before == cd.model_state(loader_model)
    RESULTS["loader_forward_is_class"] = "forward" not in \
        loader_model.model.diffusion_model.__dict__


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except Exception:
        RESULTS["errors"].append(traceback.format_exc())
    print("PLACEMENT_BATCH_PARALLEL_RESULTS " + json.dumps(cd.jsonable(RESULTS)))
