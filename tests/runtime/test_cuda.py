"""The CUDA transfer path on a real GPU (skipped where there is none): streamed equals
resident bit for bit, pinned host buffers, the slots given back."""
import copy

import pytest
import torch

from comfyui_placement.placement.devices import Inventory
from comfyui_placement.runtime import place

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.parametrize("arch,k,depth", [("flux", 0, 1), ("unet", 1, 2), ("wan", 0, 4)])
def test_streaming_on_cuda_equals_resident(arch, k, depth, tiny, plan_for, tmp_path):
    model, inp = tiny(arch)
    gpu = copy.deepcopy(model).cuda()
    dev_inp = {key: v.cuda() if isinstance(v, torch.Tensor) else v for key, v in inp.items()}
    with torch.no_grad():
        ref = gpu(**dev_inp)[0]
    inventory = Inventory.detect()
    plan = plan_for("cpu", stream=(k, depth), budget=1 << 30)
    with place(model, plan, "diffusion", inventory) as placed:
        with torch.no_grad():
            outs = [model(**inp)[0] for _ in range(3)]    # inputs moved by the root hook
        assert placed.stats()["pinned_bytes"] > 0
    for out in outs:
        assert out.is_cuda and torch.equal(out, ref)
    assert next(model.parameters()).device.type == "cpu"
    assert placed.stats()["devices"]["cuda0"]["slot_bytes"] == 0


def _delayed_gate(device, cycles=200_000_000):
    """An event that completes only after a long kernel on a side stream: a copy made to
    wait for it lands late, deterministically."""
    side = torch.cuda.Stream(device)
    with torch.cuda.stream(side):
        torch.cuda._sleep(cycles)
        gate = torch.cuda.Event()
        gate.record(side)
    return gate


def test_cuda_copy_is_read_only_after_wait():
    """Fails if CudaTransfer.wait does not order compute after the copy: a consumer that
    waits reads the new bytes, one that does not reads the stale ones."""
    from comfyui_placement.runtime.device.transfer import CudaTransfer
    device = torch.device("cuda:0")
    tr = CudaTransfer("cuda:0")
    try:
        src = torch.full((1 << 20,), 7, dtype=torch.uint8).pin_memory()
        dst = torch.zeros(1 << 20, dtype=torch.uint8, device=device)
        ticket = tr.submit(dst, src, after=_delayed_gate(device))
        stale = dst.clone()                    # the copy is still held back by the gate
        tr.wait(ticket)
        fresh = dst.clone()
        torch.cuda.synchronize(device)
        assert int(stale.max()) == 0
        assert bool((fresh == 7).all())
        tr.drain()
    finally:
        tr.close()


def test_cuda_host_copies_need_no_thread():
    """Copies from host memory are issued by the caller: no worker thread starts."""
    import threading
    from comfyui_placement.runtime.device.transfer import CudaTransfer
    before = {t.name for t in threading.enumerate()}
    tr = CudaTransfer("cuda:0")
    try:
        src = torch.ones(1024, dtype=torch.uint8).pin_memory()
        dst = torch.empty(1024, dtype=torch.uint8, device="cuda:0")
        tr.wait(tr.submit(dst, src))
        assert not ({t.name for t in threading.enumerate()} - before)
        assert bool((dst == 1).all())
    finally:
        tr.close()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_exact_pinned_buffers_are_page_locked_copy_right_and_are_given_back():
    import gc
    from comfyui_placement.runtime.host.pinned import PinnedAccount
    acc = PinnedAccount(1 << 30)                  # the real cudaHostRegister
    sizes = [(3 << 20) + 7, (1 << 20) + 1]
    bufs = [acc.alloc(n) for n in sizes]
    assert [b.numel() for b in bufs] == sizes and acc.in_use == sum(sizes)
    stream = torch.cuda.Stream()
    for b in bufs:
        assert b.is_pinned()
        b.copy_(torch.randint(0, 255, (b.numel(),), dtype=torch.uint8))
        with torch.cuda.stream(stream):
            dev = b.to("cuda", non_blocking=True)
        stream.synchronize()
        assert torch.equal(dev.cpu(), b)
    del bufs, b
    gc.collect()
    assert acc.in_use == 0


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_each_block_computes_with_its_own_device_current():
    """A layer split over cuda0&cuda1: a block on cuda1 runs with cuda1 current (kernels
    that bind a workspace to the current device, fp8/int8 ones, need it), including a
    block whose container forward never runs (entered through its units); the caller's
    current device is put back after the forward."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).parent))
    from test_split_layer import split_plan
    from test_unit_entry import LoopUNet, build
    from comfyui_placement.runtime.split import place_split

    from comfyui_placement.runtime.blocks.find import find_blocks
    model, inp = build(LoopUNet)
    seen = []
    torch.cuda.set_device(0)
    plan = split_plan(["cuda0", "cuda1"], [None, None], params="cpu")
    with place_split(model, plan, "diffusion", Inventory.detect()) as placed:
        # after the placement's own hooks, so they see the device it made current
        handles = [unit.register_forward_pre_hook(
            lambda m, a: seen.append(torch.cuda.current_device()))
            for _, block in find_blocks(model) for unit in block.children()]
        model.skip_patch = lambda h, hsp: (h, placed.follow(hsp, h))
        with torch.no_grad():
            model(**inp)
        model.skip_patch = None
        for h in handles:
            h.remove()
    assert 0 in seen and 1 in seen
    assert torch.cuda.current_device() == 0
