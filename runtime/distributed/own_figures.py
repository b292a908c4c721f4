"""What a worker tells its main process about its own devices (docs/distributed.md, "What
a worker tells its main"), beside the device list of its hello:

- per device its throughput and host link with the source of each: calibrated on this
  machine (`calibrate` run here, the same cache file a main reads: machine_figures), a
  simulated what-if (`--simulate ...@165T`), or nothing (the main takes the default for
  the device's kind); never a figure made up here;
- this machine's id (placement/machine_identity.py), which the main keys its measured
  network link by;
- on the main's "figures" request (when it plans, and around a run): free memory
  measured now, and the peak per device since the last reset: torch's allocator peak
  (max_memory_allocated) on a CUDA device, which counts the ranges and every activation;
  elsewhere (the cpu, a simulated device) the most bytes of ranges held, sampled at each
  "figures" request (the main sends one before each release and after a run), the
  activations not counted (nothing here allocates them through a meter).
"""
import time
from typing import Dict, Optional

import torch

from ...placement.devices import Inventory
from ...placement.errors import PlacementError
from ...placement.machine_figures import figures_for, machine_record
from ...placement.machine_identity import machine_id
from ...placement.remote_devices import CALIBRATED, DEFAULT, SIMULATED

ALLOCATOR = "torch.cuda.max_memory_allocated (its ranges and every activation)"
HELD = ("the most bytes of ranges held, sampled before each release and after the run "
        "(activations not measured)")


class OwnFigures:
    """One session's figures (a main process joined): made at its hello."""

    def __init__(self, offered):
        self.offered = offered
        self.machine = machine_id()
        self.problem = ""                 # a calibration file that could not be read
        detected = Inventory.detect() if offered.simulated is None else None
        # real CUDA devices by name: their allocator measures the peak
        self._cuda = {d.name: torch.device(d.torch_device) for d in
                      (detected.devices if detected else [])
                      if str(d.torch_device).startswith("cuda")}
        self._calibrated, self._saved_at = self._calibration(detected)
        self._held_peak: Dict[str, int] = {}

    def _calibration(self, detected):
        if detected is None:              # a simulated inventory: what-if speeds only
            return None, ""
        figures = figures_for(detected)
        self.problem = figures.problem
        try:
            record = machine_record(detected) or {}
        except PlacementError:            # said once, through figures.problem
            record = {}
        return figures, str(record.get("saved_at") or "")

    # -- the hello ---------------------------------------------------------------------
    def devices(self, listed: list) -> list:
        """The hello's device list (OfferedDevices.hello) with each figure's source."""
        now = time.strftime("%H:%M:%S")
        return [dict(d, figures=self._figures_of(d, now)) for d in listed]

    def _figures_of(self, d: dict, now: str) -> dict:
        out = {"free_measured": f"by the worker when the main joined, {now}"}
        for what in ("throughput", "bandwidth"):
            value, source = d.get(what), DEFAULT
            if value is not None:
                source = SIMULATED
            elif self._calibrated is not None:
                value = getattr(self._calibrated, what).get(d["name"])
                source = CALIBRATED if value is not None else DEFAULT
            out[what], out[f"{what}_source"] = value, source
        if CALIBRATED in (out["throughput_source"], out["bandwidth_source"]):
            out["calibrated_at"] = self._saved_at
        return out

    # -- the "figures" request ----------------------------------------------------------
    def answer(self, request: dict, ranges: dict, held=None) -> dict:
        """Free memory now and the peaks since the last reset, per device; with
        "reset_peaks" the peaks then count from now. `ranges`: the session's loaded
        ranges; `held`: the worker's shared tensors, when it keeps them (exact bytes of
        ranges that share tensors)."""
        now = self._held_now(ranges, held)
        for name, nbytes in now.items():
            self._held_peak[name] = max(self._held_peak.get(name, 0), nbytes)
        devices = []
        for d in self.offered.hello():        # detected again: free memory as it is now
            name = d["name"]
            free = d["free_bytes"]
            if self.offered.simulated is not None:   # what the worker counts there
                free = max(0, free - now.get(name, 0))
            entry = {"name": name, "free_bytes": free, "held_bytes": now.get(name, 0)}
            if name in self._cuda:
                entry.update(peak_bytes=int(torch.cuda.max_memory_allocated(self._cuda[name])),
                             peak_how=ALLOCATOR)
            else:
                entry.update(peak_bytes=self._held_peak.get(name, 0), peak_how=HELD)
            devices.append(entry)
        if request.get("reset_peaks"):
            for dev in self._cuda.values():
                torch.cuda.reset_peak_memory_stats(dev)
            self._held_peak = dict(now)
        return {"ok": True, "devices": devices,
                "measured": f"by the worker at {time.strftime('%H:%M:%S')}"}

    @staticmethod
    def _held_now(ranges: dict, held=None) -> Dict[str, int]:
        """Bytes of the ranges held now, per device as the main names it."""
        names = {_name_of(r) for r in ranges.values()}
        if held is not None and hasattr(held, "bytes_on"):
            return {n: int(held.bytes_on(n)) for n in names}
        out: Dict[str, int] = {}
        for r in ranges.values():
            out[_name_of(r)] = out.get(_name_of(r), 0) + int(getattr(r, "nbytes", 0))
        return out


def _name_of(loaded) -> str:
    """The device a loaded range is held on, as the main names it (a simulated cuda0
    whose range computes on the cpu keeps its name where the range says it)."""
    name: Optional[str] = getattr(loaded, "name", None)
    if name:
        return str(name)
    dev = torch.device(getattr(loaded, "device", "cpu"))
    return "cpu" if dev.type == "cpu" else f"{dev.type}{dev.index or 0}"
