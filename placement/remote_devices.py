"""Devices on other machines, named `ALIAS.DEVICE` (w1.cuda0, w1.cpu): a worker alias
(`w1=HOST:PORT`) and the device as that worker names it. Pure data, as the rest of
placement/: a plan can name remote devices; runtime/distributed runs ranges on them."""
import math
import re
from typing import Dict, Iterable, List, Optional, Tuple, Union

from .devices import Device, Inventory
from .errors import PlacementError

_ALIAS = re.compile(r"^[a-z][a-z0-9]*$")
_DEVICE = re.compile(r"^(cpu|cuda\d+)$")
_MACHINE_ID = re.compile(r"^[0-9a-f]{32}$")
# where a worker's device figure comes from, as the worker says (its hello)
CALIBRATED = "calibrated on the worker"
SIMULATED = "simulated what-if on the worker"
DEFAULT = "default for its kind"
ACCEPTED = "ALIAS=HOST:PORT entries separated by commas, e.g. w1=10.0.0.2:7860,w2=gpubox:7860"


def parse_workers(text: Union[str, Dict[str, str]]) -> Dict[str, Tuple[str, int]]:
    """'w1=HOST:PORT,w2=HOST:PORT' (or a dict alias -> 'HOST:PORT') -> {alias: (host, port)}."""
    items = text.items() if isinstance(text, dict) else \
        [item.strip().partition("=")[::2] for item in str(text).split(",") if item.strip()]
    out: Dict[str, Tuple[str, int]] = {}
    for alias, address in items:
        alias = str(alias).strip().lower()
        host, sep, port = str(address).strip().rpartition(":")
        if not _ALIAS.match(alias) or alias == "cpu" or alias.startswith("cuda"):
            raise PlacementError(f"invalid worker alias {alias!r}: a short lowercase name "
                                 f"such as w1 (not a local device name); {ACCEPTED}")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise PlacementError(f"invalid address {address!r} for worker {alias}; {ACCEPTED}")
        if alias in out:
            raise PlacementError(f"worker {alias} named twice; {ACCEPTED}")
        out[alias] = (host.strip("[]"), int(port))
    if not out:
        raise PlacementError(f"no workers given; {ACCEPTED}")
    return out


def valid_id(value) -> Optional[str]:
    """A worker's machine id as it sent it (placement/machine_identity.py), or None when
    it is not one (older workers send none)."""
    return value if isinstance(value, str) and _MACHINE_ID.match(value) else None


def split_name(name: str) -> Tuple[str, str]:
    """'w1.cuda0' -> ('w1', 'cuda0')."""
    alias, dot, device = str(name).strip().lower().partition(".")
    if not dot or not _ALIAS.match(alias) or not _DEVICE.match(device):
        raise PlacementError(f"invalid remote device {name!r}; expected ALIAS.DEVICE such as "
                             f"w1.cuda0 or w1.cpu")
    return alias, device


def is_remote(name: str) -> bool:
    return "." in str(name)


def remote_device_entries(alias: str, address: str, reported: Iterable[dict],
                          machine: Optional[str] = None) -> List[Device]:
    """A worker's own device list (name, kind, total_bytes, free_bytes, and the figures
    it sends: docs/distributed.md, "What a worker tells its main") as inventory entries
    named alias.name. No torch_device: only a remote range can run there. `machine`: the
    worker's machine id (its network link is keyed by it)."""
    out = []
    for d in reported:
        name = f"{alias}.{d['name']}"
        split_name(name)
        figures = d.get("figures") if isinstance(d.get("figures"), dict) else {}
        calibrated = figures.get("calibrated_at") or ""
        out.append(Device(name, d["kind"], int(d["total_bytes"]), int(d["free_bytes"]),
                          f"{d.get('description') or d['kind']} on worker {alias} "
                          f"({address})", simulated=bool(d.get("simulated")),
                          throughput=_speed(d.get("throughput")),
                          bandwidth=_speed(d.get("bandwidth")), machine=machine,
                          measured_throughput=_calibrated(figures, "throughput"),
                          measured_bandwidth=_calibrated(figures, "bandwidth"),
                          measured_at=str(calibrated)[:40],
                          free_measured=str(figures.get("free_measured") or "")[:80]))
    return out


def _calibrated(figures: dict, what: str):
    """A figure the worker's own calibration gave (its source says so), or None."""
    if figures.get(f"{what}_source") != CALIBRATED:
        return None
    return _speed(figures.get(what))


def _speed(value):
    """A figure the worker reported, or None."""
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) and value > 0 else None


def with_remote(inventory: Inventory, entries: Iterable[Device]) -> Inventory:
    """The local inventory followed by remote devices (local ones stay first: 'auto'
    and 'gpu' keep meaning a local GPU)."""
    return Inventory(list(inventory.devices) + list(entries),
                     source=f"{inventory.source} + remote workers")
