"""Rows of docs/sdcpp-parity.md that no older test showed: stable-diffusion.cpp's current
docs/backend.md rules, matched or beaten on purpose."""
import pytest

from comfyui_placement.placement import Inventory, PlacementError, PlacementSpec, plan
from comfyui_placement.placement.fit.options import FitOptions, device_budgets, host_reserve
from comfyui_placement.placement.metadata.info import BlockInfo, ComponentInfo
from comfyui_placement.placement.resolve import resolve_request

GiB = 1 << 30
MiB = 1 << 20


def info(comp, n_blocks, block, headroom=GiB, arch="flux"):
    blocks = tuple(BlockInfo(f"blocks.{i}", block, "blocks", i) for i in range(n_blocks))
    return ComponentInfo(comp, n_blocks * block + 64 * MiB, blocks, arch=arch, dtype="bf16",
                         headroom_bytes=headroom)


def model_set():
    return {"diffusion": info("diffusion", 10, GiB), "te": info("te", 4, GiB),
            "vae": info("vae", 2, 64 * MiB)}


@pytest.mark.parametrize("free_gib,reserve_gib", [(8, 2), (16, 2), (20, 2), (32, 3.2),
                                                  (64, 6.4), (256, 25.6)])
def test_host_reserve_is_the_larger_of_2_gib_and_a_tenth_of_free_ram(free_gib, reserve_gib):
    inv = Inventory.simulated(f"cuda0=24GiB,cpu={free_gib}GiB")
    request = resolve_request(PlacementSpec(auto_fit=True), inv)
    _, (host, how), _ = device_budgets(request, inv, FitOptions())
    free = free_gib * GiB
    assert host_reserve(free) == max(2 * GiB, free // 10)
    assert host == free - max(2 * GiB, free // 10)
    assert abs((free - host) / GiB - reserve_gib) < 0.01
    assert how.startswith(f"free {free_gib}.00 GiB - margin")


def test_host_reserve_is_kept_by_a_whole_plan():
    """32 GiB of RAM reserves 3.2 GiB (a flat 2 GiB would plan 1.2 GiB more)."""
    p = plan(PlacementSpec(auto_fit=True), Inventory.simulated("cuda0=8GiB,cpu=32GiB"),
             components={"diffusion": info("diffusion", 28, GiB)})
    assert p.components["diffusion"].params in ("cpu", "disk")
    assert p.device("cpu").planned_bytes <= 32 * GiB - 32 * GiB // 10


def test_explicit_params_backend_keeps_auto_fit_on_for_the_rest():
    """stable-diffusion.cpp turns auto-fit off for any --params-backend; the pack keeps
    that entry and still fits everything else."""
    p = plan(PlacementSpec(auto_fit=True, params_backend="te=disk"),
             Inventory.simulated("cuda0=12GiB,cpu=64GiB"), components=model_set())
    assert "fit" in p.extra                          # auto-fit ran
    assert p.components["te"].params == "disk"       # the entry kept
    diffusion = p.components["diffusion"]
    # decided: 10 GiB and its work fit the room only while te (on disk) is not loaded:
    # the diffusion model takes turns, resting in RAM
    assert (diffusion.runtime, diffusion.params) == (["cuda0"], "cpu")
    assert not any("(asked)" in r for r in diffusion.reasons)


def test_auto_fit_keeps_an_explicit_backend_and_its_device_list():
    p = plan(PlacementSpec(auto_fit=True, backend="diffusion=cuda1&cuda0,vae=cpu"),
             Inventory.simulated("cuda0=12GiB,cuda1=12GiB,cpu=64GiB"), components=model_set())
    assert p.components["diffusion"].runtime == ["cuda1", "cuda0"]
    assert p.components["vae"].runtime == ["cpu"]
    assert p.components["te"].runtime[0] in ("cuda0", "cuda1")      # decided


def test_a_module_left_unset_goes_to_the_gpu_with_the_most_room_first_on_a_tie():
    small = {"diffusion": info("diffusion", 2, GiB)}
    roomy = plan(PlacementSpec(auto_fit=True), Inventory.simulated(
        "cuda0=8GiB,cuda1=16GiB,cpu=64GiB"), components=small)
    assert roomy.components["diffusion"].runtime == ["cuda1"]
    tie = plan(PlacementSpec(auto_fit=True), Inventory.simulated(
        "cuda0=16GiB,cuda1=16GiB,cpu=64GiB"), components=small)
    assert tie.components["diffusion"].runtime == ["cuda0"]


def test_lora_under_a_row_split_applies_at_run_time(seed_inventory):
    p = plan(PlacementSpec(backend="diffusion=cuda0&cuda1", split_mode="row"), seed_inventory,
             components={"diffusion": info("diffusion", 8, GiB)})
    assert p.components["diffusion"].split_mode == "row"
    assert p.components["diffusion"].lora == "runtime"
    # fuse ("immediately") cannot patch the shards: refused, not skipped with a warning
    with pytest.raises(PlacementError, match="lora_mode fuse cannot apply to diffusion"):
        plan(PlacementSpec(backend="diffusion=cuda0&cuda1", split_mode="row",
                           lora_mode="fuse"), seed_inventory,
             components={"diffusion": info("diffusion", 8, GiB)})


def test_disk_is_never_chosen_without_auto_fit(seed_inventory):
    p = plan(PlacementSpec(backend="cuda1"), seed_inventory,
             components={"diffusion": info("diffusion", 8, GiB)})
    assert {cp.params for cp in p.components.values()} == {"cuda1"}


def test_library_default_auto_fit_is_off():
    """sd_ctx_params_init() turns auto_fit on; PlacementSpec() leaves it off (README)."""
    assert PlacementSpec().auto_fit is False
    assert PlacementSpec(auto_fit="on").auto_fit is True
    assert PlacementSpec(auto_fit="off").auto_fit is False


def test_free_memory_lowers_a_budget_above_it_in_an_explicit_plan_too():
    one = {"vae": info("vae", 1, GiB)}
    p = plan(PlacementSpec(backend="cuda1", max_vram="cuda1=20"),
             Inventory.simulated("cuda0=24GiB,cuda1=24GiB/10GiB,cpu=64GiB"), components=one)
    assert p.device("cuda1").budget_bytes == 20 * GiB           # as asked
    assert p.device("cuda1").room_bytes == 10 * GiB - 512 * MiB  # what the plan may fill


def test_a_split_of_a_module_without_blocks_runs_on_the_first_listed_device():
    whole = ComponentInfo("vae", GiB, (BlockInfo("", GiB, "", 0),), arch="unknown")
    p = plan(PlacementSpec(backend="vae=cuda1&cuda0"),
             Inventory.simulated("cuda0=24GiB,cuda1=24GiB,cpu=64GiB"),
             components={"vae": whole})
    assert p.components["vae"].blocks == {"cuda1": [0, 0]}


def test_a_vae_splits_by_its_stages_in_the_plain_runtime():
    """stable-diffusion.cpp splits only diffusion and te; the plain runtime splits any
    component with blocks (inside ComfyUI, what its adapter runs: test_capabilities)."""
    vae = info("vae", 6, 256 * MiB, arch="unknown")
    p = plan(PlacementSpec(backend="vae=cuda0&cuda1"),
             Inventory.simulated("cuda0=24GiB,cuda1=24GiB,cpu=64GiB"), components={"vae": vae})
    assert p.components["vae"].is_split and set(p.components["vae"].blocks) == {"cuda0",
                                                                                "cuda1"}
