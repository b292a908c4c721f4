"""place(): modes, refusals with reasons, exact restore (also after an out-of-memory),
release, and the block order learned on the first forward."""
import pytest
import torch
from safetensors.torch import save_file

from comfyui_placement.placement.errors import PlacementError
from comfyui_placement.runtime import place


def snapshot(model):
    params = [(n, p, p.device, p.dtype, p.requires_grad, p.detach().clone())
              for n, p in model.named_parameters()]
    buffers = [(n, b, b.detach().clone()) for n, b in model.named_buffers()]
    return params, buffers


def assert_restored(model, snap):
    params, buffers = snap
    now = dict(model.named_parameters())
    assert list(now) == [n for n, *_ in params]
    for name, p, device, dtype, grad, value in params:
        assert now[name] is p                     # the same Parameter object
        assert p.device == device and p.dtype == dtype and p.requires_grad == grad
        assert torch.equal(p.detach(), value)
    now_b = dict(model.named_buffers())
    for name, b, value in buffers:
        assert now_b[name] is b and torch.equal(b, value)
    for m in model.modules():
        assert not m._forward_pre_hooks and not m._forward_hooks


@pytest.mark.parametrize("params,stream", [("cuda0", None), ("cpu", None), ("cpu", (1, 1)),
                                           ("cpu", (0, 2))])
def test_modes_restore_exactly(params, stream, tiny, run_model, plan_for, sim_inventory):
    model, inp = tiny("wan")
    ref = run_model(model, inp)
    snap = snapshot(model)
    with place(model, plan_for(params, stream=stream), "diffusion", sim_inventory) as placed:
        assert torch.equal(run_model(model, inp), ref)
    assert_restored(model, snap)
    assert torch.equal(run_model(model, inp), ref)
    dev = placed.stats()["devices"]["cuda0"]
    total = sum(t.numel() * t.element_size() for t in
                list(model.parameters()) + list(model.buffers()))
    if stream is None:                            # every weight copied once, for the phase
        assert dev["h2d_bytes"] == total
        assert dev["peak_bytes"] >= total
    assert dev["resident_bytes"] == 0 and dev["slot_bytes"] == 0   # all given back


def test_oom_mid_run_restores_and_smaller_plan_reruns(tiny, run_model, plan_for,
                                                      sim_inventory):
    model, inp = tiny("flux")
    ref = run_model(model, inp)
    big = dict(inp, hidden_states=torch.randn(1, 4096, 8), img_ids=torch.zeros(4096, 3))
    snap = snapshot(model)
    budget = 700 * 1024              # fits the weights and small activations only
    plan = plan_for("cpu", stream=(5, 1), budget=budget)
    with pytest.raises(torch.OutOfMemoryError, match="cuda0: out of memory"):
        with place(model, plan, "diffusion", sim_inventory):
            assert torch.equal(run_model(model, inp), ref)
            run_model(model, big)    # the activations exceed the budget midway
    assert_restored(model, snap)
    smaller = plan_for("cpu", stream=(0, 1), budget=budget)
    with place(model, smaller, "diffusion", sim_inventory) as placed:
        assert torch.equal(run_model(model, inp), ref)
    assert placed.stats()["devices"]["cuda0"]["peak_bytes"] <= budget
    assert_restored(model, snap)


def test_budget_too_small_for_the_weights_fails_before_touching_the_module(
        tiny, run_model, plan_for, sim_inventory):
    model, inp = tiny("sd3")
    snap = snapshot(model)
    # the plan's prefix does not fit, nor does the ring alone: refused in one line before
    # anything is copied (not an out-of-memory error from the ledger half-way)
    with pytest.raises(PlacementError, match="streaming ring .* short by"):
        with place(model, plan_for("cpu", stream=(3, 1), budget=10_000), "diffusion",
                   sim_inventory):
            pass
    assert_restored(model, snap)


def test_interrupt_mid_forward_leaves_next_forward_correct(tiny, run_model, plan_for,
                                                          sim_inventory):
    model, inp = tiny("flux")
    ref = run_model(model, inp)
    block = model.single_transformer_blocks[1]

    def interrupt(module, args):
        raise KeyboardInterrupt

    for first in (True, False):             # interrupted while learning the order, or later
        with place(model, plan_for("cpu", stream=(0, 2)), "diffusion",
                   sim_inventory) as placed:
            if not first:
                assert torch.equal(run_model(model, inp), ref)
            handle = block.register_forward_pre_hook(interrupt)
            with pytest.raises(KeyboardInterrupt):
                run_model(model, inp)
            handle.remove()
            assert torch.equal(run_model(model, inp), ref)
            assert torch.equal(run_model(model, inp), ref)
            assert not placed.streamer.dynamic and not placed.streamer.sync


def test_reload_after_release_inside_inference_mode(tiny, run_model, plan_for, sim_inventory):
    """ComfyUI samples under torch.inference_mode: a reload there must still give the copy
    worker normal tensors to write (it runs outside inference mode)."""
    model, inp = tiny("wan")
    ref = run_model(model, inp)
    with place(model, plan_for("cpu", stream=(1, 1)), "diffusion", sim_inventory) as placed:
        placed.release()
        with torch.inference_mode():
            assert torch.equal(run_model(model, inp), ref)
            placed.release()
            assert torch.equal(run_model(model, inp), ref)


def test_release_gives_memory_back_and_next_forward_reloads(tiny, run_model, plan_for,
                                                           sim_inventory):
    model, inp = tiny("unet")
    ref = run_model(model, inp)
    with place(model, plan_for("cpu", stream=(2, 1)), "diffusion", sim_inventory) as placed:
        assert torch.equal(run_model(model, inp), ref)
        placed.release()
        dev = placed.stats()["devices"]["cuda0"]
        assert dev["resident_bytes"] == 0 and dev["slot_bytes"] == 0
        assert torch.equal(run_model(model, inp), ref)      # on the host copies? no: reloaded
        assert placed.stats()["devices"]["cuda0"]["resident_bytes"] > 0


def test_refusals_say_why(tiny, plan_for, sim_inventory):
    model, _ = tiny("wan")
    snap = snapshot(model)
    cases = [
        (plan_for("cuda0", stream=(0, 1)), "streaming needs params=cpu or params=disk"),
        (plan_for("disk", stream=(0, 1)), "needs the model file"),
        (plan_for("cpu", stream=(0, -1)), "prefetch_depth >= 0"),
        (plan_for("cuda1"), "params on cuda1 with runtime cuda0"),
        (plan_for("cpu", runtime="cpu", stream=(0, 1)), "nothing to stream"),
    ]
    for plan, message in cases:
        with pytest.raises(PlacementError, match=message):
            with place(model, plan, "diffusion", sim_inventory):
                pass
    with pytest.raises(PlacementError, match="no component 'te'"):
        place(model, plan_for("cpu"), "te", sim_inventory)
    lone = torch.nn.Sequential(torch.nn.Linear(4, 4))
    with pytest.raises(PlacementError, match="no repeated blocks"):
        with place(lone, plan_for("cpu", stream=(0, 1)), "diffusion", sim_inventory):
            pass
    assert_restored(model, snap)


class Shuffled(torch.nn.Module):
    """Runs its blocks in an order the structure does not tell; optionally one twice."""

    def __init__(self, order):
        super().__init__()
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(16, 16) for _ in range(4))
        self.head = torch.nn.Linear(16, 16)
        self.order = order

    def forward(self, x):
        for i in self.order:
            x = torch.tanh(self.blocks[i](x))
        return self.head(x)


def test_execution_order_is_learned_on_the_first_forward(plan_for, sim_inventory):
    torch.manual_seed(0)
    model = Shuffled([2, 0, 3, 1]).eval()
    x = torch.randn(3, 16)
    with torch.no_grad():
        ref = model(x)
    block_bytes = 16 * 16 * 4 + 16 * 4
    with place(model, plan_for("cpu", stream=(0, 1)), "diffusion", sim_inventory) as placed:
        with torch.no_grad():
            assert torch.equal(model(x), ref)           # first forward: corrected on the fly
            before = placed.stats()["devices"]["cuda0"]["h2d_bytes"]
            assert torch.equal(model(x), ref)
            assert torch.equal(model(x), ref)
        after = placed.stats()["devices"]["cuda0"]["h2d_bytes"]
    assert placed.streamer.schedule == [2, 0, 3, 1]
    # learned: each forward copies its 4 blocks once, no synchronous reloads; the ring
    # has already started the next forward's first 2 blocks (depth 1: 2 slots)
    assert after - before == (2 * 4 + 2) * block_bytes


def test_a_block_never_called_is_never_copied(plan_for, sim_inventory):
    torch.manual_seed(0)
    model = Shuffled([3, 0, 2]).eval()                  # blocks[1] is skipped
    x = torch.randn(3, 16)
    with torch.no_grad():
        ref = model(x)
    block_bytes = 16 * 16 * 4 + 16 * 4
    with place(model, plan_for("cpu", stream=(0, 1)), "diffusion", sim_inventory) as placed:
        with torch.no_grad():
            for _ in range(3):
                assert torch.equal(model(x), ref)
            h0 = placed.stats()["devices"]["cuda0"]["h2d_bytes"]
            assert torch.equal(model(x), ref)
        assert placed.stats()["devices"]["cuda0"]["h2d_bytes"] - h0 == 3 * block_bytes
        assert placed.streamer.streamed_bytes == 3 * block_bytes


def test_block_run_twice_falls_back_to_synchronous_and_stays_correct(plan_for, sim_inventory):
    torch.manual_seed(0)
    model = Shuffled([0, 1, 2, 1, 3]).eval()
    x = torch.randn(3, 16)
    with torch.no_grad():
        ref = model(x)
    with pytest.warns(RuntimeWarning, match="more than once per forward"):
        with place(model, plan_for("cpu", stream=(0, 2)), "diffusion", sim_inventory):
            with torch.no_grad():
                for _ in range(3):
                    assert torch.equal(model(x), ref)


def test_disk_residency_on_a_meta_module(tiny, run_model, plan_for, sim_inventory, tmp_path):
    model, inp = tiny("flux")
    ref = run_model(model, inp)
    path = tmp_path / "flux.safetensors"
    save_file(model.state_dict(), str(path))
    with torch.device("meta"):
        empty, _ = tiny("flux")
    assert next(empty.parameters()).is_meta
    with place(empty, plan_for("disk", stream=(1, 2)), "diffusion", sim_inventory,
               weights_file=str(path)):
        assert torch.equal(run_model(empty, inp), ref)
    assert next(empty.parameters()).is_meta                # back as it was


def test_disk_file_checks(tiny, plan_for, sim_inventory, tmp_path):
    model, _ = tiny("wan")
    sd = model.state_dict()
    path = tmp_path / "m.safetensors"
    save_file({k: v.half() for k, v in sd.items()}, str(path))
    with pytest.raises(PlacementError, match="needs the file's dtypes"):
        with place(model, plan_for("disk", stream=(0, 1)), "diffusion", sim_inventory,
                   weights_file=str(path)):
            pass
    save_file({k: v for k, v in sd.items() if "blocks.1." not in k}, str(path))
    with pytest.raises(PlacementError, match="has no tensor 'blocks.1"):
        with place(model, plan_for("disk", stream=(0, 1)), "diffusion", sim_inventory,
                   weights_file=str(path)):
            pass
    with pytest.raises(PlacementError, match="not found"):
        with place(model, plan_for("disk", stream=(0, 1)), "diffusion", sim_inventory,
                   weights_file=str(tmp_path / "missing.safetensors")):
            pass


def test_disk_key_map_for_prefixed_checkpoints(tiny, run_model, plan_for, sim_inventory,
                                               tmp_path):
    model, inp = tiny("sd3")
    ref = run_model(model, inp)
    path = tmp_path / "ckpt.safetensors"
    save_file({"model.diffusion_model." + k: v for k, v in model.state_dict().items()},
              str(path))
    other, _ = tiny("sd3", seed=3)
    with place(other, plan_for("disk", stream=(0, 1)), "diffusion", sim_inventory,
               weights_file=str(path), key_map=lambda k: "model.diffusion_model." + k):
        assert torch.equal(run_model(other, inp), ref)


def test_cpu_runtime_runs_in_place_or_streams_from_disk(tiny, run_model, plan_for,
                                                        sim_inventory, tmp_path):
    model, inp = tiny("sd3")
    ref = run_model(model, inp)
    snap = snapshot(model)
    data_ptr = next(model.parameters()).data_ptr()
    with place(model, plan_for("cpu", runtime="cpu"), "diffusion", sim_inventory) as placed:
        assert next(model.parameters()).data_ptr() == data_ptr      # no second copy
        assert torch.equal(run_model(model, inp), ref)
    s = placed.stats()
    assert s["mode"] == "in place" and s["devices"]["cpu"]["h2d_bytes"] == 0
    assert_restored(model, snap)
    path = tmp_path / "sd3.safetensors"
    save_file(model.state_dict(), str(path))
    other, _ = tiny("sd3", seed=2)
    with place(other, plan_for("disk", runtime="cpu", stream=(0, 1)), "diffusion",
               sim_inventory, weights_file=str(path)):
        assert torch.equal(run_model(other, inp), ref)            # disk -> RAM slots


def test_pinned_pool_falls_back_to_pageable_with_a_warning():
    from comfyui_placement.runtime.host.residency import PinnedPool
    pool = PinnedPool(enabled=True, cap_bytes=0)
    with pytest.warns(RuntimeWarning, match="pageable"):
        buf = pool.alloc(64)
    assert buf.numel() == 64 and not buf.is_pinned()
    assert pool.pinned_bytes == 0 and pool.pageable_bytes == 64


def test_budget_defaults_to_the_devices_free_memory(tiny, run_model, plan_for):
    from comfyui_placement.placement.devices import Inventory
    model, inp = tiny("wan")
    small = Inventory.simulated("cuda0=64GiB/40KiB")        # little free memory left
    with pytest.raises(PlacementError, match="capacity is 40.00 KiB.*free memory on cuda0"):
        with place(model, plan_for("cpu", stream=(0, 1), budget=None), "diffusion", small):
            pass
    roomy = Inventory.simulated("cuda0=64GiB/1GiB")
    with place(model, plan_for("cpu", stream=(0, 1), budget=None), "diffusion",
               roomy) as placed:
        run_model(model, inp)
    assert placed.stats()["devices"]["cuda0"]["capacity_bytes"] == 1 << 30


def test_a_real_device_that_is_absent_is_refused(tiny, plan_for):
    from comfyui_placement.placement.devices import Device, Inventory
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    model, _ = tiny("wan")
    inv = Inventory([Device("cuda0", "gpu", 8 << 30, 8 << 30, torch_device="cuda:0")])
    with pytest.raises(PlacementError, match="not available to torch"):
        with place(model, plan_for("cpu", stream=(0, 1)), "diffusion", inv):
            pass
