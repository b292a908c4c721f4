"""A placement of a structural copy (runtime/engine/shadow.py) with a host store
(runtime/host/hoststore.py): the caller's module keeps its tensors, hooks and inference
flags; streamed blocks are packed into host memory once and reused by the next
placement; the store follows the placement (issue 8, items 3 and 4)."""
import torch

from conftest import WORK

from comfyui_placement.placement.devices import Inventory
from comfyui_placement.placement.plan import ComponentPlan, DevicePlan, Plan, StreamPlan
from comfyui_placement.runtime.blocks.find import find_blocks
from comfyui_placement.runtime.host.hoststore import (
    HostStore,
    drop_store,
    existing_store,
    store_for,
)
from comfyui_placement.runtime.place import place
from comfyui_placement.runtime.engine.shadow import Shadow


def inference_model(tiny):
    """Weights made under inference_mode, as ComfyUI's loaders make them."""
    with torch.inference_mode():
        model, inp = tiny("flux")
    return model, inp


def state(model):
    return {n: (t, t.data_ptr(), t.is_inference(), t.requires_grad, t.dtype, t.shape,
                t.detach().clone())
            for n, t in list(model.named_parameters()) + list(model.named_buffers())}


def hooks(model):
    return sum(len(v) for m in model.modules() for k, v in vars(m).items()
               if k.endswith("hooks") or "_hooks_" in k)


def run_placed(model, inp, plan, inventory, store, run_model):
    shadow = Shadow(model)
    with place(shadow.module, plan, "diffusion", inventory, host_store=store,
               repoint=shadow.repoint, headroom_bytes=WORK) as placed:
        outs = [run_model(shadow.module, inp) for _ in range(2)]
    return outs, placed.stats()


def block_bytes(model):
    return [sum(t.numel() * t.element_size() for t in list(b.parameters()) + list(b.buffers()))
            for _, b in find_blocks(model)]


def test_copy_leaves_the_module_as_it_was(tiny, run_model, plan_for, sim_inventory):
    model, inp = inference_model(tiny)
    ref = run_model(model, inp)
    before, n_hooks = state(model), hooks(model)
    store = HostStore()
    outs, stats = run_placed(model, inp, plan_for("cpu", stream=(1, 1)), sim_inventory, store,
                             run_model)
    assert all(torch.equal(o, ref) for o in outs)
    after = state(model)
    moved = 0
    for name, (t, ptr, inf, rg, dtype, shape, value) in before.items():
        t2, ptr2, inf2, rg2, dtype2, shape2, value2 = after[name]
        assert t2 is t and inf2 == inf and rg2 == rg and dtype2 == dtype and shape2 == shape
        assert torch.equal(value2, value), name
        moved += ptr2 != ptr
    assert all(v[2] for v in after.values())          # still inference tensors
    assert hooks(model) == n_hooks
    # moved tensors point into the store's (pageable) buffers: one host copy
    ranges = store.pageable_ranges()
    streamed = sum(block_bytes(model)[1:])
    assert stats["host_pack_bytes"] == streamed == store.nbytes
    inside = sum(t.numel() * t.element_size() for t, *_ in after.values()
                 if any(lo <= t.data_ptr() < hi for lo, hi in ranges))
    assert moved > 0 and inside == store.nbytes
    assert torch.equal(run_model(model, inp), ref)     # the module itself still runs


def test_second_placement_packs_nothing(tiny, run_model, plan_for, sim_inventory):
    model, inp = inference_model(tiny)
    ref = run_model(model, inp)
    store = HostStore()
    plan = plan_for("cpu", stream=(1, 1))
    _, first = run_placed(model, inp, plan, sim_inventory, store, run_model)
    outs, second = run_placed(model, inp, plan, sim_inventory, store, run_model)
    assert first["host_pack_bytes"] == first["streamed_bytes_per_forward"] > 0
    assert second["host_pack_bytes"] == 0
    assert all(torch.equal(o, ref) for o in outs)


def test_a_replaced_tensor_repacks_its_group(tiny, run_model, plan_for, sim_inventory):
    model, inp = tiny("flux")
    store = HostStore()
    plan = plan_for("cpu", stream=(1, 1))
    run_placed(model, inp, plan, sim_inventory, store, run_model)
    last = find_blocks(model)[-1][1]
    p = next(last.parameters())
    p.data = p.data.clone()                    # the caller moved one weight elsewhere
    ref = run_model(model, inp)
    outs, stats = run_placed(model, inp, plan, sim_inventory, store, run_model)
    assert stats["host_pack_bytes"] == block_bytes(model)[-1]
    assert all(torch.equal(o, ref) for o in outs)


def test_store_follows_the_placement(tiny, run_model, plan_for, sim_inventory):
    model, inp = tiny("flux")
    sizes = block_bytes(model)
    store = HostStore()
    run_placed(model, inp, plan_for("cpu", stream=(1, 1)), sim_inventory, store, run_model)
    assert store.nbytes == sum(sizes[1:])
    # more blocks resident: the groups no longer streamed are dropped, the rest reused
    _, stats = run_placed(model, inp, plan_for("cpu", stream=(3, 1)), sim_inventory, store,
                          run_model)
    assert stats["host_pack_bytes"] == 0 and store.nbytes == sum(sizes[3:])
    # nothing streamed from host memory: nothing kept
    run_placed(model, inp, plan_for("cpu"), sim_inventory, store, run_model)
    assert len(store) == 0


def test_store_registry_per_module(tiny):
    model, _ = tiny("flux")
    assert existing_store(model) is None
    store = store_for(model)
    assert store_for(model) is store and existing_store(model) is store
    drop_store(model)
    assert existing_store(model) is None


def test_layer_split_streams_from_the_kept_copy(tiny, run_model):
    model, inp = inference_model(tiny)
    ref = run_model(model, inp)
    sizes = block_bytes(model)
    budget = sizes[1] + 2 * max(sizes[2:]) + 16 * 1024 + WORK   # cuda1 streams part of its range
    devices = [DevicePlan(n, "gpu", 256 << 20, 256 << 20, b)
               for n, b in (("cuda0", 4 << 20), ("cuda1", budget))]
    plan = Plan(devices, {"diffusion": ComponentPlan(
        "diffusion", ["cuda0", "cuda1"], "cpu", split_mode="layer", stream=StreamPlan(0, 1),
        blocks={"cuda0": [0, 0], "cuda1": [1, 4]})})
    inv = Inventory.simulated("cuda0=256MiB,cuda1=256MiB")
    before = state(model)
    store = HostStore()
    outs1, first = run_placed(model, inp, plan, inv, store, run_model)
    outs2, second = run_placed(model, inp, plan, inv, store, run_model)
    assert first["streamed_blocks"] == {"cuda1": 3}
    assert first["host_pack_bytes"] == sum(sizes[2:]) and second["host_pack_bytes"] == 0
    assert all(torch.equal(o, ref) for o in outs1 + outs2)
    after = state(model)
    for name, b in before.items():
        assert after[name][0] is b[0] and after[name][2] and torch.equal(after[name][6], b[6])
