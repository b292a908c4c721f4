"""Placement Devices: the inventory the other nodes plan for, shown in the node."""
from comfy_api.latest import io, ui

from ..placement.errors import PlacementError
from ..placement.remote_devices import parse_workers
from ..runtime.comfy.patchers.visible_devices import hidden_gpus_note
from .common import CATEGORY, SEARCH_ALIASES, node_inventory, workers_inventory

WORKERS_TIP = ("Also list the devices of these worker machines (ALIAS=HOST:PORT, comma "
               "separated; the same text as Backend Assignment's workers input), or why a "
               "worker cannot be joined. The secret comes from COMFYUI_PLACEMENT_SECRET.")


class PlacementDevices(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id="PlacementDevices",
            display_name="Placement Devices",
            category=CATEGORY,
            search_aliases=SEARCH_ALIASES + ["list devices", "inventory"],
            description="Lists the GPUs and CPU that placement, offload and multi-GPU "
                        "splits can use on this machine (name, kind, total and free "
                        "memory: VRAM for GPUs), measured when the hardware changes. The names are "
                        "the ones Backend Assignment accepts.",
            inputs=[io.String.Input("workers", default="", optional=True,
                                    tooltip=WORKERS_TIP)],
            outputs=[io.String.Output("devices", tooltip="name<TAB>description, one per line")],
            is_output_node=True,
        )

    @classmethod
    async def validate_inputs(cls, workers=""):
        """A workers text that is not ALIAS=HOST:PORT entries is a node error when the
        prompt is queued (an unreachable worker is not: the node lists why)."""
        text = workers.strip() if isinstance(workers, str) else ""
        try:
            if text:
                parse_workers(text)
        except PlacementError as exc:
            return f"placement error in workers: {exc}"
        return True

    @classmethod
    def fingerprint_inputs(cls, workers=""):
        # Cached while the hardware is the same (names, kinds, sizes; the workers' too):
        # an unchanged workflow queued again executes nothing. Free memory, live, is what
        # the device picker reads (GET /placement/devices).
        inventory, joined = workers_inventory(node_inventory(), workers, False)
        return inventory.source + "|" + hidden_gpus_note() + "|" + ",".join(
            f"{d.name}:{d.kind}:{d.total_bytes}" for d in inventory.devices) + "|" + \
            "|".join(joined.lines() if joined else [])

    @classmethod
    def execute(cls, workers="") -> io.NodeOutput:
        inventory, joined = workers_inventory(node_inventory(), workers, False)
        text = "\n".join(inventory.lines())
        shown = f"{inventory.source}\n{text}"
        if joined:
            shown += "\n\n" + "\n".join(joined.lines())
        note = hidden_gpus_note()
        if note:
            shown += f"\n\n{note}"
        return io.NodeOutput(text, ui=ui.PreviewText(shown))
