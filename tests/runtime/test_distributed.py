"""Layer split beyond one machine, on loopback: workers are real subprocesses
(`python -m comfyui_placement worker`), ports chosen free by the OS, every wait bounded."""
import json
import os
import select
import signal
import subprocess
import sys
import time

import pytest
import torch

from comfyui_placement.placement.devices import Inventory
from comfyui_placement.placement.errors import PlacementError
from comfyui_placement.placement.remote_devices import (parse_workers, split_name,
                                                         with_remote)
from comfyui_placement.runtime.blocks.find import find_blocks

SECRET_ENV = "CP_TEST_DISTRIBUTED_SECRET"


class WorkerProcess:
    def __init__(self, models, tmp_path, secret="loopback-secret", name="w", extra=()):
        env = dict(os.environ, **{SECRET_ENV: secret})
        self.name = name
        # the worker's stderr; read through a file of our own (logs()): a read through
        # this one would move the offset its writes share
        self.log = open(tmp_path / f"{name}.log", "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "comfyui_placement", "worker", "--listen", "127.0.0.1:0",
             "--models", str(models), "--secret-env", SECRET_ENV, *extra],
            stdout=subprocess.PIPE, stderr=self.log, env=env, text=True)
        ready, _, _ = select.select([self.proc.stdout], [], [], 60)
        line = self.proc.stdout.readline() if ready else ""
        if not line.startswith("listening on "):
            self.stop()
            raise RuntimeError(f"worker did not start: {line!r} {self.logs()}")
        self.address = line.split()[-1]

    def logs(self) -> str:
        with open(self.log.name) as own:
            return own.read()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)
        self.log.close()


def flux(tmp_path, seed=0):
    from diffusers import FluxTransformer2DModel
    from safetensors.torch import save_file
    torch.manual_seed(seed)
    m = FluxTransformer2DModel(patch_size=1, in_channels=8, num_layers=2, num_single_layers=4,
                               attention_head_dim=16, num_attention_heads=2,
                               joint_attention_dim=32, pooled_projection_dim=16,
                               axes_dims_rope=(4, 6, 6)).eval()
    models = tmp_path / "models"
    models.mkdir(exist_ok=True)
    path = models / "flux.safetensors"
    save_file({k: v.contiguous() for k, v in m.state_dict().items()}, str(path))
    L, T = 16, 8
    inp = dict(hidden_states=torch.randn(1, L, 8), encoder_hidden_states=torch.randn(1, T, 32),
               pooled_projections=torch.randn(1, 16), timestep=torch.tensor([0.5]),
               img_ids=torch.zeros(L, 3), txt_ids=torch.zeros(T, 3), return_dict=False)
    return m, inp, models, path


def run(model, inp):
    with torch.no_grad():
        return model(**inp)[0]


def snapshot(model):
    return ({n: (p, p.detach().clone(), p.device) for n, p in model.named_parameters()},
            {n: b.detach().clone() for n, b in model.named_buffers()},
            {n: dict(m.__dict__.get("forward", {}) and {"forward": m.__dict__["forward"]})
             for n, m in model.named_modules()})


def assert_restored(model, snap):
    params, buffers, forwards = snap
    now = dict(model.named_parameters())
    assert now.keys() == params.keys()
    for n, (obj, value, device) in params.items():
        assert now[n] is obj, n                     # the same Parameter objects
        assert now[n].device == device, n
        assert now[n].shape == value.shape if device.type == "meta" else \
            torch.equal(now[n].detach(), value), n
    for n, b in model.named_buffers():
        assert b.device == buffers[n].device, n
        assert b.device.type == "meta" or torch.equal(b, buffers[n]), n
    assert {n: dict(m.__dict__.get("forward", {}) and {"forward": m.__dict__["forward"]})
            for n, m in model.named_modules()} == forwards


def test_worker_names_and_inventory():
    assert parse_workers("w1=127.0.0.1:7000,w2=[::1]:80") == {"w1": ("127.0.0.1", 7000),
                                                               "w2": ("::1", 80)}
    assert split_name("W1.cuda0") == ("w1", "cuda0")
    for bad in ("w1", "w1.gpu", "cpu.cpu0", "1w.cpu"):
        with pytest.raises(PlacementError, match="ALIAS.DEVICE"):
            split_name(bad)
    for bad in ("w1=host", "w1=host:0", "cuda0=h:1", "w1=h:1,w1=h:2", ""):
        with pytest.raises(PlacementError):
            parse_workers(bad)


def test_two_processes_equal_local_and_restored(tmp_path, workers):
    from comfyui_placement.runtime.distributed import Cluster, remote_range
    model, inp, models, path = flux(tmp_path)
    expected = run(model, inp)
    w = workers(models)
    snap = snapshot(model)
    with Cluster(f"w1={w.address}", secret=b"loopback-secret", timeout_s=30) as cluster:
        inv = with_remote(Inventory.simulated("cpu=8GiB"), cluster.devices())
        assert inv.resolve("w1.cpu").kind == "cpu" and "worker w1" in \
            inv.resolve("w1.cpu").description
        with remote_range(model, (1, 4), cluster["w1.cpu"], str(path)) as rr:
            blocks = find_blocks(model)
            assert all(p.device.type == "meta" for _, b in blocks[1:5] for p in b.parameters())
            first = run(model, inp)                # learns the chain, block by block
            second = run(model, inp)               # one round trip for the range
            stats = rr.stats()
        assert torch.equal(first, expected) and torch.equal(second, expected)
    assert stats["chained"] and stats["round_trips"] == 4 + 1
    assert stats["hops"] == 2 * stats["round_trips"]
    assert stats["links"]["cpu->w1.cpu"]["bytes"] > 0
    assert stats["hop_bytes"] == sum(v["bytes"] for v in stats["links"].values())
    assert_restored(model, snap)
    assert torch.equal(run(model, inp), expected)


def test_three_processes_two_remote_ranges(tmp_path, workers):
    from comfyui_placement.runtime.distributed import Cluster, remote_range
    model, inp, models, path = flux(tmp_path, seed=1)
    expected = run(model, inp)
    other = tmp_path / "models2"
    other.mkdir()
    (other / "flux.safetensors").write_bytes(path.read_bytes())    # the second machine's copy
    w1, w2 = workers(models), workers(other)
    snap = snapshot(model)
    with Cluster({"w1": w1.address, "w2": w2.address}, secret=b"loopback-secret",
                 timeout_s=30) as cluster:
        with remote_range(model, (0, 1), cluster["w1.cpu"], str(path)) as r1, \
                remote_range(model, (3, 5), cluster["w2.cpu"], str(path), chain=False) as r2:
            outs = [run(model, inp) for _ in range(2)]
    assert all(torch.equal(o, expected) for o in outs)
    assert r1.stats()["round_trips"] == 2 + 1 and r1.stats()["chained"]
    assert r2.stats()["round_trips"] == 2 * 3 and not r2.stats()["chained"]
    assert set(r2.stats()["links"]) == {"cpu->w2.cpu", "w2.cpu->cpu"}
    assert_restored(model, snap)


def test_wrong_secret_refused_on_both_sides(tmp_path, workers):
    from comfyui_placement.runtime.distributed import Cluster
    _, _, models, _ = flux(tmp_path)
    w = workers(models)
    with pytest.raises(PlacementError, match=r"refused to join: wrong secret") as err:
        Cluster(f"w1={w.address}", secret=b"not-the-secret", timeout_s=10)
    assert "\n" not in str(err.value)
    deadline = time.time() + 10
    while "wrong secret" not in w.logs() and time.time() < deadline:
        time.sleep(0.1)
    refused = [ln for ln in w.logs().splitlines() if "wrong secret" in ln]
    assert len(refused) == 1 and " worker: refused 127.0.0.1:" in refused[0]
    with Cluster(f"w1={w.address}", secret=b"loopback-secret", timeout_s=10) as cluster:
        assert cluster["w1.cpu"].name == "w1.cpu"          # the worker still serves


def test_changed_file_refused(tmp_path, workers):
    from safetensors.torch import load_file, save_file
    from comfyui_placement.runtime.distributed import Cluster, remote_range
    model, inp, models, path = flux(tmp_path)
    expected = run(model, inp)
    mine = tmp_path / "main" / "flux.safetensors"
    mine.parent.mkdir()
    mine.write_bytes(path.read_bytes())
    state = load_file(str(path))
    key = "single_transformer_blocks.0.proj_out.weight"
    state[key] = state[key].clone()
    state[key].view(-1)[0] += 1.0                   # same header, other bytes in the range
    save_file(state, str(path))
    w = workers(models)
    snap = snapshot(model)
    with Cluster(f"w1={w.address}", secret=b"loopback-secret", timeout_s=30) as cluster:
        with pytest.raises(PlacementError, match="range's bytes hash differently"):
            with remote_range(model, (1, 3), cluster["w1.cpu"], str(mine)):
                pass
        with remote_range(model, (3, 4), cluster["w1.cpu"], str(mine)) as rr:   # untouched
            assert all(torch.equal(run(model, inp), expected) for _ in range(2))
        assert rr.stats()["round_trips"] == 2 + 1
        (models / "flux.safetensors").write_bytes(b"\0" * 16)
        with pytest.raises(PlacementError, match="size or header hash"):
            with remote_range(model, (3, 4), cluster["w1.cpu"], str(mine)):
                pass
    assert_restored(model, snap)


@pytest.mark.parametrize("fault", ["killed", "stalled"])
def test_lost_worker_one_error_within_timeout_and_restored(tmp_path, workers, fault):
    from comfyui_placement.runtime.distributed import Cluster, remote_range
    model, inp, models, path = flux(tmp_path)
    expected = run(model, inp)
    w = workers(models)
    snap = snapshot(model)
    blocks = find_blocks(model)

    def strike(*_):
        if fault == "killed":
            w.proc.kill()
            w.proc.wait(timeout=30)
        else:
            w.proc.send_signal(signal.SIGSTOP)
    timeout_s = 4.0
    with Cluster(f"w1={w.address}", secret=b"loopback-secret", timeout_s=timeout_s) as cluster:
        with remote_range(model, (1, 4), cluster["w1.cpu"], str(path)):
            assert torch.equal(run(model, inp), expected)
            hook = blocks[2][1].register_forward_pre_hook(strike)   # mid-run, mid-range
            try:
                t0 = time.time()
                with pytest.raises(PlacementError, match=r"worker w1 \(127\.0\.0\.1:\d+\) lost"
                                   ) as err:
                    run(model, inp)
                elapsed = time.time() - t0
            finally:
                hook.remove()
            with pytest.raises(PlacementError, match="was lost earlier"):
                run(model, inp)
    assert "\n" not in str(err.value)
    assert elapsed < (2.0 if fault == "killed" else 3 * timeout_s + 2)
    if fault == "stalled":
        assert "within 4 s" in str(err.value) or "timed out" in str(err.value)
    assert_restored(model, snap)
    assert torch.equal(run(model, inp), expected)


def test_models_folder_only_and_secret_required(tmp_path, monkeypatch, capsys):
    from comfyui_placement.cli import main
    from comfyui_placement.runtime.distributed.rangefile import resolve_under
    (tmp_path / "m").mkdir()
    (tmp_path / "outside.safetensors").write_bytes(b"x")
    for bad in ("/etc/passwd", "../outside.safetensors", "", "a/../../outside.safetensors"):
        with pytest.raises(PlacementError, match="relative to the worker's models folder"):
            resolve_under(str(tmp_path / "m"), bad)
    os.symlink(tmp_path / "outside.safetensors", tmp_path / "m" / "link.safetensors")
    with pytest.raises(PlacementError, match="leaves the worker's models folder"):
        resolve_under(str(tmp_path / "m"), "link.safetensors")
    monkeypatch.delenv(SECRET_ENV, raising=False)
    assert main(["worker", "--listen", "127.0.0.1:0", "--models", str(tmp_path / "m"),
                 "--secret-env", SECRET_ENV]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("placement error: no shared secret") and "\n" not in err


def test_simulated_remote_devices_take_their_kind_and_a_plan_names_them():
    from comfyui_placement.placement import PlacementSpec, plan
    inv = Inventory.simulated("cuda0=24GiB,w1.cuda0=24GiB,w1.cpu=64GiB")
    assert [inv.get(n).kind for n in ("cuda0", "w1.cuda0", "w1.cpu")] == ["gpu", "gpu", "cpu"]
    model, _ = _tiny_flux()
    p = plan(PlacementSpec(backend="diffusion=cuda0&w1.cuda0", split_mode="layer"),
             inv, {"diffusion": model})
    blocks = p.components["diffusion"].blocks
    assert set(blocks) == {"cuda0", "w1.cuda0"} and blocks["w1.cuda0"][1] == 5


def _tiny_flux():
    from diffusers import FluxTransformer2DModel
    return FluxTransformer2DModel(patch_size=1, in_channels=8, num_layers=2,
                                  num_single_layers=4, attention_head_dim=16,
                                  num_attention_heads=2, joint_attention_dim=32,
                                  pooled_projection_dim=16, axes_dims_rope=(4, 6, 6)), None


def test_a_plan_gives_a_range_to_a_worker(tmp_path, workers):
    from comfyui_placement.placement import PlacementSpec, plan
    from comfyui_placement.placement.remote_devices import with_remote
    from comfyui_placement.runtime.distributed import Cluster, place_remote
    model, inp, models, path = flux(tmp_path, seed=2)
    expected = run(model, inp)
    # the worker offers as much host memory as the local side: a split in proportion to
    # room, whatever the machine running the test has (a 128 GiB host gave cpu nothing)
    w = workers(models, extra=("--simulate", "cpu=8GiB"))
    snap = snapshot(model)
    with Cluster(f"w1={w.address}", secret=b"loopback-secret", timeout_s=30) as cluster:
        inv = with_remote(Inventory.simulated("cpu=8GiB"), cluster.devices())
        p = plan(PlacementSpec(backend="diffusion=cpu&w1.cpu", split_mode="layer"), inv,
                 {"diffusion": model})
        blocks = p.components["diffusion"].blocks
        assert set(blocks) == {"cpu", "w1.cpu"} and blocks["w1.cpu"][1] == 5
        with place_remote(model, p, "diffusion", cluster, str(path), inventory=inv) as placed:
            outs = [run(model, inp) for _ in range(2)]
        stats = placed.stats()
    assert all(torch.equal(o, expected) for o in outs)
    assert stats["hops"] > 0 and set(stats["links"]) == {"cpu->w1.cpu", "w1.cpu->cpu"}
    assert_restored(model, snap)
    with pytest.raises(PlacementError, match="pass cluster="):
        place_remote(model, p, "diffusion", None, str(path), inventory=inv)
    p.components["diffusion"].runtime = ["w1.cpu", "cpu"]
    with pytest.raises(PlacementError, match="must be local"):
        place_remote(model, p, "diffusion", object(), str(path), inventory=inv)


def _remote_plan(runtime, blocks, params="cpu", stream=None):
    from comfyui_placement.placement.plan import ComponentPlan, DevicePlan, Plan, StreamPlan
    devices = [DevicePlan(n, "gpu", 256 << 20, 256 << 20, None) for n in runtime]
    return Plan(devices, {"diffusion": ComponentPlan(
        "diffusion", list(runtime), params, split_mode="layer", blocks=blocks,
        stream=None if stream is None else StreamPlan(*stream))})


@pytest.mark.parametrize("case", ["streamed", "local split", "disk", "meta", "auto-fit"])
def test_place_runs_a_worker_range_as_a_stage(tmp_path, workers, case):
    """place() with a plan naming a worker device: the worker's range runs there, the
    local ranges around it under the staged engine (streamed through cuda0's ring, split
    over two local GPUs, or read from the file), outputs equal the local run, stats carry
    both the local devices and the links, and the module is restored exactly."""
    from comfyui_placement.placement.remote_devices import with_remote
    from comfyui_placement.runtime.distributed import Cluster
    from comfyui_placement.runtime.place import place
    model, inp, models, path = flux(tmp_path, seed=3)
    expected = run(model, inp)
    if case == "meta":          # params=disk with nothing in RAM: both sides read files
        model = model.to("meta")
    w = workers(models)
    snap = snapshot(model)
    if case == "local split":
        plan = _remote_plan(["cuda0", "cuda1", "w1.cpu"],
                            {"cuda0": [0, 1], "w1.cpu": [2, 3], "cuda1": [4, 5]})
    elif case == "auto-fit":    # as auto-fit writes a remote stream: the worker holds the
        plan = _remote_plan(["cuda0", "w1.cpu"], {"cuda0": [0, 3], "w1.cpu": [4, 5]},
                            stream=(1 + 2, 1))          # tail; stream counts every prefix
        plan.components["diffusion"].stream.per_device = {"cuda0": [1, 4], "w1.cpu": [2, 2]}
    else:
        plan = _remote_plan(["cuda0", "w1.cpu"], {"cuda0": [0, 5], "w1.cpu": [2, 3]},
                            params="cpu" if case == "streamed" else "disk", stream=(0, 1))
    with Cluster(f"w1={w.address}", secret=b"loopback-secret", timeout_s=30) as cluster:
        inv = with_remote(Inventory.simulated("cuda0=256MiB,cuda1=256MiB,cpu=8GiB"),
                          cluster.devices())
        with place(model, plan, "diffusion", inv, cluster=cluster,
                   weights_file=str(path)) as placed:
            blocks = find_blocks(model)
            remote = blocks[4:6] if case == "auto-fit" else blocks[2:4]
            assert all(p.device.type == "meta" for _, b in remote for p in b.parameters())
            outs = [run(model, inp) for _ in range(3)]
            stats = placed.stats()
    assert all(torch.equal(o, expected) for o in outs)
    if case == "auto-fit":
        assert stats["remote_ranges"] == {"w1.cpu": [4, 5]}
        assert stats["resident_blocks"] == 1 and stats["streamed_blocks"] == 3
        assert_restored(model, snap)
        return
    assert stats["remote_ranges"] == {"w1.cpu": [2, 3]}
    # named as the plan names the device the activations come from (cuda0 precedes the
    # range in every case: in the local split it holds blocks 0-1), not as torch's cpu
    assert set(stats["links"]) == {"cuda0->w1.cpu", "w1.cpu->cuda0"}
    assert stats["round_trips"] == 2 + 1 + 1        # learning forward block by block, then chained
    if case == "local split":
        assert stats["ranges"] == {"cuda0": [0, 1], "cuda1": [2, 3]}   # local block indices
        assert stats["devices"]["cuda1"]["resident_bytes"] > 0      # its local range
        assert stats["hops"] > 2 * stats["round_trips"]             # local hops as well
    else:
        assert stats["streamed_blocks"] == 4 and stats["resident_blocks"] == 0
        local_block_bytes = sum(p.numel() * p.element_size()
                                for i in (0, 1, 4, 5) for p in blocks[i][1].parameters())
        assert stats["streamed_bytes_per_forward"] == local_block_bytes
        if case in ("disk", "meta"):
            assert stats["disk_bytes_per_forward"] == local_block_bytes
    assert_restored(model, snap)


def test_payload_round_trip_and_refusals():
    from comfyui_placement.runtime.distributed import wire
    payload = ((torch.randn(2, 3), torch.arange(5, dtype=torch.int64)),
               {"temb": torch.randn(1, 4).to(torch.bfloat16), "mask": torch.tensor([True, False]),
                "scalar": torch.tensor(3.5), "empty": torch.empty(0, 7), "opts": None,
                "scale": 0.5, "name": "x", 7: [1, 2]})
    skeleton, tensors = wire.flatten(payload)
    metas, nbytes = wire.pack_layout(tensors)
    assert all(m["offset"] % 16 == 0 for m in metas)
    back = wire.unflatten(skeleton, wire.unpack(wire.pack(tensors, metas, nbytes,
                                                          torch.device("cpu")), metas))
    assert back[1]["scale"] == 0.5 and back[1][7] == [1, 2] and back[1]["opts"] is None
    for a, b in zip(tensors, wire.flatten(back)[1]):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    for bad in (object(), {(1, 2): 3}, [torch.nn.Linear(1, 1)]):
        with pytest.raises(PlacementError, match="accepted: tensors, tuples"):
            wire.flatten(bad)


def _nbytes(x):
    from comfyui_placement.runtime.distributed.wire import flatten
    return sum(t.numel() * t.element_size() for t in flatten(x)[1])


def test_chained_bytes_are_the_range_inputs_and_outputs_and_a_block_error_is_one_line(
        tmp_path, workers):
    from comfyui_placement.runtime.distributed import Cluster, remote_range
    model, inp, models, path = flux(tmp_path, seed=3)
    blocks = find_blocks(model)
    seen = {}
    hooks = [blocks[1][1].register_forward_pre_hook(
                 lambda m, a, k: seen.__setitem__("in", _nbytes((a, k))), with_kwargs=True),
             blocks[4][1].register_forward_hook(
                 lambda m, a, out: seen.__setitem__("out", _nbytes(out)))]
    expected = run(model, inp)
    for h in hooks:
        h.remove()
    w = workers(models)
    with Cluster(f"w1={w.address}", secret=b"loopback-secret", timeout_s=30) as cluster:
        with remote_range(model, (1, 4), cluster["w1.cpu"], str(path)) as rr:
            run(model, inp)
            before = rr.stats()["links"]
            assert torch.equal(run(model, inp), expected)
            after = rr.stats()["links"]
            assert after["cpu->w1.cpu"]["bytes"] - before["cpu->w1.cpu"]["bytes"] == seen["in"]
            assert after["w1.cpu->cpu"]["bytes"] - before["w1.cpu->cpu"]["bytes"] == \
                seen["out"]

            def narrow(m, args, kwargs):               # a wrong width reaches the worker
                kwargs = dict(kwargs, hidden_states=kwargs["hidden_states"][..., :5])
                return args, kwargs
            hook = blocks[1][1].register_forward_pre_hook(narrow, with_kwargs=True)
            try:
                with pytest.raises(PlacementError, match="a remote block failed: RuntimeError"
                                   ) as err:
                    run(model, inp)
            finally:
                hook.remove()
            assert "\n" not in str(err.value)
            assert torch.equal(run(model, inp), expected)      # the worker still serves


class SkipStack(torch.nn.Module):
    """Long skips (HunyuanDiT / U-ViT style): the first half's outputs are kept and read
    by the second half, so placeholders for them would be silently wrong."""

    def __init__(self, n=4, width=8):
        super().__init__()
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(width, width) for _ in range(n))
        self.out = torch.nn.Linear(width, width)

    def forward(self, x):
        skips, half = [], len(self.blocks) // 2
        for block in self.blocks[:half]:
            x = block(x)
            skips.append(x)
        for block in self.blocks[half:]:
            x = block(x + skips.pop())
        return self.out(x)


def _in_process_range(model, first, last):
    """RangeCalls with the 'worker' in this process: the chain logic without sockets."""
    import functools
    from comfyui_placement.runtime.distributed.chain import RangeCalls, run_chain
    from comfyui_placement.runtime.distributed.wire import flatten
    found = find_blocks(model)
    blocks = [b for _, b in found[first:last + 1]]
    real = [b.forward for b in blocks]
    trips = []

    def remote(message, payload, device):
        trips.append(message["mode"])
        args, kwargs = payload
        if message["mode"] == "block":
            return real[message["index"]](*args, **kwargs)
        return run_chain([lambda *a, f=f, **k: f(*a, **k) for f in real], message["chain"],
                         args, kwargs)
    calls = RangeCalls([n for n, _ in found[first:last + 1]], True, remote)

    def call(k, *args, **kwargs):
        skeleton, tensors = flatten((args, kwargs))
        return calls.call(k, args, kwargs, skeleton, tensors, torch.device("cpu"))
    for k, b in enumerate(blocks):
        b.forward = functools.partial(call, k)
    after = found[last + 1][1] if last + 1 < len(found) else model
    after.register_forward_pre_hook(lambda *_: calls.checkpoint())
    model.register_forward_hook(lambda *_: calls.checkpoint())
    return calls, trips


@pytest.mark.parametrize("arch", ["flux", "skips"])
def test_chain_only_where_the_model_just_passes_activations_on(arch):
    torch.manual_seed(0)
    if arch == "flux":
        model, inp = _tiny_flux()[0].eval(), None
        L, T = 16, 8
        inp = dict(hidden_states=torch.randn(1, L, 8), encoder_hidden_states=torch.randn(1, T, 32),
                   pooled_projections=torch.randn(1, 16), timestep=torch.tensor([0.5]),
                   img_ids=torch.zeros(L, 3), txt_ids=torch.zeros(T, 3), return_dict=False)
        first, last = 1, 4
    else:
        model, inp, first, last = SkipStack().eval(), {"x": torch.randn(3, 8)}, 0, 1
    with torch.no_grad():
        expected = model(**inp)
        calls, trips = _in_process_range(model, first, last)
        outs = [model(**inp) for _ in range(3)]
    for out in outs:
        assert torch.equal(out[0] if arch == "flux" else out,
                           expected[0] if arch == "flux" else expected)
    n = last - first + 1
    if arch == "flux":          # learned on the first forward, then one trip per forward
        assert calls.chained and trips == ["block"] * n + ["chain", "chain"]
    else:                       # the skips keep the outputs: never chained
        assert not calls.chained and trips == ["block"] * n * 3


def test_calibrate_measures_the_link_to_a_worker(tmp_path, workers, monkeypatch, capsys):
    """`calibrate --workers` echoes payloads through a real worker (bytes checked on the
    way back), saves bytes/s and latency per alias, the plan's cost model reads them, and
    a later run without --workers keeps them."""
    from comfyui_placement import cli
    from comfyui_placement.placement import machine_figures as mf
    from comfyui_placement.runtime.machine import calibrate as cal
    from comfyui_placement.runtime.distributed import probe
    monkeypatch.setenv(mf.ENV_DIR, str(tmp_path / "cache"))
    monkeypatch.setitem(cal.QUICK_SIZES, "cpu", 64)
    monkeypatch.setitem(cal.TIME_BUDGET_S, "cpu", 0.02)
    monkeypatch.setattr(cal, "QUICK_DISK_BYTES", 4 << 20)
    monkeypatch.setattr(probe, "QUICK_SIZES", (1 << 20, 4 << 20))
    monkeypatch.setenv(SECRET_ENV, "loopback-secret")
    _, _, models, _ = flux(tmp_path)
    w = workers(models)
    assert cli.main(["calibrate", "--quick", "--json", "--folder", str(tmp_path),
                     "--workers", f"w1={w.address}", "--secret-env", SECRET_ENV]) == 0
    out, err = capsys.readouterr()
    got = json.loads(out)["record"]["network"]["w1"]
    assert "network round trips" in err
    assert got["bytes_per_s"] > 1e6 and 0 < got["latency_s"] < 1
    assert set(got["by_size"]) == {str(1 << 20), str(4 << 20)}
    figures = mf.figures_for(Inventory.detect())
    assert figures.network_bandwidth == {"w1": got["bytes_per_s"]}
    assert cli.main(["calibrate", "--quick", "--no-save", "--folder", str(tmp_path),
                     "--workers", f"w1={w.address}", "--secret-env", SECRET_ENV]) == 0
    assert "w1        network" in capsys.readouterr().out
    assert cli.main(["calibrate", "--quick", "--folder", str(tmp_path)]) == 0
    assert mf.figures_for(Inventory.detect()).network_bandwidth == {"w1": got["bytes_per_s"]}
    capsys.readouterr()
    assert cli.main(["calibrate", "--quick", "--folder", str(tmp_path),
                     "--workers", "w1=127.0.0.1:1", "--secret-env", SECRET_ENV]) == 2
    err = capsys.readouterr().err                                   # joined first: fails at
    assert err.count("\n") == 1 and "cannot connect" in err         # once, one line, saves
    assert "matmul" not in err                                      # nothing
    assert mf.figures_for(Inventory.detect()).network_bandwidth == {"w1": got["bytes_per_s"]}


def test_lost_worker_beside_a_streaming_local_stage_is_one_error(tmp_path, workers):
    """place() with a worker range beside a local stage that streams: the worker killed in
    the middle of a forward (its range's first block) is one PlacementError, raised
    through the local engine's hooks; leaving the placement restores the local engine's
    tensors and the released remote blocks exactly, frees every simulated byte and leaves
    no copy thread; the module then computes as before."""
    import threading
    from comfyui_placement.placement.remote_devices import with_remote
    from comfyui_placement.runtime.distributed import Cluster
    from comfyui_placement.runtime.place import place
    model, inp, models, path = flux(tmp_path, seed=4)
    expected = run(model, inp)
    w = workers(models)
    snap = snapshot(model)
    blocks = find_blocks(model)
    threads = threading.active_count()
    plan = _remote_plan(["cuda0", "w1.cpu"], {"cuda0": [0, 5], "w1.cpu": [2, 3]},
                        stream=(0, 1))

    def strike(*_):
        w.proc.kill()
        w.proc.wait(timeout=30)
    with Cluster(f"w1={w.address}", secret=b"loopback-secret", timeout_s=4.0) as cluster:
        inv = with_remote(Inventory.simulated("cuda0=256MiB,cpu=8GiB"), cluster.devices())
        with pytest.raises(PlacementError, match=r"worker w1 \(127\.0\.0\.1:\d+\) lost") as err:
            with place(model, plan, "diffusion", inv, cluster=cluster,
                       weights_file=str(path)) as placed:
                assert torch.equal(run(model, inp), expected)
                hook = blocks[2][1].register_forward_pre_hook(strike)
                try:
                    run(model, inp)
                finally:
                    hook.remove()
    assert "\n" not in str(err.value)
    stats = placed.stats()
    dev = stats["devices"]["cuda0"]
    assert dev["resident_bytes"] == 0 and dev["slot_bytes"] == 0
    assert threading.active_count() == threads
    assert_restored(model, snap)
    assert torch.equal(run(model, inp), expected)


def test_a_worker_offers_a_simulated_gpu_and_refuses_a_range_past_its_capacity(tmp_path,
                                                                              workers):
    """worker --simulate: a GPU this machine lacks, computing on its cpu; a range bigger
    than the simulated device is refused as its memory would refuse it, in one line."""
    from comfyui_placement.runtime.distributed import Cluster, remote_range
    model, inp, models, path = flux(tmp_path, seed=4)
    expected = run(model, inp)
    w = workers(models, extra=("--simulate", "cuda0=200KiB,cpu=8GiB"))
    with Cluster(f"w1={w.address}", secret=b"loopback-secret", timeout_s=30) as cluster:
        (gpu,) = [d for d in cluster.devices() if d.name == "w1.cuda0"]
        assert gpu.simulated and gpu.kind == "gpu" and gpu.total_bytes == 200 << 10
        with remote_range(model, (4, 5), cluster["w1.cuda0"], str(path)):
            assert torch.equal(run(model, inp), expected)
        with pytest.raises(PlacementError, match="out of memory on simulated cuda0") as err:
            with remote_range(model, (0, 5), cluster["w1.cuda0"], str(path)):
                pass
        assert "\n" not in str(err.value)
        with remote_range(model, (3, 5), cluster["w1.cuda0"], str(path)):   # freed again
            assert torch.equal(run(model, inp), expected)
    assert "for simulated cuda0" in w.logs()
