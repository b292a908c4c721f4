"""The simulated device refuses what a GPU refuses: computing with a weight that rests
off its compute device.

On a simulated device, device memory is host memory, so a weight whose block never
arrived (its hooks never fired: a container whose forward is never called) would still
compute, on its resting host copy, and the run would succeed where a GPU raises a device
mismatch (or, under ComfyUI's cast path, copies it silently and uncounted). While a
placed forward runs on a simulated device, a dispatch mode watches every operation: one
that reads a weight's resting host storage raises `DeviceMismatch`, naming the weight.

A module holding tensor subclasses (ComfyUI-GGUF's GGMLTensor) runs unchecked: its own
code builds tensors through the legacy constructor, which a dispatch mode breaks; the
placement's stats say so (`device_check`).

What may touch a resting weight: views (no data read), `copy_` (the pack's own packing
and transfers, whose destination is a device buffer or a host copy) and the `*_like`
factories (shape only). Everything else is compute. The watched storages are the resting
copies of the tensors the engine moved (resident groups and streamed blocks), taken when
the placement loads; weights the plan leaves in place are not watched.

The mode is per thread (torch keeps dispatch modes in thread-local state): each thread
that runs a placed forward enters it (`ForwardCheck.enter`/`leave`, nested safely), in
the engine's wrapper around the module's forward (a pipelined split's share threads run
that wrapper too).
"""
import threading
from typing import Dict, Iterable, Optional, Tuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..placement.errors import PlacementError
from .workmeter import WorkMeter, input_keys, storage_key

aten = torch.ops.aten
_ALLOWED = {aten.copy_.default, aten.empty_like.default, aten.zeros_like.default,
            aten.ones_like.default, aten.full_like.default, aten.detach.default,
            aten.lift_fresh.default, aten.set_.source_Storage_storage_offset,
            aten.set_.source_Tensor, aten.set_.source_Storage,
            aten._has_compatible_shallow_copy_type.default, aten.is_pinned.default,
            aten.is_same_size.default}


class DeviceMismatch(PlacementError):
    """A computation read a weight resting off its compute device (a GPU would refuse)."""


class _Mode(TorchDispatchMode):
    def __init__(self, check: "ForwardCheck"):
        super().__init__()
        self.check = check

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        check = self.check
        watched, meter = check.watched, check.meter
        if not watched and meter is None:
            return func(*args, **kwargs)
        keys = input_keys(args, kwargs)
        if watched and func not in _ALLOWED and not func.is_view:
            for key in keys:
                hit = watched.get(key)
                if hit is not None:
                    check.refuse(hit, func)
        out = func(*args, **kwargs)
        if meter is not None:
            meter.produced(out, keys)
        return out


class ForwardCheck:
    """The watch of one placement: which host storages hold its resting weights, and the
    per-thread mode its forwards run under."""

    def __init__(self, component: str, device: str):
        self.component = component
        self.device = device
        # storage data_ptr -> name of a weight resting there; the engine keeps the
        # resting tensors alive while placed, so a pointer cannot be reused meanwhile
        self.watched: Dict[int, str] = {}
        self.off_because: Optional[str] = None
        self.meter = None               # workmeter.WorkMeter: the working memory measured
        self._local = threading.local()

    def watch(self, resting: Iterable[Tuple[str, torch.Tensor]]) -> None:
        """(weight name, resting tensor) for every weight the placement moved."""
        watched = {}
        for name, t in resting:
            if t is None or t.is_meta or t.device.type != "cpu":
                continue
            if type(t) not in (torch.Tensor, torch.nn.Parameter):
                # ComfyUI-GGUF's GGMLTensor: its own code rebuilds tensors through the
                # legacy constructor, which a dispatch mode breaks; no check for them
                self.off_because = f"{name} is a {type(t).__name__} (a tensor subclass)"
                self.watched = {}
                if self.meter is not None:      # unmetered: the ledgers estimate again
                    for ledger in self.meter.ledgers:
                        ledger.metered = False
                    self.meter = None
                return
            ptr = storage_key(t)
            if ptr:
                watched.setdefault(ptr, name)
        self.watched = watched

    def refuse(self, name: str, func) -> None:
        raise DeviceMismatch(
            f"{self.component}: {name} was read by {func} while it rests in host memory, "
            f"not on {self.device}; a GPU would refuse this (device mismatch): the block "
            f"holding it never arrived, so something runs it without the hooks the "
            f"placement put on its blocks")

    def enter(self) -> None:
        depth = getattr(self._local, "depth", 0)
        if self.off_because is not None:
            return
        if depth == 0:
            mode = _Mode(self)
            mode.__enter__()
            self._local.mode = mode
        self._local.depth = depth + 1

    def leave(self) -> None:
        depth = getattr(self._local, "depth", 0)
        if depth == 0:
            return
        self._local.depth = depth - 1
        if depth == 1:
            mode, self._local.mode = self._local.mode, None
            mode.__exit__(None, None, None)

    def close(self) -> None:
        """At teardown: nothing is watched any more. A mode still entered is left by the
        forward that entered it (popping it here, maybe inside another inference-mode
        guard, would leave torch's dispatch keys out of step with its mode stack)."""
        self.watched = {}
        if self.meter is not None:
            self.meter.forget()

    @property
    def active(self) -> bool:
        return getattr(self._local, "depth", 0) > 0


def forward_check(component: str, targets) -> Optional[ForwardCheck]:
    """A check for a placement with a simulated device among its targets, else None.
    Where every target is simulated, it meters their working memory too."""
    sim = [t.name for t in targets if t.simulated]
    if not sim:
        return None
    check = ForwardCheck(component, "&".join(sim))
    if len(sim) == len(targets):
        check.meter = WorkMeter([t.ledger for t in targets])
        for t in targets:
            t.ledger.metered = True
    return check
