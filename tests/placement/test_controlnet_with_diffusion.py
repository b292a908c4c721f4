"""A ControlNet runs where the diffusion model runs, inside ComfyUI
(placement/controlnet_with_diffusion.py): ComfyUI adds its residuals inside the
diffusion model's forward. An explicit plan that separates them is refused by plan() in
one line; auto-fit keeps them together or says why not."""
import pytest

from helpers.flux_models import flux_components, write_flux_pipeline

from comfyui_placement.placement import Inventory, PlacementError, PlacementSpec, plan
from comfyui_placement.placement.devices import Device
from comfyui_placement.placement.metadata.info import BlockInfo, ComponentInfo

GiB, MiB = 1 << 30, 1 << 20


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return write_flux_pipeline(tmp_path_factory.mktemp("flux"))


def controlnet(n=8, block=150 * MiB):
    blocks = tuple(BlockInfo(f"controlnet_blocks.{i}", block, "controlnet_blocks", i)
                   for i in range(n))
    return ComponentInfo("controlnet", n * block + 64 * MiB, blocks, dtype="bf16")


def components(files):
    return dict(flux_components(files), controlnet=controlnet())


def real(*gib, cpu=64):
    """GPUs that are not simulated: ComfyUI runs a ControlNet only on a real device."""
    devs = [Device(f"cuda{i}", "gpu", int(g * GiB), int(g * GiB), "test gpu",
                   torch_device=f"cuda:{i}") for i, g in enumerate(gib)]
    devs.append(Device("cpu", "cpu", cpu * GiB, cpu * GiB, "test cpu", torch_device="cpu"))
    return Inventory(devs, source="test")


def test_explicit_controlnet_apart_from_diffusion_is_refused_in_one_line(files):
    spec = PlacementSpec("diffusion=cuda0,controlnet=cpu", params_backend="diffusion=cpu",
                               stream_layers=True)
    with pytest.raises(PlacementError) as err:
        plan(spec, real(24), components(files),
             executor="comfyui")
    msg = str(err.value)
    assert "\n" not in msg and "controlnet on cpu while diffusion runs on cuda0" in msg
    assert "put controlnet on cuda0" in msg


def test_explicit_controlnet_with_a_split_diffusion_is_refused(files):
    spec = PlacementSpec("diffusion=cuda0&cuda1,controlnet=cuda0")
    with pytest.raises(PlacementError, match="split over cuda0&cuda1"):
        plan(spec, real(24, 24),
             components(files), executor="comfyui")


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
def test_auto_fit_keeps_them_together_or_says_why(files, gpus):
    try:
        p = plan(PlacementSpec(auto_fit=True), real(*gpus), components(files),
                 resolution=(1024, 1024), executor="comfyui")
    except PlacementError as exc:          # refused: one line naming the ControlNet
        assert "\n" not in str(exc) and "controlnet" in str(exc)
        return
    cn, dm = p.components["controlnet"], p.components["diffusion"]
    assert cn.runtime == dm.runtime and len(dm.runtime) == 1, (cn.runtime, dm.runtime)
