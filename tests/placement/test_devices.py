import sys

import pytest

from comfyui_placement.placement import Inventory, PlacementError

GiB = 1 << 30


def test_simulated_inventory_sizes_and_kinds():
    inv = Inventory.simulated("cuda0=24GiB,cuda1=12GiB/10GiB,igpu0=512MiB,cpu=64")
    assert inv.names == ["cuda0", "cuda1", "igpu0", "cpu"]
    assert [d.kind for d in inv.devices] == ["gpu", "gpu", "igpu", "cpu"]
    assert inv.get("cuda1").total_bytes == 12 * GiB and inv.get("cuda1").free_bytes == 10 * GiB
    assert inv.get("igpu0").total_bytes == 512 << 20
    assert inv.get("cpu").total_bytes == 64 * GiB
    assert all(d.simulated for d in inv.devices if d.name != "cpu")


def test_simulated_inventory_adds_host_cpu():
    inv = Inventory.simulated("cuda0=8")
    assert inv.names == ["cuda0", "cpu"] and inv.get("cpu").total_bytes > 0


@pytest.mark.parametrize("text,words", [
    ("", "empty"), ("cuda0", "invalid simulated device"), ("cuda0=0", "positive"),
    ("cuda0=8/9", "free <= total"), ("cuda0=8,cuda0=4", "twice"), ("auto=8", "invalid"),
    ("gpu=8", "invalid"), ("cuda0=8GB/x", "invalid free memory"), ("cuda0=8,,", "empty entry"),
])
def test_simulated_inventory_errors(text, words):
    with pytest.raises(PlacementError, match=words):
        Inventory.simulated(text)


def test_lines_are_name_tab_description():
    inv = Inventory.simulated("cuda0=24GiB,cpu=64GiB")
    lines = inv.lines()
    assert lines[0].startswith("cuda0\t") and "24.00 GiB" in lines[0]
    assert all(line.count("\t") == 1 for line in lines)


def test_detect_sees_this_machine():
    inv = Inventory.detect()
    assert inv.names[-1] == "cpu" and inv.get("cpu").free_bytes > 0
    assert inv.refreshed().names == inv.names


def test_planning_imports_neither_torch_nor_comfy():
    import subprocess
    code = ("import sys, comfyui_placement.placement as p;"
            "s = p.PlacementSpec(backend='te=cpu', max_vram='cuda0=4');"
            "p.plan(s, p.Inventory.simulated('cuda0=8'));"
            "print(sorted(m for m in ('torch', 'comfy', 'comfy_api', 'numpy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
