"""One component over several devices: layer split (block ranges per device, activations
hop at range boundaries) and row split (large Linear weights sharded by output rows).

`place_split(module, plan, component, inventory, **options)` is what place() runs for a
plan whose runtime lists more than one device; parallel "pipeline" gives the pipelined
layer split (pipeline.py; option shares=N). See docs/split.md.
"""
from ...placement.errors import PlacementError
from .layer import LayerSplit
from .pipeline import PipelinedSplit
from .row import RowSplit, fall_back_to_layer

SPLIT_MODES = ("layer", "row")


def place_split(module, plan, component: str, inventory, **options):
    """Options: blocks (names in execution order), link (simulated host-to-device link),
    hop_link (simulated device-to-device link), headroom_bytes (int, or {device: int}),
    max_pinned_bytes, weights_file and key_map (params=disk, layer split), lora (row
    split: {linear name: [(up, down, scale)]}), host_store and repoint (as place())."""
    comp = plan.components.get(component)
    if comp is None:
        raise PlacementError(f"plan has no component {component!r}; it has: "
                             f"{', '.join(plan.components) or 'none'}")
    if not comp.is_split:
        raise PlacementError(f"{component}: runtime {'&'.join(comp.runtime)} is one device; "
                             f"place_split needs a device list such as cuda0&cuda1")
    if comp.split_mode not in SPLIT_MODES:
        raise PlacementError(f"{component}: invalid split mode {comp.split_mode!r}; expected "
                             f"layer or row")
    pipeline = getattr(comp, "parallel", "none") == "pipeline"
    if comp.split_mode == "row":
        if pipeline:
            raise PlacementError(f"{component}: parallel pipeline runs a layer split's "
                                 f"stages; use split_mode=layer (row split has no stages)")
        if comp.stream is not None:
            raise PlacementError(f"{component}: row split does not stream; use split_mode="
                                 f"layer with stream_layers, or turn streaming off")
        if RowSplit.applies(module, options.get("blocks")):
            return RowSplit(module, plan, component, inventory, **options)
        # nothing to shard: a layer split runs, and says so in its stats
        split = LayerSplit(module, plan, component, inventory, **options)
        fall_back_to_layer(split, module)
        return split
    if pipeline:
        return PipelinedSplit(module, plan, component, inventory, **options)
    return LayerSplit(module, plan, component, inventory, **options)


__all__ = ["place_split", "LayerSplit", "PipelinedSplit", "RowSplit", "SPLIT_MODES"]
