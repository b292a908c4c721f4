"""The simulated device refuses what a GPU refuses: computing with a weight that rests
off its compute device, or with operands on two devices.

On a simulated device, device memory is host memory, so a weight whose block never
arrived (its hooks never fired: a container whose forward is never called) would still
compute, on its resting host copy, and the run would succeed where a GPU raises a device
mismatch (or, under ComfyUI's cast path, copies it silently and uncounted). While a
placed forward runs on a simulated device, a dispatch mode watches every operation: one
that reads a weight's resting host storage raises `DeviceMismatch`, naming the weight.

In a split (two or more devices, one of them simulated) every tensor is host memory too,
so an operation mixing a tensor of one device with one of another (a skip connection the
module's own code keeps, computed on cuda0 and added on cuda1) would compute where a GPU
raises "Expected all tensors to be on the same device". Each operand is located, in this
order: the device a hop or a block's output tagged it with (moves.py); the device whose
buffer holds it (a resident group's or a stream ring's storage, `home`); the device the
working-memory meter saw compute its storage; else the main device (a forward input, the
module's own code). 0-dim tensors mix freely, as CPU scalars do on CUDA; so does what
may touch a resting weight (below: `copy_` is how hops and loads move data). Operands on
two devices raise `DeviceMismatch` naming both; an operation's outputs are on its
operands' device, where the meter charges them. In a split over the real host and a
simulated device (`cuda0&cpu`) the meter only locates (the host's memory is not metered).

Tensor subclasses (ComfyUI-GGUF's GGMLTensor) are checked and metered like any tensor:
each op runs with subclass wrapping off, as without the mode, and a subclass is watched
through its storage (subclass_check.py); one without a storage turns the check off, and
the placement's stats say so (`device_check`).

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
from typing import Dict, Iterable, List, Optional, Tuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from ...placement.errors import PlacementError
from .subclass_check import plain_call, watch_key
from .subclass_check import storage_key
from .workmeter import Tally, WorkMeter, input_keys

aten = torch.ops.aten
_ALLOWED = {aten.copy_.default, aten.empty_like.default, aten.zeros_like.default,
            aten.ones_like.default, aten.full_like.default, aten.detach.default,
            aten.lift_fresh.default, aten.set_.source_Storage_storage_offset,
            aten.set_.source_Tensor, aten.set_.source_Storage,
            aten._has_compatible_shallow_copy_type.default, aten.is_pinned.default,
            aten.is_same_size.default}


class DeviceMismatch(PlacementError):
    """A computation read a weight resting off its compute device, or operands on two
    devices (a GPU would refuse)."""


class _Mode(TorchDispatchMode):
    def __init__(self, check: "ForwardCheck"):
        super().__init__()
        self.check = check

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        check = self.check
        watched, meter = check.watched, check.meter
        if not watched and meter is None:
            return plain_call(func, args, kwargs)
        free = func in _ALLOWED or func.is_view
        if not check.operands:
            keys = input_keys(args, kwargs)
        else:
            tensors = [a for a in tree_flatten((args, kwargs))[0]
                       if isinstance(a, torch.Tensor)]
            listed = [storage_key(t) for t in tensors]
            keys = set(listed)
        if watched and not free:
            for key in keys:
                hit = watched.get(key)
                if hit is not None:
                    check.refuse(hit, func)
        # a resting weight is refused above (it names the weight); then the operands
        device = None if free or not check.operands else \
            check.operand_device(func, tensors, listed)
        out = plain_call(func, args, kwargs)
        if meter is not None:
            meter.produced(out, keys, device)
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
        # a split's operand check: device names by index, the mover's tag attribute, and
        # storage key -> device index of every device buffer holding weights
        self.operands = False
        self.names: List[str] = []
        self.tag: Optional[str] = None
        self.homes: Dict[int, int] = {}
        self.mover = None               # moves.Mover whose locate is this meter's
        self._local = threading.local()

    def watch(self, resting: Iterable[Tuple[str, torch.Tensor]]) -> None:
        """(weight name, resting tensor) for every weight the placement moved."""
        watched = {}
        for name, t in resting:
            if t is None or t.is_meta or t.device.type != "cpu":
                continue
            ptr, why = watch_key(name, t)      # a subclass: its storage (subclass_check)
            if why is not None:
                self.off_because = why
                self.watched = {}
                if self.meter is not None:      # unmetered: the ledgers estimate again
                    for ledger in self.meter.ledgers:
                        ledger.metered = False
                    self.meter = None
                if self.mover is not None:      # tags alone locate activations again
                    self.mover.locate = self.mover.relocate = None
                return
            if ptr:
                watched.setdefault(ptr, name)
        self.watched = watched

    def home(self, buffers: Iterable[Tuple[int, torch.Tensor]]) -> None:
        """(device index, buffer) of every device buffer holding weights now (resident
        groups, stream rings); replaces the previous set (empty: unloaded)."""
        self.homes = {storage_key(buf): d for d, buf in buffers}
        self.homes.pop(0, None)

    def operand_device(self, func, tensors, keys) -> Optional[int]:
        """The device index all of an operation's located operands are on (None: no
        operand to locate); operands on two devices raise DeviceMismatch."""
        tag, homes = self.tag, self.homes
        meter = self.meter
        if meter is not None:
            meter.settle()              # a freed storage's address may be in use again
            owner = meter._owner
        else:
            owner = {}
        first = seen = None
        for t, key in zip(tensors, keys):
            if not key or t.dim() == 0 or t.device.type != "cpu":
                continue                # scalars mix freely; meta/empty: no storage
            d = getattr(t, tag, None) if tag is not None else None
            if d is None:
                d = homes.get(key)
                if d is None:
                    hit = owner.get(key)
                    if hit is None:
                        # neither moved nor computed here (a forward input, a model's own
                        # .to(x.device) that is no copy on a simulated device): unlocated,
                        # rather than guessed onto the main device
                        continue
                    d = hit[0]
            if first is None:
                first, seen = d, t
            elif d != first:
                self.mismatch(func, seen, first, t, d)
        return first

    def mismatch(self, func, a: torch.Tensor, da: int, b: torch.Tensor, db: int) -> None:
        names = self.names
        raise DeviceMismatch(
            f"{self.component}: {func} found operands on two devices, {names[da]} and "
            f"{names[db]} ({tuple(a.shape)} on {names[da]}, {tuple(b.shape)} on "
            f"{names[db]}); a GPU refuses this (expected all tensors to be on the same "
            f"device): a tensor computed on one device is used on another without crossing "
            f"(a skip connection kept by the module's own code must be brought over)")

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
        self.homes = {}
        if self.meter is not None:
            self.meter.forget()

    @property
    def active(self) -> bool:
        return getattr(self._local, "depth", 0) > 0


def forward_check(component: str, targets, mover=None) -> Optional[ForwardCheck]:
    """A check for a placement with a simulated device among its targets, else None.
    Where every target is simulated, it meters their working memory too; a split's
    check also locates every operand (with a meter that only locates where the split
    includes the real host), and its mover locates activations with the meter."""
    sim = [t.name for t in targets if t.simulated]
    if not sim:
        return None
    check = ForwardCheck(component, "&".join(sim))
    if len(sim) == len(targets):
        check.meter = WorkMeter([t.ledger for t in targets])
        for t in targets:
            t.ledger.metered = True
    elif len(targets) > 1:
        check.meter = WorkMeter([Tally() for _ in targets])
    if len(targets) > 1:
        check.operands = True
        check.names = [t.name for t in targets]
        if mover is not None and mover.simulated:
            check.tag, check.mover = mover.tag, mover
            mover.locate = check.meter.device_of
            mover.relocate = check.meter.relocate
    return check
