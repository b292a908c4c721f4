"""The note the nodes show when ComfyUI restricted the visible GPUs (issue 20 item 8).
The module is loaded from its file: its package's __init__ imports comfy, it does not."""
import importlib.util
from pathlib import Path

_PATH = Path(__file__).resolve().parents[2] / "runtime" / "comfy" / "patchers" / "visible_devices.py"
_SPEC = importlib.util.spec_from_file_location("placement_visible_devices", _PATH)
_MODULE = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(_MODULE)
hidden_gpus_note = _MODULE.hidden_gpus_note


def test_no_restriction_no_note():
    assert hidden_gpus_note({}, cuda_device=None) == ""


def test_one_visible_gpu_is_said_with_the_flag_that_lifts_it():
    note = hidden_gpus_note({"CUDA_VISIBLE_DEVICES": "0"}, cuda_device="0")
    assert "shows only GPU 0" in note and "CUDA_VISIBLE_DEVICES=0" in note
    assert "--cuda-device" in note and "--cuda-device all" in note
    assert "\n" not in note


def test_a_list_and_an_empty_value():
    assert "GPUs 0, 2" in hidden_gpus_note({"CUDA_VISIBLE_DEVICES": "0,2"}, cuda_device=None)
    assert "no GPU" in hidden_gpus_note({"CUDA_VISIBLE_DEVICES": ""}, cuda_device=None)
    assert "set by ComfyUI" not in hidden_gpus_note({"HIP_VISIBLE_DEVICES": "1"},
                                                     cuda_device=None)
