"""`parallel batch` in the spec (a `parallel` field, or `batch` as a split mode) and in the
explicit plan (ComponentPlan.parallel, the devices in runtime); nonsense refused."""
import pytest
import torch

from comfyui_placement.placement import Inventory, PlacementSpec, plan
from comfyui_placement.placement.capabilities import check_component, needs
from comfyui_placement.placement.errors import PlacementError
from comfyui_placement.placement.plan import Plan

INV = "cuda0=8GiB,cuda1=8GiB,cpu=32GiB"


@pytest.mark.parametrize("fields", [{"split_mode": "diffusion=batch"},
                                    {"parallel": "diffusion=batch"},
                                    {"parallel": "batch", "split_mode": "te=layer"},
                                    {"split_mode": "batch"}])
def test_grammar_both_ways(fields):
    spec = PlacementSpec(**fields)
    assert spec.parallelism.for_component("diffusion") == "batch"
    assert spec.split.for_component("diffusion") in (None, "layer")   # no split of weights
    assert PlacementSpec.from_dict(spec.to_dict()) == spec


@pytest.mark.parametrize("fields,match", [
    ({"parallel": "fast"}, "invalid parallel 'fast'; expected none, batch or pipeline"),
    ({"split_mode": "diffusion=pipe"}, "expected layer or row, or batch"),
    ({"split_mode": "diffusion=row", "parallel": "diffusion=batch"}, "both set"),
    ({"split_mode": "diffusion=batch", "parallel": "diffusion=none"}, "both set"),
    ({"parallel": 2}, "parallel must be a string"),
])
def test_nonsense_is_one_line_error(fields, match):
    with pytest.raises(PlacementError, match=match) as info:
        PlacementSpec(**fields)
    assert "\n" not in str(info.value)


def test_explicit_plan_puts_it_in_the_plan_with_both_devices():
    inv = Inventory.simulated(INV)
    model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(4)])
    p = plan(PlacementSpec(backend="diffusion=cuda0&cuda1", split_mode="diffusion=batch",
                           params_backend="diffusion=cpu", stream_layers=True,
                           max_vram="1"),
             inv, {"diffusion": model})
    cp = p.components["diffusion"]
    assert cp.parallel == "batch" and cp.runtime == ["cuda0", "cuda1"] and cp.blocks == {}
    assert cp.stream is not None and any("batch parallel" in r for r in cp.reasons)
    assert needs(cp, inv)[:4] == ["batch_parallel", "stream", "cpu_params", "simulated"]
    row = next(l for l in p.report().splitlines() if l.startswith("diffusion"))
    assert "cuda0&cuda1" in row and " batch " in row         # the split column says batch
    again = Plan.from_json(p.to_json())
    assert again.components["diffusion"].parallel == "batch"
    # every device holds its own copy: both are planned for it
    whole = plan(PlacementSpec(backend="diffusion=cuda0&cuda1", parallel="diffusion=batch"),
                 inv, {"diffusion": model})
    size = whole.components["diffusion"].total_bytes
    # an architecture the metadata does not know has no working memory planned (a fixed
    # reserve is a guess: the run measures it), and the plan says so
    assert whole.device("cuda0").planned_bytes == whole.device("cuda1").planned_bytes == size
    assert any(r.startswith("working memory not planned")
               for r in whole.components["diffusion"].reasons)
    assert p.components["te"].parallel == "none"


def test_one_device_is_refused_with_or_without_auto_fit():
    inv = Inventory.simulated(INV)
    with pytest.raises(PlacementError, match="two or more runtime devices"):
        plan(PlacementSpec(backend="diffusion=cuda0", parallel="diffusion=batch"), inv)
    with pytest.raises(PlacementError, match="needs two or more GPUs and the backend gives "
                                             "cuda0;"):
        plan(PlacementSpec(backend="diffusion=cuda0", parallel="diffusion=batch",
                           auto_fit=True), inv)
    # asked with auto_fit and two devices: honoured (tests/placement/test_fit_parallel.py)


def test_the_comfyui_executor_runs_it_for_the_diffusion_model_only():
    inv = Inventory.simulated(INV)
    p = plan(PlacementSpec(backend="te=cuda0&cuda1", parallel="te=batch"), inv)
    with pytest.raises(PlacementError, match="batch parallel over several devices"):
        check_component(p.components["te"], inv, "comfyui")
    check_component(p.components["te"], inv, "runtime")


def test_cli_split_mode_batch():
    import json
    import subprocess
    import sys

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "comfyui_placement", *args],
                               capture_output=True, text=True, timeout=120)
    sim = ("--simulate", "cuda0=8GiB,cuda1=8GiB")
    ok = cli("plan", "--backend", "diffusion=cuda0&cuda1", "--split-mode", "diffusion=batch",
             "--json", *sim)
    assert ok.returncode == 0, ok.stderr
    cp = json.loads(ok.stdout)["components"]["diffusion"]
    assert cp["parallel"] == "batch" and cp["runtime"] == ["cuda0", "cuda1"]
    bad = cli("plan", "--backend", "diffusion=cuda0", "--split-mode", "diffusion=batch", *sim)
    assert bad.returncode == 2
    assert bad.stderr.strip().count("\n") == 0 and "two or more runtime devices" in bad.stderr
