"""How LoRA patches apply to each component: fused into the weights on the compute
device when they are loaded (fast per step), or at runtime on each block as it arrives
(never baked into the resting copy: streamed, disk, split or quantized weights).

Modes (seed 003/004): `auto` picks runtime when the weights are streamed, rest on disk,
are split or quantized, and fuse otherwise; `fuse` and `runtime` force one. Fusing is
refused where it would have to write into weights that are re-read from their resting
place every step.
"""
from .errors import PlacementError


def runtime_reasons(cp, info) -> list:
    why = []
    if cp.stream is not None:
        why.append("streamed")
    if cp.params == "disk":
        why.append("params on disk")
    if cp.is_split:
        why.append("batch parallel: a copy per device" if cp.parallel == "batch"
                   else f"{cp.split_mode} split")
    if info is not None and getattr(info, "quant", None):
        why.append(f"quantized ({info.quant})")
    return why


def decide_lora(plan, infos, mode: str) -> None:
    """Set ComponentPlan.lora for every component, with the reason, in place."""
    for name, cp in plan.components.items():
        why = runtime_reasons(cp, infos.get(name))
        if mode == "fuse" and why:
            if not cp.present:
                cp.lora = "runtime"
                continue
            raise PlacementError(f"lora_mode fuse cannot apply to {name}: its weights are "
                                 f"{', '.join(why)}, so a fused LoRA would have to be baked "
                                 f"into the resting copy; use lora_mode auto or runtime")
        cp.lora = "runtime" if mode == "runtime" or why else "fuse"
        if cp.present:
            cp.reasons.append(f"LoRA {cp.lora}" + (f" ({', '.join(why)})" if why and
                                                   mode == "auto" else f" (lora_mode {mode})"))
