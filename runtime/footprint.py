"""What a placement will hold on each device, known before it is placed: the module's
tensors grouped as the engine groups them (stages.py, split/row.py), through the byte
model of placement/layout.py that the planner and the engine use. Resident weights and
ring bytes, no working memory: the ledger's "resident" + "slots" once loaded. The
ComfyUI adapter sizes its shares from it (runtime/comfy/patchers/claims.py).
"""
from typing import Dict, List, Optional, Sequence, Tuple

from torch import nn

from ..placement.errors import PlacementError
from ..placement.layout import (batch_parallel_bytes, group_blocks, layer_split_bytes,
                                one_device_bytes, owner_of, planned_prefix, row_split_bytes,
                                split_rooms, stream_prefix)
from ..placement.ranges import proportional_ranges
from .blocks.find import block_tensor_ids, find_blocks
from .blocks.module_tensors import module_tensors


def module_sizes(module: nn.Module, block_names=None) -> Tuple[int, List[int]]:
    """(non-block bytes, [bytes per block]) with the engine's grouping: a tensor shared
    by two blocks is non-block; blocks with no tensors of their own are dropped."""
    by_id = module_tensors(module)
    nbytes = {i: t.numel() * t.element_size() for i, (t, _) in by_id.items()}
    blocks = find_blocks(module, block_names)
    members, rest = group_blocks([block_tensor_ids(b) for _, b in blocks], by_id)
    return sum(nbytes[i] for i in rest), [sum(nbytes[i] for i in m) for m in members if m]


def capacity(plan, inventory, name: str) -> int:
    """The engine's ledger capacity on `name` (runtime/target.open_target): the room
    (placement/room.py) of the plan's budget and margin in the device's free memory."""
    from ..placement.room import device_room
    planned, dev = plan.device(name), inventory.get(name)
    return device_room(planned.budget_bytes, dev.free_bytes, planned.margin_bytes,
                       host=dev.kind == "cpu" and not dev.simulated)


def rooms(plan, component: str, inventory, headroom: Optional[int] = None) -> List[int]:
    """Each runtime device's room for weights: capacity less the working memory the
    engine reserves (`headroom`, else the plan's on that device)."""
    cp = plan.components[component]
    return [capacity(plan, inventory, d) -
            (cp.headroom_on(d) if headroom is None else int(headroom)) for d in cp.runtime]


def _stream(cp, device: str, n: int) -> Optional[Tuple[int, int]]:
    """(resident prefix, depth) one device streams with (runtime/engine/one_device.py)."""
    if cp.stream is None:
        return None
    return stream_prefix(cp.stream, device, n)[0], max(0, cp.stream.prefetch_depth)


def _prefixes(cp, owner: Sequence[int]) -> Optional[List[Optional[int]]]:
    """The plan's own resident prefix per device of a streaming layer split, where it
    matches the device's range (split/layer.py's _planned_prefix)."""
    if cp.stream is None or not cp.stream.per_device:
        return None
    return [planned_prefix(cp.stream, name, sum(1 for o in owner if o == d))[0]
            for d, name in enumerate(cp.runtime)]


def row_split_footprint(module: nn.Module, room: Sequence[int], block_names=None) -> List[int]:
    """Row split (split/row.py): the sharded Linears' rows per device, the rest on the
    main device."""
    from .split.row import eligible_linears, row_shards
    linears = eligible_linears(module, block_names)
    total = sum(t.numel() * t.element_size() for t, _ in module_tensors(module).values())
    shards = row_shards(linears)
    main = total - sum(rows * nb * n for rows, nb, n in shards)
    out = row_split_bytes(shards, main, room)
    if out is None:
        raise PlacementError("row split: no room left on any device after the main "
                             "device's unsharded weights; raise the budgets")
    return out


def layer_split_footprint(cp, non_block: int, sizes: List[int], room: Sequence[int]
                          ) -> List[int]:
    """Layer split (split/layer.py): the plan's ranges, or ranges in proportion to the
    rooms when it has none that fit the module, each streamed where it must be."""
    owner = owner_of(cp.blocks, cp.runtime, len(sizes)) if cp.blocks else None
    if owner is None:
        ranges = proportional_ranges(sizes, cp.runtime, split_rooms(room, non_block))
        owner = owner_of(ranges, cp.runtime, len(sizes)) or [0] * len(sizes)
    depth = max(0, cp.stream.prefetch_depth) if cp.stream is not None else 0
    return layer_split_bytes(non_block, sizes, owner, room, depth, cp.stream is not None,
                             _prefixes(cp, owner))


def footprint(module: nn.Module, plan, component: str, inventory, block_names=None,
              headroom: Optional[int] = None) -> Tuple[Dict[str, int], str]:
    """({runtime device: bytes the engine will allocate for weights and rings}, the
    basis in words) for the component's plan."""
    cp = plan.components[component]
    room = rooms(plan, component, inventory, headroom)
    if cp.is_split and cp.split_mode == "row" and cp.parallel != "batch":
        from .split.row import RowSplit
        if RowSplit.applies(module, block_names):
            sizes = row_split_footprint(module, room, block_names)
            return dict(zip(cp.runtime, sizes)), "row split shards"
    non_block, blocks = module_sizes(module, block_names)
    if cp.parallel == "batch":
        sizes = batch_parallel_bytes(non_block, blocks,
                                     [_stream(cp, d, len(blocks)) for d in cp.runtime])
        basis = "batch parallel: " + ("resident blocks + ring" if cp.stream
                                      else "whole model") + " on each device"
    elif cp.is_split:
        sizes = layer_split_footprint(cp, non_block, blocks, room)
        basis = "layer split ranges" + (" with streaming" if cp.stream else "")
        if cp.split_mode == "row":
            basis += " (row split does not apply)"
    else:
        sizes = [one_device_bytes(non_block, blocks, _stream(cp, cp.main_device, len(blocks)))]
        basis = "streamed: resident blocks + ring" if cp.stream else "whole model"
    return dict(zip(cp.runtime, sizes)), basis
