"""This machine's measured speeds: the calibration file, its lookup, and step corrections.

`python -m comfyui_placement calibrate` (runtime/machine/calibrate.py, torch) measures; this
module (no torch) stores the figures per machine and hands the planner the ones that
apply to an inventory. docs/calibration.md describes the file and the rules:

- figures are keyed by a machine fingerprint (hostname + each device's name,
  description and total memory): a changed card or a copied cache folder never lends
  its figures to other hardware;
- they apply only to the detected inventory, never to a simulated one;
- `observe_step` records measured vs predicted seconds per step (inside ComfyUI, after
  each run); the next plan divides the device's throughput by their bounded ratio.
"""
import json
import math
import os
import socket
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Optional

from .errors import PlacementError
from .remote_devices import is_remote

APP = "comfyui-placement"
ENV_DIR = "COMFYUI_PLACEMENT_CACHE_DIR"      # tests and portable installs: the folder to use
FILE_NAME = "machine_figures.json"
VERSION = 1
# A correction is a ratio measured/predicted; one odd run (a first-run compile, a
# thermally throttled card) must not swing the next plan by more than this either way.
CORRECTION_BOUNDS = (0.25, 4.0)
CORRECTION_WEIGHT = 0.3                     # exponential moving average of log ratios
GPU_DTYPES = ("bf16", "fp16", "fp32")       # the throughput the planner uses on a GPU, in order
CPU_DTYPES = ("fp32", "bf16", "fp16")       # ComfyUI computes in fp32 on the CPU


def cache_dir() -> Path:
    """The user's cache folder for this pack: $COMFYUI_PLACEMENT_CACHE_DIR, else
    platformdirs' user_cache_dir(APP, appauthor=False), else the same rules by hand."""
    override = os.environ.get(ENV_DIR)
    if override:
        return Path(override)
    try:
        import platformdirs
        return Path(platformdirs.user_cache_dir(APP, appauthor=False))
    except ImportError:
        pass
    home = Path.home()
    if sys.platform.startswith("win"):
        base = os.environ.get("LOCALAPPDATA") or str(home / "AppData" / "Local")
        return Path(base) / APP / "Cache"
    if sys.platform == "darwin":
        return home / "Library" / "Caches" / APP
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    return (Path(xdg) if os.path.isabs(xdg) else home / ".cache") / APP


def figures_path() -> Path:
    return cache_dir() / FILE_NAME


def fingerprint(inventory) -> str:
    """hostname | each device's name, description and total bytes (host RAM included)."""
    parts = [socket.gethostname()]
    for d in inventory.devices:
        parts.append(f"{d.name}:{d.description}:{d.total_bytes}")
    return "|".join(parts)


# -- the file ---------------------------------------------------------------------------
def load_all(path: Optional[Path] = None) -> dict:
    """Every machine's record; an absent file is empty; a damaged one is an error naming it."""
    path = Path(path or figures_path())
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except FileNotFoundError:
        return {"version": VERSION, "machines": {}}
    except (OSError, ValueError) as exc:
        raise PlacementError(f"cannot read the calibration file {path}: {exc}; delete it or "
                             f"run the pack's `calibrate` again (docs/calibration.md)") from None
    if not isinstance(data, dict) or data.get("version") != VERSION \
            or not isinstance(data.get("machines"), dict):
        raise PlacementError(f"calibration file {path} is not version {VERSION}; delete it or "
                             f"run the pack's `calibrate` again (docs/calibration.md)")
    return data


def _save_all(data: dict, path: Optional[Path] = None) -> Path:
    """Atomic replace: a plan reading at the same time sees the old or the new file."""
    path = Path(path or figures_path())
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".figures-", dir=str(path.parent))
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=1, sort_keys=True)
    os.replace(tmp, path)
    return path


def machine_record(inventory, path: Optional[Path] = None) -> Optional[dict]:
    return load_all(path)["machines"].get(fingerprint(inventory))


def save_measurements(inventory, measured: dict, path: Optional[Path] = None) -> Path:
    """Store a calibration run for this machine; earlier step corrections are kept."""
    data = load_all(path)
    key = fingerprint(inventory)
    old = data["machines"].get(key) or {}
    record = dict(measured)
    record["corrections"] = old.get("corrections", {})
    # a run without --workers keeps the links it did not measure; links are kept per
    # worker machine (worker_figures.py), an older record's per alias
    from .worker_figures import merged_network
    record["network"] = merged_network(old.get("network") or {}, measured.get("network") or {})
    record["saved_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    data["machines"][key] = record
    return _save_all(data, path)


def observe_step(inventory, device: str, component: str, predicted_s: float,
                 measured_s: float, path: Optional[Path] = None) -> float:
    """Record one run: the plan predicted `predicted_s` seconds per step of `component`
    on `device`, the run measured `measured_s`. Returns the device's correction now in
    force (measured/predicted, bounded to CORRECTION_BOUNDS). Only detected inventories
    are recorded (a simulated one has no machine to learn about): returns 1.0 for them."""
    if getattr(inventory, "source", "") != "detected":
        return 1.0
    for what, value in (("predicted_s", predicted_s), ("measured_s", measured_s)):
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
            raise PlacementError(f"invalid {what} {value!r}; expected seconds > 0")
    names = [d.name for d in inventory.devices]
    if device not in names:
        raise PlacementError(f"observe_step: device {device!r} is not in the inventory; "
                             f"devices: {', '.join(names)}")
    data = load_all(path)
    record = data["machines"].setdefault(fingerprint(inventory), {"corrections": {}})
    corrections = record.setdefault("corrections", {})
    entry = corrections.setdefault(device, {}).setdefault(component, {"log_ratio": 0.0, "runs": 0})
    ratio = _bounded(measured_s / predicted_s)
    weight = 1.0 if entry["runs"] == 0 else CORRECTION_WEIGHT
    entry["log_ratio"] = (1 - weight) * entry["log_ratio"] + weight * math.log(ratio)
    entry["runs"] += 1
    entry["last"] = {"predicted_s": predicted_s, "measured_s": measured_s}
    _save_all(data, path)
    return _device_correction(corrections[device])[0]


def observe_plan_step(inventory, plan, component: str, measured_s: float,
                      path: Optional[Path] = None) -> Dict[str, float]:
    """observe_step for every device `component` ran on under an auto-fit `plan`, with the
    plan's own prediction (fit.components[component].forward_s: one forward = one sampling
    step, CFG included). {device: correction now in force}; {} for a plan that predicted
    nothing (an explicit plan) or a simulated inventory."""
    fit = (getattr(plan, "extra", None) or {}).get("fit") or {}
    predicted = ((fit.get("components") or {}).get(component) or {}).get("forward_s")
    cp = plan.components.get(component)
    if not predicted or cp is None or getattr(inventory, "source", "") != "detected" or \
            any(is_remote(d) for d in cp.runtime):      # a step with network hops in it
        return {}
    return {d: observe_step(inventory, d, component, predicted, measured_s, path)
            for d in cp.runtime}


def _bounded(ratio: float) -> float:
    low, high = CORRECTION_BOUNDS
    return min(high, max(low, ratio))


def _device_correction(by_component: dict):
    """(factor, runs): the run-weighted geometric mean of the device's component ratios."""
    runs = sum(int(e.get("runs", 0)) for e in by_component.values())
    if runs <= 0:
        return 1.0, 0
    log = sum(float(e["log_ratio"]) * int(e["runs"]) for e in by_component.values()) / runs
    return _bounded(math.exp(log)), runs


# -- what the planner uses ----------------------------------------------------------------
@dataclass
class Figures:
    """Measured figures for one inventory, by device name; empty where nothing is known."""
    throughput: Dict[str, float] = field(default_factory=dict)       # FLOP/s
    bandwidth: Dict[str, float] = field(default_factory=dict)        # host->device B/s, pinned
    disk_bandwidth: Optional[float] = None
    peer_bandwidth: Optional[float] = None
    # per pair of GPUs: (a, b) -> (bytes/s, "peer" | "host-staged"), calibrate's "peer"
    links: Dict[tuple, tuple] = field(default_factory=dict)
    # per worker alias: bytes/s of the network link (a record's "network": {alias:
    # {"bytes_per_s"}}; given figures (--network-bandwidth) take precedence)
    network_bandwidth: Dict[str, float] = field(default_factory=dict)
    corrections: Dict[str, tuple] = field(default_factory=dict)      # device -> (factor, runs)
    # the record's "network" entries as saved (worker_figures.py reads them per worker)
    network_records: Dict[str, dict] = field(default_factory=dict)
    # per worker alias: where its network figure came from, in words (the plan says it)
    network_sources: Dict[str, str] = field(default_factory=dict)
    origin: str = ""                                                 # file and date, for reports
    problem: str = ""           # why the calibration file was not used (a plan warning)


NO_FIGURES = Figures()


def this_machine(inventory):
    """The detected inventory of this machine inside `inventory` (workers' devices, which
    with_remote appends, are other machines), or None for a simulated one."""
    source = getattr(inventory, "source", "")
    if source == "detected":
        return inventory
    if source == "detected + remote workers":          # remote_devices.with_remote
        from .devices import Inventory
        return Inventory([d for d in inventory.devices if not is_remote(d.name)],
                         source="detected")
    return None


def figures_for(inventory, path: Optional[Path] = None) -> Figures:
    """The measured figures that apply to `inventory`: this machine's calibration and step
    corrections when it is the detected inventory (with workers' devices or not), the
    network links calibrate measured to workers included; nothing of this machine's for a
    simulated one. Workers' devices bring the speeds calibrated on their own machines
    (remote_devices.py), whatever this machine's inventory is."""
    local = _local_figures(this_machine(inventory), path)
    from .worker_figures import with_workers
    return with_workers(local, inventory, path)


def _local_figures(inventory, path: Optional[Path]) -> Figures:
    if inventory is None:
        return NO_FIGURES
    try:
        record = machine_record(inventory, path)
    except PlacementError as exc:   # a damaged cache file must not stop every plan
        return Figures(problem=f"{exc}; planned with the default figures")
    if not record:
        return NO_FIGURES
    out = Figures(origin=f"{path or figures_path()} ({record.get('saved_at', 'steps only')})")
    kinds = {d.name: d.kind for d in inventory.devices}
    for name, dev in (record.get("devices") or {}).items():
        if name not in kinds:
            continue
        order = CPU_DTYPES if kinds[name] == "cpu" else GPU_DTYPES
        flops = dev.get("throughput_flops") or {}
        value = next((flops[t] for t in order if _positive(flops.get(t))), None)
        if value:
            out.throughput[name] = float(value)
        h2d = (dev.get("h2d_bytes_per_s") or {}).get("pinned")
        if _positive(h2d):
            out.bandwidth[name] = float(h2d)
    disks = [v.get("bytes_per_s") for v in (record.get("disk") or {}).values()]
    disks = [float(v) for v in disks if _positive(v)]
    if disks:
        out.disk_bandwidth = min(disks)        # the slowest model folder: no plan relies on luck
    peers = [float(v.get("bytes_per_s")) for v in (record.get("peer") or {}).values()
             if _positive(v.get("bytes_per_s"))]
    if peers:
        out.peer_bandwidth = min(peers)
    for pair, v in (record.get("peer") or {}).items():
        a, sep, b = str(pair).partition("->")
        if sep and a in kinds and b in kinds and _positive(v.get("bytes_per_s")):
            how = "peer" if v.get("how") == "peer" else "host-staged"
            out.links[(a, b)] = (float(v["bytes_per_s"]), how)
    out.network_records = {str(k): v for k, v in (record.get("network") or {}).items()
                           if isinstance(v, dict) and _positive(v.get("bytes_per_s"))}
    for name, by_component in (record.get("corrections") or {}).items():
        if name in kinds:
            factor, runs = _device_correction(by_component)
            if runs:
                out.corrections[name] = (factor, runs)
    return out


def _positive(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0
