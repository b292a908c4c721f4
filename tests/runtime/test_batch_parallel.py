"""Batch parallel (runtime/parallel): shares of a batch on two simulated devices at once,
each under its own placement. Outputs equal the single-device run; the module is
restored exactly on exit, after an error and after an interrupt."""
import threading
import time

import pytest
import torch

from comfyui_placement.placement.errors import PlacementError
from comfyui_placement.placement.plan import ComponentPlan, DevicePlan, Plan, StreamPlan
from comfyui_placement.runtime.parallel import BatchPlaced, place_batch, share_counts
from comfyui_placement.runtime.parallel.batch_cut import cut_batch, gather


DEVICES = ("cuda0", "cuda1")
MODES = {"resident": ("dev", None), "staged": ("cpu", None), "streamed": ("cpu", (1, 1)),
         "streamed-all": ("cpu", (0, 2))}


def snapshot(model):
    params = [(n, p, p.device, p.dtype, p.requires_grad, p.detach().clone())
              for n, p in model.named_parameters()]
    return params, [(n, b, b.detach().clone()) for n, b in model.named_buffers()]


def assert_restored(model, snap):
    """Same objects, devices, dtypes and values; no hook left anywhere."""
    params, buffers = snap
    now = dict(model.named_parameters())
    assert list(now) == [n for n, *_ in params]
    for name, p, device, dtype, grad, value in params:
        assert now[name] is p and p.device == device and p.dtype == dtype
        assert p.requires_grad == grad and torch.equal(p.detach(), value)
    now_b = dict(model.named_buffers())
    for name, b, value in buffers:
        assert now_b[name] is b and torch.equal(b, value)
    for m in model.modules():
        assert not m._forward_pre_hooks and not m._forward_hooks


def batch_plan(params="cpu", stream=None, devices=DEVICES, parallel="batch"):
    devs = [DevicePlan(d, "gpu", 256 << 20, 256 << 20, None) for d in devices]
    params = devices[0] if params == "dev" else params
    cp = ComponentPlan("diffusion", list(devices), params, parallel=parallel,
                       stream=StreamPlan(*stream) if stream else None)
    return Plan(devs, {"diffusion": cp})


def batched(inp, n, seed=1):
    """The tiny model's inputs with a batch of n (per-item tensors resampled)."""
    g = torch.Generator().manual_seed(seed)
    out = dict(inp)
    for k, v in inp.items():
        if isinstance(v, torch.Tensor) and v.dim() > 0 and v.shape[0] == 1:
            out[k] = torch.randn((n,) + tuple(v.shape[1:]), generator=g)
    out["timestep"] = torch.linspace(1.0, 3.0, n)
    return out


def run(model, inp):
    with torch.no_grad():
        return model(**inp)[0]


def test_share_counts():
    assert share_counts(4, [1, 1]) == [2, 2]
    assert share_counts(5, [1, 1]) == [3, 2]          # ties: the earlier device
    assert share_counts(4, [3, 1]) == [3, 1]
    assert share_counts(1, [1, 1]) == [1, 0]
    assert share_counts(1, [1, 2]) == [0, 1]          # the faster device takes it
    assert share_counts(2, [1, 1, 1]) == [1, 1, 0]
    assert sum(share_counts(7, [0.3, 1.7, 1.0])) == 7
    with pytest.raises(PlacementError, match="positive"):
        share_counts(2, [1, 0])


def test_cut_and_gather_keep_order_and_structure():
    x = torch.arange(12.).view(4, 3)
    ids = torch.zeros(3, 2)                            # not batch-shaped: passed whole
    args = (x, {"y": x * 2, "ids": ids, "opts": {"n": 1}}, [x, 5])
    a = cut_batch(args, 4, 1, 3)
    assert torch.equal(a[0], x[1:3]) and torch.equal(a[1]["y"], x[1:3] * 2)
    assert a[1]["ids"] is ids and a[1]["opts"] == {"n": 1} and a[2][1] == 5
    assert cut_batch(ids, 4, 0, 2) is ids
    parts = [(x[:1], {"s": x[:1]}), (x[1:], {"s": x[1:]})]
    out = gather(parts, None)
    assert torch.equal(out[0], x) and torch.equal(out[1]["s"], x)


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("arch", ["sd3", "wan"])
def test_outputs_equal_single_device_and_restore_exactly(arch, mode, tiny, sim_inventory):
    model, inp = tiny(arch)
    inp = batched(inp, 4)
    whole = run(model, inp)                           # one device, one forward
    shares = torch.cat([run(model, cut_batch(inp, 4, 0, 2)), run(model, cut_batch(inp, 4, 2, 4))])
    snap = snapshot(model)
    params, stream = MODES[mode]
    with place_batch(model, batch_plan(params, stream), "diffusion", sim_inventory) as placed:
        out = run(model, inp)
        assert "forward" in model.__dict__
    # the same shares computed on one device: bit for bit; the whole batch in one
    # forward: within float rounding (a GEMM's blocking depends on its row count)
    assert torch.equal(out, shares)
    torch.testing.assert_close(out, whole, rtol=1e-5, atol=1e-5)
    assert_restored(model, snap)
    assert "forward" not in model.__dict__
    assert torch.equal(run(model, inp), whole)
    s = placed.stats()
    assert s["items"] == {"cuda0": 2, "cuda1": 2} and s["parallel"] == "batch"
    for d in DEVICES:                                  # both devices held and computed
        assert s["devices"][d]["h2d_bytes"] > 0
        assert s["devices"][d]["resident_bytes"] == 0 and s["devices"][d]["slot_bytes"] == 0
        assert s["threads"][d] == 1


def test_shares_run_on_two_threads_at_once(tiny, sim_inventory, monkeypatch):
    """Share 0 in the caller's thread, share 1 on a worker, overlapping in time."""
    model, inp = tiny("sd3")
    inp = batched(inp, 2)
    inside = []
    barrier = threading.Barrier(2, timeout=20)
    real = BatchPlaced._run_share

    def meet(self, i, args, kwargs):
        barrier.wait()                                 # both shares are running now
        inside.append((i, threading.get_ident()))
        return real(self, i, args, kwargs)
    monkeypatch.setattr(BatchPlaced, "_run_share", meet)
    with place_batch(model, batch_plan(), "diffusion", sim_inventory):
        run(model, inp)
    assert sorted(i for i, _ in inside) == [0, 1]
    assert inside[0][1] != inside[1][1]


def test_streamed_devices_share_one_packed_host_copy(tiny, sim_inventory):
    model, inp = tiny("wan")
    inp = batched(inp, 2)
    ref = run(model, inp)
    with place_batch(model, batch_plan("cpu", (0, 1)), "diffusion", sim_inventory) as placed:
        out = run(model, inp)
    per = placed.stats()["per_device"]
    streamed = per["cuda0"]["streamed_bytes_per_forward"]
    assert streamed > 0
    assert per["cuda0"]["host_pack_bytes"] == streamed     # packed once...
    assert per["cuda1"]["host_pack_bytes"] == 0            # ...and read by both devices
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_speeds_set_the_shares_and_batch_one_runs_on_one_device(tiny, sim_inventory):
    model, inp = tiny("sd3")
    ref4 = run(model, batched(inp, 4))
    ref1 = run(model, inp)
    with place_batch(model, batch_plan(), "diffusion", sim_inventory,
                     speeds={"cuda0": 1.0, "cuda1": 3.0}) as placed:
        out4 = run(model, batched(inp, 4))
        assert placed.stats()["last_shares"] == {"cuda0": 1, "cuda1": 3}
        out1 = run(model, inp)
        assert placed.stats()["last_shares"] == {"cuda0": 0, "cuda1": 1}
    torch.testing.assert_close(out4, ref4, rtol=1e-5, atol=1e-5)
    assert torch.equal(out1, ref1)                      # one device ran it whole
    assert placed.stats()["items"] == {"cuda0": 1, "cuda1": 4}


def test_return_dict_outputs_are_gathered(tiny, sim_inventory):
    model, inp = tiny("sd3")
    inp = dict(batched(inp, 3), return_dict=True)
    with torch.no_grad():
        ref = model(**inp).sample
        with place_batch(model, batch_plan(), "diffusion", sim_inventory):
            out = model(**inp)
    assert type(out).__name__ == "Transformer2DModelOutput"
    torch.testing.assert_close(out.sample, ref, rtol=1e-5, atol=1e-5)


def test_a_failing_share_is_one_error_and_the_module_is_restored(tiny, sim_inventory,
                                                                  monkeypatch):
    model, inp = tiny("sd3")
    inp = batched(inp, 2)
    ref = run(model, inp)
    snap = snapshot(model)
    real = BatchPlaced._run_share

    def fail_on_1(self, i, args, kwargs):
        if i == 1:
            raise RuntimeError("cuda1 failed")
        time.sleep(0.05)                               # share 0 is still computing
        return real(self, i, args, kwargs)
    monkeypatch.setattr(BatchPlaced, "_run_share", fail_on_1)
    with pytest.raises(RuntimeError, match="cuda1 failed"):
        with place_batch(model, batch_plan("cpu", (0, 1)), "diffusion", sim_inventory):
            run(model, inp)
    assert_restored(model, snap)
    assert "forward" not in model.__dict__
    assert torch.equal(run(model, inp), ref)


def test_two_failing_shares_raise_the_first_with_the_second_noted(tiny, sim_inventory,
                                                                   monkeypatch):
    model, inp = tiny("sd3")

    def fail(self, i, args, kwargs):
        time.sleep(0.3 if i == 0 else 0.0)             # cuda1 fails first
        raise RuntimeError(f"share {i} failed")
    monkeypatch.setattr(BatchPlaced, "_run_share", fail)
    with pytest.raises(RuntimeError, match="share 1 failed") as info:
        with place_batch(model, batch_plan(), "diffusion", sim_inventory):
            run(model, batched(inp, 2))
    assert any("share 0 failed" in n for n in getattr(info.value, "__notes__", []))


def test_interrupt_waits_for_running_shares_then_restores(tiny, sim_inventory, monkeypatch):
    model, inp = tiny("wan")
    inp = batched(inp, 2)
    ref = run(model, inp)
    snap = snapshot(model)
    finished = []
    real = BatchPlaced._run_share

    def interrupt_0(self, i, args, kwargs):
        if i == 0:
            raise KeyboardInterrupt
        time.sleep(0.2)                                # still streaming when it comes
        out = real(self, i, args, kwargs)
        finished.append(i)
        return out
    monkeypatch.setattr(BatchPlaced, "_run_share", interrupt_0)
    with pytest.raises(KeyboardInterrupt):
        with place_batch(model, batch_plan("cpu", (0, 1)), "diffusion", sim_inventory):
            run(model, inp)
    assert finished == [1]                             # the share ended before teardown
    assert_restored(model, snap)
    assert torch.equal(run(model, inp), ref)


def test_inference_mode_reaches_the_worker_thread(tiny, sim_inventory, monkeypatch):
    model, inp = tiny("sd3")
    seen = {}
    real = BatchPlaced._run_share

    def record(self, i, args, kwargs):
        seen[i] = torch.is_inference_mode_enabled()
        return real(self, i, args, kwargs)
    monkeypatch.setattr(BatchPlaced, "_run_share", record)
    with place_batch(model, batch_plan(), "diffusion", sim_inventory):
        with torch.inference_mode():
            out = model(**batched(inp, 2))[0]
    assert seen == {0: True, 1: True} and out.is_inference()


@pytest.mark.parametrize("plan,match", [
    (batch_plan(parallel="none"), "parallel 'batch'"),
    (batch_plan(devices=("cuda0",)), "two or more runtime devices"),
])
def test_plans_it_cannot_run_are_one_line_errors(plan, match, tiny, sim_inventory):
    model, _ = tiny("sd3")
    with pytest.raises(PlacementError, match=match):
        place_batch(model, plan, "diffusion", sim_inventory)
    with pytest.raises(PlacementError, match="not runtime devices"):
        place_batch(model, batch_plan(), "diffusion", sim_inventory, speeds={"cuda7": 1})


def test_spec_to_plan_to_place_runs_batch_parallel(tiny):
    """The user's words end to end: backend a&b with split_mode batch, through place()."""
    from comfyui_placement import PlacementSpec, place, plan
    from comfyui_placement.placement.devices import Inventory
    # simulated GPUs allocate no kernel workspace; the working memory planned at a small
    # frame, as the test runs
    inv = Inventory.simulated("cuda0=256MiB@workspace=0,cuda1=256MiB@workspace=0")
    model, inp = tiny("wan")
    inp = batched(inp, 2)
    ref = run(model, inp)
    spec = PlacementSpec(backend="diffusion=cuda0&cuda1", split_mode="diffusion=batch",
                         stream_layers=True)
    p = plan(spec, inv, {"diffusion": model}, resolution=(64, 64))
    with place(model, p, "diffusion", inv) as placed:
        out = run(model, inp)
    assert isinstance(placed, BatchPlaced)
    s = placed.stats()
    assert s["items"] == {"cuda0": 1, "cuda1": 1}
    assert all(v["mode"] == "stream" for v in s["per_device"].values())
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_shares_follow_the_planned_throughputs(tiny, sim_inventory):
    """A plan carrying the cost model's throughputs (auto-fit's DevicePlan.throughput)
    shares the batch in their proportion without a speeds option."""
    model, inp = tiny("sd3")
    plan = batch_plan()
    for dev, flops in (("cuda0", 1e12), ("cuda1", 3e12)):
        plan.device(dev).throughput = flops
    with place_batch(model, plan, "diffusion", sim_inventory) as placed:
        run(model, batched(inp, 4))
    assert placed.stats()["last_shares"] == {"cuda0": 1, "cuda1": 3}


def test_the_callers_root_hooks_run_once_per_call(tiny, sim_inventory):
    model, inp = tiny("sd3")
    calls = []
    handle = model.register_forward_pre_hook(lambda m, a, k: calls.append(
        k["hidden_states"].shape[0]), with_kwargs=True)
    try:
        with place_batch(model, batch_plan(), "diffusion", sim_inventory):
            run(model, batched(inp, 2))
    finally:
        handle.remove()
    assert calls == [2]                    # the whole batch, once; not again per share


def test_runtime_lora_and_release_reach_every_device(tiny, sim_inventory):
    """set_lora patches each device's copy (outputs equal the fused model's); release
    gives every device's memory back and the next forward loads and patches again."""
    import copy as _copy
    from comfyui_placement.runtime.engine.lora import apply_in_place
    model, inp = tiny("sd3")
    inp = batched(inp, 2)
    g = torch.Generator().manual_seed(7)
    params = dict(model.named_parameters())
    names = ["pos_embed.proj.weight", "transformer_blocks.1.ff.net.0.proj.weight"]
    names = [n for n in names if n in params and params[n].dim() == 2] or \
        [n for n, p in params.items() if p.dim() == 2][:2]
    patches = {n: [(torch.randn(4, params[n].shape[1], generator=g) * 0.1,
                    torch.randn(params[n].shape[0], 4, generator=g) * 0.1, 8.0, 1.0)]
               for n in names}
    ref_model = _copy.deepcopy(model)
    with torch.no_grad():
        for n, p in dict(ref_model.named_parameters()).items():
            if n in patches:
                apply_in_place(p.data, patches[n])
    ref = run(ref_model, inp)
    plain = run(model, inp)
    assert not torch.allclose(ref, plain, atol=1e-4)       # the patches change the output
    with place_batch(model, batch_plan("cpu", (0, 1)), "diffusion", sim_inventory) as placed:
        placed.set_lora(patches)
        torch.testing.assert_close(run(model, inp), ref, rtol=1e-5, atol=1e-5)
        held = {d: v["resident_bytes"] for d, v in placed.stats()["devices"].items()}
        placed.release()                   # weights and slots go; the patches stay
        for d, v in placed.stats()["devices"].items():
            assert v["slot_bytes"] == 0 and 0 < v["resident_bytes"] < held[d]
        torch.testing.assert_close(run(model, inp), ref, rtol=1e-5, atol=1e-5)
        placed.set_lora({})
        torch.testing.assert_close(run(model, inp), plain, rtol=1e-5, atol=1e-5)
    assert placed.stats()["items"] == {"cuda0": 3, "cuda1": 3}


def test_autocast_reaches_the_worker_thread(tiny, sim_inventory):
    model, inp = tiny("sd3")
    inp = batched(inp, 2)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        shares = torch.cat([model(**cut_batch(inp, 2, 0, 1))[0], model(**cut_batch(inp, 2, 1, 2))[0]])
        with place_batch(model, batch_plan(), "diffusion", sim_inventory):
            out = model(**inp)[0]
    assert out.dtype == shares.dtype == torch.bfloat16
    assert torch.equal(out, shares)
