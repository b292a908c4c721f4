"""Placement Devices: the inventory the other nodes plan for, shown in the node."""
from comfy_api.latest import io, ui

from ..runtime.comfy.visible_devices import hidden_gpus_note
from .common import CATEGORY, SEARCH_ALIASES, node_inventory


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
            inputs=[],
            outputs=[io.String.Output("devices", tooltip="name<TAB>description, one per line")],
            is_output_node=True,
        )

    @classmethod
    def fingerprint_inputs(cls):
        # Cached while the hardware is the same (names, kinds, sizes): an unchanged
        # workflow queued again executes nothing. Free memory, live, is what the device
        # picker reads (GET /placement/devices).
        inventory = node_inventory()
        return inventory.source + "|" + hidden_gpus_note() + "|" + ",".join(
            f"{d.name}:{d.kind}:{d.total_bytes}" for d in inventory.devices)

    @classmethod
    def execute(cls) -> io.NodeOutput:
        inventory = node_inventory()
        text = "\n".join(inventory.lines())
        shown = f"{inventory.source}\n{text}"
        note = hidden_gpus_note()
        if note:
            shown += f"\n\n{note}"
        return io.NodeOutput(text, ui=ui.PreviewText(shown))
