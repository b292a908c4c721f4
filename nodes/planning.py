"""Planning from inside ComfyUI: the pack's plan() fed with the loaded objects.

Apply Placement plans every connected component together (auto-fit must see the whole
set). Each is described from its torch module (names, shapes and dtypes only, no
weights read), so the plan knows its blocks; an object the metadata reader cannot
describe is still planned, by its size alone.
"""
from typing import Dict, Optional

from ..placement.errors import PlacementError
from ..placement.metadata import ComponentInfo, describe_component
from ..placement.resolve import plan as resolve_plan

# Plans made here run inside ComfyUI: auto-fit proposes only what the adapter executes
# (placement/capabilities.py), explicit requests it cannot run are errors at queue time.
EXECUTOR = "comfyui"


def make_plan(spec, inventory, objects: Optional[Dict[str, object]] = None,
              strict: bool = False):
    infos = {comp: describe_object(comp, obj) for comp, obj in (objects or {}).items()
             if obj is not None}
    return resolve_plan(spec, inventory, components=infos or None, strict=strict,
                        executor=EXECUTOR)


def torch_module(obj):
    """The nn.Module holding a ComfyUI object's weights."""
    patcher = getattr(obj, "patcher", None) or getattr(obj, "control_model_wrapped", None)
    if patcher is None and hasattr(obj, "model_size") and hasattr(obj, "model"):
        patcher = obj                                   # MODEL is the patcher itself
    module = getattr(patcher, "model", None) if patcher is not None else obj
    # a diffusion BaseModel keeps the network (whose keys name the blocks) inside
    return getattr(module, "diffusion_model", module)


def describe_object(component: str, obj) -> ComponentInfo:
    module = torch_module(obj)
    label = f"comfy:{type(obj).__name__}"
    try:
        return describe_component(component, [module])
    except PlacementError as exc:
        return ComponentInfo(component, module_bytes(module), sources=(label,),
                             warnings=(f"{component}: described by size only ({exc})",))


def module_bytes(module) -> int:
    if not hasattr(module, "parameters"):
        return 0
    return sum(p.numel() * p.element_size() for p in module.parameters())
