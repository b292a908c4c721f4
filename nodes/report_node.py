"""Placement Report: the plan that ran and the measured figures, as a UI output.

Apply Placement runs before sampling, so its own UI output (what /history keeps) can only
hold the plan made at node time; what ran and what it measured exist once sampling and
decode have ended, and reach the editor as a websocket message (`placement.measured`)
and the log. ComfyUI 0.29.0 offers no supported way to change a node's UI output after
the node ran: history is built from the outputs nodes return when they execute. So this
output node is wired AFTER the work (its `after` input takes the decoded IMAGE, or the
sampler's LATENT), executes once that exists, and returns the plan that ran and the
measured record of every Apply Placement in the prompt as its UI output, which ComfyUI
stores in /history/<prompt_id>["outputs"][<this node's id>] and shows in the node.
When the work upstream is cached, so is this node, and ComfyUI sends its kept output
again: the figures of the run that made the cached result.
"""
import json

from comfy_api.latest import io

from .common import CATEGORY, SEARCH_ALIASES
from .measured import LATEST, current_prompt_id


class PlacementReport(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id="PlacementReport",
            display_name="Placement Report",
            category=CATEGORY,
            search_aliases=SEARCH_ALIASES + ["report", "measured", "peak memory", "history"],
            description="After a run: the plan that ran and what was measured (seconds, "
                        "peak memory per device and phase, predicted beside measured) for "
                        "every Apply Placement in the workflow, in the node and in the "
                        "prompt's /history entry. Connect the decoded IMAGE (or the "
                        "sampler's LATENT) to `after`, so it runs once the work is done.",
            inputs=[io.AnyType.Input(
                "after", tooltip="what the placed models produced (VAE Decode's IMAGE, or "
                                 "the sampler's LATENT): the report runs once it exists")],
            outputs=[io.String.Output("report_json", tooltip="the measured records, JSON "
                                      "(one per Apply Placement; 'plan' is the plan that ran)")],
            is_output_node=True,
            hidden=[io.Hidden.unique_id, io.Hidden.prompt],
        )

    @classmethod
    def execute(cls, after=None) -> io.NodeOutput:
        prompt = (getattr(cls.hidden, "prompt", None) if cls.hidden else None) or {}
        applied = [str(k) for k, v in prompt.items()
                   if isinstance(v, dict) and v.get("class_type") == "PlacementApply"]
        now = current_prompt_id()
        found, earlier = [], 0
        for node_id in applied:
            got = LATEST.get(node_id)
            if got is None:
                continue
            ran_in = got["record"].get("prompt_id")
            if now is not None and ran_in is not None and ran_in != now:
                earlier += 1              # another prompt's run of a node with this id
                continue
            found.append((node_id, got))
        records = [json.loads(json.dumps(got["record"], default=str)) for _, got in found]
        if not found:
            if not applied:
                text = "this workflow has no Apply Placement: nothing placed to report"
            elif earlier:
                text = ("the placed models did not run in this prompt (ComfyUI reused "
                        "cached results): change an input upstream, e.g. the seed, and "
                        "queue again to measure a run")
            else:
                text = ("no placed model has run before this node in this prompt: connect "
                        "what Apply Placement's outputs produce (VAE Decode's IMAGE, or "
                        "the sampler's LATENT) to `after`")
            return io.NodeOutput("[]", ui={"text": (text,)})
        parts = []
        for node_id, got in found:
            head = f"Apply Placement #{node_id}" if len(found) > 1 else "Apply Placement"
            parts.append("\n".join([f"{head}: plan that ran", got["report"], "",
                                    *got["record"].get("lines", [])]))
        ui = {"text": ("\n\n".join(parts),),
              # the first record's plan, drawn as the bars of the editor's plan view
              "placement_plan": (json.dumps(records[0].get("plan")),),
              "placement_measured": tuple(records)}
        return io.NodeOutput(json.dumps(records), ui=ui)
