"""place(): run a module under one component's plan, and restore it exactly after.

    with place(module, plan, "diffusion", inventory) as placed:
        out = module(x)
    placed.stats()   # {"devices": {"cuda0": {"peak_bytes", "h2d_bytes", ...}}, "hops", "hop_bytes"}

Modes, from the ComponentPlan:
- params on the runtime device: every weight resident on it.
- params cpu/disk, no stream: every weight copied to the device for the placement (the
  phase) and dropped after, like stable-diffusion.cpp's offload.
- params cpu/disk with stream: non-block weights and the first K blocks resident, the
  rest streamed through a byte ring sized by placement/layout.py (runtime/stream.py).
The module's tensors keep their identity: only `.data` is rebound, and put back on
exit, also when the forward raised (a simulated out-of-memory, an interrupt).
"""
from typing import Callable, Dict, List, Optional, Sequence, Union

import torch
from torch import nn

from ..placement.errors import PlacementError
from ..placement.layout import group_blocks
from .blocks import block_tensor_ids, find_blocks
from .residency import Group, PinnedPool, default_pinned_cap, give_back_freed_host_memory
from .weightfile import DiskLayout, open_weight_file
from .hoststore import group_key, packed_host
from .simdevice import Link
from .stream import Source, Streamer
from .faults import teardown_after
from .restore import put_back
from .target import open_target
from .tensors import key_mapper, make_group, module_tensors, seen_bytes, to_device

DISK_CHUNK = 64 * 1024 ** 2          # staging for one-time resident loads from disk


def place(module: nn.Module, plan, component: str, inventory, **options):
    """Options: blocks (names in execution order), weights_file (path, for params=disk),
    key_map (module tensor name -> file key, callable or dict), link (simdevice.Link for
    simulated devices), max_pinned_bytes (cap on pinned host memory), host_store
    (hoststore.HostStore: streamed blocks' packed host copies kept across placements)
    and repoint (with host_store: points the caller's tensors into pageable packed
    copies, e.g. shadow.Shadow.repoint; without a store the module's own tensors are).
    A plan whose runtime lists several devices runs on the split runtime (runtime/split,
    more options there)."""
    comp = plan.components.get(component)
    if comp is not None and comp.parallel == "batch":     # whole on each device (parallel/)
        from .parallel import place_batch
        return place_batch(module, plan, component, inventory, **options)
    if comp is not None and comp.is_split:
        from .split import place_split
        return place_split(module, plan, component, inventory, **options)
    return Placed(module, plan, component, inventory, **options)


class Placed:
    def __init__(self, module: nn.Module, plan, component: str, inventory, *,
                 blocks: Optional[Sequence] = None, weights_file: Optional[str] = None,
                 key_map: Union[None, Dict[str, str], Callable[[str], str]] = None,
                 link: Optional[Link] = None, max_pinned_bytes: Optional[int] = None,
                 host_store=None, repoint: Optional[Callable] = None):
        self.module = module
        self.component = component
        self.cplan = self._component_plan(plan, component)
        self.device = self._runtime_device(self.cplan, inventory)
        self.budget = self._budget(plan, self.device.name)
        self.block_names = None if blocks is None else [getattr(b, "name", b) for b in blocks]
        self.weights_file = weights_file
        self.key_map = key_mapper(key_map)
        self.link = link
        self.max_pinned_bytes = max_pinned_bytes
        self.host_store = host_store        # hoststore.HostStore: packed copies kept
        self.repoint = repoint              # shadow.Shadow.repoint (with host_store)
        self.host_pack_bytes = 0
        self.resident_host: Dict[int, torch.Tensor] = {}   # id(group): packed host copy
        self.host_bytes = 0                 # params=disk: streamed blocks read into RAM once
        self.disk_bytes = 0                 # params=disk: streamed bytes read per forward
        self.disk_read_bytes = 0            # bytes read from the file for streamed blocks
        self.target = None
        self.streamer: Optional[Streamer] = None
        self.file = None
        self.loaded = False
        self._handles: List = []
        self._final_stats = None
        self._info = {}
        self._lora = {}
        self._lora_bytes = 0
        self._streamed_patches = {}

    # -- plan checks -------------------------------------------------------------------
    @staticmethod
    def _component_plan(plan, component):
        comp = plan.components.get(component)
        if comp is None:
            raise PlacementError(f"plan has no component {component!r}; it has: "
                                 f"{', '.join(plan.components) or 'none'}")
        if comp.is_split:
            raise PlacementError(f"{component}: runtime {'&'.join(comp.runtime)} is a split; "
                                 f"run it through place(), which hands it to the split runtime")
        if not comp.runtime:
            raise PlacementError(f"{component}: plan gives no runtime device")
        return comp

    @staticmethod
    def _runtime_device(comp, inventory):
        return inventory.get(comp.runtime[0])

    @staticmethod
    def _budget(plan, name):
        for d in plan.devices:
            if d.name == name:
                return d.budget_bytes
        return None

    def _mode(self) -> str:
        c, dev = self.cplan, self.device
        if c.params not in ("cpu", "disk") and c.params != dev.name:
            raise PlacementError(f"{self.component}: params on {c.params} with runtime "
                                 f"{dev.name} is not supported; params must be cpu, disk or "
                                 f"the runtime device")
        if c.stream is not None:
            if c.params == "cpu" and dev.name == "cpu":
                raise PlacementError(f"{self.component}: streaming asked for, but params "
                                     f"and runtime are both cpu; nothing to stream")
            if c.params == dev.name:
                raise PlacementError(
                    f"{self.component}: streaming asked for, but params rest on the runtime "
                    f"device {dev.name}; streaming needs params=cpu or params=disk")
            if c.stream.prefetch_depth < 0 or c.stream.resident_blocks < 0:
                raise PlacementError(f"{self.component}: stream needs resident_blocks >= 0 "
                                     f"and prefetch_depth >= 0")
            return "stream"
        if c.params == dev.name or (c.params == "cpu" and dev.name == "cpu"):
            return "resident"
        return "staged"

    # -- context -------------------------------------------------------------------------
    def __enter__(self) -> "Placed":
        try:
            self._prepare()
            self._load()
            self._attach()
        except BaseException as exc:
            teardown_after(self._teardown, exc)
            raise
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        teardown_after(self._teardown, exc)
        return False

    def _prepare(self) -> None:
        self.mode = self._mode()
        by_id = self._tensors()

        def held(dev):                  # weights of this module already on the device
            return sum(t.numel() * t.element_size() for t, _ in by_id.values()
                       if t.device == dev)
        self.target = open_target(self.device, self.budget, self.link, held)
        if self.cplan.params == "disk":
            if not self.weights_file:
                raise PlacementError(f"{self.component}: params=disk needs the model file; "
                                     f"pass weights_file=PATH (.safetensors or .gguf)")
            self.file = open_weight_file(self.weights_file)
        nonblock, block_groups, block_modules = self._groups(by_id)
        self.block_modules = block_modules
        self._split_resident_streamed(by_id, nonblock, block_groups, block_modules)

        # resting copies: what each tensor goes back to (its own data, or for streamed
        # cpu groups a view of the packed host buffer: the module's copy is let go)
        self.originals = {id(t): (t, t.device) for t, _ in by_id.values()}
        self.rest: Dict[int, torch.Tensor] = {id(t): t.data for t, _ in by_id.values()}
        if any(d.is_meta for d in self.rest.values()) and self.cplan.params != "disk":
            raise PlacementError(f"{self.component}: the module's weights are on the meta "
                                 f"device; use params=disk with the model file")
        self.pool = PinnedPool(self.target.is_cuda, self.max_pinned_bytes
                               if self.max_pinned_bytes is not None else default_pinned_cap())
        self.disk_layouts = {id(g): DiskLayout(g, self.file, self.key_map, False)
                             for g in self.resident_groups} if self.file else {}
        if self.host_store is not None and not self.streamed_groups:
            self.host_store.retain(())          # nothing streams from host copies now
        if self.streamed_groups:
            self.streamer = Streamer(self.target, self.streamed_groups,
                                     self.streamed_modules, self._sources(), self.depth,
                                     staging=self.pool.alloc)
        self._info = {
            "mode": self.mode, "resident_blocks": len(block_groups) - len(self.streamed_groups),
            "streamed_blocks": len(self.streamed_groups), "prefetch_depth": self.depth,
            "resident_weight_bytes": sum(g.nbytes for g in self.resident_groups)
            + self.in_place_bytes,
            "streamed_bytes_per_forward": sum(g.nbytes for g in self.streamed_groups),
        }
        if self.file is not None and self.streamed_groups:
            self._info.update(host_blocks=len(self.streamed_groups) - sum(
                r is not None for r in self.streamer.reads), host_stream_bytes=self.host_bytes,
                disk_bytes_per_forward=self.disk_bytes)

    def _tensors(self) -> Dict[int, list]:
        by_id = module_tensors(self.module)
        self.by_name: Dict[str, torch.Tensor] = {n: t for t, names in by_id.values()
                                                 for n in names}
        return by_id

    def _groups(self, by_id):
        """One group per block (tensors shared between blocks go to the non-block group,
        which stays resident). Blocks are found also when nothing streams: their hooks
        let the ledger see the activations."""
        block_list = find_blocks(self.module, self.block_names)
        if self.mode == "stream" and not block_list:
            raise PlacementError(
                f"{self.component}: streaming asked for, but no repeated blocks were "
                f"found in {type(self.module).__name__}; pass blocks=[names]")
        members, rest_ids = group_blocks([block_tensor_ids(b) for _, b in block_list], by_id)

        def group(name, ids):
            return make_group(name, by_id, ids, self.file, self.key_map)

        nonblock = group("non-block", rest_ids) if rest_ids else None
        block_groups = [group(n, m) for (n, _), m in zip(block_list, members) if m]
        block_modules = [b for (_, b), m in zip(block_list, members) if m]
        return nonblock, block_groups, block_modules

    def _split_resident_streamed(self, by_id, nonblock, block_groups, block_modules):
        if self.mode == "stream":
            k = min(self.cplan.stream.resident_blocks, len(block_groups))
            resident = ([nonblock] if nonblock else []) + block_groups[:k]
            self.streamed_groups, self.streamed_modules = block_groups[k:], block_modules[k:]
            self.depth = self.cplan.stream.prefetch_depth
        else:
            resident = [g for g in [nonblock] + block_groups if g]
            self.streamed_groups, self.streamed_modules, self.depth = [], [], 0
        self.in_place_bytes = 0
        if self.mode == "resident" and not self.target.simulated and all(
                t.device == self.target.device for t, _ in by_id.values()):
            # already where the plan wants it (a real device, or cpu): no second copy
            self.in_place_bytes = sum(g.nbytes for g in resident)
            resident, self.mode = [], "in place"
        self.resident_groups = resident

    def _sources(self) -> List[Source]:
        """Where each streamed block is read from: file ranges, or a packed host buffer
        (the module's own copy is let go group by group, so RAM holds the weights once).
        With a host store the buffers are kept for the next placement (hoststore.py).
        params=disk with stream.host_blocks = h: the first h streamed blocks are read from
        the file once into packed host buffers (pinned for CUDA) and stream from RAM;
        the rest are read from the file each forward (mixed residency, RAM before disk)."""
        sources, keys = [], []
        host_left = self.cplan.stream.host_blocks if self.cplan.stream is not None else 0
        for g in self.streamed_groups:
            if self.file is not None:
                layout = DiskLayout(g, self.file, self.key_map, True)
                if host_left > 0:
                    host_left -= 1
                    sources.append(Source(host=self._read_once(g, layout)))
                    continue
                self.disk_bytes += g.nbytes
                sources.append(Source(read=self._counted_read(layout.runs)))
                continue
            host, packed = packed_host(g, [self.rest[id(t)] for t in g.tensors], self.pool,
                                       self.host_store, self.repoint)
            keys.append(group_key(g))
            self.host_pack_bytes += packed
            g.bind(host)
            for t, v in zip(g.tensors, g.views(host)):
                self.rest[id(t)] = v
            if packed and self.host_store is None:
                give_back_freed_host_memory()
            sources.append(Source(host=host))
        if self.host_store is not None:
            self.host_store.retain(keys)
        return sources

    def _read_once(self, g: Group, layout) -> torch.Tensor:
        """A streamed block read from the file into a packed host buffer, once."""
        host = self.pool.alloc(g.nbytes)
        self.file.read_runs(layout.runs, host)
        self.host_bytes += g.nbytes
        self.disk_read_bytes += g.nbytes
        return host

    def _counted_read(self, runs):
        nbytes = sum(n for _, _, n in runs)
        read = partial_read(self.file, runs)

        def counted(buf: torch.Tensor) -> None:
            read(buf)
            self.disk_read_bytes += nbytes      # one reader thread: no race
        return counted

    # -- device memory -------------------------------------------------------------------
    def _load(self) -> None:
        if self.loaded:
            return
        allocated = []
        self.target.ledger.reserve("resident", self.in_place_bytes, "weights in place")
        try:
            for g in self.resident_groups:
                buf = self.target.alloc(g.nbytes, "resident", f"resident {g.name}")
                allocated.append((g, buf))
            if self.streamer is not None:
                self.streamer.allocate()
        except BaseException:
            self.target.free(self.in_place_bytes, "resident")
            for g, _ in allocated:
                self.target.free(g.nbytes, "resident")
            if self.streamer is not None:
                self.streamer.free()
            raise
        self.resident_bufs = allocated
        for g, buf in allocated:
            self._fill_resident(g, buf)
            g.bind(buf)
        self.loaded = True
        self._patch_resident()

    def _fill_resident(self, g: Group, buf: torch.Tensor) -> None:
        self.target.ledger.count_h2d(g.nbytes)
        host = self.resident_host.get(id(g))
        if host is not None:            # one copy from the packed (pinned) host copy
            buf.copy_(host, non_blocking=buf.device.type == "cuda" and host.is_pinned())
            return
        layout = self.disk_layouts.get(id(g))
        if layout is None:
            g.pack(buf, [self.rest[id(t)] for t in g.tensors])
            return
        views = g.views(buf)
        for i in layout.from_module:
            src = self.rest[id(g.tensors[i])]
            if src.is_meta:
                raise PlacementError(f"{self.component}: {g.names[i][0]!r} is not in the "
                                     f"weights file and the module holds no value for it")
            views[i].copy_(src)
        if buf.device.type == "cpu":
            self.file.read_runs(layout.runs, buf)
            return
        staging = self.pool.alloc(min(DISK_CHUNK, g.nbytes))
        for f_off, b_off, n in layout.runs:
            done = 0
            while done < n:
                m = min(staging.numel(), n - done)
                self.file.read_runs([(f_off + done, 0, m)], staging)
                buf[b_off + done:b_off + done + m].copy_(staging[:m])
                done += m
        torch.cuda.synchronize(buf.device)

    def _unload(self) -> None:
        """Give the device memory back; tensors point at their resting copies."""
        if not self.loaded:
            return
        try:
            if self.streamer is not None:
                self.streamer.free()      # a failed copy surfaces here, after its frees
        finally:
            self.target.free(self.in_place_bytes, "resident")
            for g, _ in self.resident_bufs:
                self.target.free(g.nbytes, "resident")
            self.resident_bufs = []
            put_back((t, self.rest[id(t)], None) for t, _ in self.originals.values())
            if self.target.is_cuda:
                torch.cuda.synchronize(self.target.device)
            self.loaded = False

    # -- runtime LoRA ---------------------------------------------------------------------
    def set_lora(self, patches) -> None:
        """{weight name: [(down, up, alpha, strength), ...]}; {} removes all. Applied to the
        device copies only: streamed blocks on arrival, resident weights now (refilled
        from their resting copy first, so earlier patches do not accumulate)."""
        from .lora import GroupPatches, resolve
        resolved = resolve(patches, self.by_name, self.target.device)
        nbytes = sum(x.numel() * x.element_size() for _, p in resolved.values()
                     for d, u, _, _ in p for x in (d, u))
        self.target.ledger.reserve("resident", nbytes, "LoRA patches")
        self.target.free(self._lora_bytes, "resident")
        self._lora_bytes = nbytes
        touched = set(self._lora) | set(resolved)
        self._lora = resolved
        streamed_index = {id(t): gi for gi, g in enumerate(self.streamed_groups)
                          for t in g.tensors}
        per_group: Dict[int, list] = {}
        for tid, (t, p) in resolved.items():
            if tid in streamed_index:
                per_group.setdefault(streamed_index[tid], []).append((t, p))
        self._streamed_patches = {gi: GroupPatches([t for t, _ in v], [p for _, p in v])
                                  for gi, v in per_group.items()}
        if self.streamer is not None:
            self.streamer.on_arrive = [self._patch_arrived] if self._streamed_patches else []
        if self.loaded:
            for g, buf in self.resident_bufs:
                if any(id(t) in touched for t in g.tensors):
                    self._fill_resident(g, buf)
            self._patch_resident()

    def _patch_resident(self) -> None:
        from .lora import apply_in_place
        streamed = {id(t) for g in self.streamed_groups for t in g.tensors}
        for tid, (t, p) in self._lora.items():
            if tid not in streamed:
                apply_in_place(t.data, p)

    def _patch_arrived(self, gi: int) -> None:
        patches = self._streamed_patches.get(gi)
        if patches is not None:
            patches.apply()

    def release(self) -> None:
        """Drop resident blocks and slots from the device (before VAE decode, on unload);
        the next forward loads them again, each resident group in one copy from its
        packed host copy (streamed blocks stream from theirs as before)."""
        self._unload()
        self._pack_resident_host()

    def _pack_resident_host(self) -> None:
        """Resident groups that rest in host memory get one packed host buffer each
        (pinned on CUDA within the cap; with a host store the store's, pageable, so the
        caller's tensors can be pointed into it), which becomes their resting copy: the
        tensors' former storage is let go, so RAM still holds the weights once. Done at the first release, not at entry: a placement
        that never releases pays no pack."""
        for g in self.resident_groups:
            if id(g) in self.resident_host or id(g) in self.disk_layouts:
                continue
            sources = [self.rest[id(t)] for t in g.tensors]
            if any(s.device.type != "cpu" or s.is_meta for s in sources):
                continue                # not host memory: nothing to pack from
            if self.host_store is not None:     # pageable: the caller's tensors are
                host, packed = self.host_store.host_for(   # pointed into it, one copy
                    g, sources, lambda n: (torch.empty(n, dtype=torch.uint8), False),
                    self.repoint)
            else:
                host, packed = packed_host(g, sources, self.pool, None)
            self.host_pack_bytes += packed
            self.resident_host[id(g)] = host
            g.bind(host)                # the module lets go of its former storage
            for t, v in zip(g.tensors, g.views(host)):
                self.rest[id(t)] = v
            if packed and self.host_store is None:
                give_back_freed_host_memory()

    # -- hooks ---------------------------------------------------------------------------
    def _attach(self) -> None:
        m = self.module
        self._handles.append(m.register_forward_pre_hook(self._root_pre, with_kwargs=True))
        self._handles.append(m.register_forward_hook(self._root_post))
        for b in self.block_modules:
            self._handles.append(b.register_forward_pre_hook(self._block_pre, with_kwargs=True))
        if self.streamer is not None:
            self.streamer.attach()

    def _root_pre(self, module, args, kwargs):
        if not self.loaded:
            # a reload after release() may happen under the caller's inference mode
            # (ComfyUI samples in it); device buffers must be normal tensors that the
            # copy worker can write
            with torch.inference_mode(False):
                self._load()
        self._root_in = seen_bytes(args, kwargs)
        self.target.ledger.set_activations(self._root_in, "forward inputs")
        if self.streamer is not None:
            self.streamer.begin_forward()
        if self.target.is_cuda:
            dev = self.target.device
            return to_device(args, dev), to_device(kwargs, dev)
        return None

    def _block_pre(self, module, args, kwargs):
        self.target.ledger.set_activations(self._root_in + seen_bytes(args, kwargs),
                                           "block activations")
        return None

    def _root_post(self, module, args, output):
        if self.streamer is not None:
            self.streamer.end_forward()
        self.target.ledger.set_activations(0)
        return None

    # -- exit ----------------------------------------------------------------------------
    def _teardown(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
        if self.streamer is not None:
            self.streamer.detach()
        try:
            if self.target is not None:
                try:
                    self._unload()
                    self.target.free(self._lora_bytes, "resident")
                    self._lora_bytes = 0
                finally:
                    self._final_stats = self._stats_now()
                    self.target.close()
        finally:
            self._restore()
            if self.file is not None:
                self.file.close()
            self.target = None

    def _restore(self) -> None:
        originals, self.originals = getattr(self, "originals", {}), {}
        put_back((t, self.rest[id(t)], device) for t, device in originals.values())

    # -- stats ---------------------------------------------------------------------------
    def _stats_now(self) -> dict:
        dev = self.target.ledger.stats()
        out = {"devices": {self.target.name: dev}, "hops": 0, "hop_bytes": 0}
        out.update(self._info)
        pool = getattr(self, "pool", None)
        out["pinned_bytes"] = pool.pinned_bytes if pool is not None else 0
        out["pageable_host_bytes"] = pool.pageable_bytes if pool is not None else 0
        if pool is not None and pool.warning:
            out["pinned_warning"] = pool.warning
        out["host_pack_bytes"] = self.host_pack_bytes
        if self.file is not None and getattr(self, "streamed_groups", None):
            out["disk_read_bytes"] = self.disk_read_bytes
        if self.streamer is not None:
            out["prefetched_ahead_bytes"] = self.streamer.ahead_bytes
        return out

    def stats(self) -> dict:
        if self.target is None:
            if self._final_stats is None:
                raise PlacementError("stats() before the placement was entered")
            return self._final_stats
        return self._stats_now()


def partial_read(file, runs):
    def read(buf: torch.Tensor) -> None:
        file.read_runs(runs, buf)
    return read
