"""The ComfyUI adapter: executes a Plan on ComfyUI's own model objects.

The only runtime code that imports `comfy`. It places components through ComfyUI's
supported mechanisms (patcher clones, load/offload devices, wrapper copies) and
never replaces ComfyUI's memory manager or switches a global device. Plans the patcher
cannot express (streaming, disk, splits, simulated devices) run through the pack's
engine: sampling/engine_model.py and sampling/sampling_session.py (diffusion model, per
sampling run), apply/engine_calls.py (VAE and text encoders, per call),
patchers/engine_patcher.py (the load policy). The engine places a structural copy of
ComfyUI's module (runtime/engine/shadow.py), never the module itself.
"""
from .apply.apply_plan import PLACERS, place_objects
from .patchers.patcher_devices import (
    PatcherDevices,
    check_executable,
    needs_engine,
    patcher_devices_for,
)

__all__ = ["PLACERS", "place_objects", "PatcherDevices", "check_executable", "needs_engine",
           "patcher_devices_for"]
