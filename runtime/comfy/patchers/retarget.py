"""Retarget a ComfyUI ModelPatcher: a clone with new load/offload devices.

The given patcher is never changed (ComfyUI caches node outputs and shares them).
A clone shares the underlying torch module with its source, so two details matter:

- If the shared module is already loaded on another device (by the source patcher,
  an earlier run), ComfyUI's load path would skip moving it: it detaches the other
  clone without unpatching and then sees a "fully loaded" module with the same
  patches uuid. A fresh `patches_uuid` on our clone makes ComfyUI unpatch the
  shared weights to our offload device and load them on ours, exactly as it does
  when a LoRA changes (core's own `set_model_compute_dtype` uses the same lever).
- DynamicVRAM patchers (`patcher.is_dynamic()`) do not run on the CPU: core's own
  device selector rebuilds them as plain patchers (`clone(disable_dynamic=True)`,
  which needs the loader's `cached_patcher_init`); we do the same. On an accelerator
  a dynamic patcher keeps its own residency policy (weights rest in host memory
  and are cached in VRAM as room allows); the returned notes say so.
"""
import uuid
from typing import List, Tuple

from ....placement.errors import PlacementError
from .engine_patcher import strip_engine
from .patcher_devices import PatcherDevices


def plain_clone(patcher, what: str, why: str):
    """A clone rebuilt without DynamicVRAM (core's rebuild path); a loader that cannot
    rebuild it is a one-line error saying what to do instead."""
    try:
        return patcher.clone(disable_dynamic=True)
    except RuntimeError as exc:
        raise PlacementError(
            f"{what}: its DynamicVRAM patcher must be rebuilt as a plain one {why} and its "
            f"loader cannot rebuild it ({exc}); use a core loader or run ComfyUI with "
            f"--disable-dynamic-vram") from None


def retarget(patcher, devices: PatcherDevices, what: str) -> Tuple[object, List[str]]:
    """A clone of `patcher` that computes on devices.load_device and rests its weights
    on devices.offload_device, plus notes for the plan shown to the user."""
    notes: List[str] = []
    rebuilt = False
    if patcher.is_dynamic() and devices.load_device.type == "cpu":
        clone = plain_clone(patcher, what, "to compute on the cpu")
        rebuilt = True
        notes.append(f"{what}: DynamicVRAM off for this copy (it computes on the cpu)")
    else:
        clone = patcher.clone()
    strip_engine(clone)              # placing an engine-placed model again: plain patcher
    moved = clone.load_device != devices.load_device
    clone.load_device = devices.load_device
    clone.offload_device = devices.offload_device
    if moved and not rebuilt:
        clone.patches_uuid = uuid.uuid4()   # re-place shared weights on load (see above)
    if hasattr(clone, "register_load_device"):
        clone.register_load_device(clone.load_device)   # per-device state of dynamic patchers
    if clone.is_dynamic() and devices.params_resident:
        notes.append(f"{what}: DynamicVRAM manages its residency on {devices.runtime} "
                     f"(weights cached in VRAM as room allows, not pinned there)")
    return clone, notes
