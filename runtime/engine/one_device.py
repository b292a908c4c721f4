"""One device: `Placed`, the staged block engine's one-stage case (runtime/engine/stages.py,
core.py). The plan's own resident prefix, weights already in place, a staged load
(copied to the device for the placement, as stable-diffusion.cpp's offload), streaming,
and runtime LoRA on the device copies (`set_lora`). `place()` (place.py) routes here.
"""
from typing import Dict, List

from torch import nn

from ...placement.errors import PlacementError
from ...placement.layout import prefix_and_ring, resident_prefix, ring_bytes, stream_prefix
from ...placement.units import format_bytes
from ..measure.first_call import rehearsal_words
from .stages import StagedEngine


class Placed(StagedEngine):
    """One device: the staged engine's one-stage case (stages.py, core.py)."""

    def __init__(self, module: nn.Module, plan, component: str, inventory, **options):
        super().__init__(module, plan, component, inventory, **options)
        if self.cplan.is_split:
            raise PlacementError(f"{component}: runtime {'&'.join(self.cplan.runtime)} is a "
                                 f"split; run it through place(), which hands it to the "
                                 f"split engine")
        if self.lora is not None:
            raise PlacementError(f"{component}: lora= is the row split's option; on one "
                                 f"device patch the placed copies with placed.set_lora()")
        self._info = {}
        self._lora = {}
        self._lora_bytes = 0
        self._streamed_patches = {}

    @property
    def target(self):
        return self.targets[0] if self.targets else None

    @property
    def device(self):
        return self.devices[0]

    @property
    def streamed_groups(self):
        return self.streamer.groups if self.streamer is not None else []

    # -- plan checks -------------------------------------------------------------------
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

    # -- the one stage -------------------------------------------------------------------
    def _needs_blocks(self) -> bool:
        return self.mode == "stream"    # otherwise blocks only let the ledger see activations

    def _no_blocks(self) -> PlacementError:
        return PlacementError(
            f"{self.component}: streaming asked for, but no repeated blocks were "
            f"found in {type(self.module).__name__}; pass blocks=[names]")

    def _owner(self, groups, nonblock_bytes: int) -> List[int]:
        return [0] * len(groups)

    _rehearses = True

    def _prefix(self, d: int, sizes: List[int], room: int, depth: int) -> int:
        if self.mode != "stream":
            if self.rehearsed is not None and sum(sizes) > room:
                self._refuse(sum(sizes), room, "its weights")
            return len(sizes)
        k = self._planned_k(sizes)
        if prefix_and_ring(sizes, k, depth) <= room:
            return k                    # the plan's (the ledger enforces the budget)
        # the plan's prefix leaves the working memory (rehearsed, or given by the caller,
        # or the device's free memory now) too little room: the largest that fits (a ring
        # alone not fitting is refused before anything is copied)
        fits = resident_prefix(sizes, room, depth)
        if fits is None:
            self._refuse(ring_bytes(sizes, depth), room, "its streaming ring")
        self.fallbacks.add(
            "plan_rederived", {"resident": k, "of": len(sizes)},
            {"resident": fits, "of": len(sizes)},
            f"{rehearsal_words(self, 0)} leaves {format_bytes(max(0, room))} for the "
            f"streamed blocks on {self.device.name}; the plan's prefix needs "
            f"{format_bytes(prefix_and_ring(sizes, k, depth))}",
            stacklevel=6, device=self.device.name, field="stream.resident_blocks")
        return fits

    def _refuse(self, need: int, room: int, what: str) -> None:
        nonblock = sum(g.nbytes for g in self.resident[0]) if self.resident else 0
        short = need - room
        raise PlacementError(
            f"{self.component}: {self.device.name} needs {format_bytes(need)} for {what} "
            f"beside {format_bytes(nonblock)} of non-block weights and "
            f"{rehearsal_words(self, 0)}, but its capacity is "
            f"{format_bytes(self.target.ledger.capacity)}, short by {format_bytes(short)}; "
            f"{self._more_room()}, stream its blocks (stream_layers), or run smaller inputs")

    def _more_room(self) -> str:
        """The change that gives the device more room: a budget is raised; without one
        the capacity is the device's free memory, which a budget cannot raise."""
        if self.budgets and self.budgets[0][0] is not None:
            return f"raise max_vram {self.device.name}"
        return f"free memory on {self.device.name} (other programs or models hold it)"

    def _planned_k(self, sizes: List[int]) -> int:
        # the plan's prefix (the ledger enforces the budget): auto-fit's own for this
        # device where it gave one (a split it is one stage of: the worker ranges beside
        # it, distributed/planned.py), else stream.resident_blocks
        k, mismatched = stream_prefix(self.cplan.stream, self.device.name, len(sizes))
        if mismatched:
            self.fallbacks.add(
                "plan_rederived", {"resident": mismatched[0], "of": mismatched[1]},
                {"resident": k, "of": len(sizes)},
                f"the plan's stream prefix {mismatched} does not match the module's "
                f"{len(sizes)} streamed blocks; the plan's resident_blocks is used",
                stacklevel=6, device=self.device.name, field="stream.per_device")
        return k

    def _prepare_again(self, by_id) -> None:
        super()._prepare_again(by_id)
        if getattr(self, "_lora_patches", None):
            self.set_lora(self._lora_patches)   # the streamed groups are new

    def _depth(self) -> int:
        return self.cplan.stream.prefetch_depth if self.mode == "stream" else 0

    def _prepare(self, by_id) -> None:
        self.mode = self._mode()
        super()._prepare(by_id)
        if self.mode == "resident" and not self.target.simulated and all(
                t.device == self.target.device for t, _ in by_id.values()):
            # already where the plan wants it (a real device, or cpu): no second copy
            self.in_place_bytes = sum(g.nbytes for g in self.resident_groups)
            self.resident, self.disk_layouts, self.mode = [[]], {}, "in place"
        streamed = self.streamed_groups
        self._info = {
            "mode": self.mode, "resident_blocks": len(self.block_modules) - len(streamed),
            "streamed_blocks": len(streamed), "prefetch_depth": self.depth,
            "resident_weight_bytes": sum(g.nbytes for g in self.resident_groups)
            + self.in_place_bytes,
        }
        if self.file is not None and streamed:
            self._info.update(host_blocks=self.host_blocks,
                              host_stream_bytes=self.host_stream_bytes)

    # -- runtime LoRA ---------------------------------------------------------------------
    def set_lora(self, patches) -> None:
        """{weight name: [(down, up, alpha, strength), ...]}; {} removes all. Applied to the
        device copies only: streamed blocks on arrival, resident weights now (refilled
        from their resting copy first, so earlier patches do not accumulate)."""
        from .lora import GroupPatches, resolve
        self._lora_patches = patches        # applied again if the layout is made again
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
            for _, g, buf in self.resident_bufs:
                if any(id(t) in touched for t in g.tensors):
                    self.target.ledger.count_h2d(g.nbytes)
                    self._fill(g, buf)
            self._patch_resident()

    def _after_load(self) -> None:
        self._patch_resident()

    def _free_extra(self) -> None:
        self.target.free(self._lora_bytes, "resident")
        self._lora_bytes = 0

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

    # -- stats ---------------------------------------------------------------------------
    def _more_stats(self) -> dict:
        out = dict(self._info)
        # what moved in the last whole forward, counted as blocks arrive (stages.py)
        moved = self._moved_stats()
        out["streamed_bytes_per_forward"] = moved["streamed_bytes_per_forward"]
        if self.file is not None and self.streamers:
            out["disk_bytes_per_forward"] = moved["disk_bytes_per_forward"]
            out["disk_read_bytes"] = self.disk_read_bytes
        if self.streamer is not None:
            out["prefetched_ahead_bytes"] = self.streamer.ahead_bytes
        return out
