"""The pack's HTTP route: `GET /placement/devices`, the inventory the editor's device
pickers offer (registered on ComfyUI's PromptServer route table, nothing patched).

JSON: {"source", "devices": [{name, kind, total_bytes, free_bytes, description,
simulated}], "runtime": [choices], "params": [choices], "notice": "" or the line saying
ComfyUI hides GPUs of this machine (runtime/comfy/patchers/visible_devices.py), "workers": [one
line per worker: joined with its devices, or why not]}. `?simulate=cuda0=24GiB,...`
answers for hardware this machine lacks (as the CLI's --simulate); without it, the
inventory the nodes plan for (node_inventory: --cpu, COMFYUI_PLACEMENT_SIMULATE).
`?workers=w1=HOST:PORT,...` (a Backend Assignment's workers input) adds each reachable
worker's devices (w1.cuda0), joined once while ComfyUI runs (runtime/distributed/pool.py).
"""
import asyncio
import logging

from ..placement.devices import Inventory
from ..placement.errors import PlacementError
from ..placement.remote_devices import is_remote
from ..runtime.comfy.patchers.visible_devices import hidden_gpus_note
from .common import node_inventory, workers_inventory

log = logging.getLogger("comfyui-placement")
ROUTE = "/placement/devices"


def devices_payload(inventory: Inventory, workers=None) -> dict:
    """What a picker offers: each device, `auto`, and for GPUs every split a&b (in the
    inventory's order); params also `disk`. The strings are the grammar's own."""
    data = inventory.to_dict()
    names = [d["name"] for d in data["devices"]]
    local = [n for n in names if not is_remote(n)]
    gpus = [d["name"] for d in data["devices"] if d["kind"] != "cpu" and not
            is_remote(d["name"])]
    splits = ["&".join(gpus[i:j]) for i in range(len(gpus))
              for j in range(i + 2, len(gpus) + 1)]
    # a worker's device takes a range beside a local main device (the first one named)
    remote = [n for n in names if is_remote(n)]
    splits += [f"{main}&{r}" for main in (gpus or [n for n in local if n == "cpu"])
               for r in remote]
    data["runtime"] = ["auto"] + local + splits
    data["params"] = ["auto"] + local + ["disk"]
    data["notice"] = hidden_gpus_note()
    data["workers"] = list(workers.lines()) if workers else []
    return data


async def get_devices(request):
    from aiohttp import web
    simulate = request.rel_url.query.get("simulate", "").strip()
    named = request.rel_url.query.get("workers", "").strip()
    try:
        inventory = Inventory.simulated(simulate) if simulate else node_inventory()
        # joining may wait on the network: off the server's event loop
        inventory, workers = await asyncio.get_running_loop().run_in_executor(
            None, workers_inventory, inventory, named, False)
    except PlacementError as exc:
        return web.json_response({"error": f"placement error: {exc}"}, status=400)
    return web.json_response(devices_payload(inventory, workers))


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
