"""One device as the runtime sees it: its transfer queue and the component's ledger.

A placement opens one Target per device it uses (a split engine opens several);
device memory is allocated only through `alloc`, so the ledger always knows what is
held. Kinds: a simulated accelerator (inventory Device.simulated), a real CUDA device
(torch_device 'cuda:N'), or the host itself ('cpu', for streaming from disk into RAM).
"""
from typing import Callable, Optional

import torch

from ...placement.errors import PlacementError
from ...placement.room import device_room, margin_for
from .ledger import Ledger
from .simdevice import Link, SimTransfer
from .transfer import CudaTransfer, Ticket



class Target:
    def __init__(self, name: str, transfer, capacity: int, simulated: bool):
        self.name = name
        self.transfer = transfer
        self.device: torch.device = transfer.device
        self.ledger = Ledger(name, capacity)
        self.simulated = simulated
        self.is_cuda = self.device.type == "cuda"

    def alloc(self, nbytes: int, category: str, what: str) -> torch.Tensor:
        self.ledger.reserve(category, nbytes, what)
        try:
            return self.transfer.alloc(nbytes)
        except BaseException:
            self.ledger.release(category, nbytes)
            raise

    def free(self, nbytes: int, category: str) -> None:
        self.ledger.release(category, nbytes)

    def copy(self, dst: torch.Tensor, src: torch.Tensor, read=None, after=None) -> Ticket:
        self.ledger.count_h2d(dst.numel())
        return self.transfer.submit(dst, src, read, after)

    def close(self) -> None:
        self.transfer.close()


def open_target(device, budget_bytes: Optional[int], margin_bytes: Optional[int] = None,
                link: Optional[Link] = None,
                held_bytes: Callable[[torch.device], int] = lambda d: 0) -> Target:
    """`device` is a placement.devices.Device. Capacity: its room (placement/room.py)
    from the plan's budget and margin (None: the device's own margin) and the device's
    free memory, measured again now on a real device (plus what `held_bytes(torch
    device)` says the component already holds there)."""
    margin = margin_for(device, budget=budget_bytes) if margin_bytes is None \
        else int(margin_bytes)
    host = device.kind == "cpu" and not device.simulated
    if device.simulated:
        capacity = device_room(budget_bytes, device.free_bytes, margin)
        return Target(device.name, SimTransfer(device.name, link or Link()), capacity, True)
    torch_device = device.torch_device or ""
    if torch_device == "cpu":
        capacity = device_room(budget_bytes, device.free_bytes, margin, host=host)
        return Target(device.name, SimTransfer(device.name, Link(bandwidth=None),
                                               reads_into_dst=True), capacity, False)
    if torch_device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise PlacementError(f"device {device.name} ({torch_device}) is not available to "
                                 f"torch here; use a simulated inventory to plan for it")
        dev = torch.device(torch_device)
        free, _total = torch.cuda.mem_get_info(dev)
        capacity = device_room(budget_bytes, free + held_bytes(dev), margin)
        return Target(device.name, CudaTransfer(torch_device), capacity, False)
    raise PlacementError(f"device {device.name} ({torch_device or 'no torch device'}) is not "
                         f"supported by the streaming runtime; supported: simulated devices, "
                         f"cuda devices, cpu")
