"""A worker's own figures (issue 33, item 4), on loopback with real worker processes:
the speeds calibrated on the worker's machine price its devices and the plan names the
source of each; the network link is kept per worker machine, so another alias keeps it;
free memory is measured again when the main asks; the peak it measured comes back."""
import os
from pathlib import Path

import pytest

from comfyui_placement.placement import PlacementSpec, plan
from comfyui_placement.placement import machine_figures as mf
from comfyui_placement.placement.devices import Inventory
from comfyui_placement.placement.machine_identity import machine_id
from comfyui_placement.placement.remote_devices import (CALIBRATED, DEFAULT, SIMULATED,
                                                         remote_device_entries, valid_id,
                                                         with_remote)
from comfyui_placement.runtime.blocks.find import find_blocks
from test_distributed import WorkerProcess, flux, run

SECRET = b"loopback-secret"
CPU_FLOPS = 1.23e12                     # what the worker's calibration file says


@pytest.fixture
def workers(tmp_path):
    """Start workers (real processes on loopback); each is stopped, its log shown."""
    started = []

    def start(models, **kw):
        started.append(WorkerProcess(models, tmp_path, name=f"w{len(started) + 1}", **kw))
        return started[-1]
    yield start
    for w in started:
        print(f"--- worker {w.name} log ---\n{w.logs()}")   # pytest shows it on failure
        w.stop()


def _worker_cache(tmp_path, monkeypatch, name="worker-cache") -> Path:
    """A cache folder for the workers started next (they inherit the environment)."""
    folder = tmp_path / name
    monkeypatch.setenv(mf.ENV_DIR, str(folder))
    return folder


def _calibrated(folder: Path) -> None:
    """The file `calibrate` writes on the worker's machine (this one: same fingerprint)."""
    mf.save_measurements(Inventory.detect(), {"devices": {"cpu": {
        "throughput_flops": {"fp32": CPU_FLOPS}}}}, folder / mf.FILE_NAME)


def test_the_plan_prices_a_worker_with_its_own_calibration_and_names_each_source(
        tmp_path, monkeypatch, workers):
    from comfyui_placement.runtime.distributed import Cluster
    model, _, models, _ = flux(tmp_path)
    folder = _worker_cache(tmp_path, monkeypatch)
    _calibrated(folder)
    real = workers(models)
    sim = workers(models, extra=("--simulate", "cuda0=2GiB@165T,cpu=8GiB"))
    monkeypatch.setenv(mf.ENV_DIR, str(tmp_path / "main-cache"))
    with Cluster(f"w1={real.address},w2={sim.address}", secret=SECRET,
                 timeout_s=30) as cluster:
        cluster.refresh()                         # free memory measured again (planning)
        entries = {d.name: d for d in cluster.devices()}
        assert entries["w1.cpu"].measured_throughput == CPU_FLOPS
        assert entries["w1.cpu"].machine == machine_id(folder)      # its cache folder's
        assert entries["w2.cuda0"].measured_throughput is None      # a what-if: given
        inv = with_remote(Inventory.simulated("cuda0=8GiB,cpu=8GiB"), entries.values())
        p = plan(PlacementSpec(auto_fit=True), inv, {"diffusion": model},
                 throughput={"w2.cpu": 2e12})
    model_figs = p.extra["fit"]["cost_model"]
    assert model_figs["throughput_flops"]["w1.cpu"] == CPU_FLOPS
    assert model_figs["throughput_flops"]["w2.cuda0"] == 165e12
    got = p.extra["worker_figures"]["devices"]
    assert got["w1.cpu"]["throughput_source"].startswith(CALIBRATED + ", saved ")
    assert got["w1.cpu"]["bandwidth_source"] == f"{DEFAULT}, not calibrated on the worker"
    assert got["w2.cuda0"]["throughput_source"] == SIMULATED
    assert got["w2.cuda0"]["bandwidth_source"] == \
        f"{DEFAULT}, the worker's --simulate gives none"
    assert got["w2.cpu"]["throughput_source"].startswith("given to the planner")
    assert got["w1.cpu"]["free_source"].startswith("measured by the worker at ")
    links = p.extra["worker_figures"]["links"]
    assert links["w1"]["source"].startswith("default, 10 GbE as seen")
    text = p.report()
    assert "worker figures:" in text and "w1.cpu: 1.23 TFLOP/s (calibrated on the worker" \
        in text.replace("\n    ", " ")
    assert p.from_json(p.to_json()).extra["worker_figures"] == p.extra["worker_figures"]


def test_the_link_is_kept_per_worker_machine_under_another_alias(tmp_path, monkeypatch,
                                                                 workers):
    from comfyui_placement.runtime.distributed import Cluster
    model, _, models, _ = flux(tmp_path)
    folder = _worker_cache(tmp_path, monkeypatch)
    w = workers(models)
    worker_id = machine_id(folder)
    main = tmp_path / "main-cache"
    monkeypatch.setenv(mf.ENV_DIR, str(main))
    # what `calibrate --workers w1=...` saves: the link under the worker's machine id
    mf.save_measurements(Inventory.detect(), {"network": {"w1": {
        "bytes_per_s": 5e9, "latency_s": 1e-4, "machine": worker_id}}})
    saved = mf.machine_record(Inventory.detect())["network"]
    assert list(saved) == [f"machine:{worker_id}"] and saved[f"machine:{worker_id}"][
        "alias"] == "w1"
    with Cluster(f"w7={w.address}", secret=SECRET, timeout_s=30) as cluster:
        inv = with_remote(Inventory.detect(), cluster.devices())
        assert mf.figures_for(inv).network_bandwidth == {"w7": 5e9}
        p = plan(PlacementSpec(auto_fit=True), inv, {"diffusion": model})
    assert p.extra["fit"]["cost_model"]["network_bandwidth_bytes_per_s"]["w7"] == 5e9
    assert p.extra["worker_figures"]["links"]["w7"]["source"] == \
        "measured by calibrate --workers to this worker's machine, as w1"


def test_old_alias_records_are_read_and_another_machine_never_borrows_a_link(tmp_path,
                                                                            monkeypatch):
    monkeypatch.setenv(mf.ENV_DIR, str(tmp_path))
    one, other = "a" * 32, "b" * 32
    mf.save_measurements(Inventory.detect(), {"network": {
        "w1": {"bytes_per_s": 3e9, "machine": one}}})
    data = mf.load_all()       # an older record, per alias, beside it
    next(iter(data["machines"].values()))["network"]["w2"] = {"bytes_per_s": 2e9}
    mf._save_all(data)
    listed = [{"name": "cpu", "kind": "cpu", "total_bytes": 1 << 30, "free_bytes": 1 << 30}]

    def links(**machines):
        entries = [e for alias, m in machines.items()
                   for e in remote_device_entries(alias, "h:1", listed, m)]
        return mf.figures_for(with_remote(Inventory.detect(), entries)).network_bandwidth
    assert links(w1=one, w2=None) == {"w1": 3e9, "w2": 2e9}
    assert links(w1=other) == {"w2": 2e9}            # w1 is another machine now: default
    assert links(w5=one) == {"w5": 3e9, "w2": 2e9}   # the same machine, another alias
    assert links(w2=other) == {"w2": 2e9, "w1": 3e9}  # an old record: read per alias
    assert links() == {"w1": 3e9, "w2": 2e9}          # w1.cuda0 simulated: its alias
    # calibrating w2 again under an id replaces its older per-alias entry
    mf.save_measurements(Inventory.detect(), {"network": {"w2": {"bytes_per_s": 4e9,
                                                                  "machine": other}}})
    assert sorted(mf.machine_record(Inventory.detect())["network"]) == \
        [f"machine:{one}", f"machine:{other}"]
    assert valid_id("x" * 32) is None and valid_id(one) == one


def test_free_memory_is_measured_again_and_the_peak_comes_back(tmp_path, monkeypatch,
                                                               workers):
    from comfyui_placement.runtime.distributed import Cluster, remote_range
    from comfyui_placement.runtime.distributed.own_figures import HELD
    model, inp, models, path = flux(tmp_path, seed=3)
    _worker_cache(tmp_path, monkeypatch)
    w = workers(models, extra=("--simulate", "cuda0=64MiB,cpu=8GiB"))
    blocks = find_blocks(model)
    range_bytes = sum(p.numel() * p.element_size() for _, b in blocks[3:6]
                      for p in b.parameters())
    with Cluster(f"w1={w.address}", secret=SECRET, timeout_s=30) as cluster:
        link = cluster.links["w1"]
        cluster.refresh(reset_peaks=True)
        assert cluster.peaks() == {}
        with remote_range(model, (3, 5), cluster["w1.cuda0"], str(path)):
            run(model, inp)
            cluster.refresh()                     # mid-run: the range held, counted free
            gpu = next(d for d in link.devices if d["name"] == "cuda0")
            assert gpu["free_bytes"] == 64 << 20
            assert "counting this main's ranges held there as free" in \
                gpu["figures"]["free_measured"]
        cluster.refresh()                         # after the run: the range released
        assert cluster.peaks() == {"w1.cuda0": (range_bytes, HELD)}
        cluster.refresh(reset_peaks=True)         # the next run counts from here
        assert cluster.peaks() == {}
        cluster.refresh()
        assert cluster.peaks() == {}
    assert os.path.exists(tmp_path / "worker-cache" / "machine_id")


def test_a_cuda_device_reports_its_allocator_peak_and_the_reset_counts_from_now(
        tmp_path, monkeypatch):
    """In process (no GPU here): a worker's CUDA device reports torch's allocator peak and
    a reset resets it; its cpu reports the bytes of the ranges held there."""
    from types import SimpleNamespace

    import torch

    from comfyui_placement.runtime.distributed.offered import OfferedDevices
    from comfyui_placement.runtime.distributed.own_figures import ALLOCATOR, HELD, OwnFigures
    monkeypatch.setenv(mf.ENV_DIR, str(tmp_path))
    reset = []
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda dev: 3 << 20)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", reset.append)
    own = OwnFigures(OfferedDevices("cuda0=1GiB,cpu=1GiB"))
    own._cuda = {"cuda0": torch.device("cuda", 0)}        # as if detected
    ranges = {1: SimpleNamespace(name="cpu", nbytes=1000)}
    got = {d["name"]: d for d in own.answer({"reset_peaks": True}, ranges)["devices"]}
    assert (got["cuda0"]["peak_bytes"], got["cuda0"]["peak_how"]) == (3 << 20, ALLOCATOR)
    assert (got["cpu"]["peak_bytes"], got["cpu"]["peak_how"]) == (1000, HELD)
    assert got["cpu"]["free_bytes"] == (1 << 30) - 1000 and got["cpu"]["held_bytes"] == 1000
    assert reset == [torch.device("cuda", 0)]
    got = {d["name"]: d for d in own.answer({}, {})["devices"]}
    assert got["cpu"]["peak_bytes"] == 1000 and got["cpu"]["held_bytes"] == 0
    listed = own.devices(OfferedDevices("cuda0=1GiB@165T").hello())
    assert [d["figures"]["throughput_source"] for d in listed] == [SIMULATED, DEFAULT]
    assert own.machine == machine_id(tmp_path)
