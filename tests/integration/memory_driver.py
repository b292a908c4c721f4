"""Runs inside ComfyUI's own Python: ComfyUI's memory manager and the pack's engine.

Started by test_memory_manager.py as
`PYTHON memory_driver.py --comfyui DIR --pack DIR --work DIR`. It reuses comfy_driver.py
(imported: the same headless ComfyUI, tiny random models, prompts and helpers) and
records what `comfy.model_management` sees of an engine-placed MODEL: its
`current_loaded_models` during and after a run, what ComfyUI would free per device,
what happens when ComfyUI frees memory or unloads everything, and the images. It
asserts nothing: the pytest side does. One JSON object on the last line.
"""
import asyncio
import json
import os
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import comfy_driver as cd  # noqa: E402  (parses the same arguments, starts nothing)

import comfy.model_management as mm  # noqa: E402
import comfy.patcher_extension as ext  # noqa: E402

RESULTS = {"errors": []}
PROBES = {}            # tag -> what the probe saw at its model call


def shares_module():
    return cd.pack_module("runtime.comfy.patchers.claims")


def loaded_view():
    """ComfyUI's current_loaded_models, as its memory manager reads them."""
    share_cls = shares_module().EngineClaim
    out = []
    for lm in mm.current_loaded_models:
        p = lm.model
        if p is None:
            continue
        entry = {"class": type(p).__name__, "device": str(lm.device),
                 "model_size": int(p.model_size()), "loaded_size": int(p.loaded_size()),
                 "memory_required": int(lm.model_memory_required(lm.device)),
                 "share": isinstance(p, share_cls)}
        if entry["share"]:
            entry["plan_device"] = p.device_name
            entry["component"] = p.session.component
            entry["session_id"] = id(p.session)
        else:
            entry["session_id"] = id(p.get_attachment("placement"))
        out.append(entry)
    return out


def ledger_held(session):
    """Resident + slot bytes the engine's ledger holds per device now (open placement)."""
    held = shares_module().held_bytes
    placed = session.placed
    if placed is None:
        return {}
    targets = getattr(placed, "targets", None) or [placed.target]
    return {t.name: held(placed, t.name) for t in targets}


class PlacementTestMemoryProbe:
    """A clone of MODEL whose Nth model call first records what ComfyUI's memory manager
    sees and then, by `action`, asks it for room: `free_memory` (ComfyUI's free_memory on
    the shares' device, keeping the model that is sampling) or `partial` (ComfyUI's
    LoadedModel.model_unload of each share with a small amount to free). At the first
    call, so that later calls show the placement opened again."""
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"model": ("MODEL",), "at_call": ("INT", {"default": 2}),
                             "action": ("STRING", {"default": "none"}),
                             "tag": ("STRING", {"default": ""})}}
    RETURN_TYPES = ("MODEL",)
    FUNCTION = "run"
    CATEGORY = "testing"

    def run(self, model, at_call, action, tag):
        calls = [0]
        session = model.get_attachment("placement")

        def probe(executor, *args, **kwargs):
            calls[0] += 1
            if calls[0] == at_call:
                rec = {"view": loaded_view(), "ledger": ledger_held(session),
                       "open": session.placed is not None, "session_id": id(session),
                       "runs": session.runs}
                share_cls = shares_module().EngineClaim
                if action == "free_memory":
                    devices = {lm.device for lm in mm.current_loaded_models
                               if isinstance(lm.model, share_cls)}
                    keep = [lm for lm in mm.current_loaded_models
                            if not isinstance(lm.model, share_cls)]
                    unloaded = []
                    for dev in devices:
                        unloaded += mm.free_memory(1e30, dev, keep_loaded=keep)
                    rec["unloaded"] = [type(lm.model).__name__ for lm in unloaded]
                elif action == "partial":
                    # as free_memory does, for this placement's shares: ask for a little
                    # room; an entry that ComfyUI unloads whole leaves its list
                    mine = [lm for lm in mm.current_loaded_models
                            if isinstance(lm.model, share_cls) and lm.model.session is session]
                    rec["model_unload"] = []
                    for lm in mine:
                        whole = bool(lm.model_unload(memory_to_free=1024))
                        rec["model_unload"].append(whole)
                        if whole:
                            mm.current_loaded_models.remove(lm)
                rec["after"] = {"view": loaded_view(), "ledger": ledger_held(session),
                                "open": session.placed is not None,
                                "releases": list(session.releases)}
                PROBES[tag] = rec
            return executor(*args, **kwargs)

        m = model.clone()
        m.add_wrapper_with_key(ext.WrappersMP.APPLY_MODEL, "placement_test_probe", probe)
        return (m,)


def probed_pipeline(tag, action="none", at_call=2, **kw):
    """comfy_driver's pipeline with the probe between Apply Placement and KSampler."""
    prompt = cd.pipeline(tag=tag, keep_placed=True, **kw)
    prompt["33"] = {"class_type": "PlacementTestMemoryProbe",
                    "inputs": {"model": prompt["6"]["inputs"]["model"], "at_call": at_call,
                               "action": action, "tag": tag}}
    prompt["6"]["inputs"]["model"] = ["33", 0]
    return prompt


def measured_records():
    """The measured records Apply Placement sent during the last prompt (its node view
    draws them): nodes/measured.py's record, runtime_fallbacks included."""
    return [d for e, d in cd.server.PromptServer.instance.messages
            if e == "placement.measured"]


def session_record(tag):
    model = cd.KEPT.get(tag, {}).get("model")
    if model is None:
        return None
    session = model.get_attachment("placement")
    if session is None:
        return {"session": False}
    stats = session.last_stats or {}
    shares = model.get_additional_models_with_key("placement_claims")
    fit = ((session.plan.extra or {}).get("fit") or {}).get("components", {}).get("diffusion")
    return {"open": session.placed is not None, "runs": session.runs,
            "fit": None if not fit else {"decision": fit.get("decision"),
                                         "held_bytes": fit.get("held_bytes"),
                                         "headroom_bytes": fit.get("headroom_bytes")},
            "releases": list(session.releases),
            "main_model_size": int(model.model_size()),
            "shares": {s.device_name: {"planned": s.planned_bytes, "device": str(s.load_device)}
                       for s in shares},
            "devices": {n: {"resident": d.get("resident_bytes"), "slots": d.get("slot_bytes"),
                            "peak": d.get("peak_bytes"), "h2d": d.get("h2d_bytes")}
                        for n, d in stats.get("devices", {}).items()}}


async def scenario(executor, name, inventory, **kw):
    ref = kw.pop("ref", "reference")
    os.environ["COMFYUI_PLACEMENT_SIMULATE"] = inventory
    try:
        rec = {"run": await cd.run_prompt(executor, probed_pipeline(name, **kw), name)}
        rec["measured"] = measured_records()
        rec["probe"] = PROBES.get(name)
        rec["after_run"] = loaded_view()
        rec["session"] = session_record(name)
        rec["image"] = cd.compare(name, ref)
        return rec
    finally:
        del os.environ["COMFYUI_PLACEMENT_SIMULATE"]


class CallProbe:
    """While a prompt runs: at the first leaf-module forward inside an engine-placed
    call of `component` (a VAE decode, a text encode: its placement is open), record
    what ComfyUI's memory manager sees, then by `action` ask it for room: `free_memory`
    (ComfyUI's free_memory on each share's device, keeping every other model) or
    `partial` (LoadedModel.model_unload of each share with 1 KiB to free). A global
    forward pre-hook, removed afterwards: the models themselves get no hook."""

    def __init__(self, component, action="none"):
        self.component, self.action, self.rec = component, action, None

    def live_session(self):
        share_cls = shares_module().EngineClaim
        for lm in mm.current_loaded_models:
            p = lm.model
            if isinstance(p, share_cls) and p.session.component == self.component \
                    and p.session.placed is not None:
                return p.session
        return None

    def hook(self, module, args):
        if self.rec is not None or next(module.children(), None) is not None:
            return None
        session = self.live_session()
        if session is None:
            return None
        share_cls = shares_module().EngineClaim
        rec = {"view": loaded_view(), "ledger": ledger_held(session),
               "session_id": id(session), "calls": len(session.calls),
               "main_patcher_free": None}
        mine = [lm for lm in mm.current_loaded_models
                if isinstance(lm.model, share_cls) and lm.model.session is session]
        if self.action == "free_memory":
            keep = [lm for lm in mm.current_loaded_models if lm not in mine]
            unloaded = []
            for dev in {lm.device for lm in mine}:
                unloaded += mm.free_memory(1e30, dev, keep_loaded=keep)
            rec["unloaded"] = [type(lm.model).__name__ for lm in unloaded]
        elif self.action == "partial":
            rec["model_unload"] = []
            for lm in mine:
                whole = bool(lm.model_unload(memory_to_free=1024))
                rec["model_unload"].append(whole)
                if whole:
                    mm.current_loaded_models.remove(lm)
        rec["after"] = {"view": loaded_view(), "ledger": ledger_held(session),
                        "open": session.placed is not None,
                        "releases": list(session.releases)}
        self.rec = rec
        return None


async def call_scenario(executor, name, inventory, component, action="none", ref="reference",
                        **kw):
    """A prompt whose VAE or text encoder the engine places, probed during its first call."""
    import torch
    probe = CallProbe(component, action)
    os.environ["COMFYUI_PLACEMENT_SIMULATE"] = inventory
    handle = torch.nn.modules.module.register_module_forward_pre_hook(probe.hook)
    try:
        prompt = cd.pipeline(tag=name, keep_placed=True, keep_placed_vae=True, **kw)
        rec = {"run": await cd.run_prompt(executor, prompt, name)}
        rec["measured"] = measured_records()
    finally:
        handle.remove()
        del os.environ["COMFYUI_PLACEMENT_SIMULATE"]
    rec["probe"] = probe.rec
    rec["after_run"] = loaded_view()
    kept = cd.KEPT.get(name + ("_vae" if component == "vae" else "_clip"), {})
    obj = kept.get("vae") or kept.get("clip")
    if obj is not None:
        session = obj.patcher.get_attachment("placement")
        shares = obj.patcher.get_additional_models_with_key("placement_claims")
        rec["session"] = {
            "id": id(session), "open": session.placed is not None,
            "releases": list(session.releases),
            "main_model_size": int(obj.patcher.model_size()),
            "module_bytes": sum(t.numel() * t.element_size() for t in
                                list(obj.patcher.model.parameters()) +
                                list(obj.patcher.model.buffers())),
            "shares": {s.device_name: {"planned": s.planned_bytes,
                                       "device": str(s.load_device)} for s in shares},
            "calls": [{"method": c["method"], "outcome": c["outcome"],
                       "held": {n: (d.get("resident_bytes") or 0) + (d.get("slot_bytes") or 0)
                                for n, d in c.get("stats", {}).get("devices", {}).items()},
                       "peak": {n: d.get("peak_bytes") for n, d in
                                c.get("stats", {}).get("devices", {}).items()}}
                      for c in session.calls]}
        # what VAE.decode/encode see as free for their batches (get_free_memory) between
        # calls: the device's free memory less the shares not loaded yet
        real, fixed = mm.get_free_memory, 1 << 40
        mm.get_free_memory = lambda dev=None, torch_free_too=False: fixed
        try:
            rec["session"]["withheld_from_batches"] = fixed - obj.patcher.get_free_memory(
                torch.device("cpu"))
        finally:
            mm.get_free_memory = real
    rec["image"] = cd.compare(name, ref)
    return rec


SPLIT = dict(backend="diffusion=cuda0&cuda1,vae=cpu", params_backend="diffusion=cpu")


async def main():
    work = cd.ARGS.work
    cd.build_models(work)
    await cd.start_comfy(cd.ARGS.pack, work)
    import nodes
    nodes.NODE_CLASS_MAPPINGS["PlacementTestMemoryProbe"] = PlacementTestMemoryProbe
    executor = cd.execution.PromptExecutor(cd.server.PromptServer.instance,
                                           cache_type=cd.execution.CacheType.CLASSIC,
                                           cache_args={"ram": 16.0, "ram_inactive": 16.0})
    RESULTS["reference"] = await cd.run_prompt(
        executor, cd.pipeline(placed=False, tag="reference", keep=True), "reference")
    original = cd.KEPT["reference"]["model"]
    state_before, weights_before = cd.model_state(original), cd.module_weights(original)
    RESULTS["model_bytes"] = sum(p.numel() * p.element_size()
                                 for p in original.model.diffusion_model.parameters())

    # the simulated devices, each just big enough for what its plan holds there (its
    # weights, ring and working memory: comfy_driver.sized_inventory), none the model
    # whole beside its working memory
    split_inv, _ = await cd.sized_inventory(executor, "size_split", ["cuda0", "cuda1"],
                                            split_mode="layer", **SPLIT)
    stream_inv, _ = await cd.sized_inventory(
        executor, "size_stream", ["cuda0"], backend="diffusion=cuda0,vae=cpu",
        params_backend="diffusion=cpu", stream_layers=True)
    row_inv, _ = await cd.sized_inventory(executor, "size_row", ["cuda0", "cuda1"],
                                          split_mode="row", unet="tiny_flux_wide.safetensors",
                                          **SPLIT)
    RESULTS["inventories"] = {"split": split_inv, "stream": stream_inv, "row": row_inv}
    mm.unload_all_models()
    # 1. layer split over two simulated devices, each holding its range: the view
    #    during the run, then ComfyUI frees memory on the shares' device mid-run
    RESULTS["split_view"] = await scenario(executor, "split_view", split_inv,
                                           split_mode="layer", **SPLIT)
    RESULTS["split_free"] = await scenario(executor, "split_free", split_inv,
                                           split_mode="layer", action="free_memory", at_call=1, **SPLIT)
    # 2. unload_all_models between runs, then the same placement runs again
    mm.unload_all_models()
    RESULTS["after_unload_all"] = {"view": loaded_view(),
                                   "session": session_record("split_free")}
    RESULTS["split_rerun"] = await scenario(executor, "split_rerun", split_inv,
                                            split_mode="layer", **SPLIT)
    # 3. one simulated device, streamed (no room for the whole model beside its working
    #    memory): ComfyUI's partial unload
    RESULTS["stream_partial"] = await scenario(
        executor, "stream_partial", stream_inv, backend="diffusion=cuda0,vae=cpu",
        params_backend="diffusion=cpu", stream_layers=True, action="partial", at_call=1)
    # 4. row split of the wide model over two simulated devices
    RESULTS["wide_reference"] = await cd.run_prompt(executor, cd.pipeline(
        placed=False, unet="tiny_flux_wide.safetensors", tag="wide_reference"),
        "wide_reference")
    RESULTS["row_view"] = await scenario(
        executor, "row_view", row_inv, split_mode="row",
        unet="tiny_flux_wide.safetensors", ref="wide_reference", **SPLIT)
    # 5. auto-fit decides: the shares follow the planner's held bytes
    RESULTS["fit_view"] = await scenario(executor, "fit_view", "cuda0=1GiB,cuda1=1GiB",
                                         backend="vae=cpu", auto_fit=True)
    # 6. the text encoder split over two simulated devices (the engine places each
    #    encode): the shares while a call runs; ComfyUI's free_memory during a call; the
    #    VAE on a simulated device with ComfyUI's partial unload during a decode
    te_ref = cd.pipeline(placed=False, text=True, tag="te_reference")
    te_ref["24"] = {"class_type": "PlacementTestKeepClip",        # the loader's CLIP
                    "inputs": {"clip": ["40", 0], "tag": "te_loader"}}
    RESULTS["te_reference"] = await cd.run_prompt(executor, te_ref, "te_reference")
    clip_loader = cd.KEPT["te_loader"]["clip"]
    clip_before = cd.patcher_state(clip_loader.patcher)
    clip_weights = {k: v.clone() for k, v in clip_loader.patcher.model.state_dict().items()}
    vae_loader = cd.KEPT["reference"]["vae"]
    vae_weights = {k: v.clone() for k, v in vae_loader.patcher.model.state_dict().items()}
    RESULTS["te_view"] = await call_scenario(
        executor, "te_view", cd.TE_INVENTORY, "te", text=True, ref="te_reference",
        backend="diffusion=cpu,vae=cpu,te=cuda0&cuda1")
    RESULTS["te_free"] = await call_scenario(
        executor, "te_free", cd.TE_INVENTORY, "te", action="free_memory", text=True,
        ref="te_reference", backend="te=cuda0&cuda1,diffusion=cpu,vae=cpu")
    RESULTS["vae_partial"] = await call_scenario(
        executor, "vae_partial", "cuda0=64MiB@workspace=0", "vae", action="partial",
        backend="diffusion=cpu,vae=cuda0")
    RESULTS["te_fit"] = await call_scenario(
        executor, "te_fit", "cuda0=1GiB,cuda1=1GiB", "te", text=True, ref="te_reference",
        backend="diffusion=cpu,vae=cpu", auto_fit=True)
    fit = ((cd.KEPT["te_fit_clip"]["clip"].patcher.get_attachment("placement").plan.extra
            or {}).get("fit") or {}).get("components", {}).get("te")
    RESULTS["te_fit"]["fit"] = None if not fit else {
        "held_bytes": fit.get("held_bytes"), "headroom_bytes": fit.get("headroom_bytes")}
    # placing the placed CLIP again: only the new plan's shares (or none) remain
    adapter, placement = cd.pack_module("runtime.comfy"), cd.pack_module("placement")
    inv = placement.Inventory.simulated(cd.TE_INVENTORY)
    placed_clip = cd.KEPT["te_view_clip"]["clip"]
    RESULTS["te_placed_again"] = {}
    for label, backend in (("plain", "te=cpu"), ("engine", "te=cuda1")):
        plan = placement.plan(placement.PlacementSpec(backend=backend), inv)
        obj = adapter.place_objects(plan, inv, {"te": placed_clip})[0]["te"]
        RESULTS["te_placed_again"][label] = {
            "class": type(obj.patcher).__name__,
            "shares": [(s.device_name, id(s.session)) for s in
                       obj.patcher.get_additional_models_with_key("placement_claims")],
            "loaded_with": [type(m).__name__ for m in obj.patcher.model_patches_models()],
            "session": id(obj.patcher.get_attachment("placement")),
            "old_session": id(placed_clip.patcher.get_attachment("placement"))}
    RESULTS["te_vae_unload_all"] = {"before": loaded_view()}
    mm.unload_all_models()
    RESULTS["te_vae_unload_all"]["after"] = loaded_view()
    RESULTS["original_vae_unchanged"] = (
        cd.vae_state(vae_loader) == cd.KEPT["reference"]["vae_state"] and
        cd.same_weights(vae_weights, vae_loader.patcher.model.state_dict()))
    RESULTS["original_clip_unchanged"] = (
        cd.patcher_state(clip_loader.patcher) == clip_before and
        clip_loader.cond_stage_model is clip_loader.patcher.model and
        cd.same_weights(clip_weights, clip_loader.patcher.model.state_dict()))
    # the MODEL the loader gave is as it was
    RESULTS["original_unchanged"] = cd.model_state(original) == state_before
    RESULTS["original_weights_unchanged"] = cd.same_weights(weights_before,
                                                            cd.module_weights(original))
    RESULTS["original_additional_models"] = sorted(original.additional_models)


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except Exception:
        RESULTS["errors"].append(traceback.format_exc())
    print("PLACEMENT_MEMORY_RESULTS " + json.dumps(cd.jsonable(RESULTS)))
