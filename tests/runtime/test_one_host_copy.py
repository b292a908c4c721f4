"""One host copy (issue 11 item 6): streaming from host memory, on one device or in a
layer split, holds the weights once in RAM (the packed buffers are the module's storage
while placed and after), and a reload after release() brings each streamed block back
from its packed copy in one copy."""
import pytest
import torch

from comfyui_placement.placement.plan import ComponentPlan, DevicePlan, Plan, StreamPlan
from comfyui_placement.runtime.blocks.find import find_blocks
from comfyui_placement.runtime.place import place


def model_bytes(model):
    return sum(t.numel() * t.element_size()
               for t in list(model.parameters()) + list(model.buffers()))


def storages(tensors):
    """Distinct host storages behind `tensors`: {address: bytes}."""
    out = {}
    for t in tensors:
        if t is not None and t.device.type == "cpu":
            st = t.untyped_storage()
            out[st.data_ptr()] = st.nbytes()
    return out


def split_plan(blocks, budgets):
    """Every block streamed (the planner's per-device prefix K=0 on each range)."""
    devices = [DevicePlan(n, "gpu", 256 << 20, 256 << 20, b) for n, b in budgets.items()]
    plan = Plan(devices, {"diffusion": ComponentPlan(
        "diffusion", list(budgets), "cpu", split_mode="layer", stream=StreamPlan(0, 1),
        blocks=blocks)})
    plan.components["diffusion"].stream.per_device = {n: [0, b - a + 1]
                                                      for n, (a, b) in blocks.items()}
    return plan


def test_single_device_stream_holds_one_copy(tiny, run_model, plan_for, sim_inventory):
    model, inp = tiny("flux")
    ref = run_model(model, inp)
    total = model_bytes(model)
    with place(model, plan_for("cpu", stream=(0, 1)), "diffusion", sim_inventory) as placed:
        held = storages(list(placed.rest.values()) +
                        [s.host for s in placed.streamer.sources])
        assert sum(held.values()) == total
        assert torch.equal(run_model(model, inp), ref)
    assert sum(storages(list(model.parameters()) + list(model.buffers())).values()) == total


def test_layer_split_stream_holds_one_copy(tiny, run_model, sim_inventory):
    model, inp = tiny("flux")
    ref = run_model(model, inp)
    total = model_bytes(model)
    plan = split_plan({"cuda0": [0, 1], "cuda1": [2, 4]}, {"cuda0": None, "cuda1": None})
    with place(model, plan, "diffusion", sim_inventory) as placed:
        assert sum(placed.stats()["streamed_blocks"].values()) == 5
        held = storages(list(placed.rest.values()) +
                        [s.host for st in placed.streamers for s in st.sources])
        assert sum(held.values()) == total          # not total + the streamed bytes
        assert torch.equal(run_model(model, inp), ref)
    assert sum(storages(list(model.parameters()) + list(model.buffers())).values()) == total
    assert torch.equal(run_model(model, inp), ref)


def test_reload_after_release_is_one_copy_per_streamed_block(tiny, run_model, plan_for,
                                                            sim_inventory):
    model, inp = tiny("flux")
    ref = run_model(model, inp)
    n = len(find_blocks(model))
    with place(model, plan_for("cpu", stream=(0, 1)), "diffusion", sim_inventory) as placed:
        run_model(model, inp)
        placed.streamer.drain()
        placed.release()
        dev = placed.stats()["devices"]["cuda0"]
        copies, moved = dev["h2d_copies"], dev["h2d_bytes"]
        assert dev["slot_bytes"] == 0 and dev["resident_bytes"] == 0
        assert torch.equal(run_model(model, inp), ref)
        placed.streamer.drain()
        dev = placed.stats()["devices"]["cuda0"]
        ahead = placed.streamer.issued - placed.streamer.q      # next forward's, primed
        # the non-block group in one copy, each streamed block in one copy from its
        # packed host buffer
        assert dev["h2d_copies"] - copies == 1 + n + ahead
        assert dev["h2d_bytes"] - moved == model_bytes(model) + placed.streamer.ahead_bytes
        hosts = {s.host.data_ptr() for s in placed.streamer.sources}
        assert len(hosts) == n


class CopiesInto(torch.utils._python_dispatch.TorchDispatchMode):
    """Records (destination storage, source storage) of every copy_ in this thread."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.copy_.default:
            dst, src = args[0], args[1]
            self.seen.append((dst.untyped_storage().data_ptr(),
                              src.untyped_storage().data_ptr()))
        return func(*args, **(kwargs or {}))


def test_reload_after_release_is_one_copy_per_resident_group(tiny, run_model, plan_for,
                                                            sim_inventory):
    """Item 6: resident groups (non-block weights, the first K blocks) come back from
    one packed host copy each, in one copy per group, not tensor by tensor from the
    module's scattered storage; RAM still holds the weights once."""
    model, inp = tiny("flux")
    ref = run_model(model, inp)
    total = model_bytes(model)
    with place(model, plan_for("cpu", stream=(2, 1)), "diffusion", sim_inventory) as placed:
        assert torch.equal(run_model(model, inp), ref)
        placed.streamer.drain()
        placed.release()
        assert len(placed.resident_host) == len(placed.resident_groups) == 3
        hosts = {id(g): placed.resident_host[id(g)].untyped_storage().data_ptr()
                 for g in placed.resident_groups}
        held = storages(list(placed.rest.values()) +
                        [s.host for s in placed.streamer.sources])
        assert sum(held.values()) == total          # packed, the former storage let go
        packed = placed.stats()["host_pack_bytes"]
        with CopiesInto() as seen:
            out = run_model(model, inp)
        assert torch.equal(out, ref)
        bufs = {buf.untyped_storage().data_ptr(): g for _, g, buf in placed.resident_bufs}
        into = [(bufs[d], s) for d, s in seen.seen if d in bufs]
        assert sorted(g.name for g, _ in into) == sorted(g.name for g in
                                                        placed.resident_groups)
        assert all(s == hosts[id(g)] for g, s in into)      # from the packed copy
        placed.release()                            # a second release packs nothing
        assert placed.stats()["host_pack_bytes"] == packed
        assert torch.equal(run_model(model, inp), ref)
    assert sum(storages(list(model.parameters()) + list(model.buffers())).values()) == total
    assert torch.equal(run_model(model, inp), ref)


def test_batch_parallel_reload_keeps_one_host_copy(tiny, run_model, sim_inventory):
    """Two devices' placements of one module (batch parallel, every group resident):
    after release() the first packs each group once (the store's pageable buffer, the
    module pointed into it); the second finds the same buffer instead of packing its
    own, so RAM still holds the weights once and both reload from it."""
    from comfyui_placement.runtime.parallel import place_batch
    model, inp = tiny("wan")
    total = model_bytes(model)
    devs = [DevicePlan(d, "gpu", 256 << 20, 256 << 20, None) for d in ("cuda0", "cuda1")]
    plan = Plan(devs, {"diffusion": ComponentPlan("diffusion", ["cuda0", "cuda1"], "cpu",
                                                  parallel="batch")})
    ref = run_model(model, inp)
    with place_batch(model, plan, "diffusion", sim_inventory) as placed:
        assert torch.equal(run_model(model, inp), ref)
        placed.release()
        per = placed.placed
        assert per[0].host_pack_bytes == total and per[1].host_pack_bytes == 0
        held = storages(list(model.parameters()) + list(model.buffers()) +
                        [v for p in per for v in p.rest.values()])
        assert sum(held.values()) == total
        assert torch.equal(run_model(model, inp), ref)
    assert sum(storages(list(model.parameters()) + list(model.buffers())).values()) == total
    assert torch.equal(run_model(model, inp), ref)


@pytest.mark.parametrize("mode", ["layer", "row"])
def test_splits_reload_after_release_from_one_host_copy(tiny, run_model, sim_inventory, mode):
    """release() is the engine's, so every runtime's: a resident layer split packs each
    resident group once and reloads it in one copy; a row split packs only its main group
    (its shards are row slices of the module's own weights, which keep their storage: a
    packed copy would sit in RAM beside them). RAM holds the weights once in both, the
    reload computes the same, and the module is given back with one copy."""
    from comfyui_placement.runtime.split import place_split
    model, inp = tiny("flux256")
    total = model_bytes(model)
    ref = run_model(model, inp)
    devices = [DevicePlan(n, "gpu", 256 << 20, 256 << 20, None) for n in ("cuda0", "cuda1")]
    plan = Plan(devices, {"diffusion": ComponentPlan("diffusion", ["cuda0", "cuda1"], "cpu",
                                                     split_mode=mode)})
    with place_split(model, plan, "diffusion", sim_inventory) as placed:
        first = run_model(model, inp)
        placed.release()
        packed = [g.name for g in placed.resident_groups if id(g) in placed.resident_host]
        held = storages(list(model.parameters()) + list(model.buffers()) +
                        list(placed.rest.values()) + list(placed.resident_host.values()))
        assert sum(held.values()) == total
        if mode == "row":
            assert packed == ["main"]
        else:
            assert len(packed) == len(placed.resident_groups) >= 3
        before = placed.stats()["devices"]
        again = run_model(model, inp)
        after = placed.stats()["devices"]
        reloaded = sum(after[n]["h2d_copies"] - before[n]["h2d_copies"] for n in after)
        assert reloaded == len(placed.resident_groups)      # one copy per resident group
        assert torch.equal(first, again)
    assert sum(storages(list(model.parameters()) + list(model.buffers())).values()) == total
    assert torch.equal(run_model(model, inp), ref)     # the row split's own rounding is gone
