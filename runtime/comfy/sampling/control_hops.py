"""A ControlNet on another device than the diffusion model: its residuals hop.

ComfyUI calls a ControlNet from the sampler (`get_control`, once per model call) with the
latent on the diffusion model's device, and adds the residuals it returns inside the
diffusion model's forward. A ControlNet that runs elsewhere (a small GPU keeps the
diffusion model, the ControlNet computes on the cpu or a second GPU) gets its inputs
brought to its device and gives its residuals back on the caller's: both hops happen
around the control model's own call, so ComfyUI's ControlNet code (hint scaling, VAE
encoding, strength, chaining of several ControlNets) runs unchanged on the ControlNet's
device. A residual that is added inside a layer-split diffusion model on another
device than the main one follows its activation as any join does (runtime/blocks/crossings.py).

The placed ControlNet (a copy) holds a `HoppingControlModel` in place of its control
model: a proxy that forwards every attribute to the real module and moves tensors on
the call. ComfyUI's own `ControlNet.copy()` (which Apply ControlNet calls) carries it,
since it copies the `control_model` reference. The real module, the given ControlNet
and its patcher are never changed.

One kind cannot hop: Qwen-Image's Fun ControlNet computes with the diffusion model's
own embedders (`base_model.img_in`, ...), whose weights rest on the diffusion model's
device; it is refused in one line apart from it.
"""
import threading
from typing import Callable

import torch

from ....placement.errors import PlacementError


def _moved(value, to: Callable[[torch.Tensor], torch.Tensor]):
    """`value` with every tensor inside (lists, tuples, dicts, nested) passed through `to`."""
    if isinstance(value, torch.Tensor):
        return to(value)
    if isinstance(value, dict):
        return {k: _moved(v, to) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        out = [_moved(v, to) for v in value]
        return out if isinstance(value, list) else type(value)(out)
    return value


def _first_tensor(args, kwargs):
    for v in list(args) + list(kwargs.values()):
        if isinstance(v, torch.Tensor):
            return v
    return None


class HopCounter:
    """Copies and bytes the hops made (both ways), for the placement's notes and stats."""

    def __init__(self):
        self._lock = threading.Lock()
        self.copies = 0
        self.bytes = 0

    def count(self, t: torch.Tensor) -> None:
        with self._lock:
            self.copies += 1
            self.bytes += t.numel() * t.element_size()


class HoppingControlModel:
    """The control model of a ControlNet placed on `device`, called from anywhere: tensor
    arguments are brought to `device`, tensor results go back to the device of the
    first tensor argument (the latent the sampler passed)."""

    def __init__(self, inner: torch.nn.Module, device: torch.device, counter: HopCounter):
        object.__setattr__(self, "_inner", inner)
        object.__setattr__(self, "_device", torch.device(device))
        object.__setattr__(self, "hops", counter)

    def _to(self, device: torch.device):
        def move(t: torch.Tensor) -> torch.Tensor:
            if t.device == device:
                return t
            self.hops.count(t)
            return t.to(device)
        return move

    def __call__(self, *args, **kwargs):
        first = _first_tensor(args, kwargs)
        caller = first.device if first is not None else self._device
        there = self._to(self._device)
        out = self._inner(*_moved(args, there), **_moved(kwargs, there))
        return _moved(out, self._to(caller))

    # every other attribute is the real module's (dtype, x_embedder, double_y_emb, ...)
    def __getattr__(self, name):
        return getattr(self._inner, name)

    def __setattr__(self, name, value):
        setattr(self._inner, name, value)

    def __repr__(self):
        return f"HoppingControlModel({type(self._inner).__name__} on {self._device})"


def uses_diffusion_weights(control) -> bool:
    """A ControlNet that computes with the diffusion model's own modules (Qwen-Image Fun:
    `extra_args['base_model']` at pre_run)."""
    import comfy.controlnet
    return isinstance(control, getattr(comfy.controlnet, "QwenFunControlNet", ()))


def hop_residuals(placed, runtime: str, diffusion_runtime: str) -> str:
    """Make the placed ControlNet copy (`placed.control_model` on `placed.load_device`)
    callable with the diffusion model's latent on `diffusion_runtime`; the note says so."""
    if uses_diffusion_weights(placed):
        raise PlacementError(
            f"controlnet on {runtime} while diffusion runs on {diffusion_runtime}: this "
            f"ControlNet ({type(placed).__name__}) computes with the diffusion model's own "
            f"embedders, which rest there; put controlnet on {diffusion_runtime}")
    counter = HopCounter()
    placed.control_model = HoppingControlModel(placed.control_model, placed.load_device,
                                               counter)
    return (f"controlnet: runs on {runtime}; its inputs hop there and its residuals hop "
            f"to {diffusion_runtime} at each model call")
