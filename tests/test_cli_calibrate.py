"""`calibrate` measures this machine (CPU here, probes shrunk to keep it quick) and saves
figures that `plan --auto-fit` on the detected inventory then reports as measured."""
import json
import math
import os
import sys

import pytest

from comfyui_placement import cli
from comfyui_placement.placement import Inventory
from comfyui_placement.placement import machine_figures as mf
from comfyui_placement.runtime.machine import calibrate as cal

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "placement"))
from helpers import tiny_files as tf  # noqa: E402


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(mf.ENV_DIR, str(tmp_path / "cache"))
    monkeypatch.setitem(cal.QUICK_SIZES, "cpu", 64)
    monkeypatch.setitem(cal.TIME_BUDGET_S, "cpu", 0.02)
    monkeypatch.setattr(cal, "QUICK_DISK_BYTES", 8 << 20)
    return tmp_path / "cache"


def test_calibrate_measures_saves_and_plan_uses_it(cache, tmp_path, capsys):
    models = tmp_path / "models"
    models.mkdir()
    assert cli.main(["calibrate", "--quick", "--json", "--folder", str(models)]) == 0
    out, err = capsys.readouterr()
    result = json.loads(out)
    assert "cpu (host memory): matmul throughput" in err          # progress on stderr
    rec = result["record"]
    flops = rec["devices"]["cpu"]["throughput_flops"]
    assert isinstance(flops["fp32"], float) and 1e6 < flops["fp32"] < 1e14
    assert isinstance(flops["bf16"], float)
    assert 0 < rec["devices"]["cpu"]["matmul_n"]["fp32"] <= 64
    assert any("device-to-device not measured" in n for n in rec["notes"])
    disk = rec["disk"][str(models)]
    assert disk["bytes"] == 8 << 20 and 1e6 < disk["bytes_per_s"]
    assert disk["cold"] == hasattr(os, "posix_fadvise")
    assert os.listdir(models) == []                                 # the probe file is gone
    saved = json.loads((cache / mf.FILE_NAME).read_text())
    assert list(saved["machines"]) == [mf.fingerprint(Inventory.detect())]

    model = tf.write_header_file(tmp_path / "m.safetensors", tf.sd3(hidden=64, depth=3))
    assert cli.main(["plan", "--auto-fit", "--json", "--model", f"diffusion={model}"]) == 0
    cm = json.loads(capsys.readouterr().out)["fit"]["cost_model"]
    assert cm["sources"]["throughput"]["cpu"] == "measured"
    assert math.isclose(cm["throughput_flops"]["cpu"], flops["fp32"])
    assert cm["sources"]["disk_bandwidth"] == "measured"
    assert cli.main(["plan", "--auto-fit", "--json", "--model", f"diffusion={model}",
                     "--throughput", "cpu=2T", "--disk-bandwidth", "3GB/s"]) == 0
    cm = json.loads(capsys.readouterr().out)["fit"]["cost_model"]
    assert cm["throughput_flops"]["cpu"] == 2e12 and cm["disk_bandwidth_bytes_per_s"] == 3e9
    assert cm["sources"]["throughput"]["cpu"] == "given"
    # --simulate never borrows this machine's figures
    assert cli.main(["plan", "--auto-fit", "--json", "--model", f"diffusion={model}",
                     "--simulate", "cuda0=8GiB@165T@25GB/s,cpu=16GiB"]) == 0
    cm = json.loads(capsys.readouterr().out)["fit"]["cost_model"]
    assert cm["sources"]["throughput"] == {"cuda0": "given", "cpu": "default"}
    assert cm["sources"]["disk_bandwidth"] == "default"


def test_calibrate_table_and_no_save(cache, tmp_path, capsys):
    assert cli.main(["calibrate", "--quick", "--no-save", "--folder", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "cpu       matmul fp32" in out and "disk read" in out and "not saved" in out
    assert not (cache / mf.FILE_NAME).exists()


@pytest.mark.parametrize("argv,message", [
    (["--simulate", "cuda0=8GiB", "--throughput", "cuda0=165X"],
     "invalid --throughput value '165X'"),
    (["--simulate", "cuda0=8GiB", "--bandwidth", "cuda0=25GB"],
     "invalid --bandwidth value '25GB'"),
    (["--simulate", "cuda0=8GiB", "--disk-bandwidth", "fast"], "invalid --disk-bandwidth 'fast'"),
    (["--simulate", "cuda0=8GiB", "--network-bandwidth", "w1=fast"],
     "invalid --network-bandwidth value 'fast'"),
    (["--simulate", "cuda0=8GiB", "--network-bandwidth", "w1.cuda0=1GB/s"],
     "invalid --network-bandwidth entry 'w1.cuda0=1GB/s'"),
    (["--simulate", "cuda0=8GiB@3GB/x"], "throughput of simulated device cuda0"),
])
def test_bad_speed_flags_are_one_line(cache, capsys, argv, message):
    assert cli.main(["plan", "--auto-fit", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_speed_flags_need_auto_fit(cache, capsys):
    assert cli.main(["plan", "--simulate", "cuda0=8GiB", "--throughput", "1T"]) == 2
    assert "--throughput needs --auto-fit" in capsys.readouterr().err


def test_network_bandwidth_flag_prices_the_link_to_a_worker(cache, tmp_path, capsys):
    model = tf.write_header_file(tmp_path / "m.safetensors", tf.sd3(hidden=64, depth=3))
    for flag, want in (("5GB/s", 5e9), ("w1=12.5GB/s", 12.5e9)):
        assert cli.main(["plan", "--auto-fit", "--json", "--model", f"diffusion={model}",
                         "--simulate", "cuda0=8GiB,w1.cuda0=8GiB,cpu=16GiB",
                         "--network-bandwidth", flag]) == 0
        links = json.loads(capsys.readouterr().out)["fit"]["cost_model"]["links"]
        assert links["cuda0->w1.cuda0"] == {"kind": "network", "bytes_per_s": want,
                                            "latency_s": links["cuda0->w1.cuda0"]["latency_s"],
                                            "source": "given"}
