"""`Engine`, what every engine class builds on. One device (one_device.py) is the
one-stage case of the staged block engine (stages.py), whose many-stage case is the layer
split (split/layer.py); the row split (split/row.py) shares everything here and shards
Linear weights instead.

What lives here, once:
- entering and leaving: capture the module's tensors and their resting values, open one
  Target per runtime device, prepare (the subclass: groups, ranges, streamers), load,
  attach hooks; leaving detaches, unloads, closes the targets and puts every tensor back
  through restore.put_back (the one restore path), also after an error, raising the
  first error only (faults.teardown_after);
- device memory of the resident groups: allocated through each Target's ledger and
  filled in one place (`_fill`): from the group's packed host copy in one copy, from the
  weights file (several reads in flight), or packed from the module's resting tensors.
  `release()` gives the device memory back and packs each resident group that rests in
  host memory into one host buffer, so the reload is one copy per group;
- host memory: one `HostStore` of packed host copies (hoststore.py; the caller's when it
  keeps one across runs, else the placement's own), whose buffers come from one
  `PinnedPool` (exact-size pinned buffers within a cap on CUDA, else pageable);
- stats.
Where a streamed block arrives is runtime/engine/stream.py (`Streamer.arrive`).
"""
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch
from torch import nn

from ...placement.errors import PlacementError
from ..blocks.hops import DEFAULT_HOP_LINK
from ..blocks.module_tensors import key_mapper, module_tensors
from ..blocks.moves import Mover
from ..device.simcheck import forward_check
from ..device.simdevice import Link
from ..device.target import open_target
from ..host.hoststore import HostStore
from ..host.residency import Group, PinnedPool, default_pinned_cap, give_back_freed_host_memory
from ..measure.first_call import size_from_first_call
from ..weights.diskfill import fill_from_file
from .fallbacks import Fallbacks
from .faults import teardown_after
from .forward_override import ForwardOverride
from .restore import put_back


def headroom_for(option: Union[None, int, Dict[str, int]], device: str) -> int:
    if option is None:
        return 0
    if isinstance(option, dict):
        return int(option.get(device, 0))
    return int(option)


def _pageable(nbytes: int):
    return torch.empty(nbytes, dtype=torch.uint8), False


def plan_budget(plan, name: str) -> Tuple[Optional[int], Optional[int]]:
    """(budget, margin) the plan gives `name` (placement/room.py); (None, None): the plan
    has no such device (its own free memory and margin then)."""
    for d in plan.devices:
        if d.name == name:
            return d.budget_bytes, d.margin_bytes
    return None, None


class Engine:
    """Subclasses give `_prepare(by_id)` (fill `self.resident`, `self.streamers`) and
    `_attach()` (hooks), and may add `_after_load`, `_free_extra`, `_more_stats`."""
    mode = "engine"

    def __init__(self, module: nn.Module, plan, component: str, inventory, *,
                 blocks: Optional[Sequence] = None, link: Optional[Link] = None,
                 hop_link: Optional[Link] = None,
                 headroom_bytes: Union[None, int, Dict[str, int]] = None,
                 max_pinned_bytes: Optional[int] = None, weights_file: Optional[str] = None,
                 key_map: Union[None, Dict[str, str], Callable[[str], str]] = None,
                 lora=None, host_store=None, repoint: Optional[Callable] = None,
                 skip_blocks: Optional[Sequence[str]] = None, device_check: bool = True,
                 rehearse: bool = True):
        self.module = module
        # size the placement from its first call, rehearsed on the meta device at its
        # real shapes, before any weight moves (engines that can: `_rehearses`); the
        # ComfyUI adapter rehearses its first model call itself and plans from it
        self.rehearse = rehearse
        self._armed = None                 # the first call's hook handle while armed
        self.rehearsed: Optional[List[int]] = None    # working bytes per device, rehearsed
        # the simulated device's check (simcheck.py); benchmarks turn it off, since its
        # per-operation dispatch would count as compute on both sides of their ratios
        self.device_check = device_check
        # blocks another runtime owns (a worker's range, distributed/planned.py): their
        # tensors are left alone, neither grouped nor restored here
        self.skip_prefixes = tuple(f"{n}." for n in (skip_blocks or ()))
        self.component = component
        self.fallbacks = Fallbacks(component)   # what ran instead of the plan (stats)
        self.cplan = self._component_plan(plan, component)
        self.runtime = list(self.cplan.runtime)
        self.devices = [inventory.get(n) for n in self.runtime]
        self.budgets = [plan_budget(plan, n) for n in self.runtime]
        self.block_names = None if blocks is None else [getattr(b, "name", b) for b in blocks]
        self.link = link
        self.hop_link = hop_link or DEFAULT_HOP_LINK
        self.headroom_option = headroom_bytes
        self.max_pinned_bytes = max_pinned_bytes
        self.weights_file = weights_file
        self.key_map = key_mapper(key_map)
        self.lora = lora
        self.host_store = host_store        # the caller's HostStore, kept across runs
        # the one store of packed host copies: the caller's, or this placement's own
        self.store = host_store if host_store is not None else HostStore()
        self.repoint = repoint              # shadow.Shadow.repoint (with host_store)
        self.file = None
        self.targets: List = []
        self.mover: Optional[Mover] = None
        self.check = None                   # simcheck.ForwardCheck on a simulated device
        self.cuda_devices: List[torch.device] = []
        self.events = None                  # units.BlockEvents (the staged engine's)
        self._own_forward = None            # the forward the guard wraps (_guard_forward)
        self.pool: Optional[PinnedPool] = None
        # every tensor of the module: id -> (tensor, device it was on), and its resting
        # value (its own data, or a view of the packed host copy that holds it once)
        self.originals: Dict[int, tuple] = {}
        self.rest: Dict[int, torch.Tensor] = {}
        self.resident: List[List[Group]] = []     # per device: groups held while placed
        self.resident_bufs: List[tuple] = []      # (device index, group, device buffer)
        self.resident_host: Dict[int, torch.Tensor] = {}   # id(group): packed host copy
        self.disk_layouts: Dict[int, object] = {}          # id(group): DiskLayout (disk)
        self.streamers: List = []
        self.in_place_bytes = 0             # weights already where the plan wants them
        self.host_pack_bytes = 0
        self.loaded = False
        self.forwards = 0
        self.hops = 0
        self._handles: List = []
        self._final_stats = None

    @staticmethod
    def _component_plan(plan, component: str):
        comp = plan.components.get(component)
        if comp is None:
            raise PlacementError(f"plan has no component {component!r}; it has: "
                                 f"{', '.join(plan.components) or 'none'}")
        if not comp.runtime:
            raise PlacementError(f"{component}: plan gives no runtime device")
        return comp

    @property
    def resident_groups(self) -> List[Group]:
        return [g for groups in self.resident for g in groups]

    # -- context ------------------------------------------------------------------------
    _rehearses = False      # the staged engines size themselves from a rehearsed first call

    def __enter__(self):
        try:
            by_id = self._capture()
            self._open_targets(by_id)
            self._prepare(by_id)            # the plan checked, the layout made: no copy yet
            if self._defers():
                self._arm(by_id)
                return self
            self._load()
            self._attach()
        except BaseException as exc:
            teardown_after(self._teardown, exc)
            raise
        return self

    def _defers(self) -> bool:
        """Whether to wait for the first call: it is rehearsed on the meta device, and the
        resident prefix or ranges are sized from it before any weight moves."""
        return self.rehearse and self._rehearses and \
            not any(t.is_meta for t in self.rest.values())

    def _arm(self, by_id) -> None:
        """Everything but the weights is ready; the first call prepares, loads and
        attaches (the forward guard now: a call reads the module's forward before its
        pre-hooks run)."""
        self._check_capacity()
        self._guard_forward()
        self._armed_by_id = by_id
        self._armed = self.module.register_forward_pre_hook(
            self._first_call, with_kwargs=True, prepend=True)

    def _check_capacity(self) -> None:
        """What the load will allocate fits each device, checked at entry as the load
        itself would (the same error): a placement too big fails before its first call."""
        from ..device.ledger import out_of_memory
        for d, t in enumerate(self.targets):
            held = self.in_place_bytes if d == 0 else 0
            parts = [(g.nbytes, f"resident {g.name}") for g in self.resident[d]] + \
                [(s.ring_bytes, "stream ring") for s in self.streamers if s.target is t]
            for nbytes, what in parts:
                if held + nbytes > t.ledger.capacity:
                    raise out_of_memory(t.name, nbytes, held, t.ledger.capacity, what)
                held += nbytes

    def _first_call(self, module, args, kwargs):
        self._armed.remove()
        self._armed = None
        by_id, self._armed_by_id = self._armed_by_id, None
        self.first_call_grad = torch.is_grad_enabled()   # before inference_mode(False) below
        # device buffers and host packs must be normal tensors the copy worker can
        # write, also under a caller's inference mode
        with torch.inference_mode(False):
            if size_from_first_call(self, args, kwargs):
                self._prepare_again(by_id)  # the prefix or ranges sized for it
            self._load()
        self._attach()
        # this call's pre-hooks were taken before the ones just attached: the root's
        # runs here (its post-hook is read after the forward, so it runs as usual)
        return self._root_pre(module, args, kwargs)

    def __exit__(self, exc_type, exc, tb) -> bool:
        teardown_after(self._teardown, exc)
        return False

    def _capture(self) -> Dict[int, list]:
        by_id = module_tensors(self.module)
        if self.skip_prefixes:
            by_id = {i: (t, names) for i, (t, names) in by_id.items()
                     if not all(n.startswith(self.skip_prefixes) for n in names)}
        self.by_name: Dict[str, torch.Tensor] = {n: t for t, names in by_id.values()
                                                 for n in names}
        self.originals = {i: (t, t.device) for i, (t, _) in by_id.items()}
        self.rest = {i: t.data for i, (t, _) in by_id.items()}
        return by_id

    def _check_not_meta(self) -> None:
        if self.cplan.params != "disk" and any(d.is_meta for d in self.rest.values()):
            raise PlacementError(f"{self.component}: the module's weights are on the meta "
                                 f"device; use params=disk with the model file")

    def _open_targets(self, by_id) -> None:
        def held(dev):                      # weights of this module already on the device
            return sum(t.numel() * t.element_size() for t, _ in by_id.values()
                       if t.device == dev)
        for dev, (budget, margin) in zip(self.devices, self.budgets):
            self.targets.append(open_target(dev, budget, margin, self.link, held))
        option = self.headroom_option
        if option is None and self.cplan.headroom_bytes is not None:
            # the planner's working memory, per device where a split's differ
            option = {n: self.cplan.headroom_on(n) for n in self.runtime}
        self.headroom = [headroom_for(option, t.name) for t in self.targets]
        if len(self.targets) > 1:
            self.mover = Mover(self.targets, self.hop_link)
        self.check = forward_check(self.component, self.targets, self.mover) \
            if self.device_check else None
        self.cuda_devices = [t.device for t in self.targets if t.is_cuda]
        self.pool = PinnedPool(any(t.is_cuda for t in self.targets),
                               self.max_pinned_bytes if self.max_pinned_bytes is not None
                               else default_pinned_cap())

    def _prepare(self, by_id) -> None:
        raise NotImplementedError

    def _prepare_again(self, by_id) -> None:
        """The layout made anew for other working memory (first_call.py): nothing was
        allocated on a device yet; packed host copies are kept by the store."""
        if self.file is not None:
            self.file.close()
            self.file = None
        self.streamers, self.resident, self.disk_layouts = [], [], {}
        self._prepare(by_id)

    def _attach(self) -> None:
        raise NotImplementedError

    def _resting(self, t: torch.Tensor) -> torch.Tensor:
        return self.rest.get(id(t), t.data)

    def _rest_in(self, g: Group, host: torch.Tensor) -> None:
        """Group g rests in packed host buffer `host` from now on: its tensors point into
        it and the module's former storage is let go (RAM holds the weights once)."""
        g.bind(host)
        for t, v in zip(g.tensors, g.views(host)):
            self.rest[id(t)] = v

    # -- device memory ------------------------------------------------------------------
    def _load(self) -> None:
        if self.loaded:
            return
        allocated = []
        main = self.targets[0]
        main.ledger.reserve("resident", self.in_place_bytes, "weights in place")
        try:
            for d, groups in enumerate(self.resident):
                for g in groups:
                    buf = self.targets[d].alloc(g.nbytes, "resident", f"resident {g.name}")
                    allocated.append((d, g, buf))
            for s in self.streamers:
                s.allocate()
        except BaseException:
            main.free(self.in_place_bytes, "resident")
            for d, g, _ in allocated:
                self.targets[d].free(g.nbytes, "resident")
            for s in self.streamers:
                s.free()
            raise
        self.resident_bufs = allocated
        try:
            for d, g, buf in allocated:
                self.targets[d].ledger.count_h2d(g.nbytes)
                self._fill(g, buf)
                g.bind(buf)
        except BaseException:               # a read failed midway: give it all back
            self.loaded = True
            self._unload()
            raise
        for t in self.targets:
            if t.is_cuda:
                torch.cuda.synchronize(t.device)
        self.loaded = True
        if self.check is not None:
            self.check.watch(self._moved_resting())
            self.check.home(self._device_buffers())
        self._after_load()

    def _fill(self, g: Group, buf: torch.Tensor) -> None:
        """A resident group onto its device buffer: from its packed host copy (one copy),
        from the weights file, or packed from the module's resting tensors."""
        host = self.resident_host.get(id(g))
        if host is not None:
            buf.copy_(host, non_blocking=buf.device.type == "cuda" and host.is_pinned())
            return
        layout = self.disk_layouts.get(id(g))
        if layout is None:
            g.pack(buf, [self._resting(t) for t in g.tensors])
            return
        try:
            fill_from_file(self.file, layout, g, buf, self._resting, self.pool.alloc)
        except PlacementError as exc:
            raise PlacementError(f"{self.component}: {exc}") from None

    def _after_load(self) -> None:
        """Subclasses: work on the freshly loaded device copies (LoRA patches)."""

    def _device_buffers(self):
        """(device index, buffer) of every device buffer holding weights: the device
        check locates a weight by its buffer's storage."""
        for d, _, buf in self.resident_bufs:
            yield d, buf
        for s in self.streamers:
            if s.ring is not None:
                yield self.targets.index(s.target), s.ring

    def _moved_resting(self):
        """(name, resting tensor) of every weight this placement moves onto a device:
        the simulated device's check refuses computing with those resting copies."""
        for g in self.resident_groups:
            for t, names in zip(g.tensors, g.names):
                yield names[0], self.rest.get(id(t))
        for s in self.streamers:
            for g, src in zip(s.groups, s.sources):
                for t, names in zip(g.tensors, g.names):
                    yield names[0], self.rest.get(id(t))
                if src.host is not None:
                    yield f"{g.name} (its host copy)", src.host

    # -- hooks every engine shares ------------------------------------------------------
    def _guard_forward(self) -> None:
        """The module's forward runs inside a guard (an instance `forward` that wraps the
        module's own, removed at detach): on a simulated device, the device check
        (simcheck.py); on CUDA, the caller's current device is put back (blocks make their
        own device current, stages.py's `_current_device`); in a layer split, the
        module's own joins bring their tensors to one device (`_joins`, crossings.py).
        A wrapper, not a pre/post hook pair:
        torch skips always-call hooks on a KeyboardInterrupt, and a dispatch mode must be
        left in the frame (and inference-mode guard) it was entered in. Hooks run outside
        it: the root pre-hook's load copies weights, which the check allows anyway."""
        check, cuda = self.check, bool(self.cuda_devices)
        joins = self._joins
        if (check is None and not cuda and joins() is None) or self._own_forward is not None:
            return
        module = self.module
        inner = module.forward

        def forward(*args, **kwargs):
            device = torch.cuda.current_device() if cuda else None
            if check is not None:
                check.enter()
            try:
                mode = joins()
                if mode is None:
                    return inner(*args, **kwargs)
                with mode:
                    return inner(*args, **kwargs)
            finally:
                if check is not None:
                    check.leave()
                if device is not None:
                    torch.cuda.set_device(device)
        self._own_forward = ForwardOverride(module, forward)

    def _joins(self):
        """Subclasses: the mode this forward's joins run under (None: nothing to
        bring), asked at every forward."""
        return None

    def _unguard_forward(self) -> None:
        own, self._own_forward = self._own_forward, None
        if own is not None:
            own.restore()

    def _unload(self) -> None:
        """Give the device memory back; tensors point at their resting copies."""
        if not self.loaded:
            return
        if self.check is not None:
            self.check.home(())         # the buffers go: their addresses may be reused
        try:
            for s in self.streamers:
                s.free()                # a failed copy surfaces here, after its frees
        finally:
            self.targets[0].free(self.in_place_bytes, "resident")
            for d, g, _ in self.resident_bufs:
                self.targets[d].free(g.nbytes, "resident")
            self.resident_bufs = []
            put_back((t, self.rest[id(t)], None) for t, _ in self.originals.values())
            for t in self.targets:
                if t.is_cuda:
                    torch.cuda.synchronize(t.device)
            self.loaded = False

    def release(self) -> None:
        """Give every device's memory back (before VAE decode, on unload); the next
        forward loads again, each resident group in one copy from its packed host copy
        (streamed blocks stream from theirs as before)."""
        self._unload()
        self._pack_resident_host()

    def _pack_resident_host(self) -> None:
        """Resident groups that rest in host memory get one packed host buffer each
        (pinned on CUDA within the cap; with a host store the store's, pageable, so the
        caller's tensors can be pointed into it), which becomes their resting copy: RAM
        still holds the weights once. Done at the first release, not at entry: a
        placement that never releases pays no pack."""
        for g in self.resident_groups:
            if id(g) in self.resident_host or id(g) in self.disk_layouts or \
                    not self._packable(g):
                continue
            sources = [self._resting(t) for t in g.tensors]
            if any(s.device.type != "cpu" or s.is_meta for s in sources):
                continue                # not host memory: nothing to pack from
            # a caller's store: pageable, the caller's tensors are pointed into it
            alloc = _pageable if self.host_store is not None else self.pool.alloc_flagged
            host, packed = self.store.host_for(g, sources, alloc, self.repoint)
            self.host_pack_bytes += packed
            self.resident_host[id(g)] = host
            self._rest_in(g, host)
            if packed and self.host_store is None:
                give_back_freed_host_memory()

    def _packable(self, g: Group) -> bool:
        """Whether packing g lets the module's former storage go (row shards do not)."""
        return True

    # -- exit ---------------------------------------------------------------------------
    def _detach(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def _free_extra(self) -> None:
        """Subclasses: device memory held beside the groups (LoRA patches)."""

    def _teardown(self) -> None:
        if self.check is not None:
            self.check.close()
        if self._armed is not None:         # left before its first call
            self._armed.remove()
            self._armed = None
        self._detach()
        self._unguard_forward()
        if self.mover is not None:
            self.mover.end_forward()          # drop copies a forward stopped midway left
        try:
            if self.targets:
                try:
                    try:
                        self._unload()
                    finally:
                        self._free_extra()
                finally:
                    self._final_stats = self._stats_now()
                    for t in self.targets:
                        t.close()
        finally:
            self._restore()
            self.targets = []
            if self.file is not None:
                self.file.close()
                self.file = None

    def _restore(self) -> None:
        originals, self.originals = self.originals, {}
        put_back((t, self.rest[id(t)], device) for t, device in originals.values())

    # -- stats ----------------------------------------------------------------------------
    def _stats_now(self) -> dict:
        mover = self.mover
        out = {"devices": {t.name: t.ledger.stats() for t in self.targets},
               "hops": self.hops, "hop_bytes": mover.bytes if mover else 0,
               "host_pack_bytes": self.host_pack_bytes}
        pool = self.pool
        out["pinned_bytes"] = pool.pinned_bytes if pool is not None else 0
        out["pageable_host_bytes"] = pool.pageable_bytes if pool is not None else 0
        if pool is not None and pool.warning:
            out["pinned_warning"] = pool.warning
        if self.events is not None and not self.events.learning:
            # blocks whose own forward never ran, entered through their layers (units.py);
            # blocks not entered at all are named apart, counted in no figure
            out["blocks_entered_by_units"] = sum(self.events.via_units)
            out["blocks_never_ran"] = self._never_ran_names()
        out["fallbacks"] = self.fallbacks.as_list()
        # the working memory each device kept room for: the plan's, or the first call's
        # rehearsal (first_call.py) with the plan's beside it
        headroom = getattr(self, "headroom", None)
        if headroom:
            out["working_memory"] = {
                t.name: {"kept_bytes": int(h), **({
                    "rehearsed_bytes": int(self.rehearsed[d]),
                    "planned_bytes": int(self.planned_headroom[d])}
                    if self.rehearsed is not None else {})}
                for d, (t, h) in enumerate(zip(self.targets, headroom))}
        if self.check is not None:
            out["device_check"] = "on" if self.check.off_because is None else \
                f"off: {self.check.off_because}"
        out.update(self._more_stats())
        return out

    def _more_stats(self) -> dict:
        return {}

    def _never_ran_names(self) -> List[str]:
        return []

    def held_bytes(self, device: str) -> int:
        """Resident weights + ring slots the ledger holds on `device` now."""
        for t in self.targets:
            if t.name == device:
                return t.ledger.held["resident"] + t.ledger.held["slots"]
        return 0

    @property
    def crosses_devices(self) -> bool:
        return False

    def follow(self, x, like, kind: str = "follow"):
        return x

    def stats(self) -> dict:
        if not self.targets:
            if self._final_stats is None:
                raise PlacementError("stats() before the placement was entered")
            return self._final_stats
        return self._stats_now()
