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
once per forward, as the split's mover does (runtime/moves.py): the peak per device."""
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_map

from .units import BlockEvents
from .workmeter import MeterMode, Tally, WorkMeter, storage_key


class _FusedAttention(TorchFunctionMode):
    """Attention as a fused GPU kernel allocates it: its output, nothing in between."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            q = args[0] if args else kwargs["query"]
            v = args[2] if len(args) > 2 else kwargs["value"]
            return q.new_empty(q.shape[:-1] + (v.shape[-1],))
        return func(*args, **kwargs)


def meta_like(x):
    """`x` as an empty meta tensor of its shape and dtype (anything else as it is)."""
    return torch.empty_like(x, device="meta") if isinstance(x, torch.Tensor) else x


def rehearse(module: torch.nn.Module, args: Tuple = (), kwargs: Dict[str, Any] = None) -> int:
    """Peak bytes of the tensors `module(*args, **kwargs)` computes and holds at once."""
    tally = Tally()
    _run(module, args, kwargs, WorkMeter([tally]))
    return tally.peak_bytes


def _run(module, args, kwargs, meter: WorkMeter, prepare: Optional[Callable] = None):
    tensors = list(module.named_parameters()) + list(module.named_buffers())
    # weights on meta made before the meter runs: they are not working memory
    state = None if all(t.is_meta for _, t in tensors) else \
        {n: meta_like(t) for n, t in tensors}
    margs, mkwargs = tree_map(meta_like, tuple(args)), tree_map(meta_like, dict(kwargs or {}))
    if prepare is not None:
        margs, mkwargs = prepare(margs, mkwargs)
    with torch.no_grad(), _FusedAttention(), MeterMode(meter):
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
        hit = self.meter._owner.get(storage_key(t))
        return hit[0] if hit is not None else 0

    def bring(self, x, d: int):
        def one(t):
            if not isinstance(t, torch.Tensor) or self.where(t) == d:
                return t
            hit = self.copies.get((id(t), d))
            if hit is None:
                here = self.meter.device
                self.meter.set_device(d)
                hit = self.copies[(id(t), d)] = (t, t.clone())   # source kept: id stays
                self.meter.set_device(here)
            return hit[1]
        return tree_map(one, x)

    def follow(self, x, like):
        """`x` brought to the device `like` is on (a skip connection)."""
        return self.bring(x, self.where(like))


def rehearse_split(module: torch.nn.Module, args: Tuple, kwargs: Dict[str, Any],
                   blocks: Sequence[torch.nn.Module], owner: Sequence[int], devices: int,
                   prepare: Optional[Callable] = None) -> List[int]:
    """Peak working bytes per device of a layer split that runs block i on device
    owner[i] (the non-block code on device 0). `prepare(follow, args, kwargs)` may
    return new (args, kwargs) that bring skip connections along with `follow(x, like)`."""
    tallies = [Tally() for _ in range(devices)]
    meter = WorkMeter(tallies)
    hops = SplitHops(meter)
    events = BlockEvents(blocks)
    last = len(blocks) - 1
    events.on_enter.append(lambda gi: meter.set_device(owner[gi]))
    events.on_call.append(lambda gi, a, k: (hops.bring(a, owner[gi]), hops.bring(k, owner[gi])))

    def leave(gi, output, is_last):
        if gi == last and is_last:
            meter.set_device(0)
            return hops.bring(output, 0)
        return None
    events.on_output.append(leave)
    ready = None if prepare is None else (lambda a, k: prepare(hops.follow, a, k))
    events.attach()
    try:
        events.begin_forward()
        _run(module, args, kwargs, meter, ready)
    finally:
        events.detach()
    return [t.peak_bytes for t in tallies]
