"""The one way an engine takes over a module's forward: what the instance held comes back
exactly (its own forward, or none so the class's shows through), once."""
import torch
from torch import nn

from comfyui_placement.runtime.engine.forward_override import ForwardOverride


def test_a_class_forward_shows_through_again():
    lin = nn.Linear(2, 2)
    over = ForwardOverride(lin, lambda x: x * 0)
    assert "forward" in lin.__dict__ and lin(torch.ones(1, 2)).abs().sum() == 0
    over.restore()
    assert "forward" not in lin.__dict__
    assert lin.forward.__func__ is nn.Linear.forward


def test_an_instance_forward_comes_back_and_restore_runs_once():
    lin = nn.Linear(2, 2)
    own = lambda x: x + 1          # noqa: E731  (another pack's wrapper)
    lin.forward = own
    outer = ForwardOverride(lin, lambda x: x * 0)
    inner = ForwardOverride(lin, lambda x: x * 2)
    inner.restore()
    assert lin.forward is not own                 # the outer override is back
    outer.restore()
    assert lin.__dict__["forward"] is own
    lin.forward = lambda x: x                      # set after: restore must not undo it
    outer.restore()
    assert lin.__dict__["forward"] is not own
