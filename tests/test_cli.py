"""The CLI through a subprocess, as a user runs it."""
import json
import subprocess
import sys

import pytest

SIM = "cuda0=24GiB,cuda1=12GiB,vulkan0=8GiB,cpu=64GiB"


def cli(*args):
    return subprocess.run([sys.executable, "-m", "comfyui_placement", *args],
                          capture_output=True, text=True, timeout=120)


def test_devices_lists_name_tab_description():
    out = cli("devices", "--simulate", SIM)
    assert out.returncode == 0, out.stderr
    names = [line.split("\t")[0] for line in out.stdout.splitlines()]
    assert names == ["cuda0", "cuda1", "vulkan0", "cpu"]


def test_devices_json_and_real_machine():
    out = cli("devices", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["devices"][-1]["name"] == "cpu"


# Every example of seed 000, as sd-cli flags, on a simulated multi-backend inventory.
SEED_COMMANDS = [
    ["--backend", "cpu"],
    ["--backend", "te=cpu,vae=cuda0,diffusion=vulkan0"],
    ["--backend", "cuda0", "--params-backend", "te=cpu,vae=cpu"],
    ["--backend", "cuda0", "--params-backend", "disk"],
    ["--backend", "diffusion=cuda0,vae=vulkan0", "--max-vram", "cuda0=6,vulkan0=2"],
    ["--backend", "clip_vision=cpu,clip-vision=cuda1,clipvision=vulkan0"],
    ["--backend", "all=cuda0,te=cpu"],
    ["--backend", "cuda0", "--params-backend", "cpu"],
    ["--backend", "diffusion=cuda0,te=cpu,vae=cpu", "--params-backend",
     "diffusion=cuda0,te=cpu,vae=cpu"],
    ["--backend", "te=cpu,vae=cpu"],
    ["--clip-on-cpu", "--vae-on-cpu", "--control-net-cpu"],
    ["--offload-to-cpu", "--params-backend", "te=disk"],
    ["--backend", "diffusion=cuda0&cuda1", "--split-mode", "row"],
]


@pytest.mark.parametrize("flags", SEED_COMMANDS, ids=[" ".join(f) for f in SEED_COMMANDS])
def test_plan_resolves_seed_examples(flags):
    out = cli("plan", "--simulate", SIM, "--json", *flags)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["version"] == 1 and len(data["components"]) == 8     # detector too


def test_plan_json_content():
    out = cli("plan", "--simulate", SIM, "--json", "--offload-to-cpu", "--params-backend",
              "te=disk", "--clip-on-cpu", "--backend", "cuda1")
    comps = json.loads(out.stdout)["components"]
    assert comps["te"]["runtime"] == ["cpu"] and comps["te"]["params"] == "disk"
    assert comps["diffusion"]["runtime"] == ["cuda1"] and comps["diffusion"]["params"] == "cpu"


def test_plan_table_for_people():
    out = cli("plan", "--simulate", SIM, "--backend", "te=cpu")
    assert out.returncode == 0 and "component" in out.stdout and "budget" in out.stdout


@pytest.mark.parametrize("args,words", [
    (["plan", "--simulate", SIM, "--backend", "disk"], "not a runtime backend"),
    (["plan", "--simulate", SIM, "--backend", "cuda7"], "not found"),
    (["plan", "--simulate", SIM, "--backend", "cuda"], "ambiguous"),
    (["plan", "--simulate", SIM, "--split-mode", "column"], "invalid split mode"),
    (["plan", "--simulate", SIM, "--max-vram", "cuda0=lots"], "invalid max_vram"),
    (["plan", "--simulate", "cuda0"], "invalid simulated device"),
    (["plan", "--simulate", SIM, "--model", "nonsense"], "COMPONENT=PATH"),
    (["plan", "--simulate", SIM, "--resolution", "big"], "invalid resolution"),
    (["plan", "--no-such-flag"], "unrecognized arguments"),
    (["frobnicate"], "invalid choice"),
])
def test_bad_input_exits_2_with_one_line(args, words):
    out = cli(*args)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("placement error: ") and words in lines[0]
    assert out.stdout == ""
