"""Mixed residency (issue 10 item 1, runtime side): params=disk with stream.host_blocks =
h reads the first h streamed blocks from the file once into host RAM and streams them
from there; the rest are read from the file every forward, through the same ring."""
import pytest
import torch
from safetensors.torch import save_file

from comfyui_placement.placement.plan import (ComponentPlan, DevicePlan, Plan,
                                              StreamPlan)
from comfyui_placement.runtime import find_blocks, place

STEPS = 3


def block_bytes(block):
    return sum(t.numel() * t.element_size() for t in block.parameters())


def disk_plan(k, depth, host_blocks, runtime="cuda0"):
    devices = [DevicePlan(n, "gpu", 256 << 20, 256 << 20, None) for n in runtime.split("&")]
    return Plan(devices, {"diffusion": ComponentPlan(
        "diffusion", runtime.split("&"), "disk", stream=StreamPlan(k, depth, host_blocks))})


def primed_disk_bytes(streamer):
    """Bytes of file-read blocks already in flight for the next forward."""
    return sum(streamer.sizes[streamer.schedule[j % streamer.n]]
               for j in range(streamer.q, streamer.issued)
               if streamer.reads[streamer.schedule[j % streamer.n]] is not None)


@pytest.mark.parametrize("arch,k,depth,host", [("flux", 0, 1, 2), ("flux", 1, 2, 3),
                                               ("flux", 0, 1, 0), ("flux", 0, 2, 99),
                                               ("wan", 1, 1, 1), ("unet", 0, 2, 3)])
def test_host_blocks_from_ram_the_rest_from_disk(arch, k, depth, host, tiny, run_model,
                                                 sim_inventory, tmp_path):
    model, inp = tiny(arch)
    ref = run_model(model, inp)
    path = tmp_path / "model.safetensors"
    save_file(model.state_dict(), str(path))
    model, _ = tiny(arch, seed=1)                  # other weights: the file must be what runs
    sizes = [block_bytes(b) for _, b in find_blocks(model)][k:]
    h = min(host, len(sizes))
    with place(model, disk_plan(k, depth, host), "diffusion", sim_inventory,
               weights_file=str(path)) as placed:
        outs = [run_model(model, inp) for _ in range(STEPS)]
        placed.streamer.drain()
        s = placed.stats()
        primed = primed_disk_bytes(placed.streamer)
    for out in outs:
        assert torch.equal(out, ref)
    assert s["host_blocks"] == h
    assert s["host_stream_bytes"] == sum(sizes[:h])
    assert s["disk_bytes_per_forward"] == sum(sizes[h:])
    # the host blocks read once; every forward reads the rest (and the last forward's
    # end has already started the next forward's first file reads: primed)
    assert s["disk_read_bytes"] == sum(sizes[:h]) + STEPS * sum(sizes[h:]) + primed
    assert s["devices"]["cuda0"]["h2d_bytes"] >= STEPS * sum(sizes)


@pytest.mark.parametrize("host", [0, 1, 3])
def test_layer_split_host_blocks_first_in_execution_order(host, tiny, run_model,
                                                          sim_inventory, tmp_path):
    """Two devices each streaming their whole range (K=0): the first `host` streamed
    blocks of the whole module (device cuda0's range first) come from RAM."""
    model, inp = tiny("flux")
    ref = run_model(model, inp)
    path = tmp_path / "model.safetensors"
    save_file(model.state_dict(), str(path))
    model, _ = tiny("flux", seed=1)
    sizes = [block_bytes(b) for _, b in find_blocks(model)]
    plan = disk_plan(0, 1, host, runtime="cuda0&cuda1")
    plan.components["diffusion"].blocks = {"cuda0": [0, 1], "cuda1": [2, 4]}
    plan.components["diffusion"].stream.per_device = {"cuda0": [0, 2], "cuda1": [0, 3]}
    with place(model, plan, "diffusion", sim_inventory, weights_file=str(path)) as placed:
        outs = [run_model(model, inp) for _ in range(STEPS)]
        for st in placed.streamers:
            st.drain()
        s = placed.stats()
        primed = sum(primed_disk_bytes(st) for st in placed.streamers)
    for out in outs:
        assert torch.equal(out, ref)
    assert s["host_blocks"] == host
    assert s["host_stream_bytes"] == sum(sizes[:host])
    assert s["disk_bytes_per_forward"] == sum(sizes[host:])
    assert s["disk_read_bytes"] == sum(sizes[:host]) + STEPS * sum(sizes[host:]) + primed
