"""Pinned host memory exact and bounded (runtime/host/pinned.py), through the accounting on
CPU: a no-op register stands in for cudaHostRegister, everything else is the real path."""
import gc

import pytest
import torch

from comfyui_placement.runtime import place
import importlib
engine_module = importlib.import_module("comfyui_placement.runtime.engine.core")
from comfyui_placement.runtime.host.pinned import PinnedAccount, default_cap
from comfyui_placement.runtime.host.residency import PinnedPool


def fake_account(cap):
    log = {"registered": [], "unregistered": 0}
    acc = PinnedAccount(cap, lambda ptr, n: log["registered"].append(n),
                        lambda ptr: log.__setitem__("unregistered", log["unregistered"] + 1))
    return acc, log


def test_exact_sizes_no_power_of_two_rounding_freed_with_the_last_view():
    acc, log = fake_account(1 << 30)
    sizes = [648 * 1000 + 3, 270 * 1000 + 1, 5]
    bufs = [acc.alloc(n) for n in sizes]
    assert [b.numel() for b in bufs] == sizes and log["registered"] == sizes
    assert acc.in_use == sum(sizes)
    view = bufs[0][100:200]
    del bufs
    gc.collect()
    assert acc.in_use == sizes[0]             # a view keeps its buffer pinned
    del view
    gc.collect()
    assert acc.in_use == 0 and log["unregistered"] == 3


def test_cap_exactly_reached_passes_one_byte_over_is_refused():
    acc, _ = fake_account(1000)
    a = acc.alloc(600)
    b = acc.alloc(400)                        # exactly at the cap
    assert b is not None and acc.in_use == 1000
    assert acc.alloc(1) is None and acc.in_use == 1000
    del a
    gc.collect()
    assert acc.alloc(600) is not None         # freed bytes are usable again


def test_a_pool_past_the_cap_is_pageable_with_a_warning_in_stats():
    acc, _ = fake_account(1 << 20)
    pool = PinnedPool(True, 1000, account=acc)
    kept = pool.alloc(1000)
    with pytest.warns(RuntimeWarning, match="cap"):
        buf, pinned = pool.alloc_flagged(10)
    assert not pinned and pool.pageable_bytes == 10 and "pageable" in pool.warning
    assert pool.pinned_bytes == 1000
    del kept


def test_default_cap_is_lower_on_windows(monkeypatch):
    import sys
    monkeypatch.setattr(sys, "platform", "linux")
    linux = default_cap(64 << 30)
    monkeypatch.setattr(sys, "platform", "win32")
    assert default_cap(64 << 30) < linux == 32 << 30


def test_pinned_host_ram_of_a_streamed_placement_is_the_streamed_weights(
        tiny, run_model, plan_for, sim_inventory, monkeypatch):
    """Host RAM with pinning <= 1.1x the streamed weights: every streamed block's packed
    host buffer pinned at its exact size, nothing else pinned; given back with the module."""
    acc, log = fake_account(1 << 30)

    class Pinning(PinnedPool):                # the CUDA decision, taken on a simulated device
        def __init__(self, enabled, cap):
            super().__init__(True, cap, account=acc)

    monkeypatch.setattr(engine_module, "PinnedPool", Pinning)
    model, inp = tiny("flux")
    ref = run_model(model, inp)
    with place(model, plan_for("cpu", stream=(0, 1)), "diffusion", sim_inventory,
               rehearse=False) as placed:          # loaded at entry
        assert torch.equal(run_model(model, inp), ref)
        assert torch.equal(run_model(model, inp), ref)
    stats = placed.stats()
    streamed = stats["streamed_bytes_per_forward"]
    assert streamed > 0
    assert acc.in_use <= 1.1 * streamed
    assert acc.in_use == sum(log["registered"])
    assert stats["pinned_bytes"] == acc.in_use and stats["pageable_host_bytes"] == 0
    assert torch.equal(run_model(model, inp), ref)   # the module reads its pinned copies
    del model, placed
    gc.collect()
    assert acc.in_use == 0
