"""The one restore path (runtime/restore.put_back) on its own: each tensor keeps its
identity and gets back exactly its resting value, on its former device; one failure
does not stop the others."""
import pytest
import torch
from torch import nn

from comfyui_placement.runtime.engine.restore import put_back


def test_identity_and_exact_storage_come_back():
    m = nn.Linear(4, 3)
    w, b = m.weight, m.bias
    rest = {id(w): w.data, id(b): b.data}
    ptrs = {id(w): w.data_ptr(), id(b): b.data_ptr()}
    device_buf = torch.zeros(w.numel() + b.numel())
    w.data = device_buf[:12].view(3, 4)          # placed: views of a device buffer
    b.data = device_buf[12:]
    put_back([(w, rest[id(w)], None), (b, rest[id(b)], None)])
    assert m.weight is w and m.bias is b
    assert w.data_ptr() == ptrs[id(w)] and b.data_ptr() == ptrs[id(b)]
    assert isinstance(w, nn.Parameter) and w.requires_grad


def test_back_to_the_former_device_also_from_meta():
    p = nn.Parameter(torch.empty(2, 2, device="meta"))
    value = torch.arange(4.0).view(2, 2)
    put_back([(p, value, torch.device("cpu"))])        # a meta tensor made real
    assert p.device.type == "cpu" and torch.equal(p.data, value)
    q = nn.Parameter(torch.ones(3))
    put_back([(q, torch.zeros(3), torch.device("meta"))])
    assert q.device.type == "meta"


def test_one_failure_does_not_stop_the_others():
    a, b = nn.Parameter(torch.ones(2)), nn.Parameter(torch.ones(2))
    ra, rb = torch.zeros(2), torch.full((2,), 7.0)

    class Broken:
        device = torch.device("cpu")

        def to(self, device):
            raise RuntimeError("broken resting value")
    with pytest.raises(RuntimeError, match="broken resting value"):
        put_back([(a, ra, None), (nn.Parameter(torch.ones(1)), Broken(), torch.device("meta")),
                  (b, rb, None)])
    assert torch.equal(a.data, ra) and torch.equal(b.data, rb)
