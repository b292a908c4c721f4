"""Batch parallel: shares of one forward's batch run on several devices at once.

    with place_batch(module, plan, "diffusion", inventory) as placed:
        out = module(x)          # x[:k] on cuda0, x[k:] on cuda1, at the same time
    placed.stats()

The plan's component has parallel "batch" and two or more runtime devices. Each device
runs the whole module under its own single-device placement (runtime.place: resident,
staged or streamed, from the component plan with that device as its runtime) on its own
structural copy (runtime/engine/shadow.py), so placements never share a Parameter object and
the caller's module is never hooked. While the context is open, calling `module` cuts
the batch into contiguous shares proportional to the devices' speeds (`speeds={device:
relative speed}`; default: the throughputs of the planner's cost model when the plan
has them, else equal), runs share 0 in the calling thread and the others
on one thread per device (CUDA kernels release the GIL; on a simulated device compute
is CPU work), and concatenates the outputs in order on the first device. A forward
whose batch is 1 (or smaller than the device count) runs on the fastest device(s) only.

Streamed devices read the same packed host copy: the devices' placements share one
HostStore, and each later device's copy is made after the first device packed (and,
where the buffer is pageable, pointed the module's tensors into it), so their sources
are that buffer and nothing is packed twice (stats: host_pack_bytes per device).

Leaving the context (normally, after an error, after an interrupt) waits for every
share still running, leaves each placement, and takes the forward override away: the
module is as it was (like runtime.place, its streamed weights may now live in the
packed host copy, same objects and values). One error is raised: the first that
happened; later ones are attached to it as notes.
"""
import contextlib
import copy
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Callable, Dict, List, Optional

import torch
from torch import nn

from ...placement.errors import PlacementError
from ...placement.plan import Plan
from ..engine.fallbacks import merged
from ..engine.forward_override import ForwardOverride
from ..engine.one_device import Placed
from ..engine.shadow import Shadow
from ..host.hoststore import HostStore
from .batch_cut import autocast_now, batch_size, cut_all, gather, share_counts


def device_plan(plan: Plan, component: str, device: str) -> Plan:
    """The single-device plan one device of a batch-parallel component runs: the same
    residency and streaming, with `device` as the runtime (and as the params device when
    the weights were planned resident on the runtime devices)."""
    cp = plan.components[component]
    params = device if cp.params in cp.runtime else cp.params
    one = replace(cp, runtime=[device], params=params, parallel="none", blocks={},
                  stream=copy.deepcopy(cp.stream), reasons=list(cp.reasons))
    return Plan(plan.devices, {component: one}, [], plan.version, dict(plan.extra))


_HOOK_DICTS = ("_forward_pre_hooks", "_forward_pre_hooks_with_kwargs", "_forward_hooks",
               "_forward_hooks_with_kwargs", "_forward_hooks_always_called")


def _drop_root_hooks(copy_root: nn.Module) -> None:
    """The caller's hooks on the root already ran on the whole batch (the call goes
    through the module itself); the copy's own dicts are emptied so they do not run once
    more per share. Hooks deeper in the module run per share, as its forward does."""
    for name in _HOOK_DICTS:
        d = copy_root.__dict__.get(name)
        if d:
            copy_root.__dict__[name] = type(d)()


def planned_speeds(plan, devices) -> Dict[str, float]:
    """The devices' throughput from the planner's cost model (DevicePlan.throughput), when
    the plan has one for every device; else {} (equal shares)."""
    flops = {d.name: d.throughput for d in plan.devices}
    if all(isinstance(flops.get(d), (int, float)) and flops[d] > 0 for d in devices):
        return {d: float(flops[d]) for d in devices}
    return {}


def _check(plan, component: str, inventory) -> List[str]:
    cp = plan.components.get(component)
    if cp is None:
        raise PlacementError(f"plan has no component {component!r}; it has: "
                             f"{', '.join(plan.components) or 'none'}")
    if cp.parallel != "batch":
        raise PlacementError(f"{component}: plan has parallel {cp.parallel!r}; batch "
                             f"parallel runs plans with parallel 'batch' (use place())")
    if len(cp.runtime) < 2:
        raise PlacementError(f"{component}: batch parallel needs two or more runtime "
                             f"devices, plan gives {'&'.join(cp.runtime) or 'none'}; e.g. "
                             f"backend {component}=cuda0&cuda1")
    for name in cp.runtime:
        inventory.get(name)                     # an unknown device: its own error
    return list(cp.runtime)


class BatchPlaced:
    def __init__(self, module: nn.Module, plan, component: str, inventory, *,
                 speeds: Optional[Dict[str, float]] = None, link=None,
                 links: Optional[Dict[str, object]] = None, host_store=None,
                 repoint: Optional[Callable] = None, cut_inputs: Optional[Callable] = None,
                 **options):
        self.devices = _check(plan, component, inventory)
        self.module = module
        self.plan = plan
        self.component = component
        self.inventory = inventory
        speeds = dict(speeds if speeds is not None else planned_speeds(plan, self.devices))
        unknown = set(speeds) - set(self.devices)
        if unknown:
            raise PlacementError(f"speeds name {', '.join(sorted(unknown))}, not runtime "
                                 f"devices of {component} ({', '.join(self.devices)})")
        self.weights = [float(speeds.get(d, 1.0)) for d in self.devices]
        share_counts(0, self.weights)           # validates the speeds
        self.links = {d: (links or {}).get(d, link) for d in self.devices}
        self.own_store = host_store is None
        self.store = HostStore() if host_store is None else host_store
        self.outer_repoint = repoint            # module tensor -> the caller's original
        self.cut_inputs = cut_inputs or cut_all
        self.options = options
        self.placed: List = []
        self.shadows: List[Shadow] = []
        self.pool: Optional[ThreadPoolExecutor] = None
        self.items = {d: 0 for d in self.devices}
        self.last_shares = {d: 0 for d in self.devices}
        self.forwards = 0
        self.threads_seen = {d: set() for d in self.devices}
        self._override = None
        self._final = None
        self._lock = threading.Lock()

    # -- context -------------------------------------------------------------------------
    def __enter__(self) -> "BatchPlaced":
        try:
            for i, d in enumerate(self.devices):
                # made after the previous device packed the host copy: its tensors are
                # the packed buffer (pageable) or the originals the store keyed it by
                shadow = Shadow(self.module)
                _drop_root_hooks(shadow.module)
                repoint = self._chained_repoint(shadow) if i == 0 else None
                # loaded now, in turn (each packs the host copy the next one shares)
                placed = Placed(shadow.module, device_plan(self.plan, self.component, d),
                                self.component, self.inventory, link=self.links[d],
                                host_store=self.store, repoint=repoint,
                                **{**self.options, "rehearse": False})
                placed.__enter__()
                self.shadows.append(shadow)
                self.placed.append(placed)
            self.pool = ThreadPoolExecutor(max_workers=len(self.devices) - 1,
                                           thread_name_prefix="placement-batch")
            self._install()
        except BaseException as exc:
            self._teardown(exc)
            raise
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        self._teardown(exc)
        return False

    def _chained_repoint(self, shadow: Shadow):
        """Point the module's tensor (and, with an outer repoint, the caller's original
        behind it) into the packed host buffer: one host copy for every device."""
        outer = self.outer_repoint

        def repoint(t, view):
            original = shadow.original_of(t)
            done = shadow.repoint(t, view)
            if done and outer is not None and original is not None:
                outer(original, view)
            return done
        return repoint

    def _install(self) -> None:
        self._override = ForwardOverride(self.module, self.forward)

    def _uninstall(self) -> None:
        if self._override:
            self._override.restore()
        self._override = None

    def _teardown(self, exc) -> None:
        """Leave every placement (last first); the first error wins, later ones are
        noted on it. Raises a teardown error only when nothing else is in flight."""
        first = exc
        raised = None
        self._uninstall()
        if self.pool is not None:
            self.pool.shutdown(wait=True)
            self.pool = None
        for placed in reversed(self.placed):
            try:
                placed.__exit__(None, None, None)
            except BaseException as second:
                if first is None:
                    first = raised = second
                elif hasattr(first, "add_note"):
                    first.add_note(f"during the batch-parallel teardown: {second!r}")
        self._final = self._stats_now()
        self.placed, self.shadows = [], []
        if self.own_store:
            self.store.clear()
        if raised is not None:
            raise raised

    # -- the forward ---------------------------------------------------------------------
    def __call__(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def forward(self, *args, **kwargs):
        if not self.placed:
            raise PlacementError(f"{self.component}: batch-parallel placement is not open")
        batch = batch_size(args, kwargs)
        counts = share_counts(batch or 1, self.weights) if batch else \
            [1] + [0] * (len(self.devices) - 1)
        jobs, start = [], 0
        for i, n in enumerate(counts):
            if n:
                jobs.append((i, start, start + n))
                start += n
        self.forwards += 1
        self.last_shares = {d: 0 for d in self.devices}
        for i, a, b in jobs:
            self.last_shares[self.devices[i]] = b - a
            self.items[self.devices[i]] += b - a
        if len(jobs) == 1:
            return self._run_share(jobs[0][0], args, kwargs)
        modes = (torch.is_grad_enabled(), torch.is_inference_mode_enabled(), autocast_now())
        errors: List[tuple] = []
        outputs: List = [None] * len(jobs)

        def run(slot, i, a, b, in_caller):
            try:
                share_args, share_kwargs = self.cut_inputs(args, kwargs, batch, a, b)
                if in_caller:
                    outputs[slot] = self._run_share(i, share_args, share_kwargs)
                    return
                grad, inference, autocast = modes
                with torch.inference_mode(inference), torch.set_grad_enabled(grad), \
                        contextlib.ExitStack() as stack:
                    for device_type, dtype in autocast:
                        stack.enter_context(torch.autocast(device_type, dtype=dtype))
                    outputs[slot] = self._run_share(i, share_args, share_kwargs)
            except BaseException as e:          # noqa: B902 - re-raised by the caller
                with self._lock:
                    errors.append((time.perf_counter(), slot, e))

        futures = [self.pool.submit(run, slot, i, a, b, False)
                   for slot, (i, a, b) in enumerate(jobs) if slot > 0]
        i, a, b = jobs[0]
        run(0, i, a, b, True)
        interrupt = self._wait(futures)
        if interrupt is not None:
            errors.append((time.perf_counter(), -1, interrupt))
        if errors:
            errors.sort(key=lambda e: (e[0], e[1]))
            first = errors[0][2]
            for _, slot, later in errors[1:]:
                if later is not first and hasattr(first, "add_note"):
                    first.add_note(f"batch parallel: share {slot} also failed: {later!r}")
            raise first
        return gather(outputs, self._main_device())

    def _run_share(self, i: int, args, kwargs):
        self._seen(i)
        target = getattr(self.placed[i], "target", None)
        if target is not None and target.is_cuda:
            # the share's thread works on its device: kernels, streams and new tensors
            # that name no device land there, not on the caller's current device
            with torch.cuda.device(target.device):
                return self.shadows[i].module(*args, **kwargs)
        return self.shadows[i].module(*args, **kwargs)

    def _seen(self, i: int) -> None:
        with self._lock:
            self.threads_seen[self.devices[i]].add(threading.get_ident())

    @staticmethod
    def _wait(futures) -> Optional[BaseException]:
        """Wait for every share, also through an interrupt (a share still running must
        not meet a teardown); the interrupt is returned to be raised after."""
        pending = None
        for f in futures:
            while True:
                try:
                    f.result()
                    break
                except BaseException as exc:    # a KeyboardInterrupt while waiting
                    if f.done():
                        break
                    pending = pending or exc
        return pending

    def _main_device(self) -> Optional[torch.device]:
        target = getattr(self.placed[0], "target", None)
        return None if target is None else target.device

    # -- per-device placements ------------------------------------------------------------
    def set_lora(self, patches) -> None:
        """Runtime LoRA ({weight name: [(down, up, alpha, strength), ...]}) on every
        device's copy (runtime.place's set_lora: arriving blocks and resident weights)."""
        for placed in self.placed:
            placed.set_lora(patches)

    def release(self) -> None:
        """Give every device's memory back; the next forward loads again."""
        for placed in self.placed:
            placed.release()

    # -- stats ---------------------------------------------------------------------------
    def _stats_now(self) -> dict:
        per = {d: p.stats() for d, p in zip(self.devices, self.placed)} if self.placed \
            else {}
        devices = {}
        for s in per.values():
            devices.update(s.get("devices", {}))
        checks = [s["device_check"] for s in per.values() if "device_check" in s]
        return {"devices": devices, "hops": 0, "hop_bytes": 0, "parallel": "batch",
                "runtime": list(self.devices), "speeds": dict(zip(self.devices, self.weights)),
                "forwards": self.forwards, "items": dict(self.items),
                "last_shares": dict(self.last_shares),
                "threads": {d: len(t) for d, t in self.threads_seen.items()},
                "host_pack_bytes": sum(s.get("host_pack_bytes", 0) for s in per.values()),
                "device_check": next((c for c in checks if c != "on"),
                                     checks[0] if checks else None),
                # each device's runtime fallbacks (runtime/engine/fallbacks.py), each once
                "fallbacks": merged(*(s.get("fallbacks") for s in per.values())),
                "per_device": per}

    def held_bytes(self, device: str) -> int:
        return sum(p.held_bytes(device) for p in self.placed)

    @property
    def crosses_devices(self) -> bool:
        return False                # each device runs the whole module on its share

    def follow(self, x, like, kind: str = "follow"):
        return x

    def stats(self) -> dict:
        if self.placed:
            return self._stats_now()
        if self._final is None:
            raise PlacementError("stats() before the placement was entered")
        return self._final


def place_batch(module: nn.Module, plan, component: str, inventory, **options) -> BatchPlaced:
    """Run `module` batch-parallel over the component's runtime devices (see the module
    docstring). Options: speeds ({device: relative speed}), link (simdevice.Link for
    every simulated device) or links ({device: Link}), host_store (a HostStore shared by
    the devices and kept by the caller), repoint (maps the module's tensors to the
    caller's originals, e.g. a Shadow's repoint when `module` is itself a copy),
    cut_inputs ((args, kwargs, batch, start, stop) -> a share's (args, kwargs); default
    cut_all: every tensor whose leading size is the batch, so a tensor that is not
    per-item but happens to have that size must be kept whole by a cut_inputs), and
    runtime.place's options (blocks, weights_file, key_map, max_pinned_bytes)."""
    return BatchPlaced(module, plan, component, inventory, **options)
