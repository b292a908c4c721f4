"""Layer split on simulated devices: bit-identical to one device, hops at range
boundaries only, side tensors moved once per boundary, streaming on a device whose
range exceeds its budget, exact restore (also after an out-of-memory)."""

import pytest
import torch

from conftest import WORK

from comfyui_placement.placement.devices import Inventory
from comfyui_placement.placement.errors import PlacementError
from comfyui_placement.placement.plan import ComponentPlan, DevicePlan, Plan, StreamPlan
from comfyui_placement.runtime.blocks.find import find_blocks
from comfyui_placement.runtime.split import place_split

INVENTORY = "cuda0=256MiB,cuda1=256MiB,cuda2=256MiB"


def split_plan(runtime, budgets, params=None, mode="layer", stream=None, blocks=None):
    devices = [DevicePlan(n, "gpu", 256 << 20, 256 << 20, b) for n, b in zip(runtime, budgets)]
    comp = ComponentPlan("diffusion", list(runtime), params or runtime[0], split_mode=mode,
                         stream=StreamPlan(*stream) if stream else None, blocks=blocks or {})
    return Plan(devices, {"diffusion": comp})


def snapshot(model):
    return ([(n, p, p.device, p.detach().clone()) for n, p in model.named_parameters()],
            [(n, b, b.detach().clone()) for n, b in model.named_buffers()])


def assert_restored(model, snap):
    params, buffers = snap
    now = dict(model.named_parameters())
    assert list(now) == [n for n, *_ in params]
    for name, p, device, value in params:
        assert now[name] is p and p.device == device and torch.equal(p.detach(), value)
    now_b = dict(model.named_buffers())
    for name, b, value in buffers:
        assert now_b[name] is b and torch.equal(b, value)
    for m in model.modules():
        assert not m._forward_pre_hooks and not m._forward_hooks
        assert "forward" not in m.__dict__


def flat_tensors(x, out):
    if isinstance(x, torch.Tensor):
        out.append(x)
    elif isinstance(x, (tuple, list)):
        for v in x:
            flat_tensors(v, out)
    elif isinstance(x, dict):
        for v in x.values():
            flat_tensors(v, out)
    return out


def expected_traffic(model, inp, run_model, owner):
    """From an unsplit run: the tensors that must cross to each block's device (each
    source once per device), plus the last block's outputs going back to the main
    device. Independent of the split code: it only watches the blocks."""
    blocks = [b for _, b in find_blocks(model)]
    calls, keep = [], []

    def pre(i, module, args, kwargs):
        ins = flat_tensors((args, kwargs), [])
        keep.extend(ins)
        calls.append((i, ins, None))

    def post(i, module, args, output):
        outs = flat_tensors(output, [])
        keep.extend(outs)
        calls[-1] = (calls[-1][0], calls[-1][1], outs)

    handles = [b.register_forward_pre_hook(lambda m, a, k, i=i: pre(i, m, a, k),
                                           with_kwargs=True) for i, b in enumerate(blocks)]
    handles += [b.register_forward_hook(lambda m, a, o, i=i: post(i, m, a, o))
                for i, b in enumerate(blocks)]
    try:
        run_model(model, inp)
    finally:
        for h in handles:
            h.remove()
    where, moved, copies, nbytes = {}, set(), 0, 0
    for i, ins, outs in calls:
        d = owner[i]
        for t in ins:
            if where.get(id(t), 0) != d and (id(t), d) not in moved:
                moved.add((id(t), d))
                copies += 1
                nbytes += t.numel() * t.element_size()
        for t in outs:
            where[id(t)] = d
    i, _, outs = calls[-1]
    if owner[i] != 0:
        copies += len(outs)
        nbytes += sum(t.numel() * t.element_size() for t in outs)
    return copies, nbytes


def owner_from(ranges, runtime, n):
    owner = [None] * n
    for dev, (a, b) in ranges.items():
        for i in range(a, b + 1):
            owner[i] = runtime.index(dev)
    assert None not in owner
    return owner


@pytest.mark.parametrize("arch", ["flux", "sd3", "unet", "wan"])
@pytest.mark.parametrize("ndev", [2, 3])
def test_layer_split_bit_identical_and_hops(arch, ndev, tiny, run_model):
    model, inp = tiny(arch)
    ref = run_model(model, inp)
    snap = snapshot(model)
    runtime = ["cuda0", "cuda1", "cuda2"][:ndev]
    plan = split_plan(runtime, [1 << 20] * ndev)
    with place_split(model, plan, "diffusion", Inventory.simulated(INVENTORY)) as placed:
        out1 = run_model(model, inp)
        out2 = run_model(model, inp)
    assert torch.equal(out1, ref) and torch.equal(out2, ref)
    assert not [k for k in out1.__dict__ if k.startswith("_placement")]   # no tags leak
    assert_restored(model, snap)
    s = placed.stats()
    n = len(find_blocks(model))
    owner = owner_from(s["ranges"], runtime, n)
    assert len(set(owner)) == ndev                       # every device got a range
    chain = [0] + owner + [0]
    boundaries = sum(a != b for a, b in zip(chain, chain[1:]))
    assert s["forwards"] == 2 and s["hops"] == 2 * boundaries
    copies, nbytes = expected_traffic(model, inp, run_model, owner)
    assert s["hop_copies"] == 2 * copies and s["hop_bytes"] == 2 * nbytes
    for dev in s["devices"].values():
        assert 0 < dev["peak_bytes"] <= dev["capacity_bytes"]
        assert dev["resident_bytes"] == 0               # all given back


def test_side_tensors_cross_once_per_boundary(tiny, run_model):
    """Flux blocks take hidden, encoder states, temb and a rotary (cos, sin) pair: a
    range entry moves those five once, whatever the number of blocks in the range."""
    model, inp = tiny("flux")
    plan = split_plan(["cuda0", "cuda1"], [1 << 20] * 2,
                      blocks={"cuda0": [0, 0], "cuda1": [1, 4]})
    with place_split(model, plan, "diffusion", Inventory.simulated(INVENTORY)) as placed:
        run_model(model, inp)
    s = placed.stats()
    assert s["hops"] == 2
    assert s["hop_copies"] == 5 + 2                      # entry: 5 tensors; exit: 2 outputs


def test_stream_part_of_a_range_that_exceeds_its_budget(tiny, run_model):
    model, inp = tiny("flux")
    ref = run_model(model, inp)
    snap = snapshot(model)
    sizes = [sum(t.numel() * t.element_size() for t in list(b.parameters()) + list(b.buffers()))
             for _, b in find_blocks(model)]
    range_bytes = sum(sizes[1:])
    room = sizes[1] + 2 * max(sizes[2:]) + 16 * 1024     # below the range's bytes
    assert room < range_bytes
    plan = split_plan(["cuda0", "cuda1"], [4 << 20, room + WORK], params="cpu", stream=(0, 1),
                      blocks={"cuda0": [0, 0], "cuda1": [1, 4]})
    with place_split(model, plan, "diffusion", Inventory.simulated(INVENTORY),
                     headroom_bytes=WORK) as placed:
        outs = [run_model(model, inp) for _ in range(3)]
        s = placed.stats()
    for out in outs:
        assert torch.equal(out, ref)
    assert s["streamed_blocks"] == {"cuda1": 3}
    for dev in s["devices"].values():
        assert dev["peak_bytes"] <= dev["capacity_bytes"]
    cuda1 = s["devices"]["cuda1"]
    assert cuda1["peak_bytes"] > cuda1["capacity_bytes"] // 2
    # per forward, cuda1 receives its streamed blocks once (plus the resident one at load
    # and the next forward's primed blocks after the last forward)
    streamed = sum(sizes[2:])
    primed = sizes[2] + sizes[3]
    assert cuda1["h2d_bytes"] == sizes[1] + 3 * streamed + primed
    assert_restored(model, snap)


def test_range_over_budget_without_streaming_is_refused(tiny):
    model, _ = tiny("flux")
    snap = snapshot(model)
    plan = split_plan(["cuda0", "cuda1"], [4 << 20, 100_000],
                      blocks={"cuda0": [0, 0], "cuda1": [1, 4]})
    with pytest.raises(PlacementError, match="cuda1's blocks 1-4 need .* turn on stream_layers"):
        with place_split(model, plan, "diffusion", Inventory.simulated(INVENTORY)):
            pass
    assert_restored(model, snap)


def test_zero_budget_device_gets_nothing(tiny, run_model):
    model, inp = tiny("wan")
    ref = run_model(model, inp)
    plan = split_plan(["cuda0", "cuda1", "cuda2"], [1 << 20, 0, 1 << 20])
    with place_split(model, plan, "diffusion", Inventory.simulated(INVENTORY)) as placed:
        assert torch.equal(run_model(model, inp), ref)
    s = placed.stats()
    assert "cuda1" not in s["ranges"] and set(s["ranges"]) == {"cuda0", "cuda2"}
    assert s["devices"]["cuda1"]["peak_bytes"] == 0


def test_ranges_proportional_to_budget_minus_headroom(tiny):
    model, _ = tiny("flux")
    blocks = find_blocks(model)
    sizes = [sum(p.numel() * p.element_size() for p in b.parameters()) for _, b in blocks]
    nonblock = sum(p.numel() * p.element_size() for p in model.parameters()) - sum(sizes)
    budgets, headroom = [nonblock + (3 << 20), 1 << 20, 2 << 20], 256 * 1024
    plan = split_plan(["cuda0", "cuda1", "cuda2"], budgets)
    with place_split(model, plan, "diffusion", Inventory.simulated(INVENTORY),
                     headroom_bytes=headroom) as placed:
        ranges = placed.stats()["ranges"]
    rooms = [budgets[0] - headroom - nonblock, budgets[1] - headroom, budgets[2] - headroom]
    total = sum(sizes)
    for dev, room in zip(["cuda0", "cuda1", "cuda2"], rooms):
        a, b = ranges.get(dev, (0, -1))        # a share below one block may round to none
        got = sum(sizes[a:b + 1])
        assert abs(got - total * room / sum(rooms)) <= max(sizes)


def test_plan_ranges_used_and_mismatch_warned(tiny, run_model):
    model, inp = tiny("sd3")
    ref = run_model(model, inp)
    inv = Inventory.simulated(INVENTORY)
    plan = split_plan(["cuda0", "cuda1"], [1 << 20] * 2, blocks={"cuda0": [0, 1],
                                                                  "cuda1": [2, 2]})
    with place_split(model, plan, "diffusion", inv) as placed:
        assert torch.equal(run_model(model, inp), ref)
    assert placed.stats()["ranges"] == {"cuda0": [0, 1], "cuda1": [2, 2]}
    bad = split_plan(["cuda0", "cuda1"], [1 << 20] * 2, blocks={"cuda0": [0, 3],
                                                                 "cuda1": [4, 9]})
    with pytest.warns(RuntimeWarning, match="do not match the module's 3 blocks"):
        with place_split(model, bad, "diffusion", inv) as placed:
            assert torch.equal(run_model(model, inp), ref)


def test_out_of_memory_mid_forward_restores_and_rerun_is_correct(tiny, run_model):
    model, inp = tiny("flux")
    ref = run_model(model, inp)
    snap = snapshot(model)
    big = dict(inp, hidden_states=torch.randn(1, 4096, 8), img_ids=torch.zeros(4096, 3))
    sizes = [sum(p.numel() * p.element_size() for p in b.parameters())
             for _, b in find_blocks(model)]
    plan = split_plan(["cuda0", "cuda1"], [8 << 20, sum(sizes[1:]) + WORK],
                      blocks={"cuda0": [0, 0], "cuda1": [1, 4]})
    inv = Inventory.simulated(INVENTORY)
    # the big latent's working memory does not fit beside the weights: the first call's
    # rehearsal finds it and refuses in one line before any weight moves
    with pytest.raises(PlacementError, match=r"^diffusion: cuda1's blocks 1-4 need .* but "
                                             r"its budget leaves"):
        with place_split(model, plan, "diffusion", inv, headroom_bytes=WORK):
            run_model(model, big)
    assert_restored(model, snap)
    # loaded at entry without a rehearsal, it runs out of memory mid-forward (metered)
    with pytest.raises(torch.OutOfMemoryError, match="cuda1: out of memory"):
        with place_split(model, plan, "diffusion", inv, headroom_bytes=WORK, rehearse=False):
            run_model(model, big)
    assert_restored(model, snap)
    with place_split(model, plan, "diffusion", inv, headroom_bytes=WORK):
        assert torch.equal(run_model(model, inp), ref)
    assert_restored(model, snap)


def test_release_then_forward_reloads(tiny, run_model):
    model, inp = tiny("wan")
    ref = run_model(model, inp)
    plan = split_plan(["cuda0", "cuda1"], [1 << 20] * 2)
    with place_split(model, plan, "diffusion", Inventory.simulated(INVENTORY)) as placed:
        run_model(model, inp)
        placed.release()
        assert all(d["resident_bytes"] == 0 for d in placed.stats()["devices"].values())
        assert torch.equal(run_model(model, inp), ref)
        assert all(d["resident_bytes"] > 0 for d in placed.stats()["devices"].values())


def test_modelled_hop_time_is_spent(tiny, run_model):
    """Each hop costs its modelled link time: with a 20 ms latency a forward takes at
    least copies x 20 ms (a lower bound, so a busy machine cannot break it)."""
    import time
    from comfyui_placement.runtime.device.simdevice import Link
    model, inp = tiny("wan")
    plan = split_plan(["cuda0", "cuda1", "cuda2"], [1 << 20] * 3)
    with place_split(model, plan, "diffusion", Inventory.simulated(INVENTORY),
                     hop_link=Link(bandwidth=1e12, latency=0.02)) as placed:
        t0 = time.perf_counter()
        run_model(model, inp)
        took = time.perf_counter() - t0
        s = placed.stats()
    assert s["hop_copies"] >= 3
    assert took >= s["hop_copies"] * 0.02
    assert abs(s["hop_seconds_modelled"] - 0.02 * s["hop_copies"]) < 1e-3


def test_split_needs_several_devices_and_known_mode(tiny):
    model, _ = tiny("wan")
    inv = Inventory.simulated(INVENTORY)
    with pytest.raises(PlacementError, match="one device"):
        place_split(model, split_plan(["cuda0"], [1 << 20]), "diffusion", inv)
    with pytest.raises(PlacementError, match="expected layer or row"):
        place_split(model, split_plan(["cuda0", "cuda1"], [1 << 20] * 2, mode="tensor"),
                    "diffusion", inv)
    with pytest.raises(PlacementError, match="params=disk needs the model file"):
        with place_split(model, split_plan(["cuda0", "cuda1"], [1 << 20] * 2, params="disk"),
                         "diffusion", inv):
            pass


class T5Like(torch.nn.Module):
    """A text-encoder pattern: the first block makes a position bias that every later
    block reuses (ComfyUI's T5 passes it along beside the hidden state)."""

    class Block(torch.nn.Module):
        def __init__(self, first, width):
            super().__init__()
            self.lin = torch.nn.Linear(width, width)
            self.bias_table = torch.nn.Parameter(torch.randn(6, 6)) if first else None

        def forward(self, x, bias=None):
            if bias is None:
                bias = self.bias_table.softmax(-1)
            return torch.tanh(self.lin(bias @ x)), bias

    def __init__(self, n=5, width=8):
        super().__init__()
        self.embed = torch.nn.Embedding(20, width)
        self.block = torch.nn.ModuleList(self.Block(i == 0, width) for i in range(n))
        self.final = torch.nn.LayerNorm(width)

    def forward(self, ids):
        x, bias = self.embed(ids), None
        for b in self.block:
            x, bias = b(x, bias)
        return self.final(x)


def test_text_encoder_pattern_split_over_three():
    torch.manual_seed(0)
    model = T5Like().eval()
    ids = torch.randint(0, 20, (2, 6))
    with torch.no_grad():
        ref = model(ids)
    plan = split_plan(["cuda0", "cuda1", "cuda2"], [1 << 20] * 3,
                      blocks={"cuda0": [0, 1], "cuda1": [2, 3], "cuda2": [4, 4]})
    with place_split(model, plan, "diffusion", Inventory.simulated(INVENTORY)) as placed:
        with torch.no_grad():
            out = model(ids)
    assert torch.equal(out, ref)
    s = placed.stats()
    assert s["hops"] == 3 and s["hop_copies"] == 2 + 2 + 2    # (x, bias) at each crossing


def test_real_device_code_path_on_two_host_devices(tiny, run_model):
    """The non-simulated path (device checks by tensor.device, no tags) on two devices
    that are both the host: nothing has to move, the output is the same."""
    from comfyui_placement.placement.devices import Device
    model, inp = tiny("flux")
    ref = run_model(model, inp)
    inv = Inventory([Device("host0", "cpu", 1 << 30, 1 << 30, torch_device="cpu"),
                     Device("host1", "cpu", 1 << 30, 1 << 30, torch_device="cpu")])
    devices = [DevicePlan(n, "cpu", 1 << 30, 1 << 30, 1 << 20) for n in ("host0", "host1")]
    plan = Plan(devices, {"diffusion": ComponentPlan("diffusion", ["host0", "host1"], "host0")})
    with place_split(model, plan, "diffusion", inv) as placed:
        assert torch.equal(run_model(model, inp), ref)
    s = placed.stats()
    assert set(s["ranges"]) == {"host0", "host1"} and s["hop_copies"] == 0


@pytest.mark.parametrize("depth", [0, 2])
def test_two_devices_stream_their_ranges(depth):
    torch.manual_seed(0)
    model = T5Like(n=12, width=64).eval()
    ids = torch.randint(0, 20, (2, 6))
    with torch.no_grad():
        ref = model(ids)
    size = sum(p.numel() * 4 for p in model.block[1].parameters())
    room = (depth + 1) * size + 8 * 1024     # the ring and activations, not 4 blocks
    assert room < 4 * size
    plan = split_plan(["cuda0", "cuda1", "cuda2"], [8 << 20] + [room + WORK] * 2,
                      params="cpu", stream=(0, depth),
                      blocks={"cuda0": [0, 3], "cuda1": [4, 7], "cuda2": [8, 11]})
    with place_split(model, plan, "diffusion", Inventory.simulated(INVENTORY),
                     headroom_bytes=WORK) as placed:
        for _ in range(2):
            with torch.no_grad():
                assert torch.equal(model(ids), ref)
        s = placed.stats()
    assert s["streamed_blocks"] == {"cuda1": 4, "cuda2": 4}
    for dev in s["devices"].values():
        assert dev["peak_bytes"] <= dev["capacity_bytes"]


def test_auto_fit_stream_prefix_per_device_is_followed(tiny, run_model):
    """auto-fit writes each device's resident prefix in the plan (stream.per_device):
    the runtime follows it even where more would fit (the
    planner keeps room for other components), and says so when it cannot."""
    model, inp = tiny("flux")
    ref = run_model(model, inp)
    plan = split_plan(["cuda0", "cuda1"], [4 << 20, 4 << 20], params="cpu", stream=(1, 1),
                      blocks={"cuda0": [0, 0], "cuda1": [1, 4]})
    cp = plan.components["diffusion"]
    cp.headroom_bytes = 64 * 1024
    cp.stream.per_device = {"cuda0": [1, 1], "cuda1": [1, 4]}
    with place_split(model, plan, "diffusion", Inventory.simulated(INVENTORY)) as placed:
        assert torch.equal(run_model(model, inp), ref)
    assert placed.stats()["streamed_blocks"] == {"cuda1": 3}
    cp.stream.per_device["cuda1"] = [1, 7]
    with pytest.warns(RuntimeWarning, match="does not match a range of 4 blocks"):
        with place_split(model, plan, "diffusion", Inventory.simulated(INVENTORY)) as placed:
            assert torch.equal(run_model(model, inp), ref)
    assert placed.stats()["streamed_blocks"] == {}          # all fits: sized here


@pytest.mark.parametrize("stream", [None, (0, 1)])
def test_disk_params_on_a_meta_module(stream, tiny, run_model, tmp_path):
    """params=disk: resident ranges read from the file once, streamed blocks read per
    forward; the module stays on the meta device before and after."""
    from safetensors.torch import save_file
    model, inp = tiny("flux")
    ref = run_model(model, inp)
    path = tmp_path / "flux.safetensors"
    save_file(model.state_dict(), str(path))
    with torch.device("meta"):
        empty, _ = tiny("flux")
    sizes = [sum(p.numel() * p.element_size() for p in b.parameters())
             for _, b in find_blocks(model)]
    cuda1 = sum(sizes[1:]) + 64 * 1024 if stream is None else sizes[1] + 2 * max(sizes[2:]) \
        + 16 * 1024
    plan = split_plan(["cuda0", "cuda1"], [4 << 20, cuda1 + WORK], params="disk",
                      stream=stream, blocks={"cuda0": [0, 0], "cuda1": [1, 4]})
    with place_split(empty, plan, "diffusion", Inventory.simulated(INVENTORY),
                     weights_file=str(path), headroom_bytes=WORK) as placed:
        for _ in range(2):
            assert torch.equal(run_model(empty, inp), ref)
        s = placed.stats()
    assert next(empty.parameters()).is_meta
    assert s["streamed_blocks"] == ({} if stream is None else {"cuda1": 3})
    for dev in s["devices"].values():
        assert dev["peak_bytes"] <= dev["capacity_bytes"]
