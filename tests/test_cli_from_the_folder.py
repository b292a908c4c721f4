"""The command line as a ComfyUI-Manager install has it: the pack cloned into
`custom_nodes/comfyui-placement` (a folder name that is no Python identifier), its
requirements installed, the pack itself not installed as a package. The README's command
there is `python custom_nodes/comfyui-placement ...`: the folder run as a script, which
loads itself as the package `comfyui_placement`.

The copy is run with `python -S` and PYTHONPATH set to this venv's site-packages only:
torch and the requirements are importable, but not the editable install of the pack
(its import hook is a .pth file, which -S leaves unread), so only the copy can answer."""
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SIM = "cuda0=8GiB,cuda1=8GiB,cpu=32GiB"
SKIP = {".git", ".venv", "tests", "benchmarks", "docs", "example_workflows", "__pycache__",
        "node_modules", "gpu-logs"}


@pytest.fixture(scope="module")
def comfy(tmp_path_factory):
    """A ComfyUI-shaped folder, a space in its path, with a copy of the pack in custom_nodes;
    the copy's description is marked so the output shows which package answered."""
    root = tmp_path_factory.mktemp("user") / "Comfy UI"
    pack = root / "custom_nodes" / "comfyui-placement"
    shutil.copytree(REPO, pack, ignore=lambda d, names: [
        n for n in names if n in SKIP or n.endswith(".egg-info")])
    cli = pack / "cli.py"
    text = cli.read_text()
    assert "Plan where diffusion components run and rest." in text
    cli.write_text(text.replace("Plan where diffusion components run and rest.",
                                "Plan where diffusion components run and rest (the copy)."))
    return root


def _site_only_env():
    paths = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def run(comfy, *args, site_only=True, **kw):
    """`python custom_nodes/comfyui-placement ARGS` from the ComfyUI folder."""
    if site_only:
        cmd, env = [sys.executable, "-S"], _site_only_env()
    else:      # as typed by a user: this venv's site (the editable install there too)
        cmd, env = [sys.executable], {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([*cmd, os.path.join("custom_nodes", "comfyui-placement"), *args],
                          cwd=comfy, env=env, capture_output=True, text=True,
                          timeout=120, **kw)


def test_the_package_is_not_importable_by_name_there(comfy):
    """The premise: in this environment `python -m comfyui_placement` fails, as it does
    after a Manager install (so the passes below come from the folder alone)."""
    r = subprocess.run([sys.executable, "-S", "-m", "comfyui_placement", "--help"], cwd=comfy,
                       env=_site_only_env(), capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "No module named comfyui_placement" in r.stderr, r.stderr
    r = subprocess.run([sys.executable, "-S", "-c", "import torch, safetensors, gguf"],
                       cwd=comfy, env=_site_only_env(), capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]


def test_help_is_the_copys_and_names_the_command_typed(comfy):
    r = run(comfy, "--help")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "(the copy)" in r.stdout
    assert r.stdout.startswith(f"usage: python {os.path.join('custom_nodes', 'comfyui-placement')}")


def test_the_copy_answers_even_beside_an_installed_package(comfy):
    r = run(comfy, "--help", site_only=False)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "(the copy)" in r.stdout


def test_plan_on_a_simulated_inventory(comfy):
    r = run(comfy, "plan", "--simulate", SIM, "--backend", "te=cpu,diffusion=cuda0&cuda1",
            "--max-vram", "cuda0=6", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    data = json.loads(r.stdout)
    assert data["components"]["diffusion"]["runtime"] == ["cuda0", "cuda1"]
    assert data["components"]["te"]["runtime"] == ["cpu"]
    budgets = {d["name"]: d["budget_bytes"] for d in data["devices"]}
    assert budgets["cuda0"] == 6 << 30


def test_bad_input_is_one_line_and_exit_2(comfy):
    r = run(comfy, "plan", "--simulate", SIM, "--backend", "cuda7")
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("placement error: device 'cuda7'"), lines


def test_worker_help_and_a_worker_that_listens(comfy, tmp_path):
    r = run(comfy, "worker", "--help")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "--comfyui PATH" in r.stdout
    env = {**_site_only_env(), "COMFYUI_PLACEMENT_SECRET": "a secret for this test"}
    folder = os.path.join("custom_nodes", "comfyui-placement")
    proc = subprocess.Popen([sys.executable, "-S", folder,
                             "worker", "--listen", "127.0.0.1:0", "--models", str(tmp_path)],
                            cwd=comfy, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        line = proc.stdout.readline()      # the worker prints its address once it listens
        assert line.startswith("listening on 127.0.0.1:"), (line, proc.poll())
    finally:
        proc.kill()
        _, err = proc.communicate(timeout=60)
    assert "Traceback" not in err, err[-2000:]


def test_the_folder_does_not_shadow_top_level_names(comfy):
    """Run as a script, Python puts the folder first on sys.path; the pack's own nodes/,
    placement/ and runtime/ must not stay importable as top-level names there (a worker
    with --comfyui imports ComfyUI's `nodes`, which the pack's folder would hide)."""
    code = ("import runpy, sys\n"
            "sys.argv = [sys.argv[1], '--help']\n"
            "sys.path.insert(0, sys.argv[0])\n"
            "try:\n    runpy.run_path(sys.argv[0], run_name='__main__')\n"
            "except SystemExit:\n    pass\n"
            "import importlib.util\n"
            "print('FOUND', [n for n in ('nodes', 'placement', 'runtime', 'cli')\n"
            "                if importlib.util.find_spec(n) is not None])\n")
    r = subprocess.run([sys.executable, "-S", "-c", code,
                        os.path.join("custom_nodes", "comfyui-placement")],
                       cwd=comfy, env=_site_only_env(), capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "(the copy)" in r.stdout
    assert r.stdout.strip().splitlines()[-1] == "FOUND []", r.stdout[-2000:]
