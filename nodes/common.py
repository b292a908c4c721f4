"""What the three nodes share: the inventory they plan for and the PLACEMENT type."""
import os
from dataclasses import dataclass

from comfy_api.latest import io

from ..placement.devices import Inventory
from ..placement.spec import PlacementSpec
from ..runtime.comfy.patcher_devices import comfy_cpu_only

SIMULATE_ENV = "COMFYUI_PLACEMENT_SIMULATE"
CATEGORY = "placement"

# What users type into the node search (the frontend searches name, display_name and
# search_aliases): the words of core's device nodes, ComfyUI-MultiGPU and block-swap packs.
SEARCH_ALIASES = ["gpu", "vram", "low vram", "offload", "multi-gpu", "multigpu",
                  "block swap", "device", "placement", "cuda", "split", "stream",
                  "cpu offload", "memory"]

# A PLACEMENT wire carries what the user asked for; Apply Placement plans it against
# the machine and the models it is given.
PlacementType = io.Custom("PLACEMENT")


@dataclass(frozen=True)
class Placement:
    spec: PlacementSpec
    strict: bool          # a device this machine lacks is an error (else: auto + warning)


def node_inventory() -> Inventory:
    """This machine as ComfyUI uses it, or the diagnostic simulated inventory named by
    the environment. ComfyUI started with --cpu uses no GPU, so none is offered."""
    simulated = os.environ.get(SIMULATE_ENV, "").strip()
    if simulated:
        return Inventory.simulated(simulated)
    inventory = Inventory.detect()
    if comfy_cpu_only() and len(inventory.devices) > 1:
        return Inventory([d for d in inventory.devices if d.kind == "cpu"],
                         source="detected (ComfyUI runs with --cpu: GPUs not offered)")
    return inventory


def plan_ui(text: str, plan=None, warnings=()) -> dict:
    """The node's UI output (the 'executed' message, never a node input): the text, the
    plan JSON the editor draws from, and the fallback warnings it raises a toast for."""
    ui = {"text": (text,)}
    if plan is not None:
        ui["placement_plan"] = (plan.to_json(),)
    if warnings:
        ui["placement_warnings"] = tuple(warnings)
    return ui


def fallbacks(plan) -> list:
    """The plan's fall-backs (a device this machine lacks), one line per cause: the
    components it hit are listed together, and only connected ones when any is."""
    present = {c for c, cp in plan.components.items() if getattr(cp, "present", False)}
    merged = {}
    for w in plan.warnings:
        if "falling back" not in w:
            continue
        head, _, cause = w.partition(": ")
        comp = head.split(" for ")[-1] if " for " in head else ""
        if present and comp and comp not in present:
            continue
        what = head.split(" for ")[0] if " for " in head else head
        merged.setdefault((what, cause), []).append(comp)
    every = set(plan.components)
    return [f"{what}: {cause}" if not any(comps) else
            f"{what} for all modules: {cause}" if set(comps) >= every and not present else
            f"{what} for {', '.join(c for c in comps if c)}: {cause}"
            for (what, cause), comps in merged.items()]
