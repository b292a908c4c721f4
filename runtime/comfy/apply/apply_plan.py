"""Apply a Plan to the ComfyUI objects of one workflow.

`place_objects(plan, inventory, {component: object})` returns placed copies (the
given objects are untouched) and the notes to show next to the plan. Nothing is
placed unless everything can be: errors are raised before any copy is returned.
A plan ComfyUI's patcher cannot express (streaming, disk, split, simulated devices) is
run by the pack's engine (engine_model.py for the diffusion model, engine_calls.py for the
VAE and text encoders); the rest goes through ComfyUI's own patchers.
"""
from typing import Dict, List, Tuple

from ....placement.errors import PlacementError
from ..patchers.patcher_devices import check_executable, needs_engine, patcher_devices_for
from .placed_copies import (
    place_clip,
    place_clip_vision,
    place_controlnet,
    place_detectors,
    place_model,
    place_photomaker,
    place_upscale_model,
    place_vae,
)

# component -> (ComfyUI io type it arrives as, placing function)
PLACERS = {
    "diffusion": ("MODEL", place_model),
    "te": ("CLIP", place_clip),
    "vae": ("VAE", place_vae),
    "controlnet": ("CONTROL_NET", place_controlnet),
    "clip_vision": ("CLIP_VISION", place_clip_vision),
    "upscaler": ("UPSCALE_MODEL", place_upscale_model),
    "photomaker": ("PHOTOMAKER", place_photomaker),
    # runtime/detector.Detectors: Impact Pack's BBOX_DETECTOR and SEGM_DETECTOR inputs
    "detector": ("BBOX_DETECTOR", place_detectors),
}


def _engine_model():
    from ..sampling.engine_model import place_model_with_engine
    return place_model_with_engine


def _engine_vae():
    from .engine_calls import place_vae_with_engine
    return place_vae_with_engine


def _engine_clip():
    from .engine_calls import place_clip_with_engine
    return place_clip_with_engine


# component -> the engine placer (imported when used: it loads the runtime)
ENGINE_PLACERS = {"diffusion": _engine_model, "vae": _engine_vae, "te": _engine_clip}


def place_objects(plan, inventory, objects: Dict[str, object],
                  workers=None) -> Tuple[Dict[str, object], List[str]]:
    """`workers` (runtime/distributed/pool.Workers): the joined workers a plan naming
    worker devices (w1.cuda0) runs its diffusion ranges on."""
    placed: Dict[str, object] = {}
    notes: List[str] = []
    for component, obj in objects.items():
        if obj is None:
            continue
        if component not in PLACERS:
            raise PlacementError(f"no ComfyUI placer for component {component!r}; "
                                 f"placers: {', '.join(PLACERS)}")
        cp = plan.components[component]
        check_executable(cp, inventory)
        if needs_engine(cp, inventory):
            extra = {"workers": workers} if component == "diffusion" else {}
            out, more = ENGINE_PLACERS[component]()(obj, plan, inventory, **extra)
            placed[component] = out
            notes.extend(more + _tiles(component, cp, out))
            continue
        devices = patcher_devices_for(plan, component, inventory)
        place = PLACERS[component][1]
        if component == "controlnet":
            out, more = place(obj, devices, plan.components["diffusion"].main_device)
        else:
            out, more = place(obj, devices)
        placed[component] = out
        notes.append(devices.describe())
        notes.extend(more + _tiles(component, cp, out))
    return placed, notes


def _tiles(component, cp, placed) -> List[str]:
    """A VAE the plan decodes in tiles (vae_tiles.py)."""
    if component != "vae" or not getattr(cp, "tile", None):
        return []
    from .vae_tiles import decode_in_tiles
    return decode_in_tiles(placed, cp.tile, getattr(cp, "tile_frames", None))
