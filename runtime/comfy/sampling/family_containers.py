"""Objects ComfyUI's model families hand their blocks that hold tensors in plain
attributes, registered so a layer split's moves (runtime/blocks/moves.py) and the rehearsal
reach into them, as they reach into tuples, dicts and dataclasses.

SeedVR2's `Cache` memoizes per forward what every block needs alike (the timestep
embedding repeated per token, rotary tables) in one dict its blocks share, filled by
the first block that asks: a block on another device would read a tensor of the
first block's device. Brought, a block gets a `Cache` over a copy of the dict with its
tensors on the block's device (functions over tensors, its window index lambdas, left
out: the block makes its own); what that block memoizes stays its own (the next block
of another range computes it again, the same values), and the dict the module's own
code reads keeps its tensors where they were made.
"""
from ...blocks.moves import register_container


def _seedvr2_cache(map_one, cache):
    """A Cache for a block on another device: its tensors brought; an entry that holds
    functions (window index lambdas closing over index tensors, which cannot be brought)
    left out, so the block makes its own on its device (the same values)."""
    brought, moved = {}, False
    for k, v in cache.cache.items():
        if _holds_functions(v):
            continue
        brought[k] = map_one(v)
        moved = moved or brought[k] is not v
    if not moved:
        return cache
    return type(cache)(disable=cache.disable, prefix=cache.prefix, cache=brought)


def _holds_functions(v) -> bool:
    if isinstance(v, (tuple, list)):
        return any(_holds_functions(x) for x in v)
    return callable(v) and not isinstance(v, type)


def register() -> None:
    try:
        from comfy.ldm.seedvr.model import Cache
    except ImportError:          # a ComfyUI without SeedVR2
        return
    register_container(Cache, _seedvr2_cache)

