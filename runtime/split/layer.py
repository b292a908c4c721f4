"""Layer split: contiguous block ranges per device; activations hop at range boundaries.

The main device (first in the runtime list) holds the non-block weights and runs the
module's own code, so inputs and outputs live there. Ranges come from the plan
(ComponentPlan.blocks) or, when it gives none, in proportion to each device's budget
minus headroom (placement.ranges). A device whose range does not fit its budget keeps
a prefix of its range resident and streams the rest through its own ring
(runtime/stream.Streamer on that device's Target), when the plan asks for streaming.

The engine is runtime/engine/stages.py's (the one-device placement is its one-stage case):
this file decides the ranges and each device's resident prefix. Per block the hot path
is one pre-hook bound to precomputed values (device index, ledger, whether it enters a
range): bring the arguments, note the activations.

Where the plan's ranges or prefixes do not fit the module as it runs, they are derived
here again: a runtime fallback (runtime/engine/fallbacks.py) naming both, in the stats.
"""
from typing import List

from ...placement.errors import PlacementError
from ...placement.layout import (owner_of, planned_prefix, prefix_and_ring, range_prefix,
                                 ring_bytes)
from ...placement.ranges import proportional_ranges
from ...placement.units import format_bytes
from ..engine.stages import StagedEngine
from .split_engine import SplitEngine

# {device: [first, last]} -> device index per block (None: not an exact cover)
ranges_to_owner = owner_of


class LayerSplit(SplitEngine, StagedEngine):
    """The staged engine over two or more devices (stages.py has the engine)."""
    mode = "layer"
    _rehearses = True       # each device's prefix sized from the rehearsed first call

    def __init__(self, module, plan, component: str, inventory, **options):
        super().__init__(module, plan, component, inventory, **options)
        if self.lora is not None:
            raise PlacementError(f"{component}: lora= is applied by row split; a layer "
                                 f"split keeps blocks whole, patch the module as usual")

    def _no_blocks(self) -> PlacementError:
        return PlacementError(f"{self.component}: layer split needs repeated blocks, none "
                              f"found in {type(self.module).__name__}; pass blocks=[names]")

    def _owner(self, groups, nonblock_bytes: int) -> List[int]:
        return self._ranges(groups, nonblock_bytes)

    def _prefix(self, d: int, sizes: List[int], room: int, depth: int) -> int:
        t, stream = self.targets[d], self.cplan.stream
        k = self._planned_prefix(sizes, room, depth, stream, t.name)
        if k is not None:
            return k
        k = range_prefix(sizes, room, depth, stream is not None)
        if k is not None:
            return k
        first, last = self.owner.index(d), len(self.owner) - 1 - self.owner[::-1].index(d)
        where = (f"{t.name}'s blocks {first}-{last} need {format_bytes(sum(sizes))} but its "
                 f"budget leaves {format_bytes(max(0, room))}")
        if stream is None:
            raise PlacementError(f"{self.component}: {where}; turn on stream_layers or give "
                                 f"{t.name} fewer blocks")
        raise PlacementError(f"{self.component}: {where}, too little even to stream them "
                             f"(a ring of {format_bytes(ring_bytes(sizes, depth))}); "
                             f"raise its budget")

    def _planned_prefix(self, sizes, room, depth, stream, device: str):
        """auto-fit's resident prefix for this device's range (placement/layout.py
        planned_prefix), when it has one that matches the range and fits; None: decide
        here."""
        if stream is None or not sizes:
            return None
        k, mismatched = planned_prefix(stream, device, len(sizes))
        if k is not None and prefix_and_ring(sizes, k, depth) <= room:
            return k
        if k is None and mismatched is None:
            return None                     # the plan gave this device no prefix
        if mismatched is not None:
            planned = mismatched
            why = (f"the plan's stream prefix {mismatched} does not match a range of "
                   f"{len(sizes)} blocks; sized from the budget")
        else:
            planned = [k, len(sizes)]
            why = (f"the plan keeps {k} of {len(sizes)} blocks resident, which does not fit "
                   f"the budget here; sized from the budget")
        here = range_prefix(sizes, room, depth, True)
        self.fallbacks.add("plan_rederived", {"resident": planned[0], "of": planned[1]},
                           {"resident": here, "of": len(sizes)} if here is not None
                           else "refused: no prefix fits", why, stacklevel=6,
                           device=device, field="stream.per_device")
        return None

    def _ranges(self, groups, nonblock_bytes: int) -> List[int]:
        n = len(groups)
        if self.cplan.blocks:
            owner = ranges_to_owner(self.cplan.blocks, self.runtime, n)
            if owner is not None:
                return owner
        weights = self.room_weights(nonblock_bytes)
        ranges = proportional_ranges([g.nbytes for g in groups], self.runtime, weights)
        if self.cplan.blocks:
            self.fallbacks.add(
                "plan_rederived", {d: list(r) for d, r in self.cplan.blocks.items()},
                {d: list(r) for d, r in ranges.items()},
                f"the plan's block ranges do not match the module's {n} blocks; ranges "
                f"recomputed in proportion to the budgets", stacklevel=5, field="blocks")
        return ranges_to_owner(ranges, self.runtime, n)

    def _more_stats(self) -> dict:
        return {**self._split_stats(),
                "ranges": dict(getattr(self, "ranges", {})),
                "boundaries": getattr(self, "boundaries", 0),
                # hops and bytes by where they crossed: a range's first block
                # ("boundaries", the exit included), later blocks of a range pulling an
                # argument over ("inside_ranges", no hop), a non-block module's arguments
                # brought to the main device ("non_block_modules"), the module's own joins
                # ("joins"), a caller's follow() ("follow": ComfyUI's UNet skips)
                "crossings": {k: dict(v) for k, v in getattr(self, "crossings", {}).items()},
                # the joins' mode: on while the first forward learns, then only where a
                # join crossed in it (stages.py `_joins`)
                "joins_watched": getattr(self, "joins_watched", True),
                "streamed_blocks": dict(getattr(self, "streamed_blocks", {})),
                "host_blocks": getattr(self, "host_blocks", 0),
                "host_stream_bytes": getattr(self, "host_stream_bytes", 0),
                # what the streamed blocks read from the file in the last whole forward
                "disk_bytes_per_forward": self._moved_stats()["disk_bytes_per_forward"],
                "disk_read_bytes": getattr(self, "disk_read_bytes", 0)}
