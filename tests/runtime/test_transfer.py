"""The simulated device: modelled copy time, stale data before the wait, the ledger."""
import time

import pytest
import torch

from comfyui_placement.runtime.device.ledger import Ledger
from comfyui_placement.runtime.device.simdevice import Link, SimTransfer


def test_copy_lands_only_after_modelled_time():
    tr = SimTransfer("sim", Link(bandwidth=1e9, latency=0.05))
    try:
        src = torch.ones(1 << 20, dtype=torch.uint8)
        dst = torch.zeros_like(src)
        t0 = time.perf_counter()
        ticket = tr.submit(dst, src)
        assert dst.sum().item() == 0          # still on the wire: stale bytes
        tr.wait(ticket)
        elapsed = time.perf_counter() - t0
        assert torch.equal(dst, src)
        assert elapsed >= 0.05 + (1 << 20) / 1e9 - 1e-3
    finally:
        tr.close()


def test_copies_are_ordered_like_one_engine():
    tr = SimTransfer("sim", Link(bandwidth=1e9, latency=0.02))
    try:
        bufs = [torch.zeros(16, dtype=torch.uint8) for _ in range(3)]
        t0 = time.perf_counter()
        tickets = [tr.submit(b, torch.full((16,), i + 1, dtype=torch.uint8))
                   for i, b in enumerate(bufs)]
        tr.wait(tickets[-1])
        assert time.perf_counter() - t0 >= 3 * 0.02 - 1e-3   # serial, not parallel
        assert all(t.done.is_set() for t in tickets)
        assert [b[0].item() for b in bufs] == [1, 2, 3]
    finally:
        tr.close()


def test_copy_error_surfaces_on_wait():
    tr = SimTransfer("sim", Link(bandwidth=None))
    try:
        ticket = tr.submit(torch.zeros(4, dtype=torch.uint8), torch.zeros(5, dtype=torch.uint8))
        with pytest.raises(RuntimeError, match="asynchronous copy failed"):
            tr.wait(ticket)
    finally:
        tr.close()


def test_ledger_raises_the_real_oom_class_and_tracks_peak():
    led = Ledger("cuda0", 1000)
    led.reserve("resident", 600, "weights")
    led.set_activations(300)
    with pytest.raises(torch.cuda.OutOfMemoryError, match="cuda0: out of memory"):
        led.reserve("slots", 200, "slot")
    with pytest.raises(torch.OutOfMemoryError):
        led.set_activations(401)
    assert led.held["activations"] == 300       # a refused charge changes nothing
    led.set_activations(100)
    led.reserve("slots", 200, "slot")
    assert led.peak_bytes == 900
    led.release("slots", 200)
    led.release("resident", 600)
    assert led.total == 100 and led.peak_bytes == 900
