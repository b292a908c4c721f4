"""Placed copies of ComfyUI's model objects, one function per type.

Every function returns a new object and a list of notes; the object it was given
(a cached node output that other nodes share) is left exactly as it was.
Only supported mechanisms are used: clones/copies, the patcher's load/offload
devices, and the device attributes each wrapper reads at run time.
"""
import copy
from typing import List, Tuple

import comfy.controlnet
import comfy.model_management

from ....placement.errors import PlacementError
from ..patchers.patcher_devices import PatcherDevices
from ..patchers.retarget import retarget
from ..sampling.control_hops import hop_residuals

CopyAndNotes = Tuple[object, List[str]]      # (the placed copy, notes for the plan shown)


def place_model(model, devices: PatcherDevices) -> CopyAndNotes:
    """MODEL (a ModelPatcher around the diffusion model)."""
    placed, notes = retarget(model, devices, "diffusion")
    if placed.load_device != model.load_device:
        # The loader chose the weight dtype for its device; compute in one the new
        # device supports (as core's Select Model Device does).
        cast = comfy.model_management.unet_manual_cast(placed.model_dtype(), placed.load_device)
        if cast is not None:
            placed.set_model_compute_dtype(cast)
            notes.append(f"diffusion: computes in {str(cast).replace('torch.', '')} "
                         f"on {devices.runtime}")
    return placed, notes


def place_clip(clip, devices: PatcherDevices) -> CopyAndNotes:
    """CLIP (text encoders): CLIP.encode reads its patcher's load_device."""
    placed = clip.clone()
    placed.patcher, notes = retarget(clip.patcher, devices, "te")
    placed.cond_stage_model = placed.patcher.model   # differs when the patcher was rebuilt
    return placed, notes


def place_vae(vae, devices: PatcherDevices) -> CopyAndNotes:
    """VAE: core has no VAE.clone(); copy the wrapper, retarget its patcher, and keep the
    wrapper's own `device` (where it sends latents) in step with the patcher."""
    placed = copy.copy(vae)
    placed.patcher, notes = retarget(vae.patcher, devices, "vae")
    placed.first_stage_model = placed.patcher.model
    placed.device = devices.load_device
    return placed, notes


def place_controlnet(control, devices: PatcherDevices,
                     diffusion_runtime: str) -> CopyAndNotes:
    """CONTROL_NET: ComfyUI calls it from the sampler with the latent on the diffusion
    model's device; on another device its residuals hop (control_hops.py)."""
    apart = devices.runtime != diffusion_runtime
    default = comfy.model_management.get_torch_device()
    if isinstance(control, comfy.controlnet.ControlLora):
        # Built at each sampling run on ComfyUI's default device and freed afterwards.
        if devices.load_device != default or apart:
            raise PlacementError(
                f"controlnet: ComfyUI's ControlLora is always built on its default device "
                f"({default}) for each run, beside the diffusion model; it cannot run on "
                f"{devices.runtime}" + (f" while diffusion runs on {diffusion_runtime}"
                                        if apart else ""))
        return control.copy(), [f"controlnet: ControlLora is built on {default} for each "
                                f"run and freed after it (params follow ComfyUI)"]
    placed = control.copy()
    if isinstance(control, comfy.controlnet.ControlNet):     # and its subclasses
        placed.control_model_wrapped, notes = retarget(control.control_model_wrapped, devices,
                                                       "controlnet")
        placed.control_model = placed.control_model_wrapped.model
        placed.load_device = devices.load_device
        if apart:
            notes.append(hop_residuals(placed, devices.runtime, diffusion_runtime))
        return placed, notes
    if isinstance(control, comfy.controlnet.T2IAdapter):     # no patcher
        if apart:
            raise PlacementError(
                f"controlnet (T2I adapter) on {devices.runtime} while diffusion runs on "
                f"{diffusion_runtime}: its residuals do not hop yet; put controlnet on "
                f"{diffusion_runtime}")
        if devices.offload_device.type != "cpu":
            raise PlacementError(
                f"controlnet (T2I adapter): ComfyUI moves its weights back to the cpu after "
                f"each use, so params {devices.params} cannot be kept; use params cpu")
        placed.device = devices.load_device
        return placed, []
    raise PlacementError(f"controlnet: unknown control type {type(control).__name__}; "
                         f"supported: ControlNet (and subclasses), ControlLora, T2IAdapter")


def place_clip_vision(clip_vision, devices: PatcherDevices) -> CopyAndNotes:
    """CLIP_VISION: encode_image reads its own load_device and loads its patcher."""
    placed = copy.copy(clip_vision)
    placed.patcher, notes = retarget(clip_vision.patcher, devices, "clip_vision")
    placed.model = placed.patcher.model
    placed.load_device = devices.load_device
    return placed, notes


def place_upscale_model(upscale_model, devices: PatcherDevices) -> CopyAndNotes:
    """UPSCALE_MODEL: core's upscale node computes on `upscale_model.patcher.load_device`."""
    patcher = getattr(upscale_model, "patcher", None)
    if patcher is None:
        raise PlacementError("upscaler: this upscale model has no ComfyUI patcher; load it "
                             "with core's Load Upscale Model node")
    placed = copy.copy(upscale_model)
    placed.patcher, notes = retarget(patcher, devices, "upscaler")
    if placed.patcher.model is not patcher.model:
        raise PlacementError("upscaler: its patcher was rebuilt, which spandrel models "
                             "cannot follow; run ComfyUI with --disable-dynamic-vram")
    return placed, notes


def place_photomaker(photomaker, devices: PatcherDevices) -> CopyAndNotes:
    """PHOTOMAKER: core's PhotoMaker encoder has no patcher; it computes on its
    `load_device` and casts its weights there per layer from wherever they rest."""
    resting = {p.device for p in photomaker.parameters()}
    if resting and resting != {devices.offload_device}:
        have = ", ".join(sorted(str(d) for d in resting))
        raise PlacementError(
            f"photomaker: its weights rest on {have} and ComfyUI's PhotoMaker model has no "
            f"patcher to move them; use params {have.replace(':', '')}")
    placed = copy.copy(photomaker)           # shares weights; own load_device attribute
    placed.load_device = devices.load_device
    return placed, []


def place_detectors(detectors, devices: PatcherDevices) -> CopyAndNotes:
    """BBOX_DETECTOR / SEGM_DETECTOR (Impact Pack; core has no detector type): the model
    moves to the runtime device for each detection and back to its params device
    (runtime/engine/detector.py); the given detectors are not changed."""
    if not detectors.modules():
        raise PlacementError("detector: the connected detector holds no torch model (an "
                             "Impact Pack detector keeps it in bbox_model); connect the "
                             "provider's BBOX_DETECTOR or SEGM_DETECTOR")
    return detectors.placed(devices.load_device, devices.offload_device), []
