"""What a run measured, beside what the plan predicted: one record per sampling run.

Apply Placement gives its placed MODEL an OUTER_SAMPLE wrapper (the outermost, so the
engine has closed its placement and written its stats when the wrapper reads them) and
its placed VAE a timed decode. The record (seconds of sampling and decode, steps, the
peak bytes per device and phase) is built here, rendered once into lines by
placement/report.render_measured, logged with those lines and sent to the editor
(event `placement.measured`), which draws the same lines and numbers: the node, the
log and the record cannot disagree.

Peaks come from the engine's ledger (runtime.place stats: every device it placed on,
simulated ones included) and, for real CUDA devices, torch's allocator peak over the
phase. Nothing else is measured: a phase or device without either is left out, not
guessed.
"""
import logging
import time
from typing import Callable, Dict, List, Optional

import torch

from ..placement.errors import PlacementError
from ..placement.machine_figures import observe_plan_step
from ..placement.report import render_measured
from ..runtime.comfy.measure_hooks import engine_session, meter_decode, meter_sampling

log = logging.getLogger("comfyui-placement")
EVENT = "placement.measured"


def predicted_figures(plan) -> dict:
    """The plan's own predictions and planned bytes, copied into every record."""
    fit = plan.extra.get("fit") or {}
    table = {row["name"]: row for row in plan.extra.get("device_table") or []}
    phases = plan.extra.get("device_phases") or {}        # explicit plans (resolve.py)
    planned = {}
    for d in plan.devices:
        row = table.get(d.name)
        planned[d.name] = (dict(row["phases"]) if row else dict(phases.get(d.name) or {})
                           or {"any": d.planned_bytes})
    return {"predicted": dict(fit.get("predicted") or {}), "steps": fit.get("steps"),
            "planned_bytes": planned}


class Meter:
    """The measured figures of one Apply Placement's outputs, one record per run."""

    def __init__(self, node_id, plan, inventory, sessions: Callable[[str], List[object]],
                 send: Optional[Callable[[dict], None]] = None,
                 plan_that_ran: Optional[Callable[[], object]] = None):
        self.node_id = None if node_id is None else str(node_id)
        self.plan, self.inventory = plan, inventory
        # auto-fit re-plans at sampling time: its predictions are the ones to compare
        self.plan_that_ran = plan_that_ran or (lambda: self.plan)
        self.sessions = sessions           # phase -> engine sessions whose stats count
        self.send = send or send_record
        self.runs = 0
        self.record: Optional[dict] = None

    # ComfyUI copies attachments into clones with this hook: one meter per node output.
    def on_model_patcher_clone(self):
        return self

    # -- sampling ---------------------------------------------------------------------
    def outer_sample(self, executor, noise, latent_image, sampler, sigmas, *args, **kwargs):
        steps = max(1, int(sigmas.shape[-1]) - 1)
        self.runs += 1
        self.record = {"node": self.node_id, "run": self.runs, **predicted_figures(self.plan),
                       "sample": None, "decode": None, "peaks": {}}
        with self._phase("sample") as phase:
            out = executor(noise, latent_image, sampler, sigmas, *args, **kwargs)
        self.record["sample"] = {"seconds": phase.seconds, "steps": steps}
        self._publish()
        if self.runs > 1:                  # the first run also loads the weights
            self._learn(phase.seconds / steps)
        return out

    def _learn(self, step_s: float) -> None:
        """Measured seconds per step correct the next auto-fit plan on this machine
        (placement/machine_figures.py; explicit plans and simulated devices predict
        nothing to correct). A cache folder that cannot be written never fails a run."""
        try:
            observe_plan_step(self.inventory, self.plan_that_ran() or self.plan,
                              "diffusion", step_s)
        except (PlacementError, OSError) as exc:
            log.warning("placement node %s: measured step not recorded: %s",
                        self.node_id, exc)

    # -- decode (the placed VAE's decode) -----------------------------------------------
    def timed_decode(self, call):
        with self._phase("decode") as phase:
            out = call()
        if self.record is None or self.record.get("decode") is not None:
            self.runs += 1                 # a decode without a sampling run of its own
            self.record = {"node": self.node_id, "run": self.runs,
                           **predicted_figures(self.plan), "sample": None, "decode": None,
                           "peaks": {}}
        self.record["decode"] = {"seconds": phase.seconds}
        self.record["peaks"] = _merge(self.record["peaks"], phase.peaks)
        self._publish()
        return out

    def _phase(self, name: str) -> "_Phase":
        return _Phase(self, name)

    def _publish(self) -> None:
        rec = self.record
        rec.update(predicted_figures(self.plan_that_ran() or self.plan))
        sample, decode = rec["sample"], rec["decode"]
        rec["generation_s"] = sum(p["seconds"] for p in (sample, decode) if p)
        rec["lines"] = render_measured(rec)
        for line in rec["lines"]:
            log.info("placement node %s: %s", self.node_id, line)
        self.send(rec)


class _Phase:
    """Times one phase and collects its device peaks (engine stats, CUDA allocator)."""

    def __init__(self, meter: Meter, name: str):
        self.meter, self.name = meter, name
        self.seconds = 0.0
        self.peaks: Dict[str, Dict[str, int]] = {}

    def __enter__(self):
        self.before = {id(s): _stats_ids(s) for s in self.meter.sessions(self.name)}
        self.cuda = _real_cuda(self.meter.plan, self.meter.inventory)
        for dev in self.cuda.values():
            torch.cuda.reset_peak_memory_stats(dev)
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.seconds = time.perf_counter() - self.t0
        peaks: Dict[str, int] = {}
        for s in self.meter.sessions(self.name):
            seen = self.before.get(id(s), set())
            for stats in _all_stats(s):
                if id(stats) in seen:
                    continue
                for dev, d in (stats.get("devices") or {}).items():
                    peaks[dev] = max(peaks.get(dev, 0), int(d.get("peak_bytes", 0)))
        for name, dev in self.cuda.items():
            peaks[name] = max(peaks.get(name, 0), int(torch.cuda.max_memory_allocated(dev)))
        self.peaks = {dev: {self.name: b} for dev, b in peaks.items() if b > 0}
        if self.name == "sample" and self.meter.record is not None:
            self.meter.record["peaks"] = _merge(self.meter.record["peaks"], self.peaks)
        return False


def _merge(a: dict, b: dict) -> dict:
    out = {k: dict(v) for k, v in a.items()}
    for dev, phases in b.items():
        out.setdefault(dev, {}).update(phases)
    return out


def _all_stats(session) -> list:
    """The stats a session kept: SamplingSession.run_stats, CallSession.calls[].stats."""
    if hasattr(session, "run_stats"):
        return list(session.run_stats)
    return [c["stats"] for c in getattr(session, "calls", []) if c.get("stats")]


def _stats_ids(session) -> set:
    return {id(s) for s in _all_stats(session)}


def _real_cuda(plan, inventory) -> Dict[str, torch.device]:
    """The plan's real (not simulated) CUDA devices, by name."""
    if not torch.cuda.is_available():
        return {}
    out = {}
    for d in plan.devices:
        dev = inventory.get(d.name) if d.name in {x.name for x in inventory.devices} else None
        if dev is None or dev.simulated or not str(dev.torch_device).startswith("cuda"):
            continue
        out[d.name] = torch.device(dev.torch_device)
    return out


def send_record(record: dict) -> None:
    """To the editor that queued the prompt (a script without a server: logged only)."""
    try:
        from server import PromptServer
        server = PromptServer.instance
        server.send_sync(EVENT, record, server.client_id)
    except Exception as exc:
        log.info("placement: measured figures not sent (%s)", exc)


# -- wiring on Apply Placement's outputs ----------------------------------------------------
def attach(meter: Meter, placed_model, placed_vae, given_vae) -> None:
    """The meter on the placed MODEL (outermost OUTER_SAMPLE wrapper) and on the placed
    VAE's decode (runtime/comfy/measure_hooks.py). Only the node's own copies are
    touched, never a given object."""
    if placed_model is not None:
        meter_sampling(placed_model, meter)
    if placed_vae is not None and placed_vae is not given_vae:
        meter_decode(placed_vae, meter)


def engine_sessions(placed: dict, replanner=None) -> Callable[[str], List[object]]:
    """phase -> the engine sessions (runtime/comfy sampling_session.py, engine_calls.py)
    whose placements that phase runs: the placed MODEL's (and auto-fit's re-placed
    copies') for sampling, the placed VAE's for decode."""
    def sessions(phase: str) -> List[object]:
        if phase == "sample":
            objs = [placed.get("diffusion")]
            if replanner is not None:
                objs += [p for _, _, p in replanner.models]
        else:
            objs = [placed.get("vae")]
        found = [engine_session(o) for o in objs if o is not None]
        return [s for s in found if s is not None]
    return sessions
