"""A layer split's crossings outside its blocks: the module's own code between them.

Each block's arguments are brought to the block's device (moves.Mover, stages.py), and
the module's own code runs on the main device, which holds the non-block weights. Two
things in that code meet activations a block on another device made, and a GPU refuses
both ("expected all tensors to be on the same device"):

- a non-block module (embeddings, final layers, Stable Cascade's down/upscalers and
  repeat mappers between its levels) called on such an activation: its weights are on
  the main device, so its tensor arguments are brought there first. `home_modules` names
  the modules that hold weights of their own outside every block (neither inside a block
  nor holding one); the engine puts a forward pre-hook on each, on the placed module only,
  removed with the placement's other hooks;
- a join (`torch.cat`, `torch.stack`, ...) of tensors from two devices (Lumina2 and
  Z-Image concatenate their context refiner's output with their noise refiner's; a text
  encoder joins hidden states taken from several layers): `JoinsFollow` brings each
  tensor of the list to the device of its first one, a hop like a UNet skip's
  (`follow(x, like)`). A residual added across devices is a join of two (Wan VACE adds
  each hint block's output to the main stream, `x += c_skip`, after the block of the
  main list it rides with, which may rest on another device): the second operand of an
  elementwise add, subtract or multiply is brought to the first's, whose device an
  in-place op keeps. The engine runs the forward under it while the first forward
  learns, and after that only where a join crossed in it (stages.py `_joins`: the mode
  sees every torch function of the forward, a cost a split without such joins need not
  pay).

What moves is counted as any hop is (hops, hop_bytes). Anything else in the module's own
code that mixes devices is refused by the simulated device's check, as a GPU refuses it.
rehearse.rehearse_split does the same on the meta device, so the rehearsed working
memory of each device matches the run's.
"""
from typing import Callable, Iterable, List, Sequence, Tuple

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

# torch functions that join a list of tensors into one: every operand on one device
JOINS = {torch.cat, torch.concat, torch.concatenate, torch.stack, torch.hstack,
         torch.vstack, torch.dstack}
# elementwise ops of two tensors (operators, methods, in-place forms, torch functions)
PAIRS = {torch.add, torch.sub, torch.mul, torch.Tensor.add, torch.Tensor.sub,
         torch.Tensor.mul, torch.Tensor.add_, torch.Tensor.sub_, torch.Tensor.mul_,
         torch.Tensor.__add__, torch.Tensor.__radd__, torch.Tensor.__iadd__,
         torch.Tensor.__sub__, torch.Tensor.__rsub__, torch.Tensor.__isub__,
         torch.Tensor.__mul__, torch.Tensor.__rmul__, torch.Tensor.__imul__}


def _pair(a, b) -> bool:
    """Two tensors that must share a device (`follow` knows whether they do: a
    simulated device is a tag, not torch's device); a 0-dim scalar mixes with any."""
    return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
            and a.dim() > 0 and b.dim() > 0)


class JoinsFollow(TorchFunctionMode):
    """While active: the tensors of a list torch joins (or of an elementwise op of two)
    brought to its first one's device by `follow(x, like)` (the placement's, or the
    rehearsal's hops)."""

    def __init__(self, follow: Callable):
        super().__init__()
        self.follow = follow

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in PAIRS and len(args) >= 2 and _pair(args[0], args[1]):
            args = (args[0], self.follow(args[1], args[0])) + tuple(args[2:])
        elif func in JOINS and args and isinstance(args[0], (list, tuple)):
            first = next((t for t in args[0] if isinstance(t, torch.Tensor)), None)
            if first is not None:
                joined = type(args[0])(self.follow(t, first) if isinstance(t, torch.Tensor)
                                       and t is not first else t for t in args[0])
                args = (joined,) + tuple(args[1:])
        return func(*args, **kwargs)


def home_modules(root: nn.Module, blocks: Sequence[nn.Module],
                 owned: Callable[[torch.Tensor], bool] = None) -> List[Tuple[str, nn.Module]]:
    """(name, module) of every module under `root` that holds tensors of its own
    (parameters or buffers, not its children's) and is neither inside a block nor holds
    one: the non-block modules whose weights rest on the main device. `owned(tensor)`:
    whether the placement holds that tensor (a worker's range it skips is left alone)."""
    inside, above = set(), set()
    for b in blocks:
        inside.update(id(m) for m in b.modules())
    for _, m in root.named_modules():
        if id(m) in inside:
            continue
        if any(id(s) in inside for s in m.modules()):
            above.add(id(m))
    out = []
    for name, m in root.named_modules():
        if m is root or id(m) in inside or id(m) in above:
            continue
        own = list(m.parameters(recurse=False)) + list(m.buffers(recurse=False))
        if own and (owned is None or any(owned(t) for t in own)):
            out.append((name, m))
    return out


def hook_home(modules: Iterable[nn.Module], pre: Callable) -> list:
    """A forward pre-hook `pre(module, args, kwargs)` on each module; the handles."""
    return [m.register_forward_pre_hook(pre, with_kwargs=True) for m in modules]
