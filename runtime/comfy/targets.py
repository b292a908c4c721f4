"""A component's plan, turned into the two torch devices ComfyUI understands.

ComfyUI places a model through its patcher's `load_device` (where it computes) and
`offload_device` (where its weights rest between uses). This module maps one
ComponentPlan onto that pair and refuses, with the roadmap item that is missing, the
plans that pair cannot express yet: disk residency, streaming, splits and simulated
devices all need the pack's own runtime engine.
"""
from dataclasses import dataclass

import torch

from ...placement.errors import PlacementError
from ...placement.devices import Inventory
from ...placement.plan import ComponentPlan, Plan


@dataclass(frozen=True)
class Target:
    component: str
    runtime: str                  # inventory name, e.g. 'cuda0'
    params: str                   # inventory name, e.g. 'cpu'
    load_device: torch.device     # where it computes
    offload_device: torch.device  # where its weights rest between uses

    @property
    def params_resident(self) -> bool:
        """Weights stay on the compute device between uses."""
        return self.load_device == self.offload_device

    def describe(self) -> str:
        rest = "resident" if self.params_resident else f"rest on {self.params}"
        return f"{self.component}: runs on {self.runtime}, weights {rest}"


def _torch_device(inventory: Inventory, name: str, component: str, role: str) -> torch.device:
    device = inventory.get(name)
    if device.simulated or device.torch_device is None:
        raise PlacementError(
            f"{component} {role} {name} is a simulated device: ComfyUI cannot execute on "
            f"it until the pack's runtime engine drives it (issue 4, streaming runtime); "
            f"plan with it, or unset COMFYUI_PLACEMENT_SIMULATE to run")
    return torch.device(device.torch_device)


def check_executable(cp: ComponentPlan) -> None:
    """Raise for what ComfyUI's patcher cannot do and the pack's runtime does not do yet."""
    comp = cp.component
    if cp.is_split:
        raise PlacementError(
            f"{comp} is split over {'&'.join(cp.runtime)}: running one component on several "
            f"devices needs the split runtime (issue 5), not built yet; name one device")
    if cp.params == "disk":
        raise PlacementError(
            f"{comp} params 'disk' needs the streaming runtime (issue 4), not built yet; "
            f"use params cpu or a device")
    if cp.stream is not None:
        raise PlacementError(
            f"{comp} is planned streamed (stream_layers): layer streaming needs the "
            f"streaming runtime (issue 4), not built yet; turn stream_layers off")


def target_for(plan: Plan, component: str, inventory: Inventory) -> Target:
    cp = plan.components[component]
    check_executable(cp)
    load = _torch_device(inventory, cp.main_device, component, "runtime device")
    offload = _torch_device(inventory, cp.params, component, "params device")
    return Target(component, cp.main_device, cp.params, load, offload)
