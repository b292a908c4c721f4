"""The working memory of a sampling run's diffusion model, rehearsed before it computes.

ComfyUI's `BaseModel._apply_model` turns the sampler's arguments (x, sigma, the
conditioning's tensors) into the network's inputs: the scaled input, concatenated
latents, the timestep, the context and the family's extra conditions. At the first
model call of a run, that preparation runs once more with a stand-in network that only
records its inputs; then a weightless copy of the real network (every parameter on the
meta device, runtime/engine/shadow.py) runs those inputs under the working-memory meter
(runtime/measure/rehearse.py), with the patches' state put back after (patch_state.py: a patch
that keeps state between calls must not keep the rehearsal's). What comes out is the
family's own working memory at this call's real shapes (latent patching, text tokens,
frames, attention as a fused kernel) and the workload's whole batch (cond and uncond
together, as ComfyUI runs them when it can) at full width, in about a second, with no
weight read and nothing computed.

In the copy ComfyUI's cast layers compute plainly (no cast, no LoRA weight function: a
patch changes weights, not activations) and every floating weight has the compute dtype
(ComfyUI casts weights to the input's dtype, fp8 files included). Hooks of other packs
are left out: they belong to the real run.
"""
import collections
import contextlib
import logging
import os
import time
from dataclasses import dataclass, replace
from typing import Optional, Tuple
import weakref

import torch
from torch import nn
from torch.utils._pytree import tree_flatten, tree_map

from ....placement.errors import PlacementError
from ...blocks.find import find_blocks
from ...blocks.module_tensors import seen_bytes
from ...engine.shadow import meta_tensor, structural_copy
from ...measure.rehearse import input_like, rehearse, rehearse_split
from ...split.layer import ranges_to_owner
from ..patchers.patch_state import kept
from ..patchers.weight_hooks import hooked_keys
from ..sampling.skips import JoinsFollow, skip_follow_patch

_COPIES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()   # network -> copy
_RESULTS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # network -> {sig: bytes}


@dataclass(frozen=True)
class Rehearsal:
    working_bytes: int         # the peak of the tensors the forward computes, alive at once
    seconds: float
    inputs: str                # the network's input shapes, in words
    per_device: Tuple[Tuple[str, int], ...] = ()   # a layer split: the peak on each device
    input_bytes: int = 0       # the network's inputs, held on the main device throughout

    def to_dict(self) -> dict:
        return {"working_bytes": self.working_bytes, "seconds": round(self.seconds, 3),
                "inputs": self.inputs, "per_device": dict(self.per_device),
                "input_bytes": self.input_bytes}


class _Called(Exception):
    def __init__(self, args, kwargs):
        super().__init__("network inputs recorded")
        self.call = (args, kwargs)


class _Recorder(nn.Module):
    """Stands in for the network: records its inputs; what else `_apply_model` reads
    of the network (its dtype, its config) comes from the real one."""

    def __init__(self, real: nn.Module):
        super().__init__()
        object.__setattr__(self, "_real", real)

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(object.__getattribute__(self, "_real"), name)

    def forward(self, *args, **kwargs):
        raise _Called(args, kwargs)


def network_inputs(base, args, kwargs) -> Tuple[tuple, dict]:
    """The (args, kwargs) ComfyUI's `_apply_model` gives `base.diffusion_model` for the
    APPLY_MODEL call (args, kwargs). `base` is not changed: a view of it runs."""
    view = base.__class__.__new__(base.__class__)
    view.__dict__.update(base.__dict__)
    view.__dict__["_modules"] = {**base._modules, "diffusion_model": _Recorder(base.diffusion_model)}
    try:
        type(base)._apply_model(view, *args, **kwargs)
    except _Called as got:
        return got.call
    raise PlacementError(f"{type(base).__name__}._apply_model returned without calling "
                         f"its diffusion model; its working memory cannot be rehearsed")


def weightless_copy(network: nn.Module, dtype: torch.dtype) -> nn.Module:
    """A copy of `network` with meta weights (floating ones in `dtype`), computing plainly."""
    copy, _ = structural_copy(network, lambda t: meta_tensor(t, dtype))
    for m in copy.modules():
        if hasattr(m, "comfy_cast_weights"):
            m.comfy_cast_weights = False
            m.weight_function, m.bias_function = [], []
        m._forward_hooks = collections.OrderedDict()
        m._forward_pre_hooks = collections.OrderedDict()
    return copy


def _fused_attention(func, *args, **kwargs):
    """ComfyUI's attention override (transformer_options "optimized_attention_override",
    the point its wrap_attn offers): whichever attention ComfyUI picked (split,
    sub-quadratic, xformers, sage; some ask the device's free memory, which the meta
    device has not), the rehearsal runs PyTorch's, whose kernel it counts as fused."""
    import comfy.ldm.modules.attention as attention
    return attention.attention_pytorch(*args, **kwargs)


def _with_fused_attention(kwargs: dict) -> dict:
    options = dict(kwargs.get("transformer_options") or {})
    options["optimized_attention_override"] = _fused_attention
    return {**kwargs, "transformer_options": options}


def _signature(args, kwargs) -> tuple:
    leaves = tree_flatten((args, kwargs))[0]
    return tuple((tuple(t.shape), str(t.dtype)) for t in leaves if isinstance(t, torch.Tensor))


def _describe(args, kwargs) -> str:
    parts = [f"x {tuple(args[0].shape)}"] if args and isinstance(args[0], torch.Tensor) else []
    context = kwargs.get("context")
    if isinstance(context, torch.Tensor):
        parts.append(f"context {tuple(context.shape)}")
    return ", ".join(parts) or "inputs without tensors"


def _with_skip_patch(follow, args, kwargs):
    """The network's kwargs with the layer split's skip patch (skips.py) in its
    transformer_options: ComfyUI's UNet brings each skip to the device of its block."""
    options = dict(kwargs.get("transformer_options") or {})
    patches = dict(options.get("patches") or {})
    patches["output_block_patch"] = list(patches.get("output_block_patch") or []) + \
        [skip_follow_patch(follow)]
    options["patches"] = patches
    return args, {**kwargs, "transformer_options": options}


def _split_peaks(copy, net_args, net_kwargs, split) -> Optional[Tuple[int, ...]]:
    """Per-device peaks of a layer split {device: [first, last]} over `names`, or None
    when its ranges do not match the blocks the runtime finds."""
    ranges, names = split
    blocks = [b for _, b in find_blocks(copy) if next(b.parameters(), None) is not None]
    owner = ranges_to_owner(ranges, list(names), len(blocks))
    if owner is None:
        return None
    return tuple(rehearse_split(copy, net_args, net_kwargs, blocks, owner, len(names),
                                _with_skip_patch))


def _at_batch(args, kwargs, batch: int):
    """The call on meta with `batch` items where it has fewer: ComfyUI runs cond and
    uncond as one batch when the device's free memory allows at that moment, else one
    after the other; the plan is made for the whole batch, whichever the first call
    got (every tensor whose first dimension is the input's batch, grown to `batch`)."""
    args, kwargs = tree_map(input_like, tuple(args)), tree_map(input_like, dict(kwargs))
    first = args[0] if args and isinstance(args[0], torch.Tensor) and args[0].ndim else None
    if first is None or batch <= first.shape[0]:
        return args, kwargs
    have = first.shape[0]

    def grow(t):
        if isinstance(t, torch.Tensor) and t.ndim and t.shape[0] == have:
            if not t.is_meta:               # values kept (input_like): the rows repeated
                return t.repeat((-(-batch // have),) + (1,) * (t.ndim - 1))[:batch]
            return t.new_empty((batch,) + tuple(t.shape[1:]))
        return t
    return tree_map(grow, args), tree_map(grow, kwargs)


def rehearse_call(base, args, kwargs, split=None, batch=None) -> Rehearsal:
    """Rehearse the diffusion model call that APPLY_MODEL (args, kwargs) will make: the
    whole forward on one device, and with `split` ({device: [first, last]}, [device
    names]) of a layer split the peak on each of its devices too. Raises PlacementError
    (or what the forward raised on the meta device) when the network cannot run
    weightless; the caller keeps its estimate and says so."""
    start = time.perf_counter()
    network = base.diffusion_model
    net_args, net_kwargs = network_inputs(base, args, kwargs)
    inputs = seen_bytes(net_args, net_kwargs)
    net_kwargs = _with_fused_attention(net_kwargs)
    if batch:
        net_args, net_kwargs = _at_batch(net_args, net_kwargs, int(batch))
        inputs = seen_bytes(net_args, net_kwargs)
    results = _RESULTS.setdefault(network, {})
    sig = _signature(net_args, net_kwargs)
    copy = _COPIES.get(network)
    if copy is None:
        copy = _COPIES[network] = weightless_copy(network, base.get_dtype_inference())
    per_device = ()
    with kept(net_kwargs.get("transformer_options")):  # the patches' state: as before
        if sig not in results:
            results[sig] = rehearse(copy, net_args, net_kwargs)
        if split is not None:
            key = (sig, repr(sorted(split[0].items())), tuple(split[1]))
            if key not in results:
                peaks = _split_peaks(copy, net_args, net_kwargs, split)
                results[key] = tuple(zip(split[1], peaks)) if peaks else ()
            per_device = results[key]
    return Rehearsal(results[sig], time.perf_counter() - start,
                     _describe(net_args, net_kwargs), per_device, inputs)


def plan_split(plan, component: str = "diffusion"):
    """The layer split a plan runs the component with, as rehearse_call takes it (None:
    one device, a row split, or batch parallel: every device runs the whole forward on
    its share of the batch, which the planner scales)."""
    cp = plan.components.get(component)
    if cp is None or len(cp.runtime) < 2 or cp.split_mode != "layer" or not cp.blocks or \
            cp.parallel == "batch":
        return None
    return ({d: list(r) for d, r in cp.blocks.items()}, list(cp.runtime))


def _debug_trace() -> None:
    """PLACEMENT_DEBUG_REHEARSAL=1: the whole traceback of a call that could not be
    rehearsed (the warning keeps its first line), to find the op that reads values."""
    if os.environ.get("PLACEMENT_DEBUG_REHEARSAL"):
        logging.getLogger(__name__).warning("rehearsal failed", exc_info=True)


def try_rehearse(base, args, kwargs, split=None, batch=None, patcher=None
                 ) -> Tuple[Optional[Rehearsal], str]:
    """(rehearsal, "") or (None, why not) in one line. `patcher`: the ModelPatcher whose
    weight patches apply while its layers compute (lora_patch_bytes, added on top)."""
    try:
        got = rehearse_call(base, args, kwargs, split, batch)
    except Exception as exc:          # a forward that cannot run weightless: say why
        _debug_trace()
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        return None, f"{type(exc).__name__}: {first}"
    extra = lora_patch_bytes(patcher) if patcher is not None else 0
    if extra:
        logging.getLogger(__name__).info(
            "placement: working memory rehearsed %d bytes, plus %d for the LoRA patches "
            "applied as layers compute", got.working_bytes, extra)
        got = replace(got, working_bytes=got.working_bytes + extra,
                      per_device=tuple((d, b + extra) for d, b in got.per_device))
    return got, ""


# a patched weight's temporaries while its layer computes: the copy the cast op makes to
# patch (comfy/ops.py cast_bias_weight, copy=True), the LoRA product up @ down and its
# scaled copy (comfy/weight_adapter/lora.py), each of the weight's size in the compute
# dtype (measured: ComfyUI's own estimate, two, fell short by one on SDXL's GEGLU)
PATCH_TEMPORARIES = 3


def lora_patch_bytes(patcher) -> int:
    """The working memory a patched layer adds while it computes: ComfyUI applies its
    LoRA (weight) patches to a temporary copy of the weight in its weight functions, which
    the meta rehearsal does not run. PATCH_TEMPORARIES copies of the weight in the
    compute dtype plus the patch's tensors brought to the device, for the largest patched
    weight (layers compute one at a time); a weight hook's patch (weight_hooks.py) is
    applied before them, in float32: PATCH_TEMPORARIES float32 copies and its tensors."""
    patches = getattr(patcher, "patches", None) or {}
    hooked = hooked_keys(patcher)
    if not patches and not hooked:
        return 0
    import comfy.model_patcher as mp
    model = patcher.model
    most = 0
    for key in set(patches) | set(hooked):
        weight = mp.get_key_weight(model, key)[0]
        if weight is None:
            continue
        dtype = getattr(model, "manual_cast_dtype", None) or weight.dtype
        need = 0
        if key in patches:
            need += weight.numel() * dtype.itemsize * PATCH_TEMPORARIES
            need += mp.LowVramPatch(key, patches).memory_required()
        if key in hooked:
            need += weight.numel() * 4 * PATCH_TEMPORARIES
            need += mp.LowVramPatch(key, hooked).memory_required()
        most = max(most, int(need))
    return most


# -- calls outside the sampler: text encoders and VAEs (engine_calls.py) -----------------
class _Method(nn.Module):
    """forward = one method of `inner` (encode, decode, encode_token_weights)."""

    def __init__(self, inner: nn.Module, method: str):
        super().__init__()
        self.inner = inner
        self.method = method

    def forward(self, *args, **kwargs):
        return getattr(self.inner, self.method)(*args, **kwargs)


def call_copy(module: nn.Module) -> nn.Module:
    """A weightless copy of `module` that computes as the placed call does: every weight
    in its own dtype, ComfyUI's cast layers still casting (a text encoder stored in fp16
    computes in fp32 on the cpu: each layer's weight is cast for its operation, working
    memory the device holds too); LoRA weight functions and other packs' hooks left out."""
    copy, _ = structural_copy(module, meta_tensor)
    for m in copy.modules():
        if getattr(m, "execution_device", None) is not None:   # a CLIP's set_clip_options:
            m.execution_device = torch.device("meta")          # its tokens made on meta
        if hasattr(m, "weight_function"):
            m.weight_function, m.bias_function = [], []
        m._forward_hooks = collections.OrderedDict()
        m._forward_pre_hooks = collections.OrderedDict()
    return copy


def _call_signature(method: str, args, kwargs) -> tuple:
    leaves, spec = tree_flatten((args, kwargs))
    return (method, repr(spec)) + tuple((tuple(t.shape), str(t.dtype)) for t in leaves
                                        if isinstance(t, torch.Tensor))


def _call_blocks(copy: nn.Module, names: Optional[list]) -> list:
    return [b for _, b in find_blocks(copy, names) if next(b.parameters(), None) is not None]


class _Joining(nn.Module):
    """`inner` run with the lists its code joins brought to one device, as the engine's
    call does (skips.joins_follow): those copies are working memory where they land."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner
        self.follow = None

    def prepare(self, follow, args, kwargs):
        self.follow = follow
        return args, kwargs

    def forward(self, *args, **kwargs):
        with JoinsFollow(self.follow):
            return self.inner(*args, **kwargs)


def rehearse_method(module: nn.Module, method: str, args, kwargs, split=None,
                    block_names=None) -> Rehearsal:
    """Rehearse `module.<method>(*args, **kwargs)` (a VAE's encode or decode, a tile of
    decode_tiled, a CLIP's encode_token_weights) on the meta device at these inputs: the
    peak of the tensors it computes, and with `split` ({device: [first, last]}, [device
    names]) of a layer split the peak on each device. Cached per module and input shapes
    (a fresh copy each time otherwise: options ComfyUI sets on the module before a call,
    such as a CLIP's execution device, are the call's own). Raises what the call raised
    on the meta device; try_rehearse_method says it in one line."""
    start = time.perf_counter()
    results = _RESULTS.setdefault(module, {})
    sig = _call_signature(method, args, kwargs)
    key = sig if split is None else (sig, repr(sorted(split[0].items())), tuple(split[1]))
    hit = results.get(key)
    if hit is None:
        wrapper = _Method(call_copy(module), method)
        inputs = seen_bytes(args, kwargs)
        with _free_memory_of_meta():
            working = rehearse(wrapper, args, kwargs)
        per_device = ()
        if split is not None:
            ranges, names = split
            blocks = _call_blocks(wrapper, block_names)
            owner = ranges_to_owner(ranges, list(names), len(blocks))
            if owner is not None:
                joined = _Joining(wrapper)
                peaks = rehearse_split(joined, args, kwargs, blocks, owner, len(names),
                                       joined.prepare)
                per_device = tuple(zip(names, peaks))
        hit = results[key] = (working, per_device, inputs, _describe_call(method, args))
    working, per_device, inputs, words = hit
    return Rehearsal(working, time.perf_counter() - start, words, per_device, inputs)


@contextlib.contextmanager
def _free_memory_of_meta():
    """ComfyUI's VAEs size their chunks from the free (or total) memory of the latent's
    device (comfy.model_management.get_free_memory / get_total_memory(x.device)); on
    meta it has none to report: the rehearsal answers with ComfyUI's compute device's,
    as the real call would see it. Put back when the rehearsal ends (the rehearsal runs
    in the calling thread before the call's placement opens)."""
    import comfy.model_management as mm
    originals = {n: getattr(mm, n) for n in ("get_free_memory", "get_total_memory")}

    def asking(original):
        def ask(dev=None, torch_too=False):
            if dev is not None and torch.device(dev).type == "meta":
                dev = mm.get_torch_device()
            return original(dev, torch_too)
        return ask
    for n, f in originals.items():
        setattr(mm, n, asking(f))
    try:
        yield
    finally:
        for n, f in originals.items():
            setattr(mm, n, f)


def _describe_call(method: str, args) -> str:
    first = args[0] if args else None
    if isinstance(first, torch.Tensor):
        return f"{method} {tuple(first.shape)}"
    return f"{method} of {len(first) if isinstance(first, (list, tuple)) else 1} prompt(s)"


def try_rehearse_method(module, method, args, kwargs, split=None, block_names=None
                        ) -> Tuple[Optional[Rehearsal], str]:
    """(rehearsal, "") or (None, why not) in one line."""
    try:
        return rehearse_method(module, method, args, kwargs, split, block_names), ""
    except Exception as exc:          # a call that cannot run weightless: say why
        _debug_trace()
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        return None, f"{type(exc).__name__}: {first}"
