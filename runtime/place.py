"""place(): run a module under one component's plan, and restore it exactly after.

    with place(module, plan, "diffusion", inventory) as placed:
        out = module(x)
    placed.stats()   # {"devices": {"cuda0": {"peak_bytes", "h2d_bytes", ...}}, "hops", "hop_bytes"}

Modes, from the ComponentPlan:
- params on the runtime device: every weight resident on it.
- params cpu/disk, no stream: every weight copied to the device for the placement (the
  phase) and dropped after, like stable-diffusion.cpp's offload.
- params cpu/disk with stream: non-block weights and the first K blocks resident, the
  rest streamed through a byte ring sized by placement/layout.py (runtime/engine/stream.py).
`Placed` (one_device.py) is the one-stage case of the staged block engine (stages.py, whose
many-stage case is the layer split); entering, loading, release, restore and stats are
runtime/engine/core.py's, shared by every engine.
The module's tensors keep their identity: only `.data` is rebound, and put back on
exit, also when the forward raised (a simulated out-of-memory, an interrupt).
"""
from torch import nn

from ..placement.remote_devices import is_remote
from .engine.one_device import Placed
from .placed import PlacedEngine


def place(module: nn.Module, plan, component: str, inventory, **options) -> PlacedEngine:
    """Options: blocks (names in execution order), weights_file (path, for params=disk),
    key_map (module tensor name -> file key, callable or dict), link (simdevice.Link for
    simulated devices), max_pinned_bytes (cap on pinned host memory), host_store
    (hoststore.HostStore: streamed blocks' packed host copies kept across placements)
    and repoint (with host_store: points the caller's tensors into pageable packed
    copies, e.g. shadow.Shadow.repoint; without a store the module's own tensors are).
    A plan whose runtime lists several devices runs on a split engine (runtime/split,
    more options there); one that names worker devices (w1.cuda0) runs their ranges
    there and the rest here (runtime/distributed/planned.py; cluster= needed)."""
    comp = plan.components.get(component)
    if comp is not None and any(is_remote(d) for d in comp.runtime):   # w1.cuda0: a worker
        from .distributed.planned import RemoteStages
        return RemoteStages(module, plan, component, inventory, **options)
    if comp is not None and comp.parallel == "batch":     # whole on each device (parallel/)
        from .parallel import place_batch
        return place_batch(module, plan, component, inventory, **options)
    if comp is not None and comp.is_split:
        from .split import place_split
        return place_split(module, plan, component, inventory, **options)
    return Placed(module, plan, component, inventory, **options)


__all__ = ["place", "Placed", "PlacedEngine"]
