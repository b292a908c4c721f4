"""What the three nodes share: the inventory they plan for and the PLACEMENT type."""
import os
from dataclasses import dataclass

from comfy_api.latest import io

from ..placement.components import COMPONENTS
from ..placement.devices import Inventory
from ..placement.spec import PlacementSpec
from ..runtime.comfy.patchers.patcher_devices import comfy_cpu_only
from ..runtime.comfy.patchers.visible_devices import hidden_gpus_note

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
    workers: str = ""     # w1=HOST:PORT,...: worker machines joined for their devices


def node_inventory() -> Inventory:
    """This machine as ComfyUI uses it, or the diagnostic simulated inventory named by
    the environment. ComfyUI started with --cpu uses no GPU, so none is offered."""
    simulated = os.environ.get(SIMULATE_ENV, "").strip()
    if simulated:
        return computed_here(Inventory.simulated(simulated))
    inventory = Inventory.detect()
    if comfy_cpu_only() and len(inventory.devices) > 1:
        return Inventory([d for d in inventory.devices if d.kind == "cpu"],
                         source="detected (ComfyUI runs with --cpu: GPUs not offered)")
    return inventory


def computed_here(inventory: Inventory) -> Inventory:
    """The diagnostic inventory: simulated GPUs that compute on this machine's CPU (the
    runtime's simulated device). They allocate no kernel workspace, so their plans keep
    none unless an entry sets one (@workspace=SIZE); a what-if plan for a real card
    (`plan --simulate`) keeps that card's workspace. Their margin follows their size
    (placement/room.py)."""
    from dataclasses import replace
    devices = [replace(d, workspace_bytes=0) if d.kind != "cpu" and d.workspace_bytes is None
               else d for d in inventory.devices]
    return Inventory(devices, source=f"{inventory.source} (computed on this machine's CPU: "
                                     f"no kernel workspace unless @workspace= sets one)")


def simulated_note():
    """The startup line when the environment names a simulated inventory; None if not."""
    text = os.environ.get(SIMULATE_ENV, "").strip()
    if not text:
        return None
    try:
        inventory = node_inventory()
    except Exception as exc:           # said at startup, and again by every node
        return f"{SIMULATE_ENV}={text!r} is not a valid inventory: {exc}"
    return (f"{SIMULATE_ENV} is set: the nodes plan for simulated devices "
            f"({', '.join(inventory.names)}) that compute on this machine's CPU, not for "
            f"this machine's GPUs (unset it to plan for the real ones)")


def workers_inventory(inventory: Inventory, text: str, strict: bool):
    """`inventory` with the devices of the workers `text` names (joined once while ComfyUI
    runs: runtime/distributed/pool.py), and the Workers. A worker that cannot be
    joined is refused with strict on; with strict off the plan goes on without it."""
    if not str(text or "").strip():
        return inventory, None
    from ..placement.errors import PlacementError
    from ..placement.remote_devices import with_remote
    from ..runtime.distributed.pool import join_workers
    workers = join_workers(text)
    if strict and workers.unreachable:
        first = next(iter(workers.unreachable.values()))
        raise PlacementError(f"{first} (strict is on: turn it off to plan without "
                             f"the worker)")
    if not workers.joined:
        return inventory, workers
    refresh_workers(workers)
    return with_remote(inventory, workers.devices()), workers


def refresh_workers(workers, reset_peaks: bool = False) -> None:
    """Each joined worker's free memory measured now, its peaks read and, with
    reset_peaks, counted from now (runtime/distributed/own_figures.py). A worker lost
    meanwhile is left to the run, which says so in one line."""
    from ..placement.errors import PlacementError
    for cluster in (getattr(workers, "joined", None) or {}).values():
        try:
            cluster.refresh(reset_peaks)
        except PlacementError:
            pass


def note_workers(plan, workers) -> None:
    """Say on the plan which workers were left out, and name them in its fallbacks
    (a device w1.cuda0 fell back because worker w1 could not be joined)."""
    if workers is None or not workers.unreachable:
        return
    for alias, line in workers.unreachable.items():
        plan.warnings.append(f"{line}; planned without it")
        for f in plan.extra.get("fallbacks") or []:
            asked = str(f.get("asked") or "")
            if asked.lower().startswith(alias + "."):
                f["why"] = line


def plan_ui(text: str, plan=None, spec=None, workers=None) -> dict:
    """The node's UI output (the 'executed' message, never a node input): the text, the
    plan JSON the editor shows, and structured fields the editor reads instead of the
    plan's sentences: what fell back and the components the spec names."""
    ui = {"text": (text,)}
    if plan is not None:
        ui["placement_plan"] = (plan.to_json(),)
        fell = fallbacks(plan)
        if fell:
            ui["placement_fallbacks"] = tuple(fell)
        notices = [f"{line}; planned without it"
                   for line in (workers.unreachable.values() if workers else ())]
        note = hidden_gpus_note()
        if note and (fell or any(len(cp.runtime) > 1 for cp in plan.components.values())
                     or plan.extra.get("fit")):
            notices.append(note)
        if notices:
            ui["placement_notice"] = tuple(notices)
    if spec is not None:
        ui["placement_components"] = tuple(named_components(spec))
    return ui


def named_components(spec) -> list:
    """Components the spec names a device for (a bare default names them all)."""
    return [c for c in COMPONENTS if spec.runtime.for_component(c) is not None
            or spec.params.for_component(c) is not None]


def fallbacks(plan) -> list:
    """What fell back (a device this machine lacks), from the plan's records: one entry
    per cause, the components it hit together (only connected ones when any is), with
    what is used instead: {components, field, asked, used, why}."""
    present = {c for c, cp in plan.components.items() if getattr(cp, "present", False)}
    merged = {}
    for f in plan.extra.get("fallbacks") or []:
        comp = f.get("component")
        if present and comp is not None and comp not in present:
            continue
        cp = plan.components.get(comp) if comp else None
        if cp is None:
            used = "ignored"
        elif f.get("field") == "params":
            used = cp.params
        else:
            used = "&".join(cp.runtime)
        key = (f.get("field"), f.get("asked"), f.get("why"), used)
        merged.setdefault(key, []).append(comp)
    return [{"components": [c for c in comps if c], "field": field, "asked": asked,
             "used": used, "why": why}
            for (field, asked, why, used), comps in merged.items()]
