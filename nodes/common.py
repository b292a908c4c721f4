"""What the three nodes share: the inventory they plan for and the PLACEMENT type."""
import os
from dataclasses import dataclass

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
    """This machine, or the diagnostic simulated inventory named by the environment."""
    simulated = os.environ.get(SIMULATE_ENV, "").strip()
    if simulated:
        return Inventory.simulated(simulated)
    return Inventory.detect()
