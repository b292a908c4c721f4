"""A worker's range stays loaded between placements for its owner (kept.py): the second
placement moves and hashes nothing on either side; a grown range, a changed file or a
changed local tensor loads only what changed; the range goes when its owner is freed,
when it is garbage, or when a placement no longer names that worker device. Real worker
subprocesses on loopback, as test_distributed.py."""
import gc
import os
import re
import time

import pytest
import torch
from torch import nn

from comfyui_placement.placement.errors import PlacementError
from comfyui_placement.runtime.blocks.find import find_blocks
from comfyui_placement.runtime.distributed import kept

from test_distributed import flux, run

SECRET = b"loopback-secret"


def settle(path):
    """A model file written long enough ago (digests.settled): as a real one."""
    old = time.time() - 60
    os.utime(path, (old, old))


def block_bytes(model, first, last):
    return sum(t.numel() * t.element_size() for _, b in find_blocks(model)[first:last + 1]
               for t in list(b.parameters()) + list(b.buffers()))


class Owner:
    """Stands for ComfyUI's diffusion module, the object ranges are kept for."""


def enter(model, span, cluster, path, owner):
    from comfyui_placement.runtime.distributed import remote_range
    return remote_range(model, span, cluster["w1.cpu"], str(path), keep_for=owner)


def test_the_second_placement_moves_and_hashes_nothing(tmp_path, workers):
    from comfyui_placement.runtime.distributed import Cluster
    model, inp, models, path = flux(tmp_path, seed=11)
    settle(path)
    expected = run(model, inp)
    w = workers(models)
    owner = Owner()
    with Cluster(f"w1={w.address}", secret=SECRET, timeout_s=30) as cluster:
        with enter(model, (1, 4), cluster, path, owner) as first:
            assert torch.equal(run(model, inp), expected)
        load = first.stats()["loading"]
        nbytes = block_bytes(model, 1, 4)
        assert not load["kept"] and load["read_bytes"] == load["moved_bytes"] == nbytes
        assert load["hashed_bytes"] == nbytes and load["compared_bytes"] == nbytes
        assert [k.device for k in kept.held(owner)] == ["w1.cpu"]
        with enter(model, (1, 4), cluster, path, owner) as second:
            assert torch.equal(run(model, inp), expected)
        again = second.stats()["loading"]
        assert again == {"kept": True, "nbytes": nbytes, "compared_bytes": 0,
                         "read_bytes": 0, "hashed_bytes": 0, "moved_bytes": 0,
                         "main_hashed_bytes": 0}
        assert re.search(r"kept \S+flux\.safetensors blocks \S+ \(\d+ bytes\) on cpu for "
                         r"the next run: no weight moved, nothing hashed", w.logs())
        assert kept.free(owner) == 1 and kept.held(owner) == []
        with enter(model, (1, 4), cluster, path, owner) as third:   # freed: loaded again
            assert torch.equal(run(model, inp), expected)
        assert third.stats()["loading"]["moved_bytes"] == nbytes
        kept.free(owner)
    assert torch.equal(run(model, inp), expected)


def test_a_grown_range_reads_only_its_new_blocks(tmp_path, workers):
    from comfyui_placement.runtime.distributed import Cluster
    model, inp, models, path = flux(tmp_path, seed=12)
    settle(path)
    expected = run(model, inp)
    w = workers(models)
    owner = Owner()
    with Cluster(f"w1={w.address}", secret=SECRET, timeout_s=30) as cluster:
        with enter(model, (2, 4), cluster, path, owner):
            pass
        with enter(model, (1, 5), cluster, path, owner) as grown:
            assert torch.equal(run(model, inp), expected)
        load = grown.stats()["loading"]
        new = block_bytes(model, 1, 1) + block_bytes(model, 5, 5)
        assert not load["kept"] and load["read_bytes"] == load["moved_bytes"] == new
        assert load["hashed_bytes"] == new and load["compared_bytes"] == new
        assert load["nbytes"] == block_bytes(model, 1, 5)
        assert len(kept.held(owner)) == 1            # the smaller range was replaced
        kept.free(owner)
    assert f"{block_bytes(model, 1, 5) - new} kept from ranges held" in w.logs()


def test_a_changed_file_moves_only_the_tensors_that_changed(tmp_path, workers):
    from safetensors.torch import save_file
    from comfyui_placement.runtime.distributed import Cluster
    model, inp, models, path = flux(tmp_path, seed=13)
    settle(path)
    w = workers(models)
    owner = Owner()
    with Cluster(f"w1={w.address}", secret=SECRET, timeout_s=30) as cluster:
        with enter(model, (1, 4), cluster, path, owner):
            pass
        # a fine-tune of one block, written over the file; the module holds it too
        changed = find_blocks(model)[3][1]
        with torch.no_grad():
            for p in changed.parameters():
                p.add_(0.25)
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
        settle(path)
        expected = run(model, inp)
        with enter(model, (1, 4), cluster, path, owner) as after:
            assert torch.equal(run(model, inp), expected)
        load = after.stats()["loading"]
        assert not load["kept"] and load["read_bytes"] == block_bytes(model, 1, 4)
        assert load["moved_bytes"] == block_bytes(model, 3, 3)
        kept.free(owner)


def test_a_changed_local_tensor_is_compared_again(tmp_path, workers):
    """A LoRA fused into a range block's tensor (a new tensor in its place): the kept
    proof no longer matches, the comparison runs and refuses the other weights."""
    from comfyui_placement.runtime.distributed import Cluster
    model, inp, models, path = flux(tmp_path, seed=14)
    settle(path)
    w = workers(models)
    owner = Owner()
    with Cluster(f"w1={w.address}", secret=SECRET, timeout_s=30) as cluster:
        with enter(model, (1, 4), cluster, path, owner):
            pass
        block = find_blocks(model)[2][1]
        name, p = next(iter(block.named_parameters()))
        owner_mod, _, leaf = name.rpartition(".")
        mod = block.get_submodule(owner_mod) if owner_mod else block
        setattr(mod, leaf, nn.Parameter(p.detach() + 0.5, requires_grad=False))
        with pytest.raises(PlacementError, match="differs from flux.safetensors"):
            with enter(model, (1, 4), cluster, path, owner):
                pass
        assert len(kept.held(owner)) == 1            # the kept one is still there
        kept.free(owner)


def test_ranges_go_with_their_owner_and_with_another_owner_on_the_device(tmp_path,
                                                                         workers):
    from comfyui_placement.runtime.distributed import Cluster
    model, inp, models, path = flux(tmp_path, seed=15)
    settle(path)
    expected = run(model, inp)
    w = workers(models)
    a, b = Owner(), Owner()
    with Cluster(f"w1={w.address}", secret=SECRET, timeout_s=30) as cluster:
        link = cluster.links["w1"]
        with enter(model, (1, 4), cluster, path, a) as ra:
            pass
        with enter(model, (2, 5), cluster, path, b):     # replaces a's on w1.cpu
            assert torch.equal(run(model, inp), expected)
        assert kept.held(a) == [] and len(kept.held(b)) == 1
        gone = ra._range_id
        reply = link.request({"op": "check", "range": gone}, 10)
        assert reply == {"ok": True, "kept": False, "why": "not held"}
        held = kept.held(b)[0].range_id
        del b
        gc.collect()
        assert kept.free() == 1                          # the dead owner's range
        assert link.request({"op": "check", "range": held}, 10)["kept"] is False
    assert torch.equal(run(model, inp), expected)


def test_a_placement_that_no_longer_names_the_device_frees_its_range(tmp_path, workers):
    from comfyui_placement.placement.devices import Inventory
    from comfyui_placement.placement.plan import ComponentPlan, DevicePlan, Plan
    from comfyui_placement.placement.remote_devices import with_remote
    from comfyui_placement.runtime.distributed import Cluster, place_remote
    model, inp, models, path = flux(tmp_path, seed=16)
    settle(path)
    expected = run(model, inp)
    w1, w2 = workers(models), workers(models)
    owner = Owner()

    def plan(remote):
        runtime = ["cpu", remote]
        return Plan([DevicePlan(n, "cpu", 1 << 30, 1 << 30, None) for n in runtime],
                    {"diffusion": ComponentPlan("diffusion", runtime, "cpu",
                                                split_mode="layer",
                                                blocks={"cpu": [0, 2], remote: [3, 5]})})
    with Cluster(f"w1={w1.address},w2={w2.address}", secret=SECRET,
                 timeout_s=30) as cluster:
        inv = with_remote(Inventory.simulated("cpu=8GiB"), cluster.devices())
        for remote in ("w1.cpu", "w1.cpu", "w2.cpu"):
            with place_remote(model, plan(remote), "diffusion", cluster, str(path),
                              inventory=inv, keep_for=owner) as placed:
                assert torch.equal(run(model, inp), expected)
            assert set(placed.stats()["worker_loading"]) == {remote}
        assert [k.device for k in kept.held(owner)] == ["w2.cpu"]
        assert placed.stats()["worker_loading"]["w2.cpu"]["kept"] is False
        kept.free(owner)
    assert "kept " in w1.logs() and "kept " not in w2.logs()


def test_the_run_record_says_whether_the_range_was_kept():
    from comfyui_placement.placement.report import render_measured
    kept_run = {"kept": True, "nbytes": 3 << 30, "blocks": [4, 9]}
    loaded_run = {"kept": False, "nbytes": 1 << 30, "read_bytes": 1 << 30,
                  "hashed_bytes": 0, "moved_bytes": 1 << 30, "compared_bytes": 1 << 30,
                  "blocks": [0, 3], "reloaded_because": "flux.safetensors changed on the "
                                                        "worker"}
    lines = render_measured({"worker_loading": {"w1.cuda0": kept_run,
                                                "w2.cpu": loaded_run}})
    assert lines == [
        "w1.cuda0: blocks 4..9 kept loaded from the last run (3.00 GiB): no weight moved, "
        "nothing hashed",
        "w2.cpu: blocks 0..3 loaded (1.00 GiB; not kept: flux.safetensors changed on the "
        "worker): 1.00 GiB read, 0 B hashed, 1.00 GiB moved on the worker; 1.00 GiB "
        "compared with the file here"]


def test_a_file_written_a_moment_ago_is_never_kept(tmp_path, workers):
    """Within its timestamp's tick a file could change again under the same signature
    (digests.settled): its range is loaded and unloaded, and hashed each time."""
    from comfyui_placement.runtime.distributed import Cluster
    model, inp, models, path = flux(tmp_path, seed=17)
    soon = time.time() + 3600       # "just written" however slow this machine is today
    os.utime(path, (soon, soon))
    w = workers(models)
    owner = Owner()
    with Cluster(f"w1={w.address}", secret=SECRET, timeout_s=30) as cluster:
        for _ in range(2):
            with enter(model, (1, 4), cluster, path, owner) as rr:
                pass
            load = rr.stats()["loading"]
            assert not load["kept"] and load["hashed_bytes"] == block_bytes(model, 1, 4)
            assert kept.held(owner) == []
    assert "kept " not in w.logs()
