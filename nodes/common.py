"""What the three nodes share: the inventory they plan for and the PLACEMENT type."""
import os
from dataclasses import dataclass

import comfy.model_management
from comfy_api.latest import io

from ..placement.devices import Inventory
from ..placement.spec import PlacementSpec

SIMULATE_ENV = "COMFYUI_PLACEMENT_SIMULATE"
CATEGORY = "placement"

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
    if comfy.model_management.cpu_mode() and len(inventory.devices) > 1:
        return Inventory([d for d in inventory.devices if d.kind == "cpu"],
                         source="detected (ComfyUI runs with --cpu: GPUs not offered)")
    return inventory
