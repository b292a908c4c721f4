"""Working memory by rehearsal: a module's forward run on the meta device under the
working-memory meter (workmeter.py), at the real input shapes, with no weights read and
no arithmetic done (a full-size Flux at 1024x1024 in about a second on a CPU).

The figure is what a GPU allocates for the operations' outputs, alive at once, at their
peak: the working memory the simulated device meters on a real run, which a test holds
it to. Attention is counted as the fused kernels a GPU runs it with (flash or memory
efficient: the output only), not as the score matrices the reference math would build:
`F.scaled_dot_product_attention` answers an empty output of the right shape. Kernel
workspaces and the caching allocator's slack are not in it; the planner adds those.

`rehearse(module, args, kwargs)` needs a module whose forward runs on meta tensors: no
`.item()`, no data-dependent branches (diffusers' transformers do; a refusal is the
caller's to report).

`rehearse_split(...)` does the same for a layer split: each block's working memory is
charged to the device that runs it, and what crosses a range boundary is copied there
once per forward, as the split's mover does (runtime/blocks/moves.py), and the module's own code
crosses as the split's does (runtime/blocks/crossings.py: non-block modules get their arguments on
the main device, joins bring their tensors to one device): the peak per device."""
import contextlib
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_map

from ..blocks.crossings import JoinsFollow, home_modules, hook_home
from ..blocks.entry import BlockEvents
from ..blocks.moves import is_block_state, map_tensors
from ..device.simcheck import _ALLOWED as FREE          # what touches no data: views, copy_, *_like
from ..device.subclass_check import plain_call
from ..device.subclass_check import storage_key
from ..device.workmeter import MeterMode, Tally, WorkMeter


_MOVES = (torch.Tensor.to, torch.Tensor.cpu, torch.Tensor.cuda)


def _move_target(func, args, kwargs):
    """The device type a `.to()` / `.cpu()` / `.cuda()` of a tensor sends it to, or None
    (not a move, or a `.to()` that names no device)."""
    if func not in _MOVES or not args or not isinstance(args[0], torch.Tensor):
        return None
    if func is torch.Tensor.cpu:
        return "cpu"
    if func is torch.Tensor.cuda:
        return "cuda"
    target = kwargs.get("device")
    for a in args[1:]:
        if isinstance(a, (str, torch.device)):
            target = a
        elif isinstance(a, torch.Tensor):
            target = a.device
    return None if target is None else torch.device(target).type


def _leaving_meta(func, args, kwargs) -> bool:
    """A meta tensor sent to another device (ComfyUI hands a text encoder's or a VAE's
    output to its intermediate device): a copy off the device being rehearsed."""
    target = _move_target(func, args, kwargs)
    return target not in (None, "meta") and args[0].is_meta


def _index_to_meta(func, args, kwargs) -> bool:
    """A host tensor whose values a rehearsal keeps (`input_like`) sent to the rehearsed
    device (HiDream-O1: `ref_image_grid_thw.to(inputs_embeds.device)`): it stays on the
    host."""
    return _move_target(func, args, kwargs) == "meta" and _keeps_values(args[0])


def _stay(args, kwargs):
    """The tensor itself (no device memory is taken by a copy that leaves it), cast on
    meta where the move also casts."""
    t, dtype = args[0], kwargs.get("dtype")
    for a in args[1:]:
        if isinstance(a, torch.dtype):
            dtype = a
        elif isinstance(a, torch.Tensor):
            dtype = a.dtype
    return t if dtype is None or dtype == t.dtype else t.to(dtype=dtype)


class _FusedAttention(TorchFunctionMode):
    """Attention as a fused GPU kernel allocates it: its output, nothing in between;
    a tensor leaving the device stays on meta without a copy."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            q = args[0] if args else kwargs["query"]
            v = args[2] if len(args) > 2 else kwargs["value"]
            return q.new_empty(q.shape[:-1] + (v.shape[-1],))
        if _leaving_meta(func, args, kwargs):
            return _stay(args, kwargs)
        if _index_to_meta(func, args, kwargs):
            return _stay(args, kwargs)          # its values stay readable (input_like)
        if func in _BINCOUNT and args and isinstance(args[0], torch.Tensor) \
                and args[0].is_meta:
            return _bincount_on_meta(*args, **kwargs)
        if func in _FROM_DATA and _python_data_on_meta(args, kwargs) and \
                (func not in _FILLS or _index_dtype(kwargs.get("dtype"))):
            return func(*args, **dict(kwargs, device="cpu"))
        if func in _LIKE and args and isinstance(args[0], torch.Tensor) and args[0].is_meta \
                and kwargs.get("device") is not None \
                and torch.device(kwargs["device"]).type != "meta":
            # a weight copied to a host constant's device (ComfyUI's cast_to for an input
            # made by _FROM_DATA): in the real run both are on one device, where the copy
            # is no allocation unless it casts
            dtype = kwargs.get("dtype")
            if func is torch.empty_like and (dtype is None or dtype == args[0].dtype):
                return args[0]
            kwargs = dict(kwargs, device="meta")
        if func not in _HOST_COUNTS:
            args, kwargs = _host_operands_on_meta(args, kwargs)
        return func(*args, **kwargs)


# operations whose host operand is values that size the output (SeedVR2 repeats its
# timestep embedding per token by its samples' lengths; Qwen3-VL writes its image
# features where a mask made by torch.zeros is set): they stay readable
_HOST_COUNTS = (torch.repeat_interleave, torch.Tensor.repeat_interleave, torch.split,
                torch.Tensor.split, torch.Tensor.__getitem__, torch.Tensor.__setitem__,
                torch.Tensor.index_put_, torch.Tensor.index_put, torch.masked_select,
                torch.Tensor.masked_select)
_LIKE = (torch.empty_like, torch.zeros_like, torch.ones_like, torch.full_like,
         torch.rand_like, torch.randn_like)


def _host_operands_on_meta(args, kwargs):
    """The host constants above (and host counts, `_bincount_on_meta`) meet the
    rehearsed tensors in later operations (ACE-Step 1.5 joins its counts with a constant
    made on the input's device; Qwen-VL indexes with positions computed from its image
    grid): where an operation has meta operands, its host operands join them on meta,
    as on the device every one of them would be on in the real run."""
    flat = list(args) + list(kwargs.values())
    seen = [t for v in flat for t in (v if isinstance(v, (list, tuple)) else (v,))
            if isinstance(t, torch.Tensor)]
    if not any(t.is_meta for t in seen) or all(t.is_meta for t in seen):
        return args, kwargs

    def meta(v):
        if isinstance(v, torch.Tensor):
            # metered: a value the rehearsal computed on the host (an attention mask from
            # the token ids) is computed on the device in the real run
            return v if v.is_meta else meta_like(v)
        if isinstance(v, (list, tuple)) and any(isinstance(t, torch.Tensor) and not t.is_meta
                                                for t in v):
            return type(v)([meta(t) for t in v])
        return v
    return tuple(meta(a) for a in args), {k: meta(v) for k, v in kwargs.items()}


# tensors made from Python values (ranges, grids), whose values code reads back; a fill
# only of an integer or boolean dtype (a mask that selects): a float fill is a causal
# mask or a buffer of the computation, metered on meta
_FROM_DATA = (torch.tensor, torch.as_tensor, torch.arange, torch.linspace, torch.zeros,
              torch.ones, torch.full)
_FILLS = (torch.zeros, torch.ones, torch.full)


def _index_dtype(dtype) -> bool:
    return dtype is not None and not dtype.is_floating_point and not dtype.is_complex


def _python_data_on_meta(args, kwargs) -> bool:
    """A tensor made from Python values on the device being rehearsed (SeedVR2's
    `torch.as_tensor([x.shape[:-1] ...], device=hid.device)`, read back with `.tolist()`
    to unflatten; Qwen-VL's `torch.linspace` of its image grid, read back to index its
    position table): made on the host, where its values stay readable (and are not
    metered: index vectors, small beside activations). Tensors computed from the
    inputs stay on meta."""
    device = kwargs.get("device")
    return bool(args) and not isinstance(args[0], torch.Tensor) and device is not None \
        and torch.device(device).type == "meta"


_BINCOUNT = (torch.bincount, torch.Tensor.bincount)


def _bincount_on_meta(x, weights=None, minlength=0):
    """Counts whose values the code goes on to read (a mixture of experts routes tokens
    with them: `for end in counts.cumsum(0)`, slices by count), which meta cannot give:
    the counts of an input whose values are all 0, a host tensor. Every slice taken by
    these counts is then at most the whole input, so the rehearsal stays an upper bound
    (a top-k router's one expert is charged its k choices' rows: k times its most)."""
    if weights is not None:
        raise NotImplementedError("bincount with weights on the meta device: its counts "
                                  "are the weights' values, which meta tensors have not")
    counts = torch.zeros(max(int(minlength), 1), dtype=torch.int64)
    counts[0] = x.numel()
    return counts


def _all_selected():
    """Boolean-mask indexing on meta (a mixture of experts takes each expert's rows with
    `x[idx == i]`) needs torch.nonzero, whose meta kernel torch runs only when told to
    assume every element selected: the largest slice the mask can take, so the
    rehearsal stays an upper bound, as with bincount above."""
    try:
        from torch.fx.experimental import _config
        return _config.patch(meta_nonzero_assume_all_nonzero=True)
    except (ImportError, AttributeError):          # an older torch: mask indexing refused
        return contextlib.nullcontext()


def meta_like(x):
    """`x` as an empty meta tensor of its shape and dtype (anything else as it is)."""
    return torch.empty_like(x, device="meta") if isinstance(x, torch.Tensor) else x


# an integer or boolean input up to this many elements keeps its values in a rehearsal,
# and any input up to SCALARS_INPUT (a timestep per sample)
SMALL_INDEX_INPUT = 1 << 16
SCALARS_INPUT = 64


def _keeps_values(x) -> bool:
    if not isinstance(x, torch.Tensor) or x.is_meta or x.is_complex():
        return False
    if x.is_floating_point():
        return x.numel() <= SCALARS_INPUT
    return x.numel() <= SMALL_INDEX_INPUT


def input_like(x):
    """A call's input for its rehearsal: on meta, except a small integer or boolean
    tensor (token ids, an image's grid, a mask) or a few scalars (the timesteps), kept on
    the host with their values, as the constants made from Python values are
    (`_FROM_DATA`): HiDream-O1 reads its reference image's grid (`ref_image_grid_thw`)
    back to size its vision tower's positions and finds its image tokens among its ids;
    its smoothing wrapper reads the timestep (`float(t[0])`)."""
    if _keeps_values(x):
        return x.detach().to("cpu", copy=True)
    return meta_like(x)


def rehearse(module: torch.nn.Module, args: Tuple = (), kwargs: Dict[str, Any] = None) -> int:
    """Peak bytes of the tensors `module(*args, **kwargs)` computes and holds at once."""
    tally = Tally()
    _run(module, args, kwargs, WorkMeter([tally]))
    return tally.peak_bytes


class _WhereOperandsAre(MeterMode):
    """A split's rehearsal: an operation's outputs are charged to the device its computed
    operands are on, else to the running block's, as the device check charges them on a
    split run (simcheck.operand_device; a GPU computes where its operands are): the
    module's own code that mixes a block's output runs on that block's device. Inputs
    and weights are not located; a hop's copy (empty_like, then copy_) lands where set."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        tensors = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)]
        keys = [storage_key(t) for t in tensors]
        device = None
        if func not in FREE and not func.is_view:
            for t, key in zip(tensors, keys):
                device = self.meter.device_at(key) if t.dim() else None  # scalars mix
                if device is not None:
                    break
        out = plain_call(func, args, kwargs)
        self.meter.produced(out, set(keys), device)
        return out


def _run(module, args, kwargs, meter: WorkMeter, prepare: Optional[Callable] = None,
         mode=MeterMode):
    tensors = list(module.named_parameters()) + list(module.named_buffers())
    # weights on meta made before the meter runs: they are not working memory
    state = None if all(t.is_meta for _, t in tensors) else \
        {n: meta_like(t) for n, t in tensors}
    margs, mkwargs = tree_map(input_like, tuple(args)), tree_map(input_like, dict(kwargs or {}))
    if prepare is not None:
        margs, mkwargs = prepare(margs, mkwargs)
    with torch.no_grad(), _all_selected(), _FusedAttention(), mode(meter):
        if state is None:                               # a weightless copy (shadow.py)
            module(*margs, **mkwargs)
        else:
            torch.func.functional_call(module, state, margs, mkwargs)


class SplitHops:
    """Tensors brought to the device of the block about to run, as a layer split's mover
    brings them: one copy per tensor and device for the whole forward, charged to the
    device it lands on. A tensor the meter did not see made (an input) is on device 0."""

    def __init__(self, meter: WorkMeter):
        self.meter = meter
        self.copies: Dict[Tuple[int, int], Tuple[torch.Tensor, torch.Tensor]] = {}

    def where(self, t: torch.Tensor) -> int:
        d = self.meter.device_of(t)
        return 0 if d is None else d

    def bring(self, x, d: int):
        def one(t):
            if self.where(t) == d:
                return t
            hit = self.copies.get((id(t), d))
            if hit is None:
                here = self.meter.device
                self.meter.set_device(d)
                copy = torch.empty_like(t).copy_(t)            # allocated on d, as a hop's
                hit = self.copies[(id(t), d)] = (t, copy)      # source kept: id stays
                self.meter.set_device(here)
            return hit[1]
        return map_tensors(one, x)       # dataclasses too, as the mover brings them

    def follow(self, x, like):
        """`x` brought to the device `like` is on (a skip connection)."""
        return self.bring(x, self.where(like))


def rehearse_split(module: torch.nn.Module, args: Tuple, kwargs: Dict[str, Any],
                   blocks: Sequence[torch.nn.Module], owner: Sequence[int], devices: int,
                   prepare: Optional[Callable] = None,
                   home: Optional[Sequence[torch.nn.Module]] = None) -> List[int]:
    """Peak working bytes per device of a layer split that runs block i on device
    owner[i] (the non-block code on device 0). `prepare(follow, args, kwargs)` may
    return new (args, kwargs) that bring skip connections along with `follow(x, like)`.
    `home`: the non-block modules whose arguments come to device 0 (the placement's,
    stages.py `home_names`; default: crossings.home_modules of `module`)."""
    tallies = [Tally() for _ in range(devices)]
    meter = WorkMeter(tallies)
    hops = SplitHops(meter)
    events = BlockEvents(blocks)
    last = len(blocks) - 1
    events.on_enter.append(lambda gi: meter.set_device(owner[gi]))
    inside = [False]            # in a block: its joins are its own (stages.py _join_follow)

    def enter(gi, a, k):
        inside[0] = True
        for v in list(a) + list(k.values()):    # block state moves in its dict (moves.py)
            if is_block_state(v):
                v.update({n: hops.bring(t, owner[gi]) for n, t in v.items()
                          if isinstance(t, torch.Tensor)})
        return hops.bring(a, owner[gi]), hops.bring(k, owner[gi])
    events.on_call.append(enter)

    def leave(gi, output, is_last):
        if is_last:                     # the module's own code runs next, on device 0
            meter.set_device(0)
            inside[0] = False
        if gi == last and is_last:
            return hops.bring(output, 0)
        return None
    events.on_output.append(leave)
    ready = None if prepare is None else (lambda a, k: prepare(hops.follow, a, k))
    if home is None:
        home = [m for _, m in home_modules(module, blocks)]

    def bring_home(m, a, k):            # its weights are on device 0: so are its inputs
        return hops.bring(a, 0), hops.bring(k, 0)
    events.attach()
    handles = hook_home(home, bring_home)
    try:
        events.begin_forward()
        with JoinsFollow(lambda x, like: x if inside[0] else hops.follow(x, like)):
            _run(module, args, kwargs, meter, ready, _WhereOperandsAre)
    finally:
        events.detach()
        for h in handles:
            h.remove()
    return [t.peak_bytes for t in tallies]
