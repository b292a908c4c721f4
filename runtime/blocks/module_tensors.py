"""Small tensor helpers both engines (one device: engine/one_device.py, several: split/) use."""
from typing import Callable, Dict, Sequence, Union

import torch
from torch import nn

from ..host.residency import Group
from ..weights.weightfile import file_order_key


def seen_bytes(args, kwargs) -> int:
    """Bytes of the tensors handed to a module: the activations the runtime can see."""
    n = 0
    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.Tensor):
            n += a.numel() * a.element_size()
        elif isinstance(a, (tuple, list)):
            for x in a:
                if isinstance(x, torch.Tensor):
                    n += x.numel() * x.element_size()
    return n


def to_device(x, device):
    """The caller's inputs to the compute device (tensors in tuples, lists, dicts too).
    A container is copied only when something in it moved, so a caller's dict that
    needs no move (ComfyUI's transformer_options) keeps its identity."""
    if isinstance(x, torch.Tensor):
        return x if x.device == device else x.to(device, non_blocking=True)
    if type(x) in (tuple, list):
        moved = [to_device(v, device) for v in x]
        return x if all(a is b for a, b in zip(moved, x)) else type(x)(moved)
    if type(x) is dict:
        moved = {k: to_device(v, device) for k, v in x.items()}
        return x if all(moved[k] is v for k, v in x.items()) else moved
    return x


def module_tensors(module: nn.Module) -> Dict[int, list]:
    """id -> [tensor, [names]]: every parameter and buffer once, with all its names
    (tied weights have several)."""
    by_id: Dict[int, list] = {}
    for name, t in list(module.named_parameters(remove_duplicate=False)) + \
            list(module.named_buffers(remove_duplicate=False)):
        by_id.setdefault(id(t), [t, []])[1].append(name)
    return by_id


def make_group(name: str, by_id: Dict[int, list], ids: Sequence[int], file=None,
               key_map=None) -> Group:
    tensors, names = [by_id[i][0] for i in ids], [by_id[i][1] for i in ids]
    key = file_order_key(tensors, names, file, key_map) if file is not None else None
    return Group(name, tensors, names, key)


def key_mapper(key_map: Union[None, Dict[str, str], Callable[[str], str]]) -> Callable:
    """A module tensor name -> file key function from a dict, a function or nothing."""
    if isinstance(key_map, dict):
        mapping = dict(key_map)
        return lambda k: mapping.get(k, k)
    return key_map or (lambda k: k)
