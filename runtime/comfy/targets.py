"""A component's plan, turned into the two torch devices ComfyUI understands.

ComfyUI places a model through its patcher's `load_device` (where it computes) and
`offload_device` (where its weights rest between uses). This module maps one
ComponentPlan onto that pair. Plans that pair cannot express (disk residency,
streaming, splits, simulated devices) go to the pack's engine instead (engine.py,
engine_calls.py); what it runs per component is ENGINE_RUNS below, the rest is refused
with an error naming what is missing.
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


# What the pack's engine runs inside ComfyUI, per component (everything else goes through
# ComfyUI's own patchers, or is refused below).
ENGINE_RUNS = {
    "diffusion": ("stream", "disk", "split", "simulated", "lora"),
    "vae": ("disk", "simulated"),
    "te": ("stream", "disk", "split", "simulated", "lora"),
}
# Components ComfyUI patches with LoRA (the others never carry LoRA patches).
LORA_COMPONENTS = ("diffusion", "te")


def _torch_device(inventory: Inventory, name: str, component: str, role: str) -> torch.device:
    device = inventory.get(name)
    if device.simulated or device.torch_device is None:
        raise PlacementError(
            f"{component} {role} {name} is a simulated device: only the pack's engine "
            f"executes on simulated devices, and inside ComfyUI it places "
            f"{' and '.join(c for c in ENGINE_RUNS)} so far; put {component} on a real "
            f"device (e.g. cpu)")
    return torch.device(device.torch_device)


def engine_needs(cp: ComponentPlan, inventory: Inventory) -> list:
    """What in this plan ComfyUI's own patcher cannot express."""
    needs = []
    if cp.stream is not None:
        needs.append("stream")
    if cp.params == "disk":
        needs.append("disk")
    if cp.is_split:
        needs.append("split")
    names = list(cp.runtime) + ([cp.params] if cp.params not in ("cpu", "disk") else [])
    if any(inventory.get(n).simulated for n in names):
        needs.append("simulated")
    if cp.lora == "runtime" and cp.component in LORA_COMPONENTS and not needs:
        # ComfyUI fuses LoRA into fully loaded weights; the engine keeps them unpatched
        # and ComfyUI's cast path applies the patches at each forward
        needs.append("lora")
    return needs


def needs_engine(cp: ComponentPlan, inventory: Inventory) -> bool:
    """Plans ComfyUI's own patcher cannot express: the pack's engine runs them."""
    return bool(engine_needs(cp, inventory))


WHAT = {"stream": "streaming (stream_layers)", "disk": "params 'disk'",
        "lora": "runtime LoRA (lora_mode runtime)",
        "split": "a split over several devices", "simulated": "a simulated device"}


def check_executable(cp: ComponentPlan, inventory: Inventory) -> None:
    """Raise for what neither ComfyUI's patcher nor the pack's engine runs inside ComfyUI."""
    comp = cp.component
    runs = ENGINE_RUNS.get(comp, ())
    for need in engine_needs(cp, inventory):
        if need not in runs:
            where = (f" ({'&'.join(cp.runtime)})" if need == "split" else "")
            raise PlacementError(
                f"{comp}: {WHAT[need]}{where} is not executed for {comp} inside ComfyUI yet "
                f"(the pack's engine is wired for "
                + "; ".join(f"{c}: {', '.join(WHAT[n] for n in r)}"
                            for c, r in ENGINE_RUNS.items())
                + f"); place {comp} on a real device with params cpu or that device")


def target_for(plan: Plan, component: str, inventory: Inventory) -> Target:
    cp = plan.components[component]
    check_executable(cp, inventory)
    load = _torch_device(inventory, cp.main_device, component, "runtime device")
    offload = _torch_device(inventory, cp.params, component, "params device")
    return Target(component, cp.main_device, cp.params, load, offload)
