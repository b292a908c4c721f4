"""The staged block engine: a module's repeated blocks cut into contiguous stages, one per
runtime device. One device is the one-stage case (one_device.py's `Placed`); several are the
layer split (split/layer.py), whose activations hop at the stage boundaries.

Per stage: the non-block weights rest on the first (main) device, which runs the
module's own code; the first K blocks of each stage are resident and the rest stream
through that device's byte ring (runtime/stream.Streamer, where a block arrives). The
block grouping and the ring's arithmetic are placement/layout.py's, the same the
planner prices. A streamed block rests in one packed host buffer (the module's storage
is let go: one host copy), or in the weights file: read once into host RAM for the first
`stream.host_blocks` streamed blocks in execution order, every forward for the rest.

Subclasses decide who owns each block (`_owner`) and how many of a stage's blocks stay
resident (`_prefix`); everything else is here.
"""
import threading
from typing import List, Optional

import torch

from ...placement.errors import PlacementError
from ...placement.layout import group_blocks
from ..blocks.crossings import JoinsFollow, home_modules, hook_home
from ..blocks.entry import BlockEvents
from ..blocks.find import block_tensor_ids, find_blocks
from ..blocks.module_tensors import make_group, seen_bytes, to_device
from ..host.hoststore import group_key
from ..host.residency import give_back_freed_host_memory
from ..weights.weightfile import DiskLayout, open_weight_file
from .core import Engine
from .stream import Source, Streamer


class StagedEngine(Engine):
    _pipelined = False      # split/pipeline.py: a forward's shares end each ring's forward

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # hop counting only (pipelined shares cross boundaries at once): this placement's
        # own, so placements on other threads never wait on each other
        self._hop_lock = threading.Lock()

    # -- what subclasses decide ---------------------------------------------------------
    def _needs_blocks(self) -> bool:
        return True

    def _no_blocks(self) -> PlacementError:
        return PlacementError(f"{self.component}: no repeated blocks found in "
                              f"{type(self.module).__name__}; pass blocks=[names]")

    def _owner(self, groups, nonblock_bytes: int) -> List[int]:
        """Device index per block."""
        raise NotImplementedError

    def _prefix(self, d: int, sizes: List[int], room: int, depth: int) -> int:
        """How many of stage d's blocks stay resident (the rest stream)."""
        raise NotImplementedError

    def _depth(self) -> int:
        stream = self.cplan.stream
        return max(0, stream.prefetch_depth) if stream is not None else 0

    # -- prepare ------------------------------------------------------------------------
    def _prepare(self, by_id) -> None:
        block_list = find_blocks(self.module, self.block_names)
        if not block_list and self._needs_blocks():
            raise self._no_blocks()
        if self.cplan.params == "disk":
            if not self.weights_file:
                raise PlacementError(f"{self.component}: params=disk needs the model file; "
                                     f"pass weights_file=PATH (.safetensors or .gguf)")
            self.file = open_weight_file(self.weights_file)
        self._check_not_meta()
        members, rest = group_blocks([block_tensor_ids(b) for _, b in block_list], by_id)
        kept = [(n, b, m) for (n, b), m in zip(block_list, members) if m]
        self.block_modules = [b for _, b, _ in kept]
        self.block_labels = [n for n, _, _ in kept]
        groups = [make_group(n, by_id, m, self.file, self.key_map) for n, _, m in kept]
        nonblock = make_group("non-block", by_id, rest, self.file, self.key_map) \
            if rest else None
        nonblock_bytes = nonblock.nbytes if nonblock else 0

        self.owner = self._owner(groups, nonblock_bytes) if groups else []
        self.ranges = {}
        for i, d in enumerate(self.owner):
            self.ranges.setdefault(self.runtime[d], [i, i])[1] = i
        self.depth = depth = self._depth()
        self.resident = [[] for _ in self.targets]
        if nonblock:
            self.resident[0].append(nonblock)
        pending = []                    # (device index, streamed block indices)
        for d, t in enumerate(self.targets):
            idx = [i for i, o in enumerate(self.owner) if o == d]
            sizes = [groups[i].nbytes for i in idx]
            room = t.ledger.capacity - self.headroom[d] - (nonblock_bytes if d == 0 else 0)
            k = self._prefix(d, sizes, room, depth) if idx else 0
            self.resident[d] += [groups[i] for i in idx[:k]]
            if idx[k:]:
                if self.cplan.params not in ("cpu", "disk"):
                    raise PlacementError(f"{self.component}: streaming part of {t.name}'s "
                                         f"blocks needs params=cpu or disk, the plan has "
                                         f"params={self.cplan.params}")
                pending.append((d, idx[k:]))
        self._make_streamers(groups, pending)
        if self.file is not None:
            self.disk_layouts = {id(g): DiskLayout(g, self.file, self.key_map, False)
                                 for g in self.resident_groups}
        # boundaries: main -> first range ... -> last range -> main
        self.entry = [self.owner[i] != (self.owner[i - 1] if i else 0)
                      for i in range(len(self.owner))]
        self.exit_needed = bool(self.owner) and self.owner[-1] != 0
        self.boundaries = sum(self.entry) + int(self.exit_needed)
        # the non-block modules holding weights of their own (on the main device): a
        # split brings their arguments home (crossings.py); names, so a rehearsal on a
        # copy of the module (first_call.py) hooks the same ones
        self.home_names = [] if self.mover is None else [
            n for n, _ in home_modules(self.module, self.block_modules,
                                       lambda t: id(t) in self.originals)]

    def _make_streamers(self, groups, pending) -> None:
        """One streamer per stage with streamed blocks, each block's Source: its packed
        host copy (one host copy: the module's storage is let go), or the weights file,
        read once into host RAM for the first `stream.host_blocks` streamed blocks in
        execution order (RAM before disk), every forward for the rest."""
        stream = self.cplan.stream
        h = stream.host_blocks if stream is not None and self.file is not None else 0
        in_ram = set(sorted(i for _, streamed in pending for i in streamed)[:h])
        self.host_blocks = len(in_ram)
        self.host_stream_bytes = self.disk_bytes = self.disk_read_bytes = 0
        self.streamed_blocks = {}
        self.arrivals = [None] * len(groups)     # block -> (its streamer, index in it)
        kept_keys = []
        for d, streamed in pending:
            sources = []
            for i in streamed:
                g = groups[i]
                if self.file is not None:
                    layout = DiskLayout(g, self.file, self.key_map, True)
                    if i in in_ram:
                        host = self.pool.alloc(g.nbytes)
                        self.file.read_runs(layout.runs, host)
                        self.host_stream_bytes += g.nbytes
                        self.disk_read_bytes += g.nbytes
                        sources.append(Source(host=host))
                    else:
                        self.disk_bytes += g.nbytes
                        sources.append(Source(read=self._counted_read(layout.runs, g.nbytes)))
                    continue
                host, packed = self.store.host_for(g, [self._resting(x) for x in g.tensors],
                                                   self.pool.alloc_flagged, self.repoint)
                kept_keys.append(group_key(g))
                self.host_pack_bytes += packed
                self._rest_in(g, host)
                if packed and self.host_store is None:
                    give_back_freed_host_memory()
                sources.append(Source(host=host))
            streamer = Streamer(self.targets[d], [groups[i] for i in streamed], sources,
                                self.depth, staging=self.pool.alloc,
                                fallbacks=self.fallbacks)
            self.streamers.append(streamer)
            for j, i in enumerate(streamed):
                self.arrivals[i] = (streamer, j)
            self.streamed_blocks[self.targets[d].name] = len(streamed)
        self.store.retain(kept_keys)        # drops groups this placement does not stream

    def _counted_read(self, runs, nbytes: int):
        file = self.file

        def read(buf: torch.Tensor) -> None:
            file.read_runs(runs, buf)
            self.disk_read_bytes += nbytes      # one reader thread per device
        return read

    # -- hooks --------------------------------------------------------------------------
    def _attach(self) -> None:
        m = self.module
        self._guard_forward()
        self._handles.append(m.register_forward_pre_hook(self._root_pre, with_kwargs=True))
        self._handles.append(m.register_forward_hook(self._root_post))
        # inputs go to the main device on real hardware (a simulated device is host memory)
        self._move_inputs = self.targets[0].is_cuda if self.mover is None \
            else not self.mover.simulated
        # blocks are entered by whatever runs them (units.py): their own forward, or the
        # first of their layers when a container's forward is never called
        events = self.events = BlockEvents(self.block_modules)
        events.on_enter += self._enter_listeners()
        if self.arrivals:
            events.on_enter.append(self._arrive)
        if self.mover is None:              # one stage: note the activations, nothing hops
            events.on_call.append(self._stage_call)
        else:
            self._last_block = len(self.block_modules) - 1
            self._visit = threading.local()     # where the last block ran (this thread's)
            # what crossed, by where: {kind: {"hops", "bytes"}} (`_crossed`)
            self.crossings = {}
            events.on_call.append(self._block_call)
            events.on_output.append(self._block_out)
            self._handles += hook_home([m.get_submodule(n) for n in self.home_names],
                                       self._home_call)
        if self.cuda_devices:
            events.on_enter.append(self._current_device)
        meter = self.check.meter if self.check is not None else None
        if meter is not None and self.mover is not None:
            owner = self.owner           # the working memory is charged where it computes
            events.on_enter.append(lambda gi: self._compute_on(owner[gi]))
        events.attach()
        self._handles.append(events)

    def _enter_listeners(self) -> list:
        """Subclasses: listeners that must see a block's entry before its arrival."""
        return []

    def _arrive(self, gi: int) -> None:
        hit = self.arrivals[gi]
        if hit is not None:
            hit[0].arrive(hit[1])

    def _root_pre(self, module, args, kwargs):
        if not self.loaded:
            # a reload after release() may happen under the caller's inference mode
            # (ComfyUI samples in it); device buffers must be normal tensors that the
            # copy worker can write
            with torch.inference_mode(False):
                self._load()
        if self.mover is not None:
            self.mover.end_forward()          # a forward stopped midway left copies
            self._visit.last, self._visit.inside = 0, False
        self._root_in = seen_bytes(args, kwargs)
        self.targets[0].ledger.set_inputs(self._root_in)
        self._compute_on(0)
        self._moved_at = self._moved_now()
        for s in self.streamers:
            s.begin_forward()
        self.events.begin_forward()
        if self._move_inputs:
            main = self.targets[0].device
            return to_device(args, main), to_device(kwargs, main)
        return None

    def _stage_call(self, gi, args, kwargs):
        self.targets[0].ledger.set_activations(self._root_in + seen_bytes(args, kwargs),
                                               "block activations")
        return None

    def _block_call(self, gi, args, kwargs):
        d = self.owner[gi]
        mover = self.mover
        before, mover.served = mover.moved_here(), 0
        args, kwargs = mover.bring_block_args(args, kwargs, d)
        visit = self._visit
        # a hop: what crossed into a range's first block, or into a block after the
        # module's own code or another device's block ran (an order other than the
        # blocks' own: Lumina2 runs its context refiner before its noise refiner); the
        # bytes a later block of the range pulls over are no hop of their own
        if self.entry[gi] or getattr(visit, "last", 0) != d:
            self._crossed(before, "boundaries")
        else:
            self._crossed(before, "inside_ranges", hop=False)
        visit.last, visit.inside = d, True
        base = mover.cache_bytes[d] - mover.served + (self._root_in if d == 0 else 0)
        self.targets[d].ledger.set_activations(base + seen_bytes(args, kwargs),
                                               "block activations")
        return args, kwargs

    def _home_call(self, module, args, kwargs=None):
        """A non-block module is called (its weights are on the main device): its
        arguments a block on another device made are brought to the main device. Called
        without kwargs: the placement was left while torch was running this module's
        pre-hooks (ComfyUI asked for the memory inside the call; torch had already listed
        the hooks, and removing the handle dropped its with-kwargs mark): nothing to do."""
        if kwargs is None:
            return None
        self._visit.last = 0                # the module's own code runs on the main device
        if self.cuda_devices:
            self._on_main()
        mover = self.mover
        before = mover.moved_here()
        args, kwargs = mover.bring_within(args, 0), mover.bring_within(kwargs, 0)
        if not self._crossed(before, "non_block_modules"):
            return None
        return args, kwargs

    def _on_main(self) -> None:
        device = self.targets[0].device
        if device.type == "cuda" and torch.cuda.current_device() != device.index:
            torch.cuda.set_device(device)

    def _joins(self):
        """A layer split: the module's own joins (torch.cat of two devices' tensors)
        bring their tensors to one device (crossings.JoinsFollow), in the forward guard.
        The mode intercepts every torch function of the forward (about 10 us each on a
        CPU, some 10% of a small Flux's step), so it stays on after the first forward only
        where a join crossed in it (Lumina2, Z-Image); elsewhere the later forwards, the
        same code on the same shapes, run without it (`joins_watched` in the stats)."""
        if self.mover is None or not getattr(self, "joins_watched", True):
            return None
        return JoinsFollow(self._join_follow)

    def _join_follow(self, x, like):
        # inside a block everything is on the block's device (its arguments were brought);
        # a simulated device tags a block's outputs only as it returns, so the mover
        # cannot tell where the block's own intermediates are: left alone
        if getattr(self._visit, "inside", False):
            return x
        return self.follow(x, like, "joins")

    def _crossed(self, before, kind: str, hop: bool = True) -> bool:
        """Whether this thread copied anything since `before` (mover.moved_here()); if
        so, one hop (unless `hop` is False), and the hop and its bytes under `kind` in the
        stats' `crossings`, whose bytes add up to hop_bytes."""
        copies, nbytes = self.mover.moved_here()
        if copies == before[0]:
            return False
        with self._hop_lock:                # pipelined shares cross boundaries at once
            crossed = self.crossings.setdefault(kind, {"hops": 0, "bytes": 0})
            crossed["bytes"] += nbytes - before[1]
            if hop:
                self.hops += 1
                crossed["hops"] += 1
        return True

    def _bring_counted(self, x, d: int, kind: str = "boundaries"):
        """`x` brought to device d; one hop when anything crossed."""
        before = self.mover.moved_here()
        x = self.mover.bring(x, d)
        self._crossed(before, kind)
        return x

    def _block_out(self, gi, output, last):
        d = self.owner[gi]
        if d != 0 and self.mover.simulated:
            self.mover.tag_outputs(output, d)
        if last:        # the module's own code runs next, on the main device (Kandinsky5
            self._compute_on(0)     # embeds its latent between its text and visual blocks)
            self._visit.inside = False
        if gi == self._last_block and last and self.exit_needed:
            return self._bring_counted(output, 0)
        return None

    @property
    def crosses_devices(self) -> bool:
        return self.mover is not None

    def follow(self, x, like, kind: str = "follow"):
        """`x` brought to the device `like` is on (a caller's skip connection: ComfyUI's
        UNet concatenates an input block's output with an output block's input)."""
        if self.mover is None:
            return x
        d = self.mover.index_of(like)
        return x if d < 0 else self._bring_counted(x, d, kind)

    def _current_device(self, gi: int) -> None:
        """On CUDA, a block computes with its own device current, so kernels that bind a
        workspace to the current device (fp8/int8 kernels) run on the right GPU."""
        device = self.targets[self.owner[gi]].device
        if device.type == "cuda" and torch.cuda.current_device() != device.index:
            torch.cuda.set_device(device)

    def _compute_on(self, d: int) -> None:
        """Where the working memory is charged from now on (simulated devices)."""
        if self.check is not None and self.check.meter is not None:
            self.check.meter.set_device(d)

    def _root_post(self, module, args, output):
        learned = self.events.learning
        self.events.end_forward()
        if learned and self.events.never_ran:
            self._say_never_ran()
        if self.streamers:
            now, at = self._moved_now(), getattr(self, "_moved_at", (0, 0))
            self.moved_per_forward = (now[0] - at[0], now[1] - at[1])
        if not self._pipelined:
            for s in self.streamers:
                s.end_forward()
        for t in self.targets:
            t.ledger.set_activations(0)
        self.forwards += 1
        if self.mover is None:
            return None
        if learned:                         # the first forward: did any join cross?
            self.joins_watched = "joins" in self.crossings
        output = self._bring_counted(output, 0)     # a tensor that skipped the exit hook
        self.mover.end_forward()
        return output

    # -- what ran -------------------------------------------------------------------------
    def _moved_now(self):
        """(bytes, bytes read from the file) of every streamed block that arrived so far."""
        return (sum(s.arrived_bytes for s in self.streamers),
                sum(s.arrived_disk_bytes for s in self.streamers))

    def _say_never_ran(self) -> None:
        """Blocks the first forward never entered: named once per placement; what moves
        per forward is counted as it arrives, so they count in no per-forward figure."""
        names = self._never_ran_names()
        n = len(self.block_modules)
        streamed = [self.block_labels[i] for i in self.events.never_ran
                    if self.arrivals and self.arrivals[i] is not None]
        self.fallbacks.add(
            "block_never_ran", f"{n} blocks per forward", f"{n - len(names)} blocks per forward",
            f"the module's forward never entered {', '.join(names)}; "
            + (f"{len(streamed)} of them streamed, never loaded" if streamed else
               "counted in no per-forward figure"),
            stacklevel=4, blocks=names)

    def _never_ran_names(self) -> List[str]:
        events = self.events
        if events is None or events.learning:
            return []
        return [self.block_labels[i] for i in events.never_ran]

    def _moved_stats(self) -> dict:
        """What the streamed blocks moved in the last whole forward (0 before one)."""
        moved, disk = getattr(self, "moved_per_forward", (0, 0))
        return {"streamed_bytes_per_forward": moved, "disk_bytes_per_forward": disk}

    # -- stats --------------------------------------------------------------------------
    @property
    def streamer(self) -> Optional[Streamer]:
        """The one stage's streamer (None when nothing streams)."""
        return self.streamers[0] if self.streamers else None
