"""A layer split whose stages include worker devices: a plan with runtime such as
cuda0&w1.cuda0 (or cuda0&cuda1&w1.cuda0) runs each range the plan gives a worker device
there through remote_range, and the local ranges under the staged engine like any local
placement: resident, streamed through the ring, from disk, or split over local GPUs.

place() hands such a plan here when given `cluster=` (runtime/place.py). The module's
remote blocks are released locally (the worker reads its own copy of the file) and left
to remote_range; the local engine is told to skip them (Engine skip_blocks), so each
tensor has one owner and one restore path. The main device (the runtime's first) must be
local: it runs the module's own code.
"""
from contextlib import ExitStack
from dataclasses import replace
from typing import Dict, List, Optional

from ...placement.errors import PlacementError
from ...placement.plan import Plan
from ...placement.remote_devices import is_remote
from ..blocks.find import find_blocks
from ..blocks.module_tensors import key_mapper
from . import kept as kept_ranges
from .cluster import Cluster
from .remote import remote_range

REMOTE_OPTIONS = ("builder", "remote_file", "chain", "timeout_s", "inputs", "keep_for",
                  "restore_released")


class RemoteStages:
    def __init__(self, module, plan, component: str, inventory, *,
                 cluster: Optional[Cluster] = None,
                 weights_file: Optional[str] = None, blocks=None, key_map=None,
                 **options):
        comp = plan.components.get(component)
        if comp is None:
            raise PlacementError(f"plan has no component {component!r}; it has: "
                                 f"{', '.join(plan.components) or 'none'}")
        runtime = "&".join(comp.runtime)
        remote = [d for d in comp.runtime if is_remote(d)]
        local = [d for d in comp.runtime if not is_remote(d)]
        if not remote:
            raise PlacementError(f"{component}: runtime {runtime} names no worker device "
                                 f"(such as w1.cuda0); use place()")
        if cluster is None:
            raise PlacementError(f"{component}: runtime {runtime} names worker devices; pass "
                                 f"cluster= (runtime.distributed.Cluster) to reach them")
        if not local or is_remote(comp.runtime[0]):
            raise PlacementError(f"{component}: the first runtime device runs the module's "
                                 f"own code and must be local; runtime {runtime} starts "
                                 f"with a worker device: name a local device first")
        if comp.split_mode != "layer" or comp.parallel != "none":
            raise PlacementError(f"{component}: worker devices take block ranges of a layer "
                                 f"split; this plan asks for split_mode={comp.split_mode}, "
                                 f"parallel={comp.parallel}")
        if not weights_file:
            raise PlacementError(f"{component}: a worker reads its range from its own copy "
                                 f"of the model file; pass weights_file=PATH (.safetensors)")
        names = [n for n, _ in find_blocks(module, blocks)]
        n = len(names)
        missing = [d for d in remote if d not in comp.blocks]
        if missing:
            raise PlacementError(f"{component}: the plan gives {missing[0]} no block range; "
                                 f"a worker device needs blocks {{device: [first, last]}}")
        self.remote_ranges: Dict[str, tuple] = {}
        taken = set()
        for d in remote:
            first, last = (int(b) for b in comp.blocks[d])
            if not 0 <= first <= last < n or taken & set(range(first, last + 1)):
                raise PlacementError(f"{component}: {d}'s blocks {[first, last]} are not a "
                                     f"free range of the module's {n} blocks (0..{n - 1})")
            taken |= set(range(first, last + 1))
            self.remote_ranges[d] = (first, last)
        # where each range's activations come from here: the local device of the block
        # before it (the main device when a worker's block or none precedes it)
        owner = {i: d for d, (a, b) in comp.blocks.items() for i in range(int(a), int(b) + 1)}
        self.sources = {d: owner[f - 1] if owner.get(f - 1) in local else local[0]
                        for d, (f, _) in self.remote_ranges.items()}
        local_idx = [i for i in range(n) if i not in taken]
        self.local_blocks = [names[i] for i in local_idx]
        self.remote_blocks = [names[i] for i in sorted(taken)]
        position = {i: k for k, i in enumerate(local_idx)}
        local_ranges = {}
        for d in local:
            if d in comp.blocks:
                first, last = comp.blocks[d]
                kept = [position[i] for i in range(first, last + 1) if i in position]
                if kept:
                    local_ranges[d] = [kept[0], kept[-1]]
        # auto-fit's per-device prefixes (extra.fit) go along: each local stage keeps its own
        self.local_plan = Plan(plan.devices, {component: replace(
            comp, runtime=local, blocks=local_ranges if len(local) > 1 else {})},
            list(plan.warnings), plan.version, dict(plan.extra))
        self.module, self.component, self.inventory = module, component, inventory
        self.block_names = blocks
        self.cluster, self.file = cluster, weights_file
        self.key_map = key_mapper(key_map)
        # {block: [the names the model's loop calls]}: where a model calls a block's
        # layers itself (ComfyUI's UNet), a range runs as those layers
        self.units = options.pop("units", None)
        self.names = names
        self.remote_options = {k: options.pop(k) for k in REMOTE_OPTIONS if k in options}
        self.local_options = dict(options, key_map=key_map)
        if comp.params == "disk":
            self.local_options["weights_file"] = weights_file
        self._stack: Optional[ExitStack] = None
        self.opened: List = []
        self.local = None
        self._final = None

    def __enter__(self) -> "RemoteStages":
        from ..engine.one_device import Placed
        from ..split import place_split
        place = Placed if len(self.local_plan.components[self.component].runtime) == 1 \
            else place_split
        self._stack = ExitStack()
        try:
            for device, (first, last) in self.remote_ranges.items():
                span, names = (first, last), self.block_names
                if self.units is not None:
                    names = [u for n in self.names[first:last + 1] for u in self.units[n]]
                    span = (0, len(names) - 1)
                self.opened.append(self._stack.enter_context(remote_range(
                    self.module, span, self.cluster[device], self.file,
                    key_map=self.key_map, block_names=names,
                    local_name=self.sources[device], **self.remote_options)))
            keep_for = self.remote_options.get("keep_for")
            if keep_for is not None:      # the owner's ranges this plan no longer names
                kept_ranges.free(keep_for, keep=[(r.worker.link, r._range_id)
                                                 for r in self.opened])
            self.local = self._stack.enter_context(place(
                self.module, self.local_plan, self.component, self.inventory,
                blocks=self.local_blocks, skip_blocks=self.remote_blocks,
                **{**self.local_options, "rehearse": False}))   # workers' blocks: not on meta
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(self, *exc):
        try:
            return self._stack.__exit__(*exc)
        finally:
            self._final = self._stats_now()

    def release(self) -> None:
        """Give the local devices' memory back (the workers keep their ranges)."""
        self.local.release()

    def _stats_now(self) -> dict:
        out = dict(self.local.stats()) if self.local is not None else {"hops": 0,
                                                                       "hop_bytes": 0}
        out["remote_ranges"] = {d: list(r) for d, r in self.remote_ranges.items()}
        # per worker device: kept from the last run, or what loading it read, hashed, moved
        out["worker_loading"] = {r.worker.name: r.stats()["loading"] for r in self.opened}
        links: Dict[str, dict] = {}
        for r in self.opened:
            s = r.stats()
            out["hops"] = out.get("hops", 0) + s["hops"]
            out["hop_bytes"] = out.get("hop_bytes", 0) + s["hop_bytes"]
            out["round_trips"] = out.get("round_trips", 0) + s["round_trips"]
            for link, v in s["links"].items():
                acc = links.setdefault(link, {"hops": 0, "bytes": 0})
                acc["hops"] += v["hops"]
                acc["bytes"] += v["bytes"]
        out["links"] = links
        return out

    def held_bytes(self, device: str) -> int:
        return self.local.held_bytes(device) if self.local is not None else 0

    @property
    def crosses_devices(self) -> bool:
        return False                # the ranges' hops are the chain's (chain.py)

    def follow(self, x, like, kind: str = "follow"):
        return x

    def stats(self) -> dict:
        """The local engine's stats (devices, streaming, local hops), with the workers'
        hops and bytes added to hops/hop_bytes, per link under `links`."""
        if self._final is not None:
            return self._final
        if self._stack is None:
            raise PlacementError("stats() before the placement was entered")
        return self._stats_now()


# the name earlier releases used
PlannedRemote = RemoteStages


def place_remote(module, plan, component: str, cluster: Cluster, file: str, inventory=None,
                 **options) -> RemoteStages:
    """Run `plan`'s `component` with its worker ranges on the cluster's workers and its
    local ranges under the staged engine (options as place() and remote_range)."""
    if inventory is None:
        raise PlacementError(f"{component}: place_remote needs inventory= (the local "
                             f"devices with the workers', placement.remote_devices."
                             f"with_remote)")
    return RemoteStages(module, plan, component, inventory, cluster=cluster,
                        weights_file=file, **options)
