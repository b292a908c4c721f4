"""`python -m comfyui_placement ...` started from ComfyUI's folder imports none of
ComfyUI: there comfy_api is importable, and comfy.model_management fails to import on a
machine without a GPU (issue 22 item 3). Stand-ins play both parts."""
import subprocess
import sys
from pathlib import Path

import pytest

PACK_PARENT = Path(__file__).resolve().parents[2]


@pytest.fixture
def comfy_folder(tmp_path):
    (tmp_path / "comfy_api" / "latest").mkdir(parents=True)
    (tmp_path / "comfy_api" / "__init__.py").write_text("")
    (tmp_path / "comfy_api" / "latest" / "__init__.py").write_text(
        "raise RuntimeError('the CLI imported ComfyUI\\'s node API')\n")
    (tmp_path / "comfy").mkdir()
    (tmp_path / "comfy" / "__init__.py").write_text("")
    (tmp_path / "comfy" / "model_management.py").write_text(
        "raise RuntimeError('Found no NVIDIA driver on your system')\n")
    return tmp_path


@pytest.mark.parametrize("argv", [["--help"], ["worker", "--help"], ["devices"]])
def test_the_command_line_runs_from_comfyuis_folder(comfy_folder, argv):
    r = subprocess.run([sys.executable, "-m", "comfyui_placement", *argv], cwd=comfy_folder,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "ComfyUI" not in r.stderr and "NVIDIA" not in r.stderr, r.stderr[-2000:]


def test_comfyuis_loader_still_finds_the_entrypoint(comfy_folder):
    """Asked for comfy_entrypoint (as ComfyUI's loader asks), the package imports its
    nodes, so a missing ComfyUI API is an error there, not silence."""
    code = ("import comfyui_placement as p\n"
            "try:\n    p.comfy_entrypoint\nexcept RuntimeError as e:\n    print('asked:', e)\n"
            "print(hasattr(p, 'NODE_CLASS_MAPPINGS'))\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=comfy_folder, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "asked: the CLI imported ComfyUI's node API" in r.stdout, r.stdout
    assert r.stdout.strip().endswith("False"), r.stdout
