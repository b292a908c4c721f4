"""Whether ComfyUI hid GPUs of this machine from itself (and so from the pack).

ComfyUI's --cuda-device sets CUDA_VISIBLE_DEVICES (and HIP_VISIBLE_DEVICES) before torch
starts (its main.py), and some launchers start it with only GPU 0 visible: torch, and
every inventory built from it, then never sees the others. Nothing of that shows in a
device list, so the pack says it where devices are listed and where a plan uses several.
"""
import os
from typing import Mapping, Optional

VARIABLES = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")


def _comfy_cuda_device() -> Optional[str]:
    try:
        from comfy.cli_args import args
    except Exception:          # not inside ComfyUI (scripts, the worker, tests)
        return None
    value = getattr(args, "cuda_device", None)
    return None if value is None else str(value)


def hidden_gpus_note(environ: Optional[Mapping[str, str]] = None,
                     cuda_device: Optional[str] = "from ComfyUI") -> str:
    """One line when the visible GPUs are restricted, '' when they are not."""
    environ = os.environ if environ is None else environ
    flag = _comfy_cuda_device() if cuda_device == "from ComfyUI" else cuda_device
    for var in VARIABLES:
        value = environ.get(var)
        if value is None:
            continue
        value = value.strip()
        ids = [v for v in value.split(",") if v.strip()]
        shown = ("no GPU" if not ids or ids == ["-1"] else
                 f"GPU {ids[0]}" if len(ids) == 1 else f"GPUs {', '.join(ids)}")
        by = " (set by ComfyUI's --cuda-device)" if flag is not None else ""
        return (f"ComfyUI shows only {shown} ({var}={value}{by}): other GPUs of this "
                f"machine are hidden from ComfyUI and from this pack; start ComfyUI with "
                f"--cuda-device all (or a list, e.g. --cuda-device 0,1) to use them")
    return ""
