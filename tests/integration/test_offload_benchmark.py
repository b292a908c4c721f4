"""benchmarks/comfy_offload.py (issue 19 item 6, run on a lent GPU) kept working: its
plumbing on the CPU with a tiny Flux, ComfyUI resident and the pack streaming it on a
simulated cuda0 of the budget, the same latent from both."""
import json
import os
import subprocess
import sys
from pathlib import Path

from harness import MARKS

pytestmark = MARKS
SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "comfy_offload.py"


def test_the_offload_benchmark_runs_both_ways(tmp_path):
    comfy, python = os.environ["COMFYUI_PATH"], os.environ.get("COMFYUI_PYTHON", sys.executable)
    out = tmp_path / "r.json"
    proc = subprocess.run([python, str(SCRIPT), "--comfyui", comfy, "--work", str(tmp_path),
                           "--family", "flux1", "--tiny", "--cpu", "--budget-gib", "0.02",
                           "--steps", "3", "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    comfy_way, pack = result["ways"]["comfy"], result["ways"]["pack"]
    assert len(comfy_way["steps_s"]) == len(pack["steps_s"]) == 3
    assert pack["stream"] is not None and pack["ledger"]["cuda0"]["h2d_bytes"] > 0
    assert pack["ledger"]["cuda0"]["peak_bytes"] <= result["budget_bytes"]
    assert result["max_abs_diff"] < 1e-3
    assert "COMFY_OFFLOAD " in proc.stdout and "median s/step" in proc.stdout
