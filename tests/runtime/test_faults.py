"""Faults survived, nothing lost: out-of-memory, interrupts, a weights file truncated or
changed while streaming, and a failing copy, injected at every block of every step.
Each gives exactly one error (the first), the module is restored exactly, the ledger
is at zero, no copy thread or file descriptor is left, and the next run is correct."""
import os
import threading
import time

import pytest
import torch
from safetensors.torch import save_file

from comfyui_placement.placement.errors import PlacementError
from comfyui_placement.runtime import place
from comfyui_placement.runtime.device.ledger import Ledger, out_of_memory
from comfyui_placement.runtime.weights.weightfile import open_weight_file
from comfyui_placement.runtime.device.simdevice import Link, SimTransfer
from comfyui_placement.runtime.device.transfer import CopyWorker, Ticket

STEPS = 2


def snapshot(model):
    params = [(n, p, p.device, p.dtype, p.detach().clone()) for n, p in model.named_parameters()]
    buffers = [(n, b, b.detach().clone()) for n, b in model.named_buffers()]
    return params, buffers


def assert_restored(model, snap):
    params, buffers = snap
    now = dict(model.named_parameters())
    assert list(now) == [n for n, *_ in params]
    for name, p, device, dtype, value in params:
        assert now[name] is p and p.device == device and p.dtype == dtype
        assert torch.equal(p.detach(), value)
    now_b = dict(model.named_buffers())
    for name, b, value in buffers:
        assert now_b[name] is b and torch.equal(b, value)
    for m in model.modules():
        assert not m._forward_pre_hooks and not m._forward_hooks


def copy_threads():
    return [t for t in threading.enumerate() if t.name.startswith("copy-") and t.is_alive()]


def open_fds():
    return len(os.listdir("/proc/self/fd"))


def assert_clean(placed, threads_before, fds_before):
    for dev in placed.stats()["devices"].values():
        assert dev["resident_bytes"] == 0 and dev["slot_bytes"] == 0, dev
    deadline = time.monotonic() + 5           # joined in close(); allow the OS a moment
    while len(copy_threads()) > threads_before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(copy_threads()) == threads_before
    # no descriptor left open (fewer is fine: the collector may close an earlier test's)
    assert open_fds() <= fds_before


def one_error(excinfo):
    """The raised error carries no note of a second one raised during the teardown."""
    notes = getattr(excinfo.value, "__notes__", [])
    assert not any("teardown" in n for n in notes), notes


def count_blocks(model):
    return len(model.transformer_blocks) + len(model.single_transformer_blocks)


def blocks_of(model):
    return list(model.transformer_blocks) + list(model.single_transformer_blocks)


def clean_run_copies(model, inp, plan, inventory, **kw):
    with place(model, plan, "diffusion", inventory, **kw) as placed:
        for _ in range(STEPS):
            with torch.no_grad():
                model(**inp)
    return placed.stats()["devices"]["cuda0"]["h2d_copies"]


def check_then_rerun(model, inp, ref, snap, placed, threads, fds, plan, inventory, **kw):
    assert_restored(model, snap)
    assert_clean(placed, threads, fds)
    with place(model, plan, "diffusion", inventory, **kw):
        for _ in range(STEPS):
            with torch.no_grad():
                assert torch.equal(model(**inp)[0], ref)
    assert_restored(model, snap)


@pytest.mark.parametrize("stream", [(0, 1), (2, 2)])
def test_a_failing_copy_at_every_copy_is_one_error(stream, tiny, plan_for, sim_inventory,
                                                   monkeypatch):
    model, inp = tiny("flux")
    with torch.no_grad():
        ref = model(**inp)[0]
    snap = snapshot(model)
    plan = plan_for("cpu", stream=stream)
    original = SimTransfer._copy
    carried = [0]

    def counting(self, ticket, dst, src):
        carried[0] += 1
        return original(self, ticket, dst, src)

    monkeypatch.setattr(SimTransfer, "_copy", counting)
    clean_run_copies(model, inp, plan, sim_inventory)
    total = carried[0]                        # copies the copy engine carries in a clean run
    assert total >= count_blocks(model) - stream[0]
    for k in range(total):
        seen = [0]

        def failing(self, ticket, dst, src, k=k, seen=seen):
            seen[0] += 1
            if seen[0] == k + 1:
                raise OSError(f"injected copy failure {k}")
            return original(self, ticket, dst, src)

        monkeypatch.setattr(SimTransfer, "_copy", failing)
        threads, fds = len(copy_threads()), open_fds()
        placed = None
        with pytest.raises(RuntimeError, match="asynchronous copy failed") as excinfo:
            with place(model, plan, "diffusion", sim_inventory) as placed:
                for _ in range(STEPS):
                    with torch.no_grad():
                        model(**inp)
        assert isinstance(excinfo.value.__cause__, OSError)
        assert f"injected copy failure {k}" in str(excinfo.value.__cause__)
        one_error(excinfo)
        monkeypatch.setattr(SimTransfer, "_copy", original)
        if placed is None:                    # failed while loading: nothing to inspect
            assert_restored(model, snap)
            continue
        check_then_rerun(model, inp, ref, snap, placed, threads, fds, plan, sim_inventory)


def test_out_of_memory_at_every_block_and_step(tiny, plan_for, sim_inventory, monkeypatch):
    model, inp = tiny("flux")
    with torch.no_grad():
        ref = model(**inp)[0]
    snap = snapshot(model)
    plan = plan_for("cpu", stream=(1, 1))
    original = Ledger.set_activations
    n = count_blocks(model)
    for k in range(n * STEPS):
        seen = [0]

        def oom(self, nbytes, what="activations", k=k, seen=seen):
            if what == "block activations":
                seen[0] += 1
                if seen[0] == k + 1:
                    raise out_of_memory(self.device, nbytes, self.total, self.capacity, what)
            return original(self, nbytes, what)

        monkeypatch.setattr(Ledger, "set_activations", oom)
        threads, fds = len(copy_threads()), open_fds()
        with pytest.raises(torch.OutOfMemoryError) as excinfo:
            with place(model, plan, "diffusion", sim_inventory) as placed:
                for _ in range(STEPS):
                    with torch.no_grad():
                        model(**inp)
        one_error(excinfo)
        assert seen[0] == k + 1
        monkeypatch.setattr(Ledger, "set_activations", original)
        check_then_rerun(model, inp, ref, snap, placed, threads, fds, plan, sim_inventory)


@pytest.mark.parametrize("kind", [KeyboardInterrupt, RuntimeError])
def test_interrupt_from_a_hook_at_every_block_and_step(kind, tiny, plan_for, sim_inventory):
    model, inp = tiny("flux")
    with torch.no_grad():
        ref = model(**inp)[0]
    snap = snapshot(model)
    plan = plan_for("cpu", stream=(0, 2))
    for step in range(STEPS):
        for block in blocks_of(model):
            calls = [0]

            def interrupt(module, args, calls=calls, step=step):
                calls[0] += 1
                if calls[0] == step + 1:
                    raise kind("injected interrupt")

            threads, fds = len(copy_threads()), open_fds()
            with pytest.raises(kind) as excinfo:
                with place(model, plan, "diffusion", sim_inventory) as placed:
                    handle = block.register_forward_pre_hook(interrupt)
                    try:
                        for _ in range(STEPS):
                            with torch.no_grad():
                                model(**inp)
                    finally:
                        handle.remove()
            one_error(excinfo)
            check_then_rerun(model, inp, ref, snap, placed, threads, fds, plan, sim_inventory)


@pytest.mark.parametrize("how", ["truncated", "changed"])
def test_weights_file_truncated_or_changed_while_streaming(how, tiny, plan_for, sim_inventory,
                                                          tmp_path, monkeypatch):
    from comfyui_placement.runtime.weights.weightfile import WeightFile
    model, inp = tiny("flux")
    with torch.no_grad():
        ref = model(**inp)[0]
    path = str(tmp_path / "flux.safetensors")
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    save_file(state, path)
    size = os.path.getsize(path)
    snap = snapshot(model)
    plan = plan_for("disk", stream=(0, 1))
    original = WeightFile.read_runs
    n = count_blocks(model)
    for k in range(n * STEPS):
        seen = [0]

        def sabotage(self, runs, buf, k=k, seen=seen):
            seen[0] += 1
            if seen[0] == k + 1:
                if how == "truncated":
                    os.truncate(path, runs[0][0] + 1)   # the block's data is cut off
                else:
                    st = os.stat(path)
                    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
            return original(self, runs, buf)

        monkeypatch.setattr(WeightFile, "read_runs", sabotage)
        threads, fds = len(copy_threads()), open_fds()
        placed = None
        with pytest.raises((RuntimeError, PlacementError)) as excinfo:
            with place(model, plan, "diffusion", sim_inventory, weights_file=path) as placed:
                for _ in range(STEPS):
                    with torch.no_grad():
                        model(**inp)
        cause = excinfo.value                     # resident blocks are read in place ...
        if not isinstance(cause, PlacementError): # ... streamed ones on the copy worker
            assert "asynchronous copy failed" in str(cause)
            cause = cause.__cause__
        assert isinstance(cause, PlacementError)
        assert ("truncated" if how == "truncated" else "changed while streaming") in str(cause)
        one_error(excinfo)
        monkeypatch.setattr(WeightFile, "read_runs", original)
        save_file(state, path)                    # the file written again, whole
        assert os.path.getsize(path) == size
        if placed is None:
            assert_restored(model, snap)
            continue
        check_then_rerun(model, inp, ref, snap, placed, threads, fds, plan, sim_inventory,
                         weights_file=path)


@pytest.mark.parametrize("content", [b"", b"\x05", b"\x10\x00\x00\x00\x00\x00\x00\x00{bad json",
                                     b"\xff" * 8 + b"x"])
def test_bad_weights_file_headers_leak_no_descriptor(content, tmp_path):
    path = tmp_path / "bad.safetensors"
    path.write_bytes(content)
    before = open_fds()
    for _ in range(50):
        with pytest.raises((PlacementError, ValueError, OverflowError, MemoryError)):
            open_weight_file(str(path))
    assert open_fds() == before


def test_a_failed_copy_is_raised_once_at_wait_not_again_at_drain():
    transfer = SimTransfer("cuda9", Link(bandwidth=1e12))
    try:
        bad = transfer.submit(torch.empty(4, dtype=torch.uint8), torch.empty(5, dtype=torch.uint8))
        good = transfer.submit(torch.empty(4, dtype=torch.uint8), torch.ones(4, dtype=torch.uint8))
        with pytest.raises(RuntimeError, match="asynchronous copy failed"):
            transfer.wait(bad)
        with pytest.raises(RuntimeError):     # waiting again still refuses the stale data
            transfer.wait(bad)
        transfer.wait(good)
        transfer.drain()                      # seen already: not raised a second time
        # a failure nobody waited for is raised by drain, once
        transfer.submit(torch.empty(4, dtype=torch.uint8), torch.empty(5, dtype=torch.uint8))
        with pytest.raises(RuntimeError, match="asynchronous copy failed"):
            transfer.drain()
        transfer.drain()
    finally:
        transfer.close()


def test_an_unwaited_failure_is_kept_past_the_pending_list_trim():
    transfer = SimTransfer("cuda9", Link(bandwidth=1e12))
    try:
        transfer.submit(torch.empty(4, dtype=torch.uint8), torch.empty(5, dtype=torch.uint8))
        for _ in range(200):                  # many copies after it: the list is trimmed
            t = transfer.submit(torch.empty(4, dtype=torch.uint8),
                                torch.ones(4, dtype=torch.uint8))
            transfer.wait(t)
        with pytest.raises(RuntimeError, match="asynchronous copy failed"):
            transfer.drain()
    finally:
        transfer.close()


def test_close_does_not_give_up_silently_on_a_stuck_worker():
    release = threading.Event()
    worker = CopyWorker("stuck", lambda ticket: release.wait())
    worker.put(Ticket(0), ())
    with pytest.raises(RuntimeError, match="did not stop within"):
        worker.close(timeout=0.2)
    release.set()                             # let it finish: no thread left behind
    worker._thread.join(5)
    assert not worker._thread.is_alive()
