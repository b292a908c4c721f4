"""ComfyUI's weight hooks on components the pack's engine places, inside ComfyUI's Python
(runtime/comfy/patchers/weight_hooks.py). A hook LoRA (Create Hook LoRA) on the positive
conditioning only, so ComfyUI patches and unpatches it between the two cond groups of
every step; the same with keyframes (its strength changes mid-run); a CLIP hook (Set
CLIP Hooks) on an engine-placed text encoder. Each placed run is compared with ComfyUI's
own run of the same hooks; a run without hooks after them with the plain reference.
Prints PLACEMENT_HOOKS_RESULTS {json}; asserts nothing: test_weight_hooks.py does."""
import asyncio
import json
import os
import sys
import traceback
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import comfy_driver as cd  # noqa: E402  (parses the same arguments, sets ComfyUI up)

RESULTS = {"errors": []}
RESIDENT = "cuda0=1GiB,cuda1=1GiB,cpu=16GiB"


def with_keyframes(prompt, hooks, first: int):
    """`hooks` at full strength, then a quarter from 40% of the run on (nodes first..
    first+2); the keyframed hooks' output."""
    a, b, c = (str(first + i) for i in range(3))
    prompt[a] = {"class_type": "CreateHookKeyframe",
                 "inputs": {"strength_mult": 1.0, "start_percent": 0.0}}
    prompt[b] = {"class_type": "CreateHookKeyframe", "inputs": {
        "strength_mult": 0.25, "start_percent": 0.4, "prev_hook_kf": [a, 0]}}
    prompt[c] = {"class_type": "SetHookKeyframes", "inputs": {"hooks": hooks,
                                                              "hook_kf": [b, 0]}}
    return [c, 0]


def model_hook(prompt, keyframes=False):
    """The hook LoRA on the positive conditioning (node 3); with keyframes: full
    strength, a quarter from 40% of the run on."""
    prompt["50"] = {"class_type": "CreateHookLora", "inputs": {
        "lora_name": "tiny_flux_lora.safetensors", "strength_model": 0.8,
        "strength_clip": 0.0}}
    hooks = ["50", 0]
    if keyframes:
        hooks = with_keyframes(prompt, hooks, 52)
    prompt["51"] = {"class_type": "ConditioningSetProperties", "inputs": {
        "cond_NEW": ["3", 0], "strength": 1.0, "set_cond_area": "default", "hooks": hooks}}
    prompt["6"]["inputs"]["positive"] = ["51", 0]
    return prompt


def clip_hook(prompt, scheduled=False):
    """A CLIP hook LoRA on the (placed) CLIP both encodes use; scheduled: with keyframes
    (full strength, then a quarter from 40% on), encoded once per keyframe."""
    clip = prompt["3"]["inputs"]["clip"]
    prompt["60"] = {"class_type": "CreateHookLora", "inputs": {
        "lora_name": "tiny_clip_lora.safetensors", "strength_model": 0.0,
        "strength_clip": 0.9}}
    hooks = ["60", 0]
    if scheduled:
        hooks = with_keyframes(prompt, hooks, 62)
    prompt["61"] = {"class_type": "SetClipHooks", "inputs": {
        "clip": clip, "apply_to_conds": False, "schedule_clip": scheduled, "hooks": hooks}}
    prompt["3"]["inputs"]["clip"] = prompt["4"]["inputs"]["clip"] = ["61", 0]
    return prompt


async def run(executor, tag, prompt, ref):
    record = await cd.run_prompt(executor, prompt, tag)
    RESULTS[tag] = {"success": record.get("success"),
                    "errors": [e.get("exception_message", "").strip()
                               for e in record.get("exec_errors", [])],
                    "image": cd.compare(tag, ref)}


async def main():
    cd.build_models(cd.ARGS.work)
    cd.build_clip_files(cd.ARGS.work)
    await cd.start_comfy(cd.ARGS.pack, cd.ARGS.work)
    ex = cd.headless.new_executor()
    await run(ex, "reference", cd.pipeline(placed=False, tag="reference", keep=True), None)
    loader_model = cd.KEPT["reference"]["model"]
    before = cd.module_weights(loader_model)
    # ComfyUI's own runs: the hook changes the image; keyframes change it again
    await run(ex, "hook_ref", model_hook(cd.pipeline(placed=False, tag="hook_ref")),
              "reference")
    await run(ex, "keyframes_ref", model_hook(cd.pipeline(placed=False, tag="keyframes_ref"),
                                              keyframes=True), "hook_ref")
    stream = {"backend": "diffusion=cuda0,vae=cpu", "stream_layers": True}
    inventory, _ = await cd.sized_inventory(ex, "size_stream", ["cuda0"],
                                            params_backend="diffusion=cpu", **stream)
    os.environ["COMFYUI_PLACEMENT_SIMULATE"] = inventory
    for rest in ("cpu", "disk"):
        tag = f"stream_{rest}"
        await run(ex, tag, model_hook(cd.pipeline(params_backend=f"diffusion={rest}", tag=tag,
                                                  **stream)), "hook_ref")
    await run(ex, "keyframes_disk", model_hook(cd.pipeline(
        params_backend="diffusion=disk", tag="keyframes_disk", **stream), keyframes=True),
        "keyframes_ref")
    await run(ex, "plain_after", cd.pipeline(params_backend="diffusion=disk",
                                             tag="plain_after", **stream), "reference")
    os.environ["COMFYUI_PLACEMENT_SIMULATE"] = RESIDENT
    await run(ex, "resident", model_hook(cd.pipeline(
        backend="diffusion=cuda0,vae=cpu", params_backend="diffusion=cuda0", tag="resident")),
        "hook_ref")
    await run(ex, "layer_split", model_hook(cd.pipeline(
        backend="diffusion=cuda0&cuda1,vae=cpu", params_backend="diffusion=cpu",
        tag="layer_split")), "hook_ref")
    await run(ex, "batch_parallel", model_hook(cd.pipeline(
        backend="diffusion=cuda0&cuda1,vae=cpu", params_backend="diffusion=cpu",
        split_mode="diffusion=batch", tag="batch_parallel")), "hook_ref")
    # a LoRA (Load LoRA) and a hook LoRA on top: ComfyUI fuses the LoRA, then writes the
    # hook over it; the engine applies the hook, then the LoRA (the same sum, another order)
    await run(ex, "lora_hook_ref", model_hook(cd.pipeline(
        placed=False, lora="before", tag="lora_hook_ref")), "hook_ref")
    await run(ex, "lora_hook_split", model_hook(cd.pipeline(
        backend="diffusion=cuda0&cuda1,vae=cpu", params_backend="diffusion=cpu",
        lora="before", tag="lora_hook_split")), "lora_hook_ref")
    await run(ex, "row_split", model_hook(cd.pipeline(
        backend="diffusion=cuda0&cuda1,vae=cpu", params_backend="diffusion=cpu",
        split_mode="diffusion=row", tag="row_split")), "hook_ref")
    await run(ex, "on_cpu", model_hook(cd.pipeline(
        backend="diffusion=cpu,vae=cpu", params_backend="*=cpu", tag="on_cpu")), "hook_ref")
    RESULTS["loader_weights_unchanged"] = cd.same_weights(before,
                                                          cd.module_weights(loader_model))
    # a CLIP hook on a text encoder the engine places (simulated cuda0)
    await run(ex, "clip_plain", cd.pipeline(placed=False, text=True, tag="clip_plain"), None)
    await run(ex, "clip_ref", clip_hook(cd.pipeline(placed=False, text=True, tag="clip_ref")),
              "clip_plain")
    await run(ex, "clip_placed", clip_hook(cd.pipeline(
        backend="diffusion=cpu,te=cuda0,vae=cpu", params_backend="*=cpu", text=True,
        tag="clip_placed")), "clip_ref")
    await run(ex, "clip_scheduled_ref", clip_hook(cd.pipeline(
        placed=False, text=True, tag="clip_scheduled_ref"), scheduled=True), "clip_ref")
    await run(ex, "clip_scheduled", clip_hook(cd.pipeline(
        backend="diffusion=cpu,te=cuda0,vae=cpu", params_backend="*=cpu", text=True,
        tag="clip_scheduled"), scheduled=True), "clip_scheduled_ref")
    RESULTS["refusals"] = refusals()


def refusals():
    """slot_for on a stand-in patcher whose plan a slot cannot serve: the first line of
    each error."""
    weight_hooks = cd.pack_module("runtime.comfy.patchers.weight_hooks")
    ComponentPlan = cd.pack_module("placement.plan").ComponentPlan
    key = "diffusion_model.double_blocks.0.img_mod.lin.weight"

    def refused(cp, remote=(), model=None, key=key):
        plan = types.SimpleNamespace(components={"diffusion": cp})
        session = types.SimpleNamespace(plan=plan, component="diffusion", placed=None,
                                        remote_blocks=list(remote))
        stand_in = types.SimpleNamespace(attachments={"placement": session},
                                         hook_patches={}, model=model)
        try:
            weight_hooks.slot_for(stand_in, key)
        except Exception as exc:          # noqa: BLE001 - reported, asserted by the test
            return f"{type(exc).__name__}: {exc}"
        return None
    return {"worker": refused(ComponentPlan("diffusion", ["cuda0", "w1.cuda0"], "cpu"),
                              ["double_blocks.0"]),
            "row": refused(ComponentPlan("diffusion", ["cuda0", "cuda1"], "cpu",
                                         split_mode="row")),
            "gguf": refused(ComponentPlan("diffusion", ["cuda0"], "cpu"), (),
                            model=quantized_model(), key="lin.weight")}


def quantized_model():
    """A stand-in for a module holding a ComfyUI-GGUF layer with a quantized weight (its
    bytes in a uint8 tensor; the layer says it is quantized)."""
    import torch

    class QuantizedLayer(torch.nn.Module):
        comfy_cast_weights = True

        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.zeros(4, 18, dtype=torch.uint8),
                                             requires_grad=False)
            self.weight_function, self.bias_function = [], []

        def is_ggml_quantized(self, *, weight=None, bias=None):
            return True
    root = torch.nn.Module()
    root.lin = QuantizedLayer()
    return root


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except Exception:
        RESULTS["errors"].append(traceback.format_exc())
    print("PLACEMENT_HOOKS_RESULTS " + json.dumps(cd.jsonable(RESULTS)))
