"""A module's forward replaced for the time of a placement, and put back exactly.

`module.forward = fn` sets an instance attribute that shadows the class's forward; what
must come back on removal is what the instance held before: its own forward when it had
one (another pack's wrapper, a patched forward), else no instance attribute at all, so
the class's forward shows through again. Every engine that takes over a forward (the
guard of the base engine, the pipelined split, batch parallel, the row split's Linears,
the worker ranges) does it through this one class."""
from typing import Callable

from torch import nn


class ForwardOverride:
    """`module.forward` is `forward` until `restore()` (idempotent) puts back what was."""

    __slots__ = ("module", "_had", "_previous")

    def __init__(self, module: nn.Module, forward: Callable):
        self.module = module
        self._had = "forward" in module.__dict__
        self._previous = module.__dict__.get("forward")
        module.forward = forward

    def restore(self) -> None:
        module, self.module = self.module, None
        if module is None:
            return
        if self._had:
            module.forward = self._previous
        else:
            module.__dict__.pop("forward", None)
