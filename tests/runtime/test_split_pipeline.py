"""Pipelined layer split on simulated devices: shares of a batch flow through the stages
one behind the other; outputs equal the shares run one after the other through the plain
split, batch 1 is the plain split, errors and interrupts leave the module as it was."""
import threading
from dataclasses import replace

import pytest
import torch

from comfyui_placement.placement.devices import Inventory
from comfyui_placement.placement.errors import PlacementError
from comfyui_placement.runtime.blocks.find import find_blocks
from comfyui_placement.runtime.split import PipelinedSplit, place_split

from test_split_layer import INVENTORY, T5Like, assert_restored, snapshot, split_plan


def pipe_plan(*args, **kwargs):
    plan = split_plan(*args, **kwargs)
    plan.components["diffusion"] = replace(plan.components["diffusion"], parallel="pipeline")
    return plan


def model_and_ids(batch=4, n=12):
    torch.manual_seed(0)
    return T5Like(n=n, width=64).eval(), torch.randint(0, 20, (batch, 6))


def plain_by_shares(model, plan, ids, counts):
    """The shares one after the other through the plain layer split."""
    plain = split_plan(plan.components["diffusion"].runtime, [8 << 20] * 3,
                       params=plan.components["diffusion"].params,
                       blocks=plan.components["diffusion"].blocks)
    outs, start = [], 0
    with place_split(model, plain, "diffusion", Inventory.simulated(INVENTORY)):
        for c in counts:
            with torch.no_grad():
                outs.append(model(ids[start:start + c]))
            start += c
    return torch.cat(outs)


def split_threads():
    """Share threads still running. A joined thread can stay listed by enumerate() for a
    moment after join() returns (stopped, not yet deleted): it has stopped, so not counted."""
    return [t for t in threading.enumerate()
            if t.name.startswith("pipeline share") and t.is_alive()]


@pytest.mark.parametrize("ndev", [2, 3])
def test_pipelined_equals_shares_through_plain_split(ndev):
    model, ids = model_and_ids(batch=4)
    with torch.no_grad():
        whole = model(ids)
    snap = snapshot(model)
    runtime = ["cuda0", "cuda1", "cuda2"][:ndev]
    plan = pipe_plan(runtime, [8 << 20] * ndev)
    with place_split(model, plan, "diffusion", Inventory.simulated(INVENTORY)) as placed:
        assert isinstance(placed, PipelinedSplit)
        with torch.no_grad():
            out = model(ids)
            out2 = model(ids)
        s = placed.stats()
    assert_restored(model, snap)
    assert torch.equal(out, out2)
    assert torch.allclose(out, whole, atol=1e-5)
    blocks = {k: v for k, v in s["ranges"].items()}
    plain = plain_by_shares(model, replace_blocks(plan, blocks), ids, [1, 1, 1, 1])
    assert torch.equal(out, plain)
    assert s["pipeline"] == {"shares": 4, "forwards": 2}
    assert s["forwards"] == 2 and len(s["ranges"]) == ndev
    assert s["hops"] == 2 * 4 * ndev           # every share enters each range and comes back
    for dev in placed.stats()["devices"].values():
        assert dev["resident_bytes"] == 0 and dev["peak_bytes"] <= dev["capacity_bytes"]
    assert not split_threads()


def replace_blocks(plan, blocks):
    plan.components["diffusion"] = replace(plan.components["diffusion"], blocks=blocks)
    return plan


def test_stages_overlap_and_run_shares_in_order():
    """Each block sees the shares in order; share 1 computes in stage 1 while share 0 is
    inside stage 2 (share 0 waits in its last block until share 1 ran block 0: a
    pipeline that ran one stage at a time would time out there)."""
    model, ids = model_and_ids(batch=3)
    plan = pipe_plan(["cuda0", "cuda1"], [8 << 20] * 2,
                     blocks={"cuda0": [0, 5], "cuda1": [6, 11]})
    blocks = [b for _, b in find_blocks(model)]
    log, lock = [], threading.Lock()
    share1_in_stage1 = threading.Event()
    overlapped = []
    with place_split(model, plan, "diffusion", Inventory.simulated(INVENTORY)):
        def pre(i, module, args):
            name = threading.current_thread().name
            with lock:
                log.append((i, name))
            if i == 0 and name == "pipeline share 1":
                share1_in_stage1.set()
            if i == 11 and name == "pipeline share 0":
                overlapped.append(share1_in_stage1.wait(timeout=10))
        hs = [b.register_forward_pre_hook(lambda m, a, i=i: pre(i, m, a))
              for i, b in enumerate(blocks)]
        try:
            with torch.no_grad():
                model(ids)
        finally:
            for h in hs:
                h.remove()
    for i in range(len(blocks)):
        assert [name for j, name in log if j == i] == \
            [f"pipeline share {s}" for s in range(3)]
    assert overlapped == [True]


def test_batch_one_is_the_plain_split_bit_equal():
    model, ids = model_and_ids(batch=1)
    with torch.no_grad():
        ref = model(ids)
    plan = pipe_plan(["cuda0", "cuda1"], [8 << 20] * 2)
    with place_split(model, plan, "diffusion", Inventory.simulated(INVENTORY)) as placed:
        with torch.no_grad():
            out = model(ids)
    assert torch.equal(out, ref)
    assert placed.stats()["pipeline"] == {"shares": 0, "forwards": 0}


def test_streamed_stage():
    model, ids = model_and_ids(batch=4)
    with torch.no_grad():
        whole = model(ids)
    size = sum(p.numel() * 4 for p in model.block[1].parameters())
    budget = 2 * size + 64 * 1024
    plan = pipe_plan(["cuda0", "cuda1"], [8 << 20, budget], params="cpu", stream=(0, 1),
                     blocks={"cuda0": [0, 5], "cuda1": [6, 11]})
    snap = snapshot(model)
    with place_split(model, plan, "diffusion", Inventory.simulated(INVENTORY)) as placed:
        with torch.no_grad():
            outs = [model(ids) for _ in range(3)]
        s = placed.stats()
    assert_restored(model, snap)
    streamed = s["streamed_blocks"]["cuda1"]
    assert 0 < streamed <= 6
    plain = plain_by_shares(model, pipe_plan(["cuda0", "cuda1"], [8 << 20] * 2,
                                             blocks={"cuda0": [0, 5], "cuda1": [6, 11]}),
                            ids, [1, 1, 1, 1])
    for out in outs:
        assert torch.equal(out, plain) and torch.allclose(out, whole, atol=1e-5)
    cuda1 = s["devices"]["cuda1"]
    assert cuda1["peak_bytes"] <= cuda1["capacity_bytes"]
    assert cuda1["h2d_bytes"] >= 3 * 4 * streamed * size   # the ring served every share


@pytest.mark.parametrize("kind", [RuntimeError, KeyboardInterrupt])
def test_error_in_stage_two_of_share_one(kind):
    model, ids = model_and_ids(batch=4)
    with torch.no_grad():
        whole = model(ids)
    snap = snapshot(model)
    plan = pipe_plan(["cuda0", "cuda1"], [8 << 20] * 2,
                     blocks={"cuda0": [0, 5], "cuda1": [6, 11]})
    armed = [True]

    def boom(module, args):
        if armed[0] and threading.current_thread().name == "pipeline share 1":
            armed[0] = False
            raise kind("injected")
    with place_split(model, plan, "diffusion", Inventory.simulated(INVENTORY)) as placed:
        h = model.block[8].register_forward_pre_hook(boom)
        with pytest.raises(kind, match="injected") as info:
            with torch.no_grad():
                model(ids)
        assert "forward" in model.__dict__          # still placed
        with torch.no_grad():
            again = model(ids)                      # next run correct
        h.remove()
        with pytest.raises(kind):
            armed[0] = True
            h = model.block[8].register_forward_pre_hook(boom)
            with torch.no_grad():
                model(ids)
        h.remove()
        assert all(t.ledger.held["activations"] == 0 for t in placed.targets)
        assert not split_threads()
    assert info.value is not None
    assert torch.allclose(again, whole, atol=1e-5)
    assert_restored(model, snap)
    for dev in placed.stats()["devices"].values():
        assert dev["resident_bytes"] == 0
    assert not split_threads()


def test_row_split_with_pipeline_is_refused():
    model, _ = model_and_ids()
    plan = pipe_plan(["cuda0", "cuda1"], [8 << 20] * 2, mode="row")
    with pytest.raises(PlacementError, match="use split_mode=layer"):
        place_split(model, plan, "diffusion", Inventory.simulated(INVENTORY))


def test_flux_tiny_batch_two(tiny, run_model):
    model, inp = tiny("flux")
    torch.manual_seed(1)
    inp = dict(inp, hidden_states=torch.randn(2, 16, 8),
               encoder_hidden_states=torch.randn(2, 8, 32),
               pooled_projections=torch.randn(2, 16), timestep=torch.tensor([0.5, 0.7]))
    whole = run_model(model, inp)
    snap = snapshot(model)
    plan = pipe_plan(["cuda0", "cuda1"], [8 << 20] * 2)
    with place_split(model, plan, "diffusion", Inventory.simulated(INVENTORY)) as placed:
        out = run_model(model, inp)
    assert_restored(model, snap)
    assert placed.stats()["pipeline"]["shares"] == 2
    assert torch.allclose(out, whole, atol=1e-5)


class Residual(torch.nn.Module):
    """The residual inside the block: a parent adding its own x to a block's output on
    another device is refused, as a GPU refuses it (runtime/device/simcheck.py)."""

    def __init__(self, width):
        super().__init__()
        self.lin = torch.nn.Linear(width, width)

    def forward(self, x):
        return x + torch.tanh(self.lin(x))


class Skipper(torch.nn.Module):
    """Skips the first block of the second stage for items whose first value is > 0:
    a share that never meets a stage's gate must not hold the others."""

    def __init__(self, n=8, width=16):
        super().__init__()
        self.blocks = torch.nn.ModuleList(Residual(width) for _ in range(n))

    def forward(self, x):
        for i, b in enumerate(self.blocks):
            if i == 4 and bool(x[0, 0] > 0):
                continue
            x = b(x)
        return x


def test_a_share_skipping_a_stage_start_does_not_hang():
    torch.manual_seed(0)
    model = Skipper().eval()
    x = torch.randn(4, 16)
    x[0, 0], x[1, 0], x[2, 0], x[3, 0] = 1.0, -1.0, 1.0, -1.0
    with torch.no_grad():
        ref = torch.cat([model(x[i:i + 1]) for i in range(4)])
    plan = pipe_plan(["cuda0", "cuda1"], [8 << 20] * 2,
                     blocks={"cuda0": [0, 3], "cuda1": [4, 7]})
    out = []
    with place_split(model, plan, "diffusion", Inventory.simulated(INVENTORY)):
        def call():
            with torch.no_grad():
                out.append(model(x))
        t = threading.Thread(target=call, daemon=True)
        t.start()
        t.join(timeout=30)
        assert not t.is_alive(), "the pipelined forward hung"
    assert torch.equal(out[0], ref)


def test_place_routes_a_pipeline_plan_and_stats_keys():
    """runtime.place with a plan from JSON (parallel pipeline) gets the pipelined engine;
    its stats have the plain split's keys plus "pipeline"; shares= caps the shares."""
    from comfyui_placement.placement.plan import Plan
    from comfyui_placement.runtime import place
    model, ids = model_and_ids(batch=4)
    with torch.no_grad():
        whole = model(ids)
    plain = split_plan(["cuda0", "cuda1"], [8 << 20] * 2)
    data = plain.to_json() if hasattr(plain, "to_json") else None
    assert data is not None
    piped = Plan.from_json(data.replace('"parallel": "none"', '"parallel": "pipeline"'))
    assert piped.components["diffusion"].parallel == "pipeline"
    with place_split(model, plain, "diffusion", Inventory.simulated(INVENTORY)) as p0:
        with torch.no_grad():
            model(ids)
    with place(model, piped, "diffusion", Inventory.simulated(INVENTORY), shares=2) as p1:
        assert isinstance(p1, PipelinedSplit)
        with torch.no_grad():
            out = model(ids)
    assert torch.allclose(out, whole, atol=1e-5)
    s0, s1 = p0.stats(), p1.stats()
    assert set(s1) == set(s0) | {"pipeline"}
    assert s1["pipeline"] == {"shares": 2, "forwards": 1}


def test_real_device_code_path_on_two_host_devices():
    """The non-simulated path (tensor.device, gather onto the main device)."""
    from comfyui_placement.placement.devices import Device
    from comfyui_placement.placement.plan import ComponentPlan, DevicePlan, Plan
    model, ids = model_and_ids(batch=3)
    with torch.no_grad():
        ref = torch.cat([model(ids[i:i + 1]) for i in range(3)])
    inv = Inventory([Device("host0", "cpu", 1 << 30, 1 << 30, torch_device="cpu"),
                     Device("host1", "cpu", 1 << 30, 1 << 30, torch_device="cpu")])
    devices = [DevicePlan(n, "cpu", 1 << 30, 1 << 30, 1 << 20) for n in ("host0", "host1")]
    plan = Plan(devices, {"diffusion": ComponentPlan("diffusion", ["host0", "host1"], "host0",
                                                     parallel="pipeline")})
    with place_split(model, plan, "diffusion", inv) as placed:
        with torch.no_grad():
            out = model(ids)
    assert torch.equal(out, ref)
    assert placed.stats()["pipeline"] == {"shares": 3, "forwards": 1}


def test_interrupt_in_the_calling_thread_stops_every_share():
    """Ctrl-C reaches the caller while it waits for the shares: every share stops at its
    next stage boundary and is joined before the KeyboardInterrupt is raised."""
    import _thread
    model, ids = model_and_ids(batch=4)
    with torch.no_grad():
        whole = model(ids)
    snap = snapshot(model)
    plan = pipe_plan(["cuda0", "cuda1"], [8 << 20] * 2,
                     blocks={"cuda0": [0, 5], "cuda1": [6, 11]})
    armed, seen = [True], []

    def ctrl_c(module, args):
        seen.append(threading.current_thread().name)
        if armed[0] and threading.current_thread().name == "pipeline share 1":
            armed[0] = False
            _thread.interrupt_main()
            threading.Event().wait(0.2)             # the caller sees it while we compute
    with place_split(model, plan, "diffusion", Inventory.simulated(INVENTORY)) as placed:
        h = model.block[2].register_forward_pre_hook(ctrl_c)
        try:
            with torch.no_grad():
                model(ids)
            raised = None
        except KeyboardInterrupt as exc:
            raised = exc
        assert raised is not None, f"no KeyboardInterrupt; block 2 entered by {seen}"
        assert not split_threads()
        h.remove()
        with torch.no_grad():
            again = model(ids)
        assert all(t.ledger.held["activations"] == 0 for t in placed.targets)
    assert torch.allclose(again, whole, atol=1e-5)
    assert_restored(model, snap)
