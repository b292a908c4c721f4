"""The devices a worker offers its main process: the ones it detects, or with
`--simulate cuda0=8GiB,...` a simulated inventory (a diagnostic, like the main side's
COMFYUI_PLACEMENT_SIMULATE: plan and test a worker GPU this machine lacks). A range on a
simulated device computes on this machine's cpu, and ranges past the device's capacity
are refused as the GPU's memory would refuse them (never computed anyway)."""
from typing import Optional

from ...placement.devices import Inventory
from ...placement.errors import PlacementError
from ...placement.units import format_bytes


class OfferedDevices:
    def __init__(self, simulate: Optional[str] = None):
        self.simulated = Inventory.simulated(simulate) if simulate else None

    def hello(self) -> list:
        """The device list the worker's hello reports."""
        if self.simulated is None:
            devices = Inventory.detect().devices
        else:
            devices = self.simulated.devices
        # a simulated entry's what-if speeds (cuda0=8GiB@165T) go along: the main's
        # auto-fit prices the worker's range with them
        return [{"name": d.name, "kind": d.kind, "total_bytes": d.total_bytes,
                 "free_bytes": d.free_bytes, "description": d.description,
                 "simulated": bool(d.simulated), "throughput": d.throughput,
                 "bandwidth": d.bandwidth} for d in devices]

    def load_request(self, request: dict) -> dict:
        """The request as the loader runs it: a simulated device's range on the cpu."""
        if self.simulated is None:
            return request
        name = str(request.get("device", "cpu"))
        self.simulated.get(name)                 # an unknown device: the inventory's error
        return dict(request, device="cpu")

    def admit(self, name: str, held_bytes: int, new_bytes: int) -> None:
        """A simulated device holding `held_bytes` once a range is loaded (its
        `new_bytes` among them): past the capacity, refuse the range."""
        if self.simulated is None:
            return
        capacity = self.simulated.get(name).total_bytes
        if held_bytes > capacity:
            free = capacity - (held_bytes - new_bytes)
            raise PlacementError(f"out of memory on simulated {name}: the range needs "
                                 f"{format_bytes(new_bytes)}, {format_bytes(max(free, 0))} "
                                 f"of {format_bytes(capacity)} free")
