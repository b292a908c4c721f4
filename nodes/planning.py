"""Planning from inside ComfyUI: the lead's plan() with the sizes of loaded objects."""
from typing import Dict

from ..placement.errors import PlacementError
from ..placement.metadata.info import ComponentInfo
from ..placement.resolve import plan as resolve_plan


def make_plan(spec, inventory, objects: Dict[str, object] = None, strict: bool = False):
    """Plan `spec`; `objects` ({component: ComfyUI object}) fills in sizes and marks which
    components are loaded. auto_fit needs the planner of issue 3."""
    infos = {comp: ComponentInfo(comp, object_bytes(obj), sources=(f"comfy:{type(obj).__name__}",))
             for comp, obj in (objects or {}).items() if obj is not None}
    if spec.auto_fit:
        try:
            from ..placement import fit  # noqa: F401
        except ImportError:
            raise PlacementError("auto_fit needs the auto-fit planner (issue 3), not built "
                                 "yet; turn auto_fit off") from None
    try:
        return resolve_plan(spec, inventory, components=infos or None, strict=strict)
    except ImportError:
        # placement.metadata cannot describe components yet: plan without their sizes
        return resolve_plan(spec, inventory, components=None, strict=strict)


def object_bytes(obj) -> int:
    """Weight bytes of a ComfyUI object through its patcher (no weights are read)."""
    patcher = getattr(obj, "patcher", None) or getattr(obj, "control_model_wrapped", None)
    if patcher is None and hasattr(obj, "model_size"):
        patcher = obj
    if patcher is not None and hasattr(patcher, "model_size"):
        return int(patcher.model_size())
    if hasattr(obj, "parameters"):
        return sum(p.numel() * p.element_size() for p in obj.parameters())
    return 0
