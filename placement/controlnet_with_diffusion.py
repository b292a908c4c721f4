"""A ControlNet runs where the diffusion model runs (inside ComfyUI).

ComfyUI adds a ControlNet's residuals inside the diffusion model's forward (a UNet's
input, middle and output blocks, a DiT's blocks), on the device of the activation they
are added to. A ControlNet on another device than the diffusion model would need its
residuals to hop devices at every step, and a diffusion model split over devices would
need each residual on its block's device: the ComfyUI adapter does neither yet
(runtime/comfy/components.py place_controlnet refuses it as it loads). So the planner
keeps the two together: an explicit plan that separates them is refused by `plan()` in
one line, and auto-fit, when its search separated them, fits again with the ControlNet
on the diffusion model's device (a split diffusion model: on one device).
"""
from typing import Optional

from .errors import PlacementError


def _both(plan):
    cn, dm = plan.components.get("controlnet"), plan.components.get("diffusion")
    if cn is None or dm is None or not (cn.present and dm.present):
        return None
    return cn, dm


def apart(plan) -> Optional[str]:
    """One line saying why the plan's ControlNet cannot run beside its diffusion model,
    or None where it can (or either is absent)."""
    both = _both(plan)
    if both is None:
        return None
    cn, dm = both
    if list(cn.runtime) == list(dm.runtime) and len(dm.runtime) == 1:
        return None
    where = "&".join(dm.runtime)
    if len(dm.runtime) > 1:
        return (f"controlnet with diffusion split over {where}: ComfyUI adds ControlNet "
                f"residuals inside each block, which would have to hop to the block's "
                f"device, which the pack does not do yet; run diffusion on one device "
                f"with the controlnet (backend diffusion=DEV,controlnet=DEV)")
    return (f"controlnet on {'&'.join(cn.runtime)} while diffusion runs on {where}: "
            f"ComfyUI adds ControlNet residuals inside the diffusion model's forward, so "
            f"they would have to hop devices every step, which the pack does not do yet; "
            f"put controlnet on {where}")


def check(plan) -> None:
    why = apart(plan)
    if why is not None:
        raise PlacementError(why)


def together(plan, refit) -> object:
    """An auto-fit plan with its ControlNet on the diffusion model's device: `plan`
    where it already is, else `refit(device)`, the fit made again with both pinned to
    one device: the diffusion model's main device, else the cpu (where the ControlNet
    cannot run on that device: a simulated GPU inside ComfyUI); the first device's
    PlacementError says why neither fits."""
    if apart(plan) is None:
        return plan
    first = plan.components["diffusion"].main_device
    failed = None
    for device in dict.fromkeys([first, "cpu"]):
        try:
            fitted = refit(device)
        except PlacementError as exc:
            failed = failed or exc
            continue
        check(fitted)
        fitted.warnings.append(f"controlnet: fitted on {device} with the diffusion model "
                               f"(ComfyUI adds its residuals inside the diffusion model's "
                               f"forward)")
        return fitted
    raise failed
