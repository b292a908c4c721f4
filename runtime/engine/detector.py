"""A detector placed for its calls (stable-diffusion.cpp's `detector` module, ADetailer).

A detector is an object that calls its own torch module: the Impact Pack's BBOX_DETECTOR
and SEGM_DETECTOR keep an ultralytics YOLO in `bbox_model` and call it as
`bbox_model(image, conf=..., device="")`. The pack does not run that forward, so the
detector is placed whole: for each call its weights move to the runtime device and the
call is told that device; afterwards they go back to where the plan rests them.
Streaming, disk or a split would need the pack to run the forward (the capabilities
table offers none of them for the detector inside ComfyUI).
"""
import copy
from typing import Optional

import torch

from ...placement.errors import PlacementError


def detector_module(obj) -> Optional[torch.nn.Module]:
    """The torch module a detector holds: Impact's `bbox_model`, or the object itself."""
    if isinstance(obj, torch.nn.Module):
        return obj
    module = getattr(obj, "bbox_model", None)
    return module if isinstance(module, torch.nn.Module) else None


def _to(value, device: torch.device):
    return value.to(device) if isinstance(value, torch.Tensor) else value


class PlacedModel:
    """Calls `module` on `runtime`; between calls its weights rest on `params`."""

    def __init__(self, module: torch.nn.Module, runtime: torch.device,
                 params: torch.device):
        self.module, self.runtime, self.params = module, runtime, params
        self.calls = 0

    def __call__(self, *args, **kwargs):
        module = self.module
        # ultralytics fixes its device when its predictor is built (the first call); one
        # built for another device would feed inputs there, so it is built again here
        predictor = getattr(module, "predictor", None)
        if predictor is not None and getattr(predictor, "device", self.runtime) != self.runtime:
            module.predictor = None
        module.to(self.runtime)
        if "device" in kwargs:               # ultralytics' own device argument
            kwargs["device"] = self.runtime
        try:
            self.calls += 1
            return module(*(_to(a, self.runtime) for a in args),
                          **{k: _to(v, self.runtime) for k, v in kwargs.items()})
        finally:
            if self.params != self.runtime:
                module.to(self.params)

    def __getattr__(self, name):             # names, task, ... read through to the model
        return getattr(self.module, name)


def place_detector(detector, runtime: torch.device, params: torch.device):
    """A copy of `detector` whose model computes on `runtime` and rests on `params`; the
    given object is not changed (the copy shares its weights)."""
    module = detector_module(detector)
    if module is None:
        raise PlacementError(f"detector: {type(detector).__name__} holds no torch module "
                             f"(an Impact Pack detector keeps it in bbox_model)")
    if detector is module:
        return PlacedModel(module, runtime, params)
    placed = copy.copy(detector)
    placed.bbox_model = PlacedModel(module, runtime, params)
    return placed


class Detectors:
    """What one Apply Placement is given as the `detector` component: an Impact Pack
    BBOX_DETECTOR and/or SEGM_DETECTOR (one provider's pair wraps one model). Objects
    holding no model (Impact's NO_SEGM_DETECTOR) pass through unplaced."""

    def __init__(self, bbox=None, segm=None):
        self.bbox, self.segm = bbox, segm

    def modules(self):
        """The distinct torch modules, each once."""
        out = []
        for obj in (self.bbox, self.segm):
            module = detector_module(obj) if obj is not None else None
            if module is not None and all(module is not m for m in out):
                out.append(module)
        return out

    def placed(self, runtime: torch.device, params: torch.device) -> "Detectors":
        def one(obj):
            if obj is None or detector_module(obj) is None:
                return obj
            return place_detector(obj, runtime, params)
        return Detectors(one(self.bbox), one(self.segm))


__all__ = ["Detectors", "PlacedModel", "detector_module", "place_detector"]
