"""A component's plan, turned into the two torch devices ComfyUI understands.

ComfyUI places a model through its patcher's `load_device` (where it computes) and
`offload_device` (where its weights rest between uses). This module maps one
ComponentPlan onto that pair. Plans that pair cannot express (disk residency,
streaming, splits, simulated devices) go to the pack's engine instead (engine_model.py,
engine_calls.py); what runs per component is the "comfyui" row of
placement/capabilities.py, the rest is refused with an error naming what is missing.
"""
from dataclasses import dataclass

import torch

from ....placement import capabilities
from ....placement.capabilities import TABLE
from ....placement.devices import Inventory
from ....placement.errors import PlacementError
from ....placement.plan import ComponentPlan, Plan


@dataclass(frozen=True)
class PatcherDevices:
    """Where ComfyUI's patcher computes and rests one component's weights (not the
    runtime's Target: runtime/device/target.py is a device the engine opened)."""
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


# What runs inside ComfyUI is the table in placement/capabilities.py (EXECUTOR "comfyui"):
# the planner reads it too, so auto-fit never proposes a plan refused here.
EXECUTOR = "comfyui"


def _torch_device(inventory: Inventory, name: str, component: str, role: str) -> torch.device:
    device = inventory.get(name)
    if device.simulated or device.torch_device is None:
        raise PlacementError(
            f"{component} {role} {name} is a simulated device: only the pack's engine "
            f"executes on simulated devices, and inside ComfyUI it places "
            f"{', '.join(c for c, caps in TABLE[EXECUTOR].items() if 'simulated' in caps)}; "
            f"put {component} on a real device (e.g. cpu)")
    return torch.device(device.torch_device)


def comfy_cpu_only() -> bool:
    """ComfyUI was started with --cpu: it computes on no GPU."""
    import comfy.model_management
    return comfy.model_management.cpu_mode()


def engine_needs(cp: ComponentPlan, inventory: Inventory) -> list:
    """What in this plan ComfyUI's own patcher cannot express."""
    return capabilities.engine_needs(cp, inventory, EXECUTOR)


def needs_engine(cp: ComponentPlan, inventory: Inventory) -> bool:
    """Plans ComfyUI's own patcher cannot express: the pack's engine runs them."""
    return bool(engine_needs(cp, inventory))


def check_executable(cp: ComponentPlan, inventory: Inventory) -> None:
    """Raise for what neither ComfyUI's patcher nor the pack's engine runs inside ComfyUI
    (one line naming the missing capability; placement/capabilities.py)."""
    capabilities.check_component(cp, inventory, EXECUTOR)


def patcher_devices_for(plan: Plan, component: str, inventory: Inventory) -> PatcherDevices:
    cp = plan.components[component]
    check_executable(cp, inventory)
    load = _torch_device(inventory, cp.main_device, component, "runtime device")
    offload = _torch_device(inventory, cp.params, component, "params device")
    return PatcherDevices(component, cp.main_device, cp.params, load, offload)
