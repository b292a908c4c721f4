"""Issue 10 item 7: measured figures feed the cost model; given > measured > default;
step corrections observed in earlier runs improve the next plan, bounded."""
import json
import math

import pytest

from comfyui_placement.placement import Inventory, PlacementError
from comfyui_placement.placement import machine_figures as mf
from comfyui_placement.placement import units
from comfyui_placement.placement.components import COMPONENTS
from comfyui_placement.placement.devices import Device
from comfyui_placement.placement.fit import FitOptions, fit
from comfyui_placement.placement.fit.costs import (DEFAULT_BANDWIDTH, DEFAULT_DISK_BANDWIDTH,
                                                   DEFAULT_THROUGHPUT)
from comfyui_placement.placement.metadata.info import BlockInfo, ComponentInfo
from comfyui_placement.placement.resolve import Choice, Request

GiB = 1 << 30


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(mf.ENV_DIR, str(tmp_path / "cache"))
    return tmp_path / "cache"


def machine(description="Fake GPU 24GB", total=24 * GiB):
    """A detected inventory without torch: what Inventory.detect() builds on a 1-GPU box."""
    return Inventory([Device("cuda0", "gpu", total, total, description, torch_device="cuda:0"),
                      Device("cpu", "cpu", 64 * GiB, 64 * GiB, "host memory", "cpu")],
                     source="detected")


def flux_like():
    blocks = tuple(BlockInfo(f"blocks.{i}", GiB // 2, "blocks", i) for i in range(40))
    return {"diffusion": ComponentInfo("diffusion", 20 * GiB, blocks, arch="test",
                                       dtype="bf16", headroom_bytes=GiB)}


def plan_on(inv, **options):
    req = Request({c: Choice(None, None, None) for c in COMPONENTS}, {}, False, [])
    return fit(req, inv, flux_like(), FitOptions(**options))


def cost(p):
    return p.extra["fit"]["cost_model"]


def record(flops=165e12, pinned=50e9, disk=3e9, peer=None):
    out = {"devices": {"cuda0": {"throughput_flops": {"bf16": flops, "fp32": flops / 4,
                                                      "fp8": "not supported: old card"},
                                 "h2d_bytes_per_s": {"pinned": pinned, "pageable": pinned / 2}},
                       "cpu": {"throughput_flops": {"fp32": 1e12, "bf16": 3e12}}},
           "disk": {"/models": {"bytes_per_s": disk, "cold": True}}, "peer": {}, "notes": []}
    if peer:
        out["peer"]["cuda0->cuda1"] = {"bytes_per_s": peer, "how": "peer"}
    return out


# -- units ----------------------------------------------------------------------------------
@pytest.mark.parametrize("text,value", [("165T", 165e12), ("165TFLOPS", 165e12),
                                        ("165 TFLOP/s", 165e12), ("900G", 900e9),
                                        ("1.6e14", 1.6e14), ("2.5tflops", 2.5e12)])
def test_throughput_units(text, value):
    assert units.parse_throughput(text) == pytest.approx(value)


@pytest.mark.parametrize("text,value", [("25GB/s", 25e9), ("3.5GiB/s", 3.5 * GiB),
                                        ("800MB/s", 800e6), ("1 TB/s", 1e12),
                                        ("512MiB/s", 512 << 20)])
def test_bandwidth_units(text, value):
    assert units.parse_bandwidth(text) == pytest.approx(value)


@pytest.mark.parametrize("bad", ["", "fast", "-3T", "0T", "25GB/s", "3X", "nanT", "infT"])
def test_bad_throughput_is_one_line(bad):
    with pytest.raises(PlacementError, match="expected FLOP/s") as e:
        units.parse_throughput(bad)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("bad", ["25GB", "25", "GB/s", "-1GB/s", "3XB/s", "0MB/s"])
def test_bad_bandwidth_is_one_line(bad):
    with pytest.raises(PlacementError, match="expected bytes per second"):
        units.parse_bandwidth(bad)


def test_figure_lists_by_device_or_kind():
    assert units.parse_figure_list("cuda:0=165T, gpu=80T", units.parse_throughput, "--throughput") \
        == {"cuda0": 165e12, "gpu": 80e12}
    assert units.parse_figure_list("25GB/s", units.parse_bandwidth, "--bandwidth") == {"gpu": 25e9}
    with pytest.raises(PlacementError, match="empty entry"):
        units.parse_figure_list("cuda0=1T,", units.parse_throughput, "--throughput")


# -- simulate entries --------------------------------------------------------------------------
def test_simulate_entries_give_figures_and_flags_win():
    inv = Inventory.simulated("cuda0=24GiB@165T@50GB/s,cuda1=24GiB,cpu=64GiB@2T")
    c = cost(plan_on(inv))
    assert c["throughput_flops"] == {"cuda0": 165e12, "cuda1": DEFAULT_THROUGHPUT["gpu"],
                                     "cpu": 2e12}
    assert c["bandwidth_bytes_per_s"]["cuda0"] == 50e9
    assert c["sources"]["throughput"] == {"cuda0": "given", "cuda1": "default", "cpu": "given"}
    assert c["sources"]["bandwidth"]["cuda1"] == "default"
    assert c["sources"]["disk_bandwidth"] == "default"
    assert c["disk_bandwidth_bytes_per_s"] == DEFAULT_DISK_BANDWIDTH
    # a flag for the device beats its entry; a flag for the kind does not
    c = cost(plan_on(inv, throughput={"cuda0": 100e12, "gpu": 10e12}, disk_bandwidth=7e9))
    assert c["throughput_flops"]["cuda0"] == 100e12 and c["throughput_flops"]["cuda1"] == 10e12
    assert c["disk_bandwidth_bytes_per_s"] == 7e9 and c["sources"]["disk_bandwidth"] == "given"


@pytest.mark.parametrize("bad,match", [("cuda0=24GiB@5GB/ss", "expected FLOP/s"),
                                       ("cuda0=24GiB@1T@2T", "two throughputs"),
                                       ("cuda0=24GiB@1GB/s@2GB/s", "two bandwidths"),
                                       ("cuda0=24GiB@", "expected FLOP/s")])
def test_bad_simulate_figures(bad, match):
    with pytest.raises(PlacementError, match=match):
        Inventory.simulated(bad)


def test_faster_given_card_predicts_a_faster_step():
    slow = plan_on(Inventory.simulated("cuda0=24GiB@40T,cpu=64GiB"))
    fast = plan_on(Inventory.simulated("cuda0=24GiB@160T,cpu=64GiB"))
    assert fast.extra["fit"]["predicted"]["step_s"] < slow.extra["fit"]["predicted"]["step_s"]


# -- measured figures ----------------------------------------------------------------------------
def test_measured_figures_replace_defaults_on_this_machine_only(cache):
    inv = machine()
    before = cost(plan_on(inv))
    assert before["sources"]["throughput"] == {"cuda0": "default", "cpu": "default"}
    path = mf.save_measurements(inv, record(peer=30e9))
    assert path.parent == cache and json.loads(path.read_text())["version"] == mf.VERSION
    c = cost(plan_on(inv))
    assert c["throughput_flops"] == {"cuda0": 165e12, "cpu": 1e12}     # bf16 on GPU, fp32 on CPU
    assert c["bandwidth_bytes_per_s"]["cuda0"] == 50e9
    assert c["disk_bandwidth_bytes_per_s"] == 3e9 and c["peer_bandwidth_bytes_per_s"] == 30e9
    assert c["sources"] == {"throughput": {"cuda0": "measured", "cpu": "measured"},
                            "bandwidth": {"cuda0": "measured", "cpu": "default"},
                            "disk_bandwidth": "measured", "peer_bandwidth": "measured"}
    assert str(cache) in c["measured_in"]
    # the same hardware simulated: never the measured figures
    sim = cost(plan_on(Inventory.simulated("cuda0=24GiB,cpu=64GiB")))
    assert set(sim["sources"]["throughput"].values()) == {"default"}
    # another card in the same machine (another description or size): not its figures
    for other in (machine(description="Other GPU"), machine(total=12 * GiB)):
        assert cost(plan_on(other))["sources"]["throughput"]["cuda0"] == "default"
    # options may turn them off
    assert cost(plan_on(inv, measured=None))["sources"]["throughput"]["cuda0"] == "default"


def test_given_beats_measured():
    inv = machine()
    mf.save_measurements(inv, record())
    c = cost(plan_on(inv, throughput={"gpu": 10e12}, bandwidth={"cuda0": 5e9}))
    assert c["throughput_flops"]["cuda0"] == 10e12 and c["bandwidth_bytes_per_s"]["cuda0"] == 5e9
    assert c["sources"]["throughput"] == {"cuda0": "given", "cpu": "measured"}


def test_measured_speed_changes_the_prediction():
    inv = machine()
    default_s = plan_on(inv).extra["fit"]["predicted"]["sample_step_s"]
    mf.save_measurements(inv, record(flops=DEFAULT_THROUGHPUT["gpu"] / 4,
                                     pinned=DEFAULT_BANDWIDTH["gpu"] / 4))
    slow_s = plan_on(inv).extra["fit"]["predicted"]["sample_step_s"]
    assert slow_s > 3.5 * default_s


def test_unsupported_dtypes_fall_back_in_order():
    inv = machine()
    rec = record()
    rec["devices"]["cuda0"]["throughput_flops"] = {"bf16": "not supported: x", "fp16": 60e12,
                                                   "fp32": 20e12}
    mf.save_measurements(inv, rec)
    assert cost(plan_on(inv))["throughput_flops"]["cuda0"] == 60e12


def test_damaged_file_is_one_line_naming_it_and_plans_go_on(cache):
    """A damaged cache file never stops planning: the plan warns in one line naming the
    file and what to do, and uses the default figures; reading it directly still raises."""
    cache.mkdir(parents=True)
    (cache / mf.FILE_NAME).write_text("{not json")
    p = plan_on(machine())
    assert any("cannot read the calibration file" in w and "calibrate" in w
               and "default figures" in w for w in p.warnings), p.warnings
    assert set(cost(p)["sources"]["throughput"].values()) == {"default"}
    with pytest.raises(PlacementError, match="cannot read the calibration file .*calibrate"):
        mf.load_all()
    (cache / mf.FILE_NAME).write_text(json.dumps({"version": 99, "machines": {}}))
    assert any("not version 1" in w for w in plan_on(machine()).warnings)


# -- step corrections --------------------------------------------------------------------------
def test_observed_steps_correct_the_next_plan_bounded_and_explained():
    inv = machine()
    mf.save_measurements(inv, record())
    first = plan_on(inv)
    predicted = first.extra["fit"]["components"]["diffusion"]["forward_s"]
    assert mf.observe_step(inv, "cuda0", "diffusion", predicted, 2 * predicted) \
        == pytest.approx(2.0)
    second = plan_on(inv)
    c = cost(second)
    assert c["throughput_flops"]["cuda0"] == pytest.approx(165e12 / 2)
    assert c["sources"]["throughput"]["cuda0"] == "measured"
    assert c["corrections"] == {"cuda0": {"factor": pytest.approx(2.0), "runs": 1}}
    assert any("observed run(s) took 2.00x" in r
               for r in second.components["diffusion"].reasons)
    # later runs move it by a weighted average; an absurd run is bounded
    factor = mf.observe_step(inv, "cuda0", "diffusion", 1.0, 1000.0)
    assert factor == pytest.approx(math.exp(0.7 * math.log(2) + 0.3 * math.log(4)))
    for _ in range(30):
        factor = mf.observe_step(inv, "cuda0", "diffusion", 1.0, 1e6)
    assert 3.99 < factor <= 4.0
    # a new calibration keeps what runs taught; a given throughput is not corrected
    mf.save_measurements(inv, record())
    assert cost(plan_on(inv))["corrections"]["cuda0"]["runs"] == 32
    given = cost(plan_on(inv, throughput={"cuda0": 100e12}))
    assert given["throughput_flops"]["cuda0"] == 100e12 and given["corrections"] == {}


def test_corrections_without_calibration_apply_to_defaults():
    inv = machine()
    mf.observe_step(inv, "cuda0", "diffusion", 2.0, 1.0)
    c = cost(plan_on(inv))
    assert c["throughput_flops"]["cuda0"] == pytest.approx(DEFAULT_THROUGHPUT["gpu"] * 2)
    assert c["sources"]["throughput"]["cuda0"] == "default"


def test_observe_step_checks_its_input_and_ignores_simulated_hardware(cache):
    inv = machine()
    for bad in (0, -1.0, float("nan"), "1"):
        with pytest.raises(PlacementError, match="expected seconds > 0"):
            mf.observe_step(inv, "cuda0", "diffusion", 1.0, bad)
    with pytest.raises(PlacementError, match="not in the inventory"):
        mf.observe_step(inv, "cuda7", "diffusion", 1.0, 1.0)
    assert mf.observe_step(Inventory.simulated("cuda0=8GiB"), "cuda0", "diffusion", 1.0, 3.0) == 1.0
    assert not (cache / mf.FILE_NAME).exists()


# -- where the file lives ----------------------------------------------------------------------
def test_cache_dir_rules_by_hand(monkeypatch, tmp_path):
    import builtins
    import sys
    real_import = builtins.__import__

    def no_platformdirs(name, *a, **k):
        if name == "platformdirs":
            raise ImportError(name)
        return real_import(name, *a, **k)
    monkeypatch.setattr(builtins, "__import__", no_platformdirs)
    monkeypatch.delenv(mf.ENV_DIR)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert mf.cache_dir() == tmp_path / "xdg" / mf.APP
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")
    assert mf.cache_dir() == tmp_path / ".cache" / mf.APP
    monkeypatch.setattr(sys, "platform", "darwin")
    assert mf.cache_dir() == tmp_path / "Library" / "Caches" / mf.APP
    monkeypatch.setattr(sys, "platform", "win32")
    monkeypatch.setenv("LOCALAPPDATA", str(tmp_path / "local"))
    assert mf.cache_dir() == tmp_path / "local" / mf.APP / "Cache"


def test_fingerprint_names_host_and_hardware():
    a, b = mf.fingerprint(machine()), mf.fingerprint(machine(total=12 * GiB))
    assert a != b and "Fake GPU 24GB" in a


def test_simulated_figures_are_listed_with_the_device():
    d = Inventory.simulated("cuda0=24GiB@165T@25GB/s,cuda1=8GiB").to_dict()["devices"]
    assert d[0]["throughput_flops"] == 165e12 and d[0]["bandwidth_bytes_per_s"] == 25e9
    assert "throughput_flops" not in d[1]


def test_observe_plan_step_uses_the_plans_prediction_on_each_runtime_device():
    inv = Inventory([Device(f"cuda{i}", "gpu", 8 * GiB, 8 * GiB, "Fake 8GB", f"cuda:{i}")
                     for i in range(2)] + [Device("cpu", "cpu", 64 * GiB, 64 * GiB, "host", "cpu")],
                    source="detected")
    p = plan_on(inv)
    runtime = p.components["diffusion"].runtime
    assert runtime == ["cuda0", "cuda1"]
    predicted = p.extra["fit"]["components"]["diffusion"]["forward_s"]
    assert mf.observe_plan_step(inv, p, "diffusion", 1.5 * predicted) == \
        {"cuda0": pytest.approx(1.5), "cuda1": pytest.approx(1.5)}
    assert cost(plan_on(inv))["corrections"]["cuda1"]["factor"] == pytest.approx(1.5)
    assert mf.observe_plan_step(inv, p, "vae", 1.0) == {}              # not in the plan
    assert mf.observe_plan_step(Inventory.simulated("cuda0=8GiB,cuda1=8GiB"), p,
                                "diffusion", 1.0) == {}


def test_report_says_where_the_speeds_come_from():
    inv = machine()
    assert "(the default speeds of each device kind; run `calibrate`" in \
        " ".join(plan_on(inv).report().split())
    mf.save_measurements(inv, record())
    text = " ".join(plan_on(inv, bandwidth={"cuda0": 9e9}).report().split())
    assert "(measured on this machine, some given)" in text
    mf.observe_step(inv, "cuda0", "diffusion", 1.0, 2.0)
    assert "corrected by observed runs)" in " ".join(plan_on(inv).report().split())
