"""A ControlNet and the diffusion model it steers (inside ComfyUI).

ComfyUI adds a ControlNet's residuals inside the diffusion model's forward (a UNet's
input, middle and output blocks, a DiT's blocks). A ControlNet on another device than
the diffusion model's main device computes there and its residuals hop to the
diffusion model's device at every model call (runtime/comfy/sampling/control_hops.py); inside a
layer split, a residual added on another device of the split follows its activation.

The residuals all rest on the diffusion model's main device while its forward runs, so
a plan that puts the two apart reserves them there, in the diffusion model's working
memory: the ControlNet's own working memory, which bounds what it returns. Auto-fit
prefers them together (no hop per step): where its search put them apart, it fits
again with both on the diffusion model's device; where that does not fit, it keeps
them apart if the diffusion model's device has room for the residuals (a GPU for the
diffusion model and hops beat both on the cpu), else both on the cpu.
"""
import dataclasses
from typing import Optional

from .errors import PlacementError
from .units import format_bytes


# the arch a ControlNet is described with when it computes with the diffusion model's
# own modules (Qwen-Image Fun: its embedders; nodes/planning.py names it): it runs on the
# diffusion model's device or is refused
WITH_DIFFUSION_WEIGHTS = "controlnet_with_diffusion_weights"


def hopless(infos) -> bool:
    cn = infos.get("controlnet")
    return cn is not None and getattr(cn, "arch", "") == WITH_DIFFUSION_WEIGHTS


def _both(plan):
    cn, dm = plan.components.get("controlnet"), plan.components.get("diffusion")
    if cn is None or dm is None or not (cn.present and dm.present):
        return None
    return cn, dm


def apart(plan) -> Optional[str]:
    """'controlnet on X while diffusion runs on Y' where they are apart, else None."""
    both = _both(plan)
    if both is None:
        return None
    cn, dm = both
    if cn.main_device == dm.main_device and not cn.is_split:
        return None
    return f"controlnet on {'&'.join(cn.runtime)} while diffusion runs on {'&'.join(dm.runtime)}"


def residual_bytes(infos) -> int:
    """What the residuals may take on the diffusion model's device: the ControlNet's
    working memory (0 where it is not known: the run measures it then)."""
    from .explicit import working_memory
    return working_memory(infos.get("controlnet")) or 0


def will_be_apart(choices, default: str) -> bool:
    """Whether an explicit request puts the ControlNet on another device than the
    diffusion model's main device (either left to the default device counts as there)."""
    cn, dm = choices.get("controlnet"), choices.get("diffusion")
    cn_at = (cn.runtime if cn is not None and cn.runtime else [default])
    dm_at = (dm.runtime if dm is not None and dm.runtime else [default])
    return cn_at[0] != dm_at[0] or len(cn_at) > 1


def with_residuals(infos, choices, default: str):
    """`infos` with the residuals added to the diffusion model's working memory on its
    main device, where an explicit request puts the ControlNet elsewhere (unchanged
    otherwise): the plan then keeps the budget with them, or refuses in one line."""
    dm = infos.get("diffusion")
    if dm is None or not will_be_apart(choices, default):
        return infos
    if hopless(infos):
        raise PlacementError(
            f"controlnet apart from the diffusion model (on {_main(choices, default)}): "
            f"this ControlNet computes with the diffusion model's own embedders, so it "
            f"runs on the diffusion model's device; put controlnet there")
    extra = residual_bytes(infos)
    if not extra or dm.headroom_bytes is None:
        return infos
    return dict(infos, diffusion=_plus(dm, extra, _main(choices, default)))


def _main(choices, default: str) -> str:
    dm = choices.get("diffusion")
    return (dm.runtime if dm is not None and dm.runtime else [default])[0]


def _plus(info, extra: int, main: str):
    per = tuple((d, b + extra if d == main else b) for d, b in info.headroom_per_device)
    return dataclasses.replace(
        info, headroom_bytes=info.headroom_bytes + extra, headroom_per_device=per,
        headroom_basis=f"{info.headroom_basis}; plus the ControlNet's residuals "
                       f"({format_bytes(extra)}), which hop to {main}")


def note(plan) -> None:
    """Say in the plan's warnings that the residuals hop (a cost per step)."""
    where = apart(plan)
    if where is not None:
        plan.warnings.append(f"{where}: its residuals hop to the diffusion model's device "
                             f"at every model call (runtime/comfy/sampling/control_hops.py)")


def together(plan, refit, infos=None) -> object:
    """An auto-fit plan that runs its ControlNet on the diffusion model's device where
    that fits: `plan` where it already does, else `refit(device)` (the fit made again
    with both pinned to `device`) on the diffusion model's main device; else `plan`
    itself, apart, where the diffusion model's device has room for the residuals; else
    both on the cpu; else the first refit's PlacementError."""
    if apart(plan) is None:
        return plan
    first = plan.components["diffusion"].main_device
    try:
        return _pinned_together(refit, first)
    except PlacementError as exc:
        failed = exc
    if not hopless(infos or {}) and _room_for_residuals(plan, infos or {}):
        note(plan)
        return plan
    if first != "cpu":
        try:
            return _pinned_together(refit, "cpu")
        except PlacementError:
            pass
    raise failed


def _pinned_together(refit, device: str):
    fitted = refit(device)
    if apart(fitted) is not None:
        raise PlacementError(f"controlnet: auto-fit could not keep it on {device} with the "
                             f"diffusion model")
    fitted.warnings.append(f"controlnet: fitted on {device} with the diffusion model "
                           f"(ComfyUI adds its residuals inside the diffusion model's "
                           f"forward; together, they do not hop)")
    return fitted


def _room_for_residuals(plan, infos) -> bool:
    dm = plan.components["diffusion"]
    extra = residual_bytes(infos)
    dev = next((d for d in plan.devices if d.name == dm.main_device), None)
    if dev is None or dev.room_bytes - dev.planned_bytes < extra:
        return False
    if extra and dm.headroom_bytes is not None:
        main = dm.main_device
        if dm.headroom_per_device:
            dm.headroom_per_device[main] = dm.headroom_on(main) + extra
        dm.headroom_bytes += extra
        dev.planned_bytes += extra
        dm.reasons.append(f"working memory on {main} includes the ControlNet's residuals "
                          f"({format_bytes(extra)}), which hop here at every model call")
    return True
