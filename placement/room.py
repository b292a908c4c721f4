"""A device's room: the bytes a plan may fill there with everything it places, resident
weights, stream ring and working memory alike.

One rule for every plan, explicit or auto-fit, and for the runtime's ledger, so what
was planned is what the run may hold: the budget (`max_vram`) capped by the free memory
(the host's budget stands as given: RAM is not measured per device), or the free memory
when no budget is set, less one margin that stays free inside it.

The margin is the slack nobody counts: a real accelerator's allocator rounding and
fragmentation, and memory other code takes between the plan and the run. It is seed
002's 512 MiB ("free minus 512 MiB"), but never more than a sixteenth of the memory it
is kept inside: a 4 GiB budget keeps 256 MiB, a simulated 8 MiB device 512 KiB (the
share keeps small devices usable, and tests on tiny simulated devices honest). A
--simulate entry may set its own (`cuda0=24GiB@margin=0`). The host's RAM is budgeted
apart (auto-fit's host margin), so its margin here is 0.
"""
from typing import Optional

from .units import MiB

MARGIN = 512 * MiB


def margin_for(device, accelerator_margin: int = MARGIN, budget: Optional[int] = None) -> int:
    """The margin of a placement.devices.Device (or anything with kind, free_bytes and
    margin_bytes) under `budget` (None: none set). `accelerator_margin`: the most an
    accelerator keeps (auto-fit's budget_margin option may change it)."""
    given = getattr(device, "margin_bytes", None)
    if given is not None:
        return int(given)
    if device.kind == "cpu":
        return 0
    cap = int(device.free_bytes) if budget is None else min(int(budget), int(device.free_bytes))
    return max(0, min(int(accelerator_margin), cap // 16))


def device_room(budget: Optional[int], free: int, margin: int = 0, host: bool = False) -> int:
    """Bytes a plan may fill on one device: weights, ring and working memory."""
    if host:
        return max(0, int(free if budget is None else budget) - int(margin))
    cap = int(free) if budget is None else min(int(budget), int(free))
    return max(0, cap - int(margin))
