"""GGUF under the simulated device's checks (issue 29 item 6): modules holding a tensor
subclass, as ComfyUI-GGUF's do, run under the device check and the working-memory meter.

`QTensor` stands for ComfyUI-GGUF's GGMLTensor in what broke the check: a torch.Tensor
subclass over the raw bytes whose constructor takes required keyword arguments, and a
layer that drops the class through torch's legacy constructor (`torch.Tensor(w)`).
Under a dispatch mode that constructor used to hand back a QTensor and fail in its
`__init__`; the check was turned off for such modules. Here they are checked: a block
that never arrives raises DeviceMismatch, the meter counts the dequantized weights, and
the bytes copied per forward are the blocks' quantized bytes."""
import contextlib
from collections import OrderedDict

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from comfyui_placement.runtime import place
from comfyui_placement.runtime.gguf import dequantize
from comfyui_placement.runtime.device.simcheck import DeviceMismatch, ForwardCheck
from comfyui_placement.runtime.device.subclass_check import build_subclass

gguf = pytest.importorskip("gguf")
WIDTH, BLOCKS = 64, 4


class QTensor(torch.Tensor):
    def __new__(cls, data, *, qtype):
        return super().__new__(cls, data)

    def __init__(self, data, *, qtype):
        super().__init__()
        self.qtype = qtype


class QLayer(nn.Module):
    def __init__(self, raw: np.ndarray):
        super().__init__()
        self.weight = nn.Parameter(QTensor(torch.from_numpy(raw.copy()), qtype="Q8_0"),
                                   requires_grad=False)

    def forward(self, x):
        raw = self.weight.reshape(WIDTH, -1)            # ops on a QTensor give QTensors
        w = dequantize(torch.Tensor(raw), "Q8_0", (WIDTH, WIDTH), x.dtype)  # legacy ctor
        return torch.tanh(F.linear(x, w))


class Block(nn.Module):
    def __init__(self, raws):
        super().__init__()
        self.a, self.b = QLayer(raws[0]), QLayer(raws[1])

    def forward(self, x):
        return x + self.b(self.a(x))


class QStack(nn.Module):
    """Blocks of two QLayers, and one QLayer outside them (resident, as a model's
    embedders are)."""

    def __init__(self, raws):
        super().__init__()
        self.head = QLayer(raws[-1])
        self.blocks = nn.ModuleList(Block(raws[2 * i:2 * i + 2]) for i in range(BLOCKS))

    def forward(self, x):
        x = self.head(x)
        for block in self.blocks:
            x = block(x)
        return x


def quantized_weights(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [gguf.quants.quantize(torch.randn(WIDTH, WIDTH, generator=g).numpy(),
                                 gguf.GGMLQuantizationType.Q8_0) for _ in range(2 * BLOCKS + 1)]


@contextlib.contextmanager
def never_arrives(root: nn.Module, block: nn.Module):
    """While inside, each forward of `root` runs `block` with no hook on it or on any
    module inside it: what a loop calling the block's own code does. The hooks are taken
    off when `root` is entered (after the placement's own root hook, which may attach
    them then) and put back on leaving, so the block's weights are never brought over."""
    saved = []

    def strip(module, args):
        for m in block.modules():
            saved.append((m, m._forward_pre_hooks, m._forward_hooks))
            m._forward_pre_hooks, m._forward_hooks = OrderedDict(), OrderedDict()
    handle = root.register_forward_pre_hook(strip)
    try:
        yield
    finally:
        handle.remove()
        for m, pre, post in reversed(saved):
            m._forward_pre_hooks, m._forward_hooks = pre, post


def test_the_legacy_constructor_works_under_the_check():
    raw = torch.from_numpy(quantized_weights()[0].copy())
    q = QTensor(raw, qtype="Q8_0")
    check = ForwardCheck("diffusion", "cuda0")
    check.watched = {1: "x"}                # anything watched: the mode checks every op
    check.enter()
    try:
        plain = torch.Tensor(q)
        rebuilt = build_subclass(QTensor, raw[:2], qtype="Q8_0")
    finally:
        check.leave()
    assert type(plain) is torch.Tensor and plain.data_ptr() == raw.data_ptr()
    assert type(rebuilt) is QTensor and rebuilt.qtype == "Q8_0" and \
        rebuilt.data_ptr() == raw.data_ptr()


@pytest.mark.parametrize("resident", [0, 1])
def test_subclass_weights_are_checked_metered_and_move_their_quantized_bytes(
        resident, plan_for, sim_inventory):
    raws = quantized_weights()
    model = QStack(raws).eval()
    x = torch.randn(3, WIDTH)
    with torch.no_grad():
        ref = model(x)
    assert all(type(p) is QTensor for p in model.parameters())
    # independent of the stats: each block's raw Q8_0 arrays, and one dequantized weight
    block_bytes = [raws[2 * i].nbytes + raws[2 * i + 1].nbytes for i in range(BLOCKS)]
    streamed = sum(block_bytes[resident:])
    with place(model, plan_for("cpu", stream=(resident, 1)), "diffusion",
               sim_inventory) as placed:
        h2d = []
        for _ in range(3):
            with torch.no_grad():
                assert torch.equal(model(x), ref)
            h2d.append(placed.stats()["devices"]["cuda0"]["h2d_bytes"])
        stats = placed.stats()
    assert stats["device_check"] == "on"
    # the first call's rehearsal on the meta device ran through the subclass too
    assert [f for f in stats.get("fallbacks", []) if f["kind"] == "not_rehearsed"] == []
    assert stats["streamed_blocks"] == BLOCKS - resident
    # a forward copies every streamed block's quantized bytes once, and nothing else
    assert [b - a for a, b in zip(h2d, h2d[1:])] == [streamed, streamed]
    # the meter saw the dequantized float weights computed on the device
    assert stats["devices"]["cuda0"]["working_peak_bytes"] >= WIDTH * WIDTH * 4
    assert all(type(p) is QTensor for p in model.parameters())
    with torch.no_grad():
        assert torch.equal(model(x), ref)                      # restored


def test_a_block_that_never_arrives_raises_device_mismatch(plan_for, sim_inventory):
    model = QStack(quantized_weights()).eval()
    x = torch.randn(3, WIDTH)
    with torch.no_grad():
        ref = model(x)
    with place(model, plan_for("cpu", stream=(0, 1)), "diffusion", sim_inventory) as placed:
        with never_arrives(model, model.blocks[2]), torch.no_grad():
            with pytest.raises(DeviceMismatch, match=r"blocks\.2\.a\.weight .*rests in host "
                                                     r"memory, not on cuda0"):
                model(x)
        with torch.no_grad():                                  # with its hooks back: runs
            assert torch.equal(model(x), ref)
        assert placed.stats()["device_check"] == "on"


def test_a_subclass_without_storage_turns_the_check_off_by_name():
    class Wrapper(torch.Tensor):
        @staticmethod
        def __new__(cls, inner):
            return torch.Tensor._make_wrapper_subclass(cls, inner.shape, dtype=inner.dtype)

        def __init__(self, inner):
            self.inner = inner

        @classmethod
        def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
            raise NotImplementedError

    plain = torch.ones(4)
    q = QTensor(torch.ones(4, dtype=torch.uint8), qtype="Q8_0")
    check = ForwardCheck("diffusion", "cuda0")
    check.watch([("w", plain), ("q", q)])
    assert check.off_because is None
    assert check.watched == {plain.untyped_storage().data_ptr(): "w",
                             q.untyped_storage().data_ptr(): "q"}
    check.watch([("w", plain), ("blocks.0.w", Wrapper(plain))])
    assert check.watched == {} and check.off_because == \
        "blocks.0.w is a Wrapper (a tensor subclass) without a storage to watch"
