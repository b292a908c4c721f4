"""How a batch is cut into per-device shares and put back together (pure torch, no
placement): the size of each share, which inputs are cut, and the gather.

A share is a contiguous run of batch items, in device order, so gathering is a
concatenation and item i of the output is item i of the input whatever the devices.
"""
from typing import List, Optional, Sequence

import torch

from ...placement.errors import PlacementError


def share_counts(batch: int, weights: Sequence[float]) -> List[int]:
    """Items per device for a batch of `batch`, proportional to `weights` (the devices'
    predicted speeds), by largest remainder; ties go to the earlier device. A batch
    smaller than the device count leaves the slowest devices idle."""
    if batch < 0:
        raise PlacementError(f"batch size must be >= 0, got {batch}")
    if not weights or any(not (w > 0) for w in weights):
        raise PlacementError(f"device speeds must be positive numbers, got {list(weights)}")
    total = float(sum(weights))
    exact = [batch * w / total for w in weights]
    counts = [int(e) for e in exact]
    order = sorted(range(len(weights)), key=lambda i: (-(exact[i] - counts[i]), -weights[i], i))
    for i in order[:batch - sum(counts)]:
        counts[i] += 1
    return counts


def batch_size(args, kwargs) -> Optional[int]:
    """The leading size of the first tensor input (positional first, then keyword):
    the batch the caller passed. None when there is no tensor with a leading dim."""
    for x in (*args, *kwargs.values()):
        if isinstance(x, torch.Tensor):
            return int(x.shape[0]) if x.dim() > 0 else None
    return None


def cut_batch(x, batch: int, start: int, stop: int):
    """`x` with every tensor whose leading size is `batch` cut to items start:stop
    (also inside plain tuples, lists and dicts; containers copied only when something
    in them was cut). Anything else (timestep scalars, position ids, options) is passed
    whole to every share."""
    if isinstance(x, torch.Tensor):
        return x[start:stop] if x.dim() > 0 and x.shape[0] == batch else x
    if type(x) in (tuple, list):
        parts = [cut_batch(v, batch, start, stop) for v in x]
        return x if all(a is b for a, b in zip(parts, x)) else type(x)(parts)
    if type(x) is dict:
        parts = {k: cut_batch(v, batch, start, stop) for k, v in x.items()}
        return x if all(parts[k] is v for k, v in x.items()) else parts
    return x


def gather(outputs: list, device: Optional[torch.device]):
    """Concatenate the shares' outputs along the batch dimension onto `device` (None:
    where the first share's output is). Tensors, tuples, lists, dicts and dict-like
    outputs (diffusers' ModelOutput) are gathered item by item; anything else must be
    equal in every share and is returned once."""
    first = outputs[0]
    if len(outputs) == 1:
        return first
    if isinstance(first, torch.Tensor):
        dev = device if device is not None else first.device
        return torch.cat([o.to(dev) for o in outputs], dim=0)
    if isinstance(first, (tuple, list)) and not hasattr(first, "_fields"):
        return type(first)(gather([o[i] for o in outputs], device) for i in range(len(first)))
    if isinstance(first, tuple):            # a namedtuple
        return type(first)(*(gather([o[i] for o in outputs], device)
                             for i in range(len(first))))
    if isinstance(first, dict):
        merged = {k: gather([o[k] for o in outputs], device) for k in first}
        return merged if type(first) is dict else type(first)(**merged)
    if first is None or all(o is first or o == first for o in outputs[1:]):
        return first
    raise PlacementError(f"batch parallel: the shares' outputs of type "
                         f"{type(first).__name__} cannot be gathered (expected tensors, "
                         f"tuples, lists or dicts of them)")


def autocast_now():
    """[(device type, dtype)] of the autocast regions the caller's thread is in: thread
    state, like grad and inference mode, that the share threads must take on."""
    out = []
    for device_type in ("cuda", "cpu"):
        if torch.is_autocast_enabled(device_type):
            out.append((device_type, torch.get_autocast_dtype(device_type)))
    return out


def cut_all(args, kwargs, batch: int, start: int, stop: int):
    """The default cut: every tensor whose leading size is the batch (`cut_batch` above)."""
    return cut_batch(args, batch, start, stop), cut_batch(kwargs, batch, start, stop)
