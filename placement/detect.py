"""Real devices through torch, and host memory without it. torch is imported only when
detection is asked for, so that planning never pays for (or needs) a torch import. The
facts come back as plain dicts of `Device` fields: devices.py builds the inventory from
them (this module imports nothing of the pack)."""
import os
from typing import Dict, List, Tuple

DeviceFacts = dict     # the fields of placement/devices.py's Device


def _device(name, kind, total, free, description, torch_device) -> DeviceFacts:
    return {"name": name, "kind": kind, "total_bytes": total, "free_bytes": free,
            "description": description, "torch_device": torch_device}


def _cuda_devices(torch) -> List[DeviceFacts]:
    out = []
    if not torch.cuda.is_available():
        return out
    backend = "ROCm" if getattr(torch.version, "hip", None) else "CUDA"
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        try:
            free, total = torch.cuda.mem_get_info(i)
        except RuntimeError:
            free, total = props.total_memory, props.total_memory
        kind = "igpu" if getattr(props, "is_integrated", False) else "gpu"
        out.append(_device(f"cuda{i}", kind, int(total), int(free),
                          f"{props.name} ({backend})", torch_device=f"cuda:{i}"))
    return out


def _xpu_devices(torch) -> List[DeviceFacts]:
    xpu = getattr(torch, "xpu", None)
    if xpu is None or not xpu.is_available():
        return []
    out = []
    for i in range(xpu.device_count()):
        props = xpu.get_device_properties(i)
        total = int(getattr(props, "total_memory", 0))
        try:
            free, total = xpu.mem_get_info(i)
        except (AttributeError, RuntimeError):
            free = total - int(xpu.memory_reserved(i))
        out.append(_device(f"xpu{i}", "gpu", int(total), int(free), f"{props.name} (XPU)",
                          torch_device=f"xpu:{i}"))
    return out


def _mps_devices(torch) -> List[DeviceFacts]:
    mps = getattr(torch.backends, "mps", None)
    if mps is None or not mps.is_available():
        return []
    total = int(torch.mps.recommended_max_memory())
    free = max(0, total - int(torch.mps.driver_allocated_memory()))
    return [_device("mps", "gpu", total, free, "Apple GPU (Metal)", torch_device="mps")]


def torch_devices() -> List[DeviceFacts]:
    import torch
    total, avail = host_memory()
    devices = _cuda_devices(torch) + _xpu_devices(torch) + _mps_devices(torch)
    devices.append(_device("cpu", "cpu", total, avail,
                          "host memory", torch_device="cpu"))
    return devices


def free_bytes_by_name() -> Dict[str, int]:
    return {d["name"]: d["free_bytes"] for d in torch_devices()}


def host_memory() -> Tuple[int, int]:
    """(total, available) host RAM in bytes, without torch."""
    total = avail = 0
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                key, _, rest = line.partition(":")
                if key == "MemTotal":
                    total = int(rest.split()[0]) * 1024
                elif key == "MemAvailable":
                    avail = int(rest.split()[0]) * 1024
    except OSError:
        pass
    if not total:
        try:
            page = os.sysconf("SC_PAGE_SIZE")
            total = os.sysconf("SC_PHYS_PAGES") * page
            avail = os.sysconf("SC_AVPHYS_PAGES") * page
        except (ValueError, OSError, AttributeError):
            total = avail = 16 * 1024 ** 3   # unknown platform: a modest guess
    return total, avail or total
