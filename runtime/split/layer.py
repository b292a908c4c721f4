"""Layer split: contiguous block ranges per device; activations hop at range boundaries.

The main device (first in the runtime list) holds the non-block weights and runs the
module's own code, so inputs and outputs live there. Ranges come from the plan
(ComponentPlan.blocks) or, when it gives none, in proportion to each device's budget
minus headroom (placement.ranges). A device whose range does not fit its budget keeps
a prefix of its range resident and streams the rest through its own ring
(runtime/stream.Streamer on that device's Target), when the plan asks for streaming.

Per block the hot path is one pre-hook bound to precomputed values (device index,
ledger, whether it enters a range): bring the arguments, note the activations.
"""
import threading
import warnings
from functools import partial
from typing import Dict, List

import torch

from ...placement.errors import PlacementError
from ...placement.layout import group_blocks, resident_prefix, ring_bytes
from ...placement.ranges import proportional_ranges
from ...placement.units import format_bytes
from ..blocks import block_tensor_ids, find_blocks
from ..residency import PinnedPool, default_pinned_cap, give_back_freed_host_memory
from ..weightfile import DiskLayout, open_weight_file
from ..hoststore import group_key, packed_host
from ..stream import Source, Streamer
from ..tensors import make_group, seen_bytes, to_device
from .base import SplitBase
from .disk import fill_from_file, reader


def ranges_to_owner(ranges: Dict[str, List[int]], names: List[str], n: int):
    """{device: [first, last]} -> device index per block, or None when the ranges do not
    cover 0..n-1 exactly once with devices of the runtime list."""
    owner = [-1] * n
    for dev, (first, last) in ranges.items():
        if dev not in names or not 0 <= first <= last < n:
            return None
        for i in range(first, last + 1):
            if owner[i] != -1:
                return None
            owner[i] = names.index(dev)
    return None if -1 in owner else owner


def streamed_split(sizes: List[int], room: int, depth: int):
    """Largest resident prefix k of a range so that prefix + the ring fit `room`.
    Returns k, or None when not even an all-streamed range fits."""
    return resident_prefix(sizes, room, depth)


class LayerSplit(SplitBase):
    mode = "layer"
    _pipelined = False      # pipeline.py: a forward's shares end each stage's ring forward
    _hop_lock = threading.Lock()     # hop counting only: boundaries are few per forward

    def _prepare(self) -> None:
        if self.lora is not None:
            raise PlacementError(f"{self.component}: lora= is applied by row split; a layer "
                                 f"split keeps blocks whole, patch the module as usual")
        block_list = find_blocks(self.module, self.block_names)
        if not block_list:
            raise PlacementError(f"{self.component}: layer split needs repeated blocks, none "
                                 f"found in {type(self.module).__name__}; pass blocks=[names]")
        by_id = self._capture()
        if self.cplan.params == "disk":
            self.file = open_weight_file(self.weights_file)
        members, rest = group_blocks([block_tensor_ids(b) for _, b in block_list], by_id)
        kept = [(n, b, m) for (n, b), m in zip(block_list, members) if m]
        self.block_modules = [b for _, b, _ in kept]
        groups = [make_group(n, by_id, m, self.file, self.key_map) for n, _, m in kept]
        nonblock = make_group("non-block", by_id, rest, self.file, self.key_map) \
            if rest else None
        nonblock_bytes = nonblock.nbytes if nonblock else 0

        self.owner = self._ranges(groups, nonblock_bytes)
        n_dev = len(self.targets)
        self.ranges = {}
        for i, d in enumerate(self.owner):
            name = self.runtime[d]
            self.ranges.setdefault(name, [i, i])[1] = i

        stream = self.cplan.stream
        depth = max(0, stream.prefetch_depth) if stream is not None else 0
        self.resident = [[] for _ in range(n_dev)]
        if nonblock:
            self.resident[0].append(nonblock)
        self.streamers: List[Streamer] = []
        self.streamed_blocks = {}
        self.pool = PinnedPool(any(t.is_cuda for t in self.targets),
                               self.max_pinned_bytes if self.max_pinned_bytes is not None
                               else default_pinned_cap())
        kept_keys, pending = [], []
        self.host_stream_bytes = self.disk_bytes = self.host_blocks = 0
        self.disk_read_bytes = 0          # bytes read from the file for streamed blocks
        planned_k = self.fit_info.get("stream_per_device") or {}
        for d, t in enumerate(self.targets):
            idx = [i for i, o in enumerate(self.owner) if o == d]
            sizes = [groups[i].nbytes for i in idx]
            room = t.ledger.capacity - self.headroom[d] - (nonblock_bytes if d == 0 else 0)
            k = self._planned_prefix(planned_k.get(t.name), sizes, room, depth, stream)
            if k is None:
                if not idx or sum(sizes) <= room:
                    k = len(idx)
                else:
                    where = (f"{t.name}'s blocks {idx[0]}-{idx[-1]} need "
                             f"{format_bytes(sum(sizes))} but its budget leaves "
                             f"{format_bytes(max(0, room))}")
                    if stream is None:
                        raise PlacementError(f"{self.component}: {where}; turn on "
                                             f"stream_layers or give {t.name} fewer blocks")
                    k = streamed_split(sizes, room, depth)
                    if k is None:
                        raise PlacementError(f"{self.component}: {where}, too little even to "
                                             f"stream them (a ring of "
                                             f"{format_bytes(ring_bytes(sizes, depth))}); "
                                             f"raise its budget")
            self.resident[d] += [groups[i] for i in idx[:k]]
            streamed = idx[k:]
            if not streamed:
                continue
            if self.cplan.params not in ("cpu", "disk"):
                raise PlacementError(f"{self.component}: streaming part of {t.name}'s range "
                                     f"needs params=cpu or disk, the plan has params="
                                     f"{self.cplan.params}")
            pending.append((t, streamed))

        # params=disk, stream.host_blocks = h: the first h streamed blocks in execution
        # order are read from the file once into host RAM, the rest every forward
        h = stream.host_blocks if stream is not None and self.file is not None else 0
        in_ram = set(sorted(i for _, streamed in pending for i in streamed)[:h])
        for t, streamed in pending:
            sources = []
            for i in streamed:
                if self.file is not None:
                    layout = DiskLayout(groups[i], self.file, self.key_map, True)
                    if i in in_ram:
                        host = self.pool.alloc(groups[i].nbytes)
                        self.file.read_runs(layout.runs, host)
                        self.host_stream_bytes += groups[i].nbytes
                        self.disk_read_bytes += groups[i].nbytes
                        sources.append(Source(host=host))
                    else:
                        self.disk_bytes += groups[i].nbytes
                        sources.append(Source(read=self._counted(reader(self.file, layout.runs),
                                                                 groups[i].nbytes)))
                    continue
                host, packed = packed_host(groups[i],
                                           [self._resting(x) for x in groups[i].tensors],
                                           self.pool, self.host_store, self.repoint)
                kept_keys.append(group_key(groups[i]))
                self.host_pack_bytes += packed
                # one host copy: the group's tensors rest in the packed buffer from now on
                # (what place.py does), so the module's former storage is let go
                for x, v in zip(groups[i].tensors, groups[i].views(host)):
                    self.originals[id(x)] = (x, v)
                if packed and self.host_store is None:
                    give_back_freed_host_memory()
                sources.append(Source(host=host))
            self.streamers.append(Streamer(t, [groups[i] for i in streamed],
                                           [self.block_modules[i] for i in streamed],
                                           sources, depth, staging=self.pool.alloc))
            self.streamed_blocks[t.name] = len(streamed)
        self.host_blocks = len(in_ram)

        if self.host_store is not None:
            self.host_store.retain(kept_keys)     # groups this placement does not stream
        # boundaries: main -> first range ... -> last range -> main
        self.entry = [self.owner[i] != (self.owner[i - 1] if i else 0)
                      for i in range(len(self.owner))]
        self.exit_needed = self.owner[-1] != 0
        self.boundaries = sum(self.entry) + int(self.exit_needed)

    def _counted(self, read, nbytes: int):
        def counted(buf) -> None:
            read(buf)
            self.disk_read_bytes += nbytes      # one reader thread per device
        return counted

    def _planned_prefix(self, planned, sizes, room, depth, stream):
        """auto-fit's resident prefix for this device's range ([resident, of blocks]),
        when it has one that matches the range and fits; None: decide here."""
        if stream is None or not planned or not sizes:
            return None
        k, of = int(planned[0]), int(planned[1])
        if of != len(sizes) or not 0 <= k <= of:
            warnings.warn(f"{self.component}: the plan's stream prefix {planned} does not "
                          f"match a range of {len(sizes)} blocks; sized from the budget",
                          RuntimeWarning, stacklevel=5)
            return None
        if sum(sizes[:k]) + ring_bytes(sizes[k:], depth) > room:
            warnings.warn(f"{self.component}: the plan keeps {k} of {of} blocks resident, "
                          f"which does not fit the budget here; sized from the budget",
                          RuntimeWarning, stacklevel=5)
            return None
        return k

    def _ranges(self, groups, nonblock_bytes: int) -> List[int]:
        n = len(groups)
        if self.cplan.blocks:
            owner = ranges_to_owner(self.cplan.blocks, self.runtime, n)
            if owner is not None:
                return owner
            warnings.warn(f"{self.component}: the plan's block ranges {self.cplan.blocks} do "
                          f"not match the module's {n} blocks; ranges recomputed in "
                          f"proportion to the budgets", RuntimeWarning, stacklevel=4)
        weights = self.share_weights(nonblock_bytes)
        ranges = proportional_ranges([g.nbytes for g in groups], self.runtime, weights)
        return ranges_to_owner(ranges, self.runtime, n)

    # -- memory beyond resident groups -------------------------------------------------
    def _fill(self, g, buf) -> None:
        if self.file is None:
            return super()._fill(g, buf)
        layouts = self.__dict__.setdefault("_layouts", {})
        if id(g) not in layouts:
            layouts[id(g)] = DiskLayout(g, self.file, self.key_map, False)
        fill_from_file(self.file, layouts[id(g)], g, buf, self._resting, self.pool.alloc)

    def _allocate_more(self) -> None:
        for s in getattr(self, "streamers", []):
            s.allocate()

    def _free_more(self) -> None:
        for s in getattr(self, "streamers", []):
            if s.allocated:
                s.free()

    # -- hooks --------------------------------------------------------------------------
    def _attach(self) -> None:
        m = self.module
        self._handles.append(m.register_forward_pre_hook(self._root_pre, with_kwargs=True))
        self._handles.append(m.register_forward_hook(self._root_post))
        last = len(self.block_modules) - 1
        for i, (block, d) in enumerate(zip(self.block_modules, self.owner)):
            ledger = self.targets[d].ledger
            pre = partial(self._block_pre, d, self.entry[i], ledger)
            self._handles.append(block.register_forward_pre_hook(pre, with_kwargs=True))
            if i == last and self.exit_needed:
                self._handles.append(block.register_forward_hook(partial(self._block_exit, d)))
            elif d != 0 and self.mover.simulated:
                self._handles.append(block.register_forward_hook(partial(self._block_tag, d)))
        for s in self.streamers:
            s.attach()

    def _detach(self) -> None:
        super()._detach()
        for s in getattr(self, "streamers", []):
            s.detach()

    def _root_pre(self, module, args, kwargs):
        if not self.loaded:
            # a reload after release() may happen under the caller's inference mode
            # (ComfyUI samples in it); device buffers must be normal tensors that the
            # copy worker can write
            with torch.inference_mode(False):
                self._load()
        self.mover.end_forward()              # a forward stopped midway left copies
        self._root_in = seen_bytes(args, kwargs)
        self.targets[0].ledger.set_activations(self._root_in, "forward inputs")
        for s in self.streamers:
            s.begin_forward()
        if not self.mover.simulated:
            main = self.targets[0].device
            return to_device(args, main), to_device(kwargs, main)
        return None

    def _block_pre(self, d, entry, ledger, module, args, kwargs):
        mover = self.mover
        copies, mover.served = mover.copies, 0
        args, kwargs = mover.bring(args, d), mover.bring(kwargs, d)
        if entry and mover.copies != copies:
            self._hop()
        base = mover.cache_bytes[d] - mover.served + (self._root_in if d == 0 else 0)
        ledger.set_activations(base + seen_bytes(args, kwargs), "block activations")
        return args, kwargs

    def _hop(self) -> None:
        with self._hop_lock:                # pipelined shares cross boundaries at once
            self.hops += 1

    def _block_tag(self, d, module, args, output):
        self.mover.tag_outputs(output, d)
        return None

    def _block_exit(self, d, module, args, output):
        if self.mover.simulated:
            self.mover.tag_outputs(output, d)
        copies = self.mover.copies
        output = self.mover.bring(output, 0)
        if self.mover.copies != copies:
            self._hop()
        return output

    def _root_post(self, module, args, output):
        if not self._pipelined:
            for s in self.streamers:
                s.end_forward()
        for t in self.targets:
            t.ledger.set_activations(0)
        copies = self.mover.copies
        output = self.mover.bring(output, 0)     # a tensor that skipped the exit hook
        if self.mover.copies != copies:
            self._hop()
        self.mover.end_forward()
        self.forwards += 1
        return output

    def _more_stats(self) -> dict:
        return {"ranges": dict(getattr(self, "ranges", {})),
                "boundaries": getattr(self, "boundaries", 0),
                "streamed_blocks": dict(getattr(self, "streamed_blocks", {})),
                "host_blocks": getattr(self, "host_blocks", 0),
                "host_stream_bytes": getattr(self, "host_stream_bytes", 0),
                "disk_bytes_per_forward": getattr(self, "disk_bytes", 0),
                "disk_read_bytes": getattr(self, "disk_read_bytes", 0)}
