"""Apply Placement: placed copies of the connected models, and the plan in the node.

The inputs are cached outputs of other nodes and stay untouched; every output is a
copy (patcher clone) placed as the plan says: through ComfyUI's own patchers, or, for
what those cannot express (streaming, disk residency, splits, simulated devices), by
the pack's engine (runtime/comfy/sampling/engine_model.py). What neither runs yet is a node error
naming the missing piece.
"""
import logging
from dataclasses import replace

from comfy_api.latest import io

from ..placement.units import format_bytes
from ..runtime.comfy import place_objects
from ..runtime.comfy.replan.workload import (
    FOLLOWS_LATENT,
    SamplingReplanner,
    from_prompt,
    latent_ratios,
    placement_key,
)
from .common import (CATEGORY, SEARCH_ALIASES, Placement, PlacementType,
                     node_inventory, note_workers, plan_ui, workers_inventory)
from .measured import Meter, attach, engine_sessions
from .planning import make_plan

log = logging.getLogger("comfyui-placement")

# (input name, io type, component)
SLOTS = (
    ("model", io.Model, "diffusion"),
    ("clip", io.Clip, "te"),
    ("vae", io.Vae, "vae"),
    ("control_net", io.ControlNet, "controlnet"),
    ("clip_vision", io.ClipVision, "clip_vision"),
    ("upscale_model", io.UpscaleModel, "upscaler"),
    ("photomaker", io.Photomaker, "photomaker"),
)
# stable-diffusion.cpp's `detector` (ADetailer). Core has no detector type: these are the
# Impact Pack's. Added after every older input and output, so saved workflows keep their
# slots (plan_json stays output 7).
DETECTOR_SLOTS = (
    ("bbox_detector", io.Custom("BBOX_DETECTOR"), "detector"),
    ("segm_detector", io.Custom("SEGM_DETECTOR"), "detector"),
)


class ApplyPlacement(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        inputs = [PlacementType.Input("placement", tooltip="from Backend Assignment")]
        inputs += [kind.Input(name, optional=True, tooltip=f"placed as the plan's {comp}")
                   for name, kind, comp in SLOTS]
        inputs.append(io.Latent.Input(
            "latent", optional=True,
            tooltip="auto_fit: the latent the sampler starts from, so the plan is made at "
                    "node time for its real size (else read from the prompt: the "
                    "sampler's steps/cfg and its Empty Latent's width/height/batch)"))
        inputs += [kind.Input(name, optional=True, tooltip="placed as the plan's detector "
                              "(an Impact Pack detector: its model computes on the "
                              "detector's runtime device)")
                   for name, kind, _ in DETECTOR_SLOTS]
        outputs = [kind.Output(name) for name, kind, _ in SLOTS]
        outputs.append(io.String.Output(
            "plan_json", tooltip="the plan, JSON schema v1; with auto_fit, its 'workload' "
                                 "key says what it was planned for (the plan that ran is "
                                 "shown in the node when sampling re-plans)"))
        outputs += [kind.Output(name) for name, kind, _ in DETECTOR_SLOTS]
        return io.Schema(
            node_id="PlacementApply",
            display_name="Apply Placement",
            category=CATEGORY,
            search_aliases=SEARCH_ALIASES + ["apply placement", "model device",
                                             "layer split", "disk offload"],
            description="Multi-GPU, CPU offload and low-VRAM placement: places the connected models where the Backend Assignment says: "
                        "each output is a copy that computes on its runtime device and rests "
                        "its weights on its params device; streamed, disk-resident and "
                        "split models run through the pack's engine for each sampling run "
                        "(LoRA applied at run time). Inputs are not modified. "
                        "Unconnected outputs are empty.",
            inputs=inputs,
            outputs=outputs,
            hidden=[io.Hidden.unique_id, io.Hidden.prompt],
            # its plan is UI output ComfyUI keeps and sends again when the run is cached,
            # so a reloaded page shows it (it still runs only when an output needs it)
            has_intermediate_output=True,
        )

    @classmethod
    def execute(cls, placement: Placement, latent=None, bbox_detector=None,
                segm_detector=None, **objects) -> io.NodeOutput:
        by_component = {comp: objects.get(name) for name, _, comp in SLOTS}
        by_component["detector"] = detectors_given(bbox_detector, segm_detector)
        spec, strict = placement.spec, placement.strict
        inventory, workers = workers_inventory(node_inventory(),
                                               getattr(placement, "workers", ""), strict)
        model = by_component.get("diffusion")
        node_id = getattr(cls.hidden, "unique_id", None) if cls.hidden else None
        # what sampling will compute, as far as the prompt tells: the working memory of
        # every plan, and with auto_fit its choices (runtime/comfy/replan/workload.py)
        workload = from_prompt(getattr(cls.hidden, "prompt", None) if cls.hidden else None,
                               node_id, _latent_shape(latent),
                               latent_ratios(model) if model is not None else (8, 1))
        plan = make_plan(spec, inventory, by_component, strict=strict, workload=workload)
        note_workers(plan, workers)
        placed, notes = place_objects(plan, inventory, by_component, workers=workers)
        text = plan.report()
        absent = no_detector_line(spec, by_component["detector"])
        if absent:
            text += f"\n\n{absent}"
        if notes:
            text += "\n\napplied:\n" + "\n".join(f"  {n}" for n in notes)
        text += (f"\n\n{'auto-fit planned' if spec.auto_fit else 'working memory estimated'}"
                 f" for: {workload.describe()} ({workload.source})")
        replanner = None
        if placed.get("diffusion") is not None:
            replanner = _sampling_replanner(plan, workload, spec, strict, inventory,
                                            by_component, placed, node_id, workers)
            replanner.attach(placed["diffusion"])
            text += ("\nWhen sampling starts, its first model call is rehearsed on the "
                     "meta device (the working memory at the run's real shapes) and the "
                     "run is planned with it"
                     + (" (with auto_fit, also for a different latent size, frames, batch, "
                        "steps or CFG)" if spec.auto_fit else "")
                     + "; the plan that ran is shown here.")
        # measured figures of each run, sent to this node beside the plan's predictions
        meter = Meter(node_id, plan, inventory, engine_sessions(placed, replanner),
                      plan_that_ran=lambda: replanner.last[1] if replanner and replanner.last
                      else plan, workers=workers)
        attach(meter, placed.get("diffusion"), placed.get("vae"), by_component.get("vae"))
        results = [placed.get(comp) for _, _, comp in SLOTS]
        detectors = placed.get("detector") or by_component["detector"]
        return io.NodeOutput(*results, plan.to_json(),
                             getattr(detectors, "bbox", bbox_detector),
                             getattr(detectors, "segm", segm_detector),
                             ui=plan_ui(text, plan, workers=workers))


def detectors_given(bbox, segm):
    """The detector component: None when no connected input holds a model (Impact's
    NO_SEGM_DETECTOR holds none: it passes through)."""
    from ..runtime.engine.detector import Detectors
    given = Detectors(bbox, segm)
    return given if given.modules() else None


def no_detector_line(spec, detectors) -> str:
    """An entry for `detector` with no detector connected: said once, never dropped."""
    if detectors is not None:
        return ""
    named = [f"{field} detector={_value(assign.modules['detector'])}"
             for field, assign in (("backend", spec.runtime), ("params_backend", spec.params),
                                   ("split_mode", spec.split),
                                   ("parallel", spec.parallelism))
             if "detector" in assign.modules]
    if not named:
        return ""
    return (f"detector: no detector in this workflow; {', '.join(named)} places nothing "
            f"(connect an Impact Pack BBOX_DETECTOR or SEGM_DETECTOR to bbox_detector or "
            f"segm_detector)")


def _value(value) -> str:
    if value is None:
        return "auto"
    return "&".join(value) if isinstance(value, tuple) else str(value)


def _latent_shape(latent):
    if not isinstance(latent, dict) or latent.get("samples") is None:
        return None
    samples = latent["samples"]
    if getattr(samples, "is_nested", False):
        samples = samples.unbind()[0]
    return tuple(samples.shape)


def _sampling_replanner(plan, workload, spec, strict, inventory, objects, placed, node_id,
                        workers=None):
    """The sampling-time half of planning (runtime/comfy/replan/workload.py)."""
    def replan(real, first):
        pins = {c: cp for c, cp in first.components.items()
                if c not in FOLLOWS_LATENT and cp.present}
        again = make_plan(spec, inventory, objects, strict=strict, workload=real, pins=pins)
        note_workers(again, workers)
        return again

    def place(new_plan, objs):
        return place_objects(new_plan, inventory, objs, workers=workers)[0]

    def show(real, ran, not_rehearsed=""):
        same_workload = replace(real, text_tokens=workload.text_tokens) == workload
        same_place = all(placement_key(ran, c) == placement_key(plan, c)
                         for c in FOLLOWS_LATENT)
        if same_workload and same_place:
            how = ("plan_json holds this plan (planned at node time for this workload"
                   + (", its working memory now rehearsed)" if real.rehearsed_bytes
                      is not None else ")"))
        elif same_place:
            how = (f"same placement as plan_json, which was planned for {workload.describe()} "
                   f"({workload.source})")
        elif same_workload:
            how = ("plan_json holds the node-time plan for this workload, made with the "
                   "metadata's working-memory estimate; the working memory rehearsed at "
                   "the first model call placed this run otherwise")
        else:
            how = (f"plan_json holds the node-time plan for {workload.describe()} "
                   f"({workload.source}); this run was planned again. Connect the "
                   f"sampler's latent to Apply Placement's latent input to plan it at "
                   f"node time.")
        if not_rehearsed:
            how += (f"\nThe diffusion model's working memory is the metadata's estimate: "
                    f"it could not be rehearsed on the meta device ({not_rehearsed}).")
        elif real.rehearsed_bytes is not None:
            how += (f"\nThe diffusion model's working memory was rehearsed at this run's "
                    f"first model call: {format_bytes(real.rehearsed_bytes)} of tensors "
                    f"(plus the kernel workspace), in place of the estimate.")
        text = (f"plan that ran (sampling {real.describe()}):\n{ran.report()}\n\n{how}")
        send_node_text(text, node_id)

    return SamplingReplanner(plan, workload, replan, place, show,
                             vae_input=objects.get("vae"), vae_output=placed.get("vae"))


def send_node_text(text: str, node_id) -> None:
    """Show `text` in the node while the prompt runs (ComfyUI's progress text message,
    the one core nodes use for text shown under a node)."""
    if node_id is None:
        return
    try:
        from server import PromptServer
        PromptServer.instance.send_progress_text(text, str(node_id))
    except Exception as exc:          # no server (a script), or an older one
        log.info("placement: node text not sent (%s): %s", exc, text.splitlines()[0])
