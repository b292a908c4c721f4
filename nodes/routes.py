"""The pack's HTTP route: `GET /placement/devices`, the inventory the editor's device
pickers offer (registered on ComfyUI's PromptServer route table, nothing patched).

JSON: {"source", "devices": [{name, kind, total_bytes, free_bytes, description,
simulated}], "runtime": [choices], "params": [choices], "notice": "" or the line saying
ComfyUI hides GPUs of this machine (runtime/comfy/visible_devices.py)}. `?simulate=cuda0=24GiB,...`
answers for hardware this machine lacks (as the CLI's --simulate); without it, the
inventory the nodes plan for (node_inventory: --cpu, COMFYUI_PLACEMENT_SIMULATE).
"""
import logging

from ..placement.devices import Inventory
from ..placement.errors import PlacementError
from ..runtime.comfy.visible_devices import hidden_gpus_note
from .common import node_inventory

log = logging.getLogger("comfyui-placement")
ROUTE = "/placement/devices"


def devices_payload(inventory: Inventory) -> dict:
    """What a picker offers: each device, `auto`, and for GPUs every split a&b (in the
    inventory's order); params also `disk`. The strings are the grammar's own."""
    data = inventory.to_dict()
    names = [d["name"] for d in data["devices"]]
    gpus = [d["name"] for d in data["devices"] if d["kind"] != "cpu"]
    splits = ["&".join(gpus[i:j]) for i in range(len(gpus))
              for j in range(i + 2, len(gpus) + 1)]
    data["runtime"] = ["auto"] + names + splits
    data["params"] = ["auto"] + names + ["disk"]
    data["notice"] = hidden_gpus_note()
    return data


async def get_devices(request):
    from aiohttp import web
    simulate = request.rel_url.query.get("simulate", "").strip()
    try:
        inventory = Inventory.simulated(simulate) if simulate else node_inventory()
    except PlacementError as exc:
        return web.json_response({"error": f"placement error: {exc}"}, status=400)
    return web.json_response(devices_payload(inventory))


def register() -> bool:
    """Add the route to the running server's table (before ComfyUI builds its app).
    False where there is no server (headless drivers, scripts)."""
    try:
        from server import PromptServer
    except ImportError:
        return False
    instance = getattr(PromptServer, "instance", None)
    routes = getattr(instance, "routes", None)
    if routes is None:
        return False
    routes.get(ROUTE)(get_devices)
    return True
