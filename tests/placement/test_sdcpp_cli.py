"""stable-diffusion.cpp's current docs/backend.md from the command line: the eighth
module `detector` (aliases adetailer, yolo) and `--auto-fit on|off` (docs/sdcpp-parity.md)."""
import json
import subprocess
import sys

import pytest

from helpers.tiny_files import total, write_header_file

SIM = "cuda0=24GiB,cuda1=12GiB,cpu=64GiB"


def cli(*args):
    return subprocess.run([sys.executable, "-m", "comfyui_placement", *args],
                          capture_output=True, text=True, timeout=120)


def plan_json(*args):
    out = cli("plan", "--simulate", SIM, "--json", *args)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def yolo_layout():
    """An ultralytics YOLOv8 checkpoint's key layout (conv stages 'model.N.'), small."""
    layout = {}
    for i, (cin, cout) in enumerate([(3, 16), (16, 32), (32, 32), (32, 64)]):
        layout[f"model.{i}.conv.weight"] = ("F16", [cout, cin, 3, 3])
        for part in ("weight", "bias", "running_mean", "running_var"):
            layout[f"model.{i}.bn.{part}"] = ("F16", [cout])
    layout["model.22.dfl.conv.weight"] = ("F16", [1, 16, 1, 1])
    return layout


@pytest.mark.parametrize("name", ["detector", "adetailer", "yolo", "ADetailer", "YOLO"])
def test_detector_and_its_aliases_in_backend(name):
    data = plan_json("--backend", f"cuda0,{name}=cuda1")
    assert data["components"]["detector"]["runtime"] == ["cuda1"]
    assert data["components"]["diffusion"]["runtime"] == ["cuda0"]


def test_detector_in_params_backend_and_split_mode():
    data = plan_json("--backend", "detector=cuda0", "--params-backend", "yolo=disk",
                     "--split-mode", "adetailer=layer")
    det = data["components"]["detector"]
    assert (det["runtime"], det["params"]) == (["cuda0"], "disk")


def test_detector_row_in_the_plan_table():
    out = cli("plan", "--simulate", SIM, "--backend", "yolo=cpu")
    assert out.returncode == 0, out.stderr
    rows = [line.split() for line in out.stdout.splitlines() if line.startswith("detector")]
    assert len(rows) == 1
    cells = [c for c in rows[0] if c not in ("(not", "loaded)")]   # a model-less plan
    assert cells[:3] == ["detector", "cpu", "cpu"]


def test_a_detector_file_is_planned_by_its_size(tmp_path):
    path = tmp_path / "face_yolov8m.safetensors"
    write_header_file(path, yolo_layout())
    data = plan_json("--model", f"detector={path}", "--backend", "detector=cuda1")
    det = data["components"]["detector"]
    assert det["present"] and det["total_bytes"] == total(yolo_layout())
    assert det["runtime"] == ["cuda1"] and det["params"] == "cuda1"


def test_auto_fit_places_a_detector(tmp_path):
    path = tmp_path / "face_yolov8m.safetensors"
    write_header_file(path, yolo_layout())
    data = plan_json("--auto-fit", "on", "--model", f"detector={path}")
    det = data["components"]["detector"]
    assert det["present"] and det["runtime"] == ["cuda0"]   # the GPU with the most room
    assert any("detector" in r and "resident" in r for r in det["reasons"]), det["reasons"]


def test_max_vram_keys_are_devices_not_modules():
    out = cli("plan", "--simulate", SIM, "--max-vram", "detector=2")
    assert out.returncode == 2 and out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "max_vram keys are devices, not modules" in lines[0]
    assert "'detector' is the module detector" in lines[0]


@pytest.mark.parametrize("args,fitted", [
    (["--auto-fit", "on"], True), (["--auto-fit", "off"], False), (["--auto-fit"], True),
    (["--auto-fit=on"], True), (["--auto-fit=off"], False), ([], False),
    (["--auto-fit", "ON"], True),
    # the bare flag still means on when another flag follows it
    (["--auto-fit", "--backend", "cuda0"], True),
])
def test_auto_fit_on_off_and_bare(args, fitted):
    data = plan_json(*args)
    assert ("fit" in data) is fitted


@pytest.mark.parametrize("value", ["maybe", "1", "true", "yes", ""])
def test_auto_fit_anything_else_is_one_error_line(value):
    out = cli("plan", "--simulate", SIM, "--auto-fit", value)
    assert out.returncode == 2 and out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("placement error: ") and "expected on or off" in lines[0]
    assert repr(value) in lines[0]
