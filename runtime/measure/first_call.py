"""A placement sized from its first call: rehearsed on the meta device at the call's real
shapes (rehearse.py), before any weight moves.

The plan reserves working memory from an estimate made before the workload was known
(or none, for an architecture the metadata does not know). When place() is entered the
weights wait; the first call is rehearsed (its blocks on the devices the plan gives
them, for a layer split), and each device's working memory becomes what the rehearsal
measured: the tensors computed and alive at once, the call's inputs on the main device,
and the device's kernel workspace (none on a simulated device, whose ledger counts only
tensors), where that is more than the plan kept (never less: the plan's promise holds).
The resident prefix and a split's stream prefixes are then sized in the room
that leaves (one_device.py, split/layer.py), and a placement whose weights that must sit
on a device plus that working memory cannot fit is refused in one line there, before
anything is copied. A forward that cannot run on meta (data-dependent code) keeps the
plan's figure, said as a runtime fallback.
"""
from typing import List

from ...placement.metadata.headroom import WORKSPACE
from ...placement.units import format_bytes
from ..blocks.module_tensors import seen_bytes


def workspace_of(target, device) -> int:
    """Kernel workspace beside a computation's tensors on one target."""
    if target.simulated:
        return int(device.workspace_bytes or 0)
    if target.is_cuda:
        return WORKSPACE if device.workspace_bytes is None else int(device.workspace_bytes)
    return 0


def size_from_first_call(engine, args, kwargs) -> bool:
    """Set engine.headroom per device from the first call, rehearsed on the blocks and
    owners the engine prepared; True when it changed (the layout is then made again)."""
    import torch
    from .rehearse import rehearse, rehearse_split
    grad = getattr(engine, "first_call_grad", torch.is_grad_enabled())
    if grad and any(p.requires_grad for p in engine.module.parameters()):
        # autograd keeps what backward needs alive; the rehearsal runs without it
        engine.fallbacks.add(
            "not_rehearsed", "working memory rehearsed from the first call",
            "the plan's working memory", "the call records gradients (the rehearsal "
            "measures inference); run under torch.no_grad() or inference_mode")
        return False
    quiet = None
    try:
        # a weightless copy runs it: the module's own state (counters, caches a forward
        # fills) and the caller's hooks see the real call only
        shadow = meta_copy(engine)
        quiet = _without_hooks(shadow)
        if len(engine.targets) == 1 or not engine.block_modules:
            peaks: List[int] = [rehearse(shadow, args, kwargs)] + \
                [0] * (len(engine.targets) - 1)
        else:
            blocks = [shadow.get_submodule(n) for n in engine.block_labels]
            home = [shadow.get_submodule(n) for n in getattr(engine, "home_names", [])]
            peaks = rehearse_split(shadow, args, kwargs, blocks, engine.owner,
                                   len(engine.targets), home=home)
    except Exception as exc:        # noqa: BLE001 - any failure on meta: keep the plan's
        engine.fallbacks.add(
            "not_rehearsed", "working memory rehearsed from the first call",
            "the plan's working memory",
            f"the forward does not run on the meta device ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0][:160] if str(exc) else ''})")
        return False
    finally:
        if quiet is not None:
            quiet.restore()
    inputs = seen_bytes(args, kwargs)
    engine.rehearsed = list(peaks)
    engine.planned_headroom = list(engine.headroom)
    need = [p + (inputs if d == 0 else 0) + workspace_of(t, dev)
            for d, (p, t, dev) in enumerate(zip(peaks, engine.targets, engine.devices))]
    # never less than the plan kept (what it promised stays true); more where the call
    # needs it, and then the layout is made again for it
    engine.headroom = [max(n, int(h)) for n, h in zip(need, engine.planned_headroom)]
    return engine.headroom != engine.planned_headroom


def meta_copy(engine):
    """The module's structure with every weight and buffer an empty meta tensor of its
    shape and dtype (nothing read or copied), without the placement's forward guard."""
    import copy

    import torch
    module = engine.module
    memo = {}
    for t in list(module.parameters()) + list(module.buffers()):
        meta = torch.empty_like(t, device="meta")
        memo[id(t)] = torch.nn.Parameter(meta, requires_grad=False) \
            if isinstance(t, torch.nn.Parameter) else meta
    shadow = copy.deepcopy(module, memo)
    shadow.__dict__.pop("forward", None)    # the guard wraps the real module's forward
    return shadow


_HOOK_DICTS = ("_forward_pre_hooks", "_forward_pre_hooks_with_kwargs", "_forward_hooks",
               "_forward_hooks_with_kwargs", "_forward_hooks_always_called")


class _without_hooks:
    """Every module's forward hooks set aside while the rehearsal runs, and put back
    exactly (the same dict objects): a caller's hook counts or acts on real calls, and
    the rehearsal is not one."""

    def __init__(self, module):
        self.saved = []
        for m in module.modules():
            for name in _HOOK_DICTS:
                hooks = m.__dict__.get(name)
                if hooks:
                    self.saved.append((m, name, hooks))
                    m.__dict__[name] = type(hooks)()

    def restore(self) -> None:
        for m, name, hooks in self.saved:
            m.__dict__[name] = hooks
        self.saved = []


def rehearsal_words(engine, d: int) -> str:
    """`X of working memory (rehearsed)` on device d, for one-line errors."""
    how = "rehearsed from the first call" if engine.rehearsed is not None else "planned"
    return f"{format_bytes(engine.headroom[d])} of working memory ({how})"
