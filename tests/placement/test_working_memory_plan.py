"""Working memory in the plan (issue 19 item 4): a device's planned bytes are what it
holds while its phase runs, weights and working memory both, and the kernel workspace
in it is the inventory's own (a simulated device that allocates none says
@workspace=0)."""
import pytest

from comfyui_placement.placement import Inventory, PlacementError, PlacementSpec, plan
from comfyui_placement.placement.metadata import headroom as hr
from comfyui_placement.placement.metadata.info import BlockInfo, ComponentInfo
from comfyui_placement.placement.resolve import with_workspace
from comfyui_placement.placement.units import format_bytes

MiB = 1 << 20


def dit(blocks=8, block=4 * MiB, act=12 * MiB, per_device=()):
    return ComponentInfo(
        "diffusion", 2 * MiB + blocks * block,
        tuple(BlockInfo(f"blocks.{i}", block, "blocks", i) for i in range(blocks)),
        arch="flux", dtype="bf16", headroom_bytes=hr.WORKSPACE + act,
        workspace_bytes=hr.WORKSPACE,
        headroom_basis=f"test + {format_bytes(hr.WORKSPACE)} workspace",
        headroom_per_device=tuple(per_device))


def test_workspace_of_a_simulated_device_is_read_and_checked():
    inv = Inventory.simulated("cuda0=8GiB@workspace=0,cuda1=8GiB@workspace=64MiB")
    assert [d.workspace_bytes for d in inv.gpus()] == [0, 64 * MiB]
    assert inv.workspace_bytes() == 64 * MiB
    assert Inventory.simulated("cuda0=8GiB").workspace_bytes() == hr.WORKSPACE
    assert Inventory.simulated("cpu=8GiB").workspace_bytes() is None
    assert inv.to_dict()["devices"][0]["workspace_bytes"] == 0
    for bad in ("cuda0=8GiB@workspace=-1", "cuda0=8GiB@workspace=0@workspace=0",
                "cuda0=8GiB@speed=3"):
        with pytest.raises(PlacementError) as err:
            Inventory.simulated(bad)
        assert "\n" not in str(err.value) and "workspace=SIZE" in str(err.value)
    with pytest.raises(PlacementError, match="workspace of simulated device cuda0 'lots'"):
        Inventory.simulated("cuda0=8GiB@workspace=lots")


def test_the_inventory_workspace_replaces_the_default_one():
    info = dit(per_device=(("cuda0", hr.WORKSPACE + 3 * MiB),))
    out = with_workspace({"diffusion": info}, Inventory.simulated("cuda0=8GiB@workspace=0"))
    got = out["diffusion"]
    assert got.headroom_bytes == 12 * MiB and got.workspace_bytes == 0
    assert got.headroom_per_device == (("cuda0", 3 * MiB),)
    assert got.headroom_basis == f"test + {format_bytes(0)} workspace"
    # a fixed reserve (architecture unknown) has no workspace part: left as it is
    fixed = ComponentInfo("diffusion", 10 * MiB, headroom_bytes=2 << 30)
    assert with_workspace({"diffusion": fixed},
                          Inventory.simulated("cuda0=8GiB@workspace=0"))["diffusion"] is fixed


def test_an_explicit_plan_counts_the_working_memory_where_it_computes():
    inv = Inventory.simulated("cuda0=8GiB@workspace=0")
    p = plan(PlacementSpec(backend="diffusion=cuda0"), inv, {"diffusion": dit()})
    assert p.device("cuda0").planned_bytes == 2 * MiB + 8 * 4 * MiB + 12 * MiB
    # the default workspace of a GPU joins it
    q = plan(PlacementSpec(backend="diffusion=cuda0"), Inventory.simulated("cuda0=8GiB"),
             {"diffusion": dit()})
    assert q.device("cuda0").planned_bytes == p.device("cuda0").planned_bytes + hr.WORKSPACE


def test_a_layer_split_plans_each_device_its_own_working_memory():
    inv = Inventory.simulated("cuda0=8GiB@workspace=0,cuda1=8GiB@workspace=0")
    info = dit(per_device=(("cuda0", hr.WORKSPACE + 5 * MiB), ("cuda1", hr.WORKSPACE + 9 * MiB)))
    p = plan(PlacementSpec(backend="diffusion=cuda0&cuda1", params_backend="diffusion=cpu"),
             inv, {"diffusion": info})
    cp = p.components["diffusion"]
    held = {d: sum(b.nbytes for b in info.blocks[r[0]:r[1] + 1]) for d, r in cp.blocks.items()}
    assert p.device("cuda0").planned_bytes == held["cuda0"] + 2 * MiB + 5 * MiB
    assert p.device("cuda1").planned_bytes == held["cuda1"] + 9 * MiB


def test_a_plan_past_its_budget_by_working_memory_says_so_in_one_line():
    inv = Inventory.simulated("cuda0=8GiB@workspace=0")
    with pytest.raises(PlacementError) as err:
        plan(PlacementSpec(backend="diffusion=cuda0", max_vram="cuda0=0.0371"), inv,
             {"diffusion": dit()})
    line = str(err.value)
    assert "\n" not in line
    assert line.startswith("cuda0: diffusion needs 34.00 MiB for its weights and 12.00 MiB "
                           "of working memory for diffusion there but the budget of cuda0 "
                           "(37.99 MiB less its 2.37 MiB margin) leaves 35.62 MiB, short by "
                           "10.38 MiB; ")
