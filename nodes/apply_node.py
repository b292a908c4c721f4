"""Apply Placement: placed copies of the connected models, and the plan in the node.

The inputs are cached outputs of other nodes and stay untouched; every output is a
copy (patcher clone) placed as the plan says: through ComfyUI's own patchers, or, for
what those cannot express (streaming, disk residency, splits, simulated devices), by
the pack's engine (runtime/comfy/engine.py). What neither runs yet is a node error
naming the missing piece.
"""
from comfy_api.latest import io, ui

from ..runtime.comfy import place_objects
from .common import CATEGORY, Placement, PlacementType, node_inventory
from .planning import make_plan

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


class ApplyPlacement(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        inputs = [PlacementType.Input("placement", tooltip="from Backend Assignment")]
        inputs += [kind.Input(name, optional=True, tooltip=f"placed as the plan's {comp}")
                   for name, kind, comp in SLOTS]
        outputs = [kind.Output(name) for name, kind, _ in SLOTS]
        outputs.append(io.String.Output("plan_json", tooltip="the plan, JSON schema v1"))
        return io.Schema(
            node_id="PlacementApply",
            display_name="Apply Placement",
            category=CATEGORY,
            description="Places the connected models where the Backend Assignment says: "
                        "each output is a copy that computes on its runtime device and rests "
                        "its weights on its params device; streamed, disk-resident and "
                        "split models run through the pack's engine for each sampling run "
                        "(LoRA applied at run time). Inputs are not modified. "
                        "Unconnected outputs are empty.",
            inputs=inputs,
            outputs=outputs,
        )

    @classmethod
    def execute(cls, placement: Placement, **objects) -> io.NodeOutput:
        by_component = {comp: objects.get(name) for name, _, comp in SLOTS}
        inventory = node_inventory()
        plan = make_plan(placement.spec, inventory, by_component, strict=placement.strict)
        placed, notes = place_objects(plan, inventory, by_component)
        text = plan.report()
        if notes:
            text += "\n\napplied:\n" + "\n".join(f"  {n}" for n in notes)
        results = [placed.get(comp) for _, _, comp in SLOTS]
        return io.NodeOutput(*results, plan.to_json(), ui=ui.PreviewText(text))
