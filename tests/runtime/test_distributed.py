"""Layer split beyond one machine, on loopback: workers are real subprocesses
(`python -m comfyui_placement worker`), ports chosen free by the OS, every wait bounded."""
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
from comfyui_placement.runtime.blocks import find_blocks

SECRET_ENV = "CP_TEST_DISTRIBUTED_SECRET"


class WorkerProcess:
    def __init__(self, models, tmp_path, secret="loopback-secret", name="w"):
        env = dict(os.environ, **{SECRET_ENV: secret})
        self.log = open(tmp_path / f"{name}.log", "w+")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "comfyui_placement", "worker", "--listen", "127.0.0.1:0",
             "--models", str(models), "--secret-env", SECRET_ENV],
            stdout=subprocess.PIPE, stderr=self.log, env=env, text=True)
        ready, _, _ = select.select([self.proc.stdout], [], [], 60)
        line = self.proc.stdout.readline() if ready else ""
        if not line.startswith("listening on "):
            self.stop()
            raise RuntimeError(f"worker did not start: {line!r} {self.logs()}")
        self.address = line.split()[-1]

    def logs(self) -> str:
        self.log.seek(0)
        return self.log.read()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)
        self.log.close()


@pytest.fixture
def workers(tmp_path):
    started = []

    def start(models, **kw):
        w = WorkerProcess(models, tmp_path, name=f"w{len(started) + 1}", **kw)
        started.append(w)
        return w
    yield start
    for w in started:
        if w.proc.poll() is None:
            w.proc.send_signal(signal.SIGCONT)
        w.stop()


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
        assert now[n].device == device and torch.equal(now[n].detach(), value), n
    for n, b in model.named_buffers():
        assert torch.equal(b, buffers[n]), n
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
