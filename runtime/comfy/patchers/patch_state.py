"""The state the model's patches keep, put back after a call that must leave none.

ComfyUI's patches (transformer_options "patches" and "patches_replace": attention
patches, block patches, post-input patches) are objects and closures that may keep state
from one model call to the next: Flux's KV cache (comfy_extras/nodes_flux.py
KV_Attn_Input) stores the reference image's keys and values at the first call and reads
them at every later one; DiffSynth's ControlNet patch re-encodes its image when the
latent's size changes. The first call's rehearsal (rehearse_call.py) runs the forward on
the meta device: what a patch stored there would be a meta tensor the real first call
then reads ("Tensor on device meta is not on the expected device"), and the real first
call would no longer be the first.

`kept(transformer_options)` snapshots every such object's attributes (the contents of
its dicts, lists and sets too) and puts them back exactly when the block ends, however
it ends. Modules, tensors, classes and functions are not snapshotted: they are weights
and code, not a patch's per-call state.
"""
import contextlib
import types
from typing import Iterator, List

import torch
from torch import nn

_PLAIN = (nn.Module, torch.Tensor, type, types.ModuleType, types.FunctionType,
          types.BuiltinFunctionType)


def _stateful(obj) -> bool:
    return hasattr(obj, "__dict__") and not isinstance(obj, _PLAIN)


def _callables(options: dict) -> Iterator:
    for key in ("patches", "patches_replace"):
        for group in (options.get(key) or {}).values():
            items = group.values() if isinstance(group, dict) else group
            for item in (items or ()):
                yield item


def patch_objects(options: dict) -> List[object]:
    """The objects that hold the patches' state: each patch object, the object a bound
    method belongs to, and what a patch function's closure holds (one level)."""
    found, seen = [], set()

    def add(obj):
        if _stateful(obj) and id(obj) not in seen:
            seen.add(id(obj))
            found.append(obj)
    for item in _callables(options or {}):
        if isinstance(item, types.MethodType):
            add(item.__self__)
            item = item.__func__
        if isinstance(item, types.FunctionType):
            for cell in item.__closure__ or ():
                try:
                    add(cell.cell_contents)
                except ValueError:          # an empty cell
                    pass
        else:
            add(item)
    return found


def _snapshot(obj):
    state = dict(vars(obj))
    contents = {k: (type(v)(v)) for k, v in state.items()
                if type(v) in (dict, list, set)}
    return obj, state, contents


def _restore(obj, state, contents) -> None:
    now = vars(obj)
    for name in [n for n in now if n not in state]:
        del now[name]
    now.update(state)
    for name, saved in contents.items():
        container = state[name]
        container.clear()
        if isinstance(container, dict):
            container.update(saved)
        elif isinstance(container, list):
            container.extend(saved)
        else:
            container.update(saved)


@contextlib.contextmanager
def kept(options: dict):
    """While the block runs, the patches of `options` may change their state; after it,
    every attribute and container is as before."""
    saved = [_snapshot(o) for o in patch_objects(options)]
    try:
        yield
    finally:
        for obj, state, contents in saved:
            _restore(obj, state, contents)
