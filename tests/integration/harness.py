"""What the integration test modules share: where ComfyUI is, its Python, the skip
marks, and running one driver script headless in ComfyUI's own Python."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

COMFYUI_PATH = os.environ.get("COMFYUI_PATH", "")
# CI sets this: there the integration tests must run, and a missing ComfyUI is a failure,
# never a skip (a skip stays only for a developer's quick local run).
REQUIRED = os.environ.get("COMFYUI_PLACEMENT_REQUIRE_COMFYUI") == "1"
PACK = Path(__file__).resolve().parents[2]

if REQUIRED and not os.path.isfile(os.path.join(COMFYUI_PATH, "main.py")):
    raise RuntimeError(f"COMFYUI_PLACEMENT_REQUIRE_COMFYUI=1 but COMFYUI_PATH={COMFYUI_PATH!r} "
                       f"holds no ComfyUI checkout (main.py); set it up with "
                       f"../shared/tools/comfyui-harness")

MARKS = [
    pytest.mark.comfyui,
    pytest.mark.skipif(not COMFYUI_PATH, reason="COMFYUI_PATH is not set: no ComfyUI checkout "
                       "to run the integration tests against"),
]


def require_comfyui_gguf() -> None:
    """ComfyUI-GGUF in the checkout's custom_nodes (WITH_GGUF=1 comfyui-harness installs
    it): a failure where the integration tests must run (CI), a skip otherwise."""
    where = os.path.join(COMFYUI_PATH, "custom_nodes", "ComfyUI-GGUF")
    if os.path.isfile(os.path.join(where, "nodes.py")):
        return
    msg = (f"ComfyUI-GGUF is not installed in {where}; install it with "
           f"WITH_GGUF=1 ../shared/tools/comfyui-harness")
    if REQUIRED:
        pytest.fail(msg)
    pytest.skip(msg)


def comfy_python() -> str:
    for candidate in (os.environ.get("COMFYUI_PYTHON"),
                      os.path.join(COMFYUI_PATH, "venv", "bin", "python"),
                      os.path.join(COMFYUI_PATH, ".venv", "bin", "python"),
                      "/tmp/comfyvenv/bin/python"):
        if candidate and os.path.exists(candidate):
            return candidate
    return sys.executable


def run_driver(driver: Path, marker: str, work: Path, extra=(), timeout: int = 900) -> dict:
    """Run `driver` in ComfyUI's Python; return the JSON it printed after `marker`
    (`timeout`: seconds the whole driver may take)."""
    proc = subprocess.run(
        [comfy_python(), str(driver), "--comfyui", COMFYUI_PATH, "--pack", str(PACK),
         "--work", str(work), *extra],
        capture_output=True, text=True, timeout=timeout,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "COMFYUI_PLACEMENT_SIMULATE": ""})
    lines = [l for l in proc.stdout.splitlines() if l.startswith(marker + " ")]
    assert lines, f"driver printed no results (exit {proc.returncode}):\n{proc.stderr[-4000:]}"
    data = json.loads(lines[-1][len(marker) + 1:])
    assert not data["errors"], "\n".join(data["errors"]) + proc.stderr[-3000:]
    return data
