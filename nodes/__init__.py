"""The pack's V3 nodes (comfy_api.latest). Imported only when ComfyUI is present."""
import logging

from typing_extensions import override

from comfy_api.latest import ComfyExtension, io

from .apply_node import ApplyPlacement
from .assignment_node import BackendAssignment
from .common import simulated_note
from .devices_node import PlacementDevices
from .prompt_inputs import register as _register_prompt_inputs
from .report_node import PlacementReport
from .routes import register as _register_routes

NODES = [PlacementDevices, BackendAssignment, ApplyPlacement, PlacementReport]


class PlacementExtension(ComfyExtension):
    @override
    async def get_node_list(self) -> list[type[io.ComfyNode]]:
        return list(NODES)


async def comfy_entrypoint() -> PlacementExtension:
    _register_routes()
    _register_prompt_inputs()
    note = simulated_note()
    if note:
        logging.getLogger("comfyui-placement").warning("placement: %s", note)
    return PlacementExtension()


__all__ = ["NODES", "PlacementExtension", "comfy_entrypoint"]
