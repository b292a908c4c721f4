"""Worker devices (ALIAS.DEVICE) inside ComfyUI: the adapter runs diffusion model ranges
on workers and nothing else (placement/capabilities.py 'remote_range'); auto-fit never
proposes more, and an explicit request for more is one line naming what is missing."""
import pytest

from comfyui_placement.placement import Inventory, PlacementError, PlacementSpec
from comfyui_placement.placement import capabilities as caps
from comfyui_placement.placement.metadata.info import BlockInfo, ComponentInfo
from comfyui_placement.placement.resolve import plan

GiB = 1 << 30


def info(comp, n=16, block=GiB):
    blocks = tuple(BlockInfo(f"b.{i}", block, "b", i) for i in range(n))
    return ComponentInfo(comp, n * block + GiB // 4, blocks, arch="test", dtype="bf16",
                         headroom_bytes=GiB // 2)


def test_diffusion_ranges_on_workers_inside_comfyui_and_nothing_else():
    inv = Inventory.simulated("cuda0=24GiB,w1.cuda0=24GiB,cpu=64GiB")
    p = plan(PlacementSpec(backend="diffusion=cuda0&w1.cuda0"), inv,
             {"diffusion": info("diffusion")}, executor="comfyui")
    assert "remote_range" in caps.needs(p.components["diffusion"], inv)
    assert caps.missing(p.components["diffusion"], inv, "comfyui") == []
    with pytest.raises(PlacementError) as err:
        plan(PlacementSpec(backend="te=cuda0&w1.cuda0"), inv, {"te": info("te")},
             executor="comfyui")
    msg = str(err.value)
    assert "a block range on a worker machine" in msg and "\n" not in msg
    assert "workers run diffusion model ranges" in msg
    # the plain runtime runs a range of any component on a worker
    plan(PlacementSpec(backend="te=cuda0&w1.cuda0"), inv, {"te": info("te")})


@pytest.mark.parametrize("component", ["te", "controlnet"])
def test_autofit_for_comfyui_keeps_other_components_off_workers(component):
    inv = Inventory.simulated("cuda0=8GiB,w1.cuda0=80GiB,cpu=64GiB")
    infos = {component: info(component)}
    for_runtime = plan(PlacementSpec(auto_fit=True), inv, infos, network_bandwidth=100e9)
    inside = plan(PlacementSpec(auto_fit=True), inv, infos, executor="comfyui",
                  network_bandwidth=100e9)
    if component == "te":     # the plain runtime would use the worker: the check bites
        assert any(d.startswith("w1.") for d in for_runtime.components["te"].runtime)
    assert not any(d.startswith("w1.") for d in inside.components[component].runtime)


def test_autofit_for_comfyui_gives_the_diffusion_model_a_worker_range_and_shows_the_link():
    inv = Inventory.simulated("cuda0=12GiB,w1.cuda0=24GiB,cpu=64GiB")
    p = plan(PlacementSpec(auto_fit=True), inv, {"diffusion": info("diffusion")},
             executor="comfyui", network_bandwidth=50e9)
    cp = p.components["diffusion"]
    assert cp.runtime == ["cuda0", "w1.cuda0"]
    link = p.extra["fit"]["cost_model"]["links"]["cuda0->w1.cuda0"]
    assert link["kind"] == "network" and link["bytes_per_s"] == 50e9
    assert "network cuda0->w1.cuda0 50.00 GB/s (given)" in " ".join(p.report().split())


def test_calibrated_network_figures_apply_with_the_workers_devices_added(tmp_path):
    from comfyui_placement.placement.devices import Device
    from comfyui_placement.placement.machine_figures import figures_for, save_measurements
    from comfyui_placement.placement.remote_devices import with_remote
    here = Inventory([Device("cuda0", "gpu", 24 * GiB, 24 * GiB, "test gpu",
                             torch_device="cuda:0"),
                      Device("cpu", "cpu", 64 * GiB, 64 * GiB, "host", torch_device="cpu")],
                     source="detected")
    path = tmp_path / "figures.json"
    save_measurements(here, {"network": {"w1": {"bytes_per_s": 3e9}}}, path)
    joined = with_remote(here, [Device("w1.cuda0", "gpu", 24 * GiB, 24 * GiB, "on w1")])
    assert figures_for(joined, path).network_bandwidth == {"w1": 3e9}
    simulated = with_remote(Inventory.simulated("cuda0=24GiB"), joined.devices[-1:])
    assert figures_for(simulated, path).network_bandwidth == {}
