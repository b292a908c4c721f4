"""comfyui-placement: where every part of a diffusion pipeline runs and rests.

ComfyUI loads this file as a custom node pack; outside ComfyUI the same tree is the
`comfyui_placement` package (planner, runtime, CLI). Nodes are exported only when
ComfyUI's API is importable, so the package works without ComfyUI.
"""
from .placement import (COMPONENTS, Inventory, Plan, PlacementError, PlacementSpec,  # noqa: F401
                        plan)

WEB_DIRECTORY = "./web"

__all__ = ["COMPONENTS", "Inventory", "Plan", "PlacementError", "PlacementSpec", "plan",
           "place", "WEB_DIRECTORY"]


def place(module, plan, component, inventory, **options):
    """Run `module` under `plan` (runtime/ needs torch, so it is imported on use)."""
    from .runtime.place import place as _place
    return _place(module, plan, component, inventory, **options)


try:  # ComfyUI present: expose the V3 extension
    import comfy_api.latest  # noqa: F401
except ImportError:
    pass
else:
    from .nodes import comfy_entrypoint  # noqa: F401
