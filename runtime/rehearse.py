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
caller's to report)."""
from typing import Any, Dict, Tuple

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_map

from .workmeter import MeterMode, Tally, WorkMeter


class _FusedAttention(TorchFunctionMode):
    """Attention as a fused GPU kernel allocates it: its output, nothing in between."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            q = args[0] if args else kwargs["query"]
            v = args[2] if len(args) > 2 else kwargs["value"]
            return q.new_empty(q.shape[:-1] + (v.shape[-1],))
        return func(*args, **kwargs)


def _meta(x):
    return torch.empty_like(x, device="meta") if isinstance(x, torch.Tensor) else x


def rehearse(module: torch.nn.Module, args: Tuple = (), kwargs: Dict[str, Any] = None) -> int:
    """Peak bytes of the tensors `module(*args, **kwargs)` computes and holds at once."""
    state = {n: _meta(t) for n, t in list(module.named_parameters()) +
             list(module.named_buffers())}
    margs, mkwargs = tree_map(_meta, tuple(args)), tree_map(_meta, dict(kwargs or {}))
    tally = Tally()
    meter = WorkMeter([tally])
    with torch.no_grad(), _FusedAttention(), MeterMode(meter):
        torch.func.functional_call(module, state, margs, mkwargs)
    return tally.peak_bytes
