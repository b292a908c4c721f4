"""comfyui-placement: where every part of a diffusion pipeline runs and rests.

ComfyUI loads this file as a custom node pack; outside ComfyUI the same tree is the
`comfyui_placement` package (planner, runtime, CLI). Nodes are exported only when
ComfyUI's API is importable, so the package works without ComfyUI.
"""
WEB_DIRECTORY = "./web"

__all__ = ["COMPONENTS", "Inventory", "Plan", "PlacementError", "PlacementSpec", "plan",
           "place", "WEB_DIRECTORY"]


def place(module, plan, component, inventory, **options):
    """Run `module` under `plan` (runtime/ needs torch, so it is imported on use)."""
    from .runtime.place import place as _place
    return _place(module, plan, component, inventory, **options)


if not __package__:
    # Imported as a plain file, not as a package: pytest does this to a repository root
    # that holds __init__.py when the folder's name is no identifier (the README's own
    # `comfyui-placement`). There is nothing to export then: the package is
    # `comfyui_placement` (pip install -e .) or the custom node ComfyUI names itself.
    __all__ = []
else:
    from .placement import (COMPONENTS, Inventory, Plan, PlacementError,  # noqa: F401
                            PlacementSpec, plan)

    def __getattr__(name):
        """The nodes load when ComfyUI's loader asks for `comfy_entrypoint`, not when the
        package is imported: `python -m comfyui_placement ...` started from ComfyUI's
        folder (comfy_api importable) must not import ComfyUI's model management, which
        fails on a machine without a GPU."""
        if name == "comfy_entrypoint":
            try:
                import comfy_api.latest  # noqa: F401
            except ImportError:
                raise AttributeError(name) from None
            from .nodes import comfy_entrypoint
            return comfy_entrypoint
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
