"""Issue 10 item 6: an auto-fit error names the binding resource, by how much, and a
change that exists (the CLI has --max-vram cpu=, not host_budget)."""
import subprocess
import sys

import pytest

from helpers import tiny_files as tf

from comfyui_placement.placement import Inventory, PlacementError, PlacementSpec, plan


@pytest.fixture(scope="module")
def flux(tmp_path_factory):
    return tf.write_header_file(tmp_path_factory.mktemp("err") / "flux1-dev.safetensors",
                                tf.flux())


def _error(spec, inv, models):
    with pytest.raises(PlacementError) as e:
        plan(spec, Inventory.simulated(inv), models)
    msg = str(e.value)
    assert "\n" not in msg
    return msg


def test_host_conflict_blames_host_ram_with_the_cli_option(flux):
    msg = _error(PlacementSpec(auto_fit=True, params_backend="diffusion=cpu", max_vram="cpu=16"),
                 "cuda0=8GiB,cpu=64GiB", {"diffusion": flux})
    assert msg.startswith("auto-fit: host RAM budget 16.00 GiB")
    assert "short by 6.17 GiB" in msg            # 22.17 GiB of Flux weights - 16 GiB
    assert "max_vram cpu=" in msg and "host_budget" not in msg and "GPU" not in msg


def test_host_conflict_from_free_memory_says_free_it(flux):
    msg = _error(PlacementSpec(auto_fit=True, params_backend="diffusion=cpu"),
                 "cuda0=8GiB,cpu=16GiB", {"diffusion": flux})
    assert "host RAM" in msg and "free host memory" in msg and "host_budget" not in msg


def test_host_budget_named_only_when_it_was_given(flux):
    from comfyui_placement.placement.resolve import describe_components, resolve_request
    from comfyui_placement.placement.fit import FitOptions, fit
    inv = Inventory.simulated("cuda0=8GiB,cpu=64GiB")
    req = resolve_request(PlacementSpec(auto_fit=True, params_backend="diffusion=cpu"), inv)
    with pytest.raises(PlacementError, match="raise host_budget"):
        fit(req, inv, describe_components({"diffusion": flux}),
            FitOptions(host_budget=16 << 30))


def test_one_gpu_is_not_called_every_gpu(flux):
    msg = _error(PlacementSpec(auto_fit=True, offload_mode="none"), "cuda0=12GiB,cpu=64GiB",
                 {"diffusion": flux})
    assert "every GPU" not in msg and "short by 12.08 GiB" in msg


def test_cli_host_error(flux):
    out = subprocess.run([sys.executable, "-m", "comfyui_placement", "plan", "--auto-fit",
                          "--simulate", "cuda0=8GiB,cpu=64GiB", "--max-vram", "cpu=16",
                          "--params-backend", "diffusion=cpu", "--model", f"diffusion={flux}"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and out.stderr.count("\n") == 1
    assert "host RAM" in out.stderr and "--max-vram cpu=" in out.stderr
