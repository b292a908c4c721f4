"""A weight patch that fails inside ComfyUI's weight adapters stops a placed run instead of
leaving the LoRA silently out (runtime/comfy/patchers/patch_errors.py), with a stand-in adapter
module at comfy/weight_adapter/ (no ComfyUI needed)."""
import importlib
import importlib.util
from pathlib import Path

import pytest

NAME = "comfyui_placement.runtime.comfy.patchers.patch_errors"
ADAPTER = '''
import logging

def calculate(fail):
    """As ComfyUI's adapters do: any error is logged and the weight goes on unpatched."""
    try:
        if fail:
            raise MemoryError("cuda0: out of memory allocating 448 KiB")
        return "patched"
    except Exception as e:
        logging.error("ERROR {} {} {}".format("lora", "blocks.0.linear.weight", e))
        return "unpatched"
'''


@pytest.fixture(scope="module")
def patch_errors():
    """Its package's __init__ imports comfy; the module itself does not."""
    try:
        return importlib.import_module(NAME)
    except ModuleNotFoundError as exc:
        if not (exc.name or "").startswith("comfy"):
            raise
    import comfyui_placement.runtime as rt
    spec = importlib.util.spec_from_file_location(
        NAME, Path(rt.__file__).parent / "comfy" / "patchers" / "patch_errors.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _load(path: Path, name: str):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(ADAPTER)
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_an_adapter_error_is_raised_while_placed_and_logged_outside(patch_errors, tmp_path):
    adapter = _load(tmp_path / "comfy" / "weight_adapter" / "lora.py", "fake_adapter")
    assert adapter.calculate(False) == "patched"
    assert adapter.calculate(True) == "unpatched"          # ComfyUI's own behaviour
    with patch_errors.patches_must_apply("diffusion"):
        assert adapter.calculate(False) == "patched"
        with pytest.raises(MemoryError, match="out of memory") as info:
            adapter.calculate(True)
    assert any("lora patch of blocks.0.linear.weight failed" in n
               for n in getattr(info.value, "__notes__", [])) or not hasattr(
        info.value, "add_note")
    assert adapter.calculate(True) == "unpatched"          # the filter is gone again


def test_the_same_line_from_other_code_is_left_alone(patch_errors, tmp_path):
    other = _load(tmp_path / "custom_nodes" / "x" / "lora.py", "fake_other")
    with patch_errors.patches_must_apply("diffusion"):
        assert other.calculate(True) == "unpatched"
