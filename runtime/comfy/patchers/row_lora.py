"""ComfyUI's LoRA patches on row-split Linears, as the row split's own `lora=` entries.

Under the engine's load policy every patched cast layer carries its patches as
`weight_function`s (ComfyUI's LowVramPatch: `patches[key]` entries of the form
(strength, adapter, strength_model, offset, function), applied by
comfy.lora.calculate_weight to the whole weight). A sharded Linear runs the row
split's own forward, which would skip them, and calculate_weight cannot run on a row
slice (a LoRA adds strength * alpha / rank * up @ down over the whole weight). So each
plain LoRA patch becomes (up, down, scale) for RowSplit, which adds
scale * (x @ down.T) @ up[rows].T per shard: the same delta, sliced by up's rows.

Converted exactly: LoRA adapters without mid (LoCon/Tucker), dora_scale or reshape,
with strength_model 1 and no per-patch function; an offset (a LoRA on part of a fused
weight, e.g. q of Flux's qkv) becomes zero rows or columns around up or down. Anything
else (LoHa, LoKr, DoRA, full diffs, bias patches, weight wrappers) is refused with one
line naming the patch kind and the layer.

While the placement opens, the eligible Linears' patch lists are set aside (RowSplit
refuses layers that still carry them) and put back right after: the instance forward
the row split installs bypasses them for the rest of the placement.

No `comfy` import: adapters and patch lists are read by their attributes, so the
conversion is testable without ComfyUI.
"""
from contextlib import contextmanager
from typing import Dict, List, Tuple

from ....placement.errors import PlacementError
from ...split.row import RowSplit, eligible_linears

_MISSING = object()
_LISTS = ("weight_function", "bias_function")


def patch_kind(v) -> str:
    """What a ComfyUI patch value is, in the words of its loader."""
    if isinstance(v, list):
        return "nested patch list"
    name = getattr(v, "name", None)
    if isinstance(name, str) and hasattr(v, "weights"):
        return name                                  # weight adapter: lora, loha, lokr, ...
    if isinstance(v, tuple):
        if len(v) == 1:
            return "diff"
        if len(v) == 2 and isinstance(v[0], str):
            return v[0]                              # diff, set, model_as_lora
    return type(v).__name__


def lora_entries(patches, name: str, shape, component: str) -> List[Tuple]:
    """ComfyUI `patches[key]` entries for the weight of Linear `name` (out, in) ->
    [(up (out, r), down (r, in), scale)]; refuses what it cannot convert exactly."""
    out_f, in_f = shape

    def refuse(what: str):
        return PlacementError(f"{component}: row split cannot shard {name} with its {what}; "
                              f"only plain LoRA patches (up, down, alpha) are sliced by rows; "
                              f"use split_mode layer for this model")

    entries = []
    for entry in patches:
        strength, v, strength_model, offset, function = entry
        kind = patch_kind(v)
        if kind != "lora" or len(getattr(v, "weights", ())) != 6:
            raise refuse(f"{kind} patch")
        up, down, alpha, mid, dora_scale, reshape = v.weights
        if dora_scale is not None:
            raise refuse("DoRA patch (lora with dora_scale)")
        if mid is not None:
            raise refuse("LoCon/Tucker patch (lora with a mid weight)")
        if reshape is not None:
            raise refuse("lora patch with reshape")
        if function is not None:
            raise refuse("patch with a weight function")
        if float(strength_model) != 1.0:
            raise refuse(f"patch scaling the weight itself (strength_model {strength_model})")
        if float(strength) == 0.0:
            continue                                 # adds exactly nothing
        up = up.reshape(up.shape[0], -1)
        down = down.reshape(down.shape[0], -1)
        rank = down.shape[0]
        rows, cols, at = out_f, in_f, None
        if offset is not None:
            dim, start, length = (int(x) for x in offset)
            if dim not in (0, 1) or start < 0 or start + length > shape[dim]:
                raise refuse(f"lora patch at offset {tuple(offset)}")
            rows, cols, at = (length, in_f, dim) if dim == 0 else (out_f, length, dim)
        if up.shape[1] != rank or up.shape[0] != rows or down.shape[1] != cols:
            raise refuse(f"lora patch of up {tuple(up.shape)} and down {tuple(down.shape)} "
                         f"(the weight part is {rows}x{cols})")
        if at == 0:          # a LoRA on rows start..start+length: zero rows elsewhere
            full = up.new_zeros(out_f, rank)
            full[start:start + length] = up
            up = full
        elif at == 1:        # on input columns start..start+length: zero columns elsewhere
            full = down.new_zeros(rank, in_f)
            full[:, start:start + length] = down
            down = full
        per_rank = 1.0 if alpha is None else float(alpha) / rank
        entries.append((up, down, float(strength) * per_rank))
    return entries


def _patch_lists(fns, name: str, component: str, what: str) -> List:
    """The `patches[key]` entries behind a layer's weight/bias function list."""
    out = []
    for f in fns:
        if not getattr(f, "is_lowvram_patch", False):
            raise PlacementError(f"{component}: row split cannot shard {name}: its {what} "
                                 f"function {type(f).__name__} is not one of ComfyUI's patch "
                                 f"lists (a weight wrapper); use split_mode layer")
        out.extend(f.patches[f.key])
    return out


def comfy_lora_for_rows(module, component: str) -> Tuple[Dict[str, List], List]:
    """({linear name: [(up, down, scale)]}, the eligible Linears carrying patch lists)."""
    lora, carrying = {}, []
    for name, lin in eligible_linears(module, None):
        weight_fns = getattr(lin, "weight_function", None) or []
        bias_fns = getattr(lin, "bias_function", None) or []
        # ComfyUI-GGUF keeps a quantized weight's patches on the tensor: [(patches, key)]
        on_tensor = [e for plist, _ in (getattr(lin.weight, "patches", None) or [])
                     for e in plist]
        if not weight_fns and not bias_fns and not on_tensor:
            continue
        if weight_fns or bias_fns:
            carrying.append(lin)
        bias_patches = _patch_lists(bias_fns, name, component, "bias")
        if bias_patches:
            raise PlacementError(f"{component}: row split cannot shard {name} with its bias "
                                 f"{patch_kind(bias_patches[0][1])} patch; only plain LoRA "
                                 f"weight patches are sliced by rows; use split_mode layer "
                                 f"for this model")
        entries = lora_entries(_patch_lists(weight_fns, name, component, "weight")
                               + on_tensor, name, tuple(lin.weight.shape), component)
        if entries:
            lora[name] = entries
    return lora, carrying


@contextmanager
def row_lora_options(module, cp):
    """Around opening a placement of `module` (the module place() gets) under plan
    component `cp`: yields extra place() options ({"lora": ...} or {}), with the
    eligible Linears' ComfyUI patch lists set aside until the block exits."""
    if not cp.is_split or cp.split_mode != "row" or not RowSplit.applies(module, None):
        yield {}
        return
    lora, carrying = comfy_lora_for_rows(module, cp.component)
    saved = [(lin, [lin.__dict__.get(a, _MISSING) for a in _LISTS]) for lin in carrying]
    try:
        for lin in carrying:
            for a in _LISTS:
                if hasattr(lin, a):
                    setattr(lin, a, [])
        yield {"lora": lora} if lora else {}
    finally:
        for lin, values in saved:
            for a, value in zip(_LISTS, values):
                if value is _MISSING:
                    lin.__dict__.pop(a, None)
                else:
                    setattr(lin, a, value)


__all__ = ["row_lora_options", "comfy_lora_for_rows", "lora_entries", "patch_kind"]
