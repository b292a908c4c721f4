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


def bench(tmp_path, name, budget_gib, *extra):
    comfy, python = os.environ["COMFYUI_PATH"], os.environ.get("COMFYUI_PYTHON", sys.executable)
    out = tmp_path / f"{name}.json"
    proc = subprocess.run([python, str(SCRIPT), "--comfyui", comfy, "--work",
                           str(tmp_path / name), "--family", "flux1", "--tiny", "--cpu",
                           "--budget-gib", f"{budget_gib:.9f}", "--out", str(out), *extra],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return json.loads(out.read_text()), proc


def test_the_offload_benchmark_runs_both_ways(tmp_path):
    # the budget from the plan: on a roomy device the pack's plan holds the weights whole
    # and the working memory at the family's latent; the budget then holds that working
    # memory and half the weights (less the device's margin, a sixteenth), so it streams
    roomy, _ = bench(tmp_path, "roomy", 1.0, "--ways", "pack", "--steps", "1")
    weights, planned = roomy["weight_bytes"], roomy["ways"]["pack"]["planned_bytes"]
    work = planned - weights
    assert work > 0, roomy
    budget = (work + weights // 2) * 16 / 15 + 1024
    result, proc = bench(tmp_path, "run", budget / 1024 ** 3, "--steps", "3")
    comfy_way, pack = result["ways"]["comfy"], result["ways"]["pack"]
    assert len(comfy_way["steps_s"]) == len(pack["steps_s"]) == 3
    assert pack["stream"] is not None and pack["ledger"]["cuda0"]["h2d_bytes"] > 0
    assert pack["planned_bytes"] < planned           # fewer blocks on the device than roomy
    # the plan kept the working memory inside the budget, and the run stayed inside it
    assert pack["planned_bytes"] <= result["budget_bytes"]
    assert pack["ledger"]["cuda0"]["peak_bytes"] <= result["budget_bytes"]
    assert result["max_abs_diff"] < 1e-3
    assert "COMFY_OFFLOAD " in proc.stdout and "median s/step" in proc.stdout
