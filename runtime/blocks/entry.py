"""When execution enters a block, whatever runs it.

A block is a module (a transformer block, a UNet stage), but its own forward is not
always what runs: ComfyUI's UNet calls `forward_timestep_embed(block, ...)`, which loops
over a TimestepEmbedSequential's layers itself, and Stable Cascade loops over each
level's ModuleList (a ModuleList has no forward at all). Hooks on the block alone would
never fire there, and its weights would be used where they rest.

So a block is watched through its units too: on the first forward, every module inside
it that holds tensors; whichever of them runs first is the block's arrival. After that
forward each block keeps the fewest hooks that still see every entry: the block itself
when its forward ran, else the outermost units that ran (and any unit that did not run,
in case a later forward takes another path). A block none of whose hooks fired in that
forward never ran (`never_ran`): it is entered neither by its forward nor by its units.

Listeners, in the order they were added:
- `on_enter(gi)`: once per visit of block gi (the streamer's arrival, a pipeline's gate);
- `on_call(gi, args, kwargs)`: every hooked call in a visit entered through units, and
  the block's own call otherwise; may return new (args, kwargs) (a split brings them to
  the block's device);
- `on_output(gi, output, last)`: after each such call; `last` when it ends the visit (the
  block's own forward, or the block's last unit in module order); may return a new output.
The visit in progress is per thread (pipelined shares run blocks on threads at once).
"""
import threading
from functools import partial
from typing import Callable, List, Sequence

from torch import nn


def _units(block: nn.Module) -> List[nn.Module]:
    """Every module inside `block` with tensors in it, in module order."""
    return [m for _, m in block.named_modules(remove_duplicate=True) if m is not block and
            (next(m.parameters(), None) is not None or next(m.buffers(), None) is not None)]


def _last_of(block: nn.Module, hooked: set):
    """The hooked unit whose end ends the block: its last child holding tensors, or that
    child's last one where the child itself is not hooked (a ModuleList)."""
    m = block
    while True:
        children = [c for c in m.children() if next(c.parameters(), None) is not None or
                    next(c.buffers(), None) is not None]
        if not children:
            return None
        m = children[-1]
        if id(m) in hooked:
            return m


class BlockEvents:
    def __init__(self, blocks: Sequence[nn.Module]):
        self.blocks = list(blocks)
        self.on_enter: List[Callable] = []
        self.on_call: List[Callable] = []
        self.on_output: List[Callable] = []
        self.learning = True
        self._fired = set()             # id(module) of hooked modules that ran (learning)
        self._local = threading.local()
        self._handles = []
        self._unit_handles = [[] for _ in self.blocks]
        self.via_units = [False] * len(self.blocks)     # learned: entered by its units
        self.never_ran: List[int] = []                  # learned: not entered at all

    # -- hooks ------------------------------------------------------------------------
    def attach(self) -> None:
        for gi, block in enumerate(self.blocks):
            self._handles.append(block.register_forward_pre_hook(
                partial(self._block_pre, gi), with_kwargs=True))
            if self.on_output:
                self._handles.append(block.register_forward_hook(partial(self._block_post, gi)))
            self._hook_units(gi, block, _units(block))

    def _hook_units(self, gi: int, block: nn.Module, units: List[nn.Module]) -> None:
        """Hooks on `units` of block gi, the ones there were removed first."""
        for h in self._unit_handles[gi]:
            h.remove()
        hs = self._unit_handles[gi] = []
        last = _last_of(block, {id(u) for u in units})
        for u in units:
            hs.append(u.register_forward_pre_hook(partial(self._unit_pre, gi, u),
                                                  with_kwargs=True))
            if self.on_output:
                hs.append(u.register_forward_hook(partial(self._unit_post, gi, u is last)))

    def remove(self) -> None:           # a hook handle's name: the engine removes handles
        self.detach()

    def detach(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
        for hs in self._unit_handles:
            for h in hs:
                h.remove()
        self._unit_handles = [[] for _ in self.blocks]

    # -- the visit in progress (this thread's) -------------------------------------------
    def _state(self):
        s = self._local
        if not hasattr(s, "current"):
            s.current = -1
            s.via_block = False
        return s

    def begin_forward(self) -> None:
        s = self._state()
        s.current, s.via_block = -1, False

    def end_forward(self) -> None:
        """After the first forward: keep the fewest unit hooks that see every entry."""
        s = self._state()
        s.current, s.via_block = -1, False
        if not self.learning:
            return
        self.learning = False
        fired = self._fired
        for gi, block in enumerate(self.blocks):
            if id(block) in fired:
                keep = set()            # its own forward runs: its hooks are enough
            else:
                keep = self._outermost(block, fired)
                if any(id(u) in fired for u in _units(block)):
                    self.via_units[gi] = True
                else:
                    self.never_ran.append(gi)
            self._hook_units(gi, block, [u for u in _units(block) if id(u) in keep])
        self._fired = set()

    @staticmethod
    def _outermost(block: nn.Module, fired) -> set:
        """Units that ran with no unit above them that ran, and units inside the block
        under no unit that ran (a path a later forward may take)."""
        keep = set()

        def walk(m):
            for child in m.children():
                if id(child) in fired:
                    keep.add(id(child))
                else:
                    if next(child.parameters(recurse=False), None) is not None or \
                            next(child.buffers(recurse=False), None) is not None:
                        keep.add(id(child))
                    walk(child)
        walk(block)
        return keep

    def _block_pre(self, gi, module, args, kwargs):
        s = self._state()
        if self.learning:
            self._fired.add(id(module))
        s.current, s.via_block = gi, True         # a call of the block: always a new visit
        for fn in self.on_enter:
            fn(gi)
        return self._call(gi, args, kwargs)

    def _unit_pre(self, gi, unit, module, args, kwargs):
        s = self._state()
        if self.learning:
            self._fired.add(id(unit))
        if s.current != gi:
            s.current, s.via_block = gi, False
            for fn in self.on_enter:
                fn(gi)
        elif s.via_block:
            return None                 # inside the block's own call: its inputs moved
        return self._call(gi, args, kwargs)

    def _call(self, gi, args, kwargs):
        changed = False
        for fn in self.on_call:
            out = fn(gi, args, kwargs)
            if out is not None:
                args, kwargs = out
                changed = True
        return (args, kwargs) if changed else None

    def _block_post(self, gi, module, args, output):
        s = self._state()
        s.via_block = False
        return self._output(gi, output, True)

    def _unit_post(self, gi, last, module, args, output):
        s = self._state()
        if s.via_block or s.current != gi:
            return None
        return self._output(gi, output, last)

    def _output(self, gi, output, last):
        changed = False
        for fn in self.on_output:
            out = fn(gi, output, last)
            if out is not None:
                output, changed = out, True
        return output if changed else None
