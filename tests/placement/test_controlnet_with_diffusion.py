"""A ControlNet and its diffusion model inside ComfyUI
(placement/controlnet_with_diffusion.py): ComfyUI adds its residuals inside the
diffusion model's forward. Apart, they hop (runtime/comfy/sampling/control_hops.py): an explicit
plan reserves them in the diffusion model's working memory on its main device, and is
refused in one line where that does not fit; auto-fit prefers them together."""
import pytest

from helpers.flux_models import flux_components, write_flux_pipeline

from comfyui_placement.placement import Inventory, PlacementError, PlacementSpec, plan
from comfyui_placement.placement.devices import Device
from comfyui_placement.placement.metadata.info import BlockInfo, ComponentInfo

GiB, MiB = 1 << 30, 1 << 20


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return write_flux_pipeline(tmp_path_factory.mktemp("flux"))


def controlnet(n=8, block=150 * MiB, work=512 * MiB):
    blocks = tuple(BlockInfo(f"controlnet_blocks.{i}", block, "controlnet_blocks", i)
                   for i in range(n))
    return ComponentInfo("controlnet", n * block + 64 * MiB, blocks, dtype="bf16",
                         headroom_bytes=work, headroom_basis="test estimate")


def components(files, **cn):
    return dict(flux_components(files), controlnet=controlnet(**cn))


def real(*gib, cpu=64):
    """GPUs that are not simulated: ComfyUI runs a ControlNet only on a real device."""
    devs = [Device(f"cuda{i}", "gpu", int(g * GiB), int(g * GiB), "test gpu",
                   torch_device=f"cuda:{i}") for i, g in enumerate(gib)]
    devs.append(Device("cpu", "cpu", cpu * GiB, cpu * GiB, "test cpu", torch_device="cpu"))
    return Inventory(devs, source="test")


APART = PlacementSpec("diffusion=cuda0,controlnet=cpu", params_backend="diffusion=cpu",
                      stream_layers=True)


def test_explicit_controlnet_apart_reserves_its_residuals_on_the_diffusion_device(files):
    alone = plan(APART, real(24), components(files), executor="runtime")
    hops = plan(APART, real(24), components(files), executor="comfyui")
    assert hops.components["controlnet"].runtime == ["cpu"]
    dm, dm_alone = hops.components["diffusion"], alone.components["diffusion"]
    assert dm.headroom_bytes == dm_alone.headroom_bytes + 512 * MiB
    cuda0 = {d.name: d for d in hops.devices}["cuda0"]
    cuda0_alone = {d.name: d for d in alone.devices}["cuda0"]
    assert cuda0.planned_bytes >= cuda0_alone.planned_bytes + 512 * MiB - 1
    assert any("residuals hop" in w for w in hops.warnings)


def test_explicit_controlnet_apart_is_refused_in_one_line_where_its_residuals_do_not_fit(
        files):
    comps = components(files, work=30 * GiB)       # residuals larger than the GPU
    with pytest.raises(PlacementError) as err:
        plan(APART, real(24), comps, executor="comfyui")
    assert "\n" not in str(err.value) and "cuda0" in str(err.value)
    plan(APART, real(24), comps, executor="runtime")   # without the hops it fits


def test_explicit_controlnet_with_a_split_diffusion_plans(files):
    spec = PlacementSpec("diffusion=cuda0&cuda1,controlnet=cuda0")
    p = plan(spec, real(24, 24), components(files), executor="comfyui")
    assert p.components["diffusion"].runtime == ["cuda0", "cuda1"]
    assert not any("residuals hop" in w for w in p.warnings)   # beside its main device


def test_explicit_together_plans(files):
    spec = PlacementSpec("diffusion=cuda0,controlnet=cuda0", params_backend="diffusion=cpu",
                               stream_layers=True)
    p = plan(spec, real(24), components(files),
             executor="comfyui")
    assert p.components["controlnet"].runtime == p.components["diffusion"].runtime == ["cuda0"]


def test_the_runtime_executor_runs_them_apart(files):
    # runtime.place runs each component alone: nothing ties them there
    spec = PlacementSpec("diffusion=cuda0,controlnet=cpu", params_backend="diffusion=cpu",
                               stream_layers=True)
    p = plan(spec, real(24), components(files),
             executor="runtime")
    assert p.components["controlnet"].runtime == ["cpu"]


@pytest.mark.parametrize("gpus", [(24,), (12,), (8,), (16, 8), (8, 8), (4,)])
def test_auto_fit_keeps_them_together_or_reserves_the_hops(files, gpus):
    try:
        p = plan(PlacementSpec(auto_fit=True), real(*gpus), components(files),
                 resolution=(1024, 1024), executor="comfyui")
    except PlacementError as exc:          # refused: one line
        assert "\n" not in str(exc)
        return
    cn, dm = p.components["controlnet"], p.components["diffusion"]
    if cn.main_device == dm.main_device:
        return
    assert any("residuals hop" in w for w in p.warnings)
    assert any("ControlNet's residuals" in r for r in dm.reasons)
    main = {d.name: d for d in p.devices}[dm.main_device]
    assert main.planned_bytes <= main.room_bytes


def test_a_controlnet_that_computes_with_the_diffusion_weights_never_runs_apart(files):
    """Qwen-Image's Fun ControlNet calls the diffusion model's own embedders (described
    so by the node: nodes/planning.with_control_kind): refused apart in one line, and
    auto-fit keeps the two on one device."""
    import dataclasses
    from comfyui_placement.placement.controlnet_with_diffusion import WITH_DIFFUSION_WEIGHTS
    comps = components(files)
    comps["controlnet"] = dataclasses.replace(comps["controlnet"], arch=WITH_DIFFUSION_WEIGHTS)
    with pytest.raises(PlacementError) as err:
        plan(APART, real(24), comps, executor="comfyui")
    assert "\n" not in str(err.value) and "own embedders" in str(err.value)
    for gpus in [(24,), (8,), (4,)]:
        p = plan(PlacementSpec(auto_fit=True), real(*gpus), comps, resolution=(1024, 1024),
                 executor="comfyui")
        cn, dm = p.components["controlnet"], p.components["diffusion"]
        assert cn.main_device == dm.main_device, (gpus, cn.runtime, dm.runtime)
