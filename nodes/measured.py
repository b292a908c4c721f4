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

What fell back while the run ran (runtime/engine/fallbacks.py: a block that never ran, a row
split run as a layer split, synchronous streaming, a plan re-derived, a call finished on
ComfyUI's cast path) rides in the record as `runtime_fallbacks`, the engine's own
records, each once; the editor draws a line per record from its fields.
"""
import logging
import time
from typing import Callable, Dict, List, Optional

import torch

from ..placement.errors import PlacementError
from ..placement.machine_figures import observe_plan_step
from ..placement.ran_figures import planned_by_phase, with_calls
from ..placement.report import render_measured
from ..runtime.comfy.patchers.measure_hooks import engine_session, meter_decode, meter_sampling
from ..runtime.engine.fallbacks import describe, make, merged
from .common import refresh_workers

log = logging.getLogger("comfyui-placement")
EVENT = "placement.measured"
# node id -> {"record", "report"}: the record published last and the text report of the
# plan that ran (Placement Report reads it, so the plan that ran and the measured figures
# reach a UI output, which /history keeps). Data only: no model is kept alive by it.
LATEST: Dict[str, dict] = {}


def predicted_figures(plan, calls=None) -> dict:
    """The plan's own predictions and planned bytes, copied into every record: those of
    the plan that ran, with the bytes rehearsed engine calls planned ({phase: {device:
    bytes}}, CallSession.planned_by_device) in their phase. `plan` (its JSON) is what
    the editor draws the bars from, so bars and the measured line show one figure."""
    import json
    fit = plan.extra.get("fit") or {}
    ran = with_calls(json.loads(plan.to_json(indent=None)), calls)
    return {"predicted": dict(fit.get("predicted") or {}), "steps": fit.get("steps"),
            "planned_bytes": planned_by_phase(ran), "plan": ran}


class Meter:
    """The measured figures of one Apply Placement's outputs, one record per run."""

    def __init__(self, node_id, plan, inventory, sessions: Callable[[str], List[object]],
                 send: Optional[Callable[[dict], None]] = None,
                 plan_that_ran: Optional[Callable[[], object]] = None, workers=None):
        self.node_id = None if node_id is None else str(node_id)
        self.workers = workers             # joined workers: their own peaks come back
        self.plan, self.inventory = plan, inventory
        # auto-fit re-plans at sampling time: its predictions are the ones to compare
        self.plan_that_ran = plan_that_ran or (lambda: self.plan)
        self.sessions = sessions           # phase -> engine sessions whose stats count
        self.send = send or send_record
        self.runs = 0
        self.record: Optional[dict] = None
        self._told: Dict[int, dict] = {}   # id -> stats whose fallbacks a record carries

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
        _note_how(self.record, phase.how)
        self._publish()
        return out

    def _phase(self, name: str) -> "_Phase":
        return _Phase(self, name)

    def _publish(self) -> None:
        rec = self.record
        rec.update(predicted_figures(self.plan_that_ran() or self.plan, self._calls()))
        sample, decode = rec["sample"], rec["decode"]
        rec["generation_s"] = sum(p["seconds"] for p in (sample, decode) if p)
        rec["lines"] = render_measured(rec)
        rec["runtime_fallbacks"] = merged(rec.get("runtime_fallbacks"), self._new_fallbacks(),
                                          rederived(self.plan, self.plan_that_ran()))
        # published after sampling and again after the decode: each line logged once
        if getattr(self, "_logged", (None,))[0] is not rec:
            self._logged = (rec, set())
        logged = self._logged[1]
        for line in rec["lines"] + [f"fell back: {describe(f)}"
                                    for f in rec["runtime_fallbacks"]]:
            if line not in logged:
                logged.add(line)
                log.info("placement node %s: %s", self.node_id, line)
        rec["prompt_id"] = current_prompt_id()
        if self.node_id is not None:
            ran = self.plan_that_ran() or self.plan
            LATEST[self.node_id] = {"record": rec, "report": ran.report()}
        self.send(rec)

    def _calls(self) -> Dict[str, Dict[str, int]]:
        """{phase: {device: bytes}} the last rehearsed call of each engine-placed text
        encoder (encode) and VAE (decode) planned (runtime/comfy/apply/engine_calls.py)."""
        out: Dict[str, Dict[str, int]] = {}
        for phase, methods in (("encode", None), ("decode", ("decode",))):
            for s in self.sessions(phase):
                got = getattr(s, "planned_by_device", None)
                for dev, b in (got(methods) if got else {}).items():
                    out.setdefault(phase, {})[dev] = max(out.get(phase, {}).get(dev, 0), b)
        return out

    def _new_fallbacks(self) -> List[dict]:
        """The runtime fallbacks of the placements that ended since the last record (the
        text encoders' calls too), each placement's once."""
        out, now = [], {}
        for phase in ("encode", "sample", "decode"):
            for s in self.sessions(phase):
                for stats in _all_stats(s):
                    now[id(stats)] = stats
                    if id(stats) not in self._told:
                        out.extend(stats.get("fallbacks") or [])
        # kept (so an id is never reused while known) only while a session still holds it
        self._told = now
        return out


class _Phase:
    """Times one phase and collects its device peaks (engine stats, CUDA allocator)."""

    def __init__(self, meter: Meter, name: str):
        self.meter, self.name = meter, name
        self.seconds = 0.0
        self.peaks: Dict[str, Dict[str, int]] = {}
        self.how: Dict[str, str] = {}      # a worker's device: how the worker measured it

    def __enter__(self):
        self.before = {id(s): _stats_ids(s) for s in self.meter.sessions(self.name)}
        self.cuda = _real_cuda(self.meter.plan, self.meter.inventory)
        for dev in self.cuda.values():
            torch.cuda.reset_peak_memory_stats(dev)
        if self.meter.workers:             # their peaks count from here
            refresh_workers(self.meter.workers, reset_peaks=True)
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.seconds = time.perf_counter() - self.t0
        peaks: Dict[str, int] = {}
        loading: Dict[str, dict] = {}      # a worker's range: kept, or what loading it cost
        for s in self.meter.sessions(self.name):
            seen = self.before.get(id(s), set())
            for stats in _all_stats(s):
                if id(stats) in seen:
                    continue
                for dev, d in (stats.get("devices") or {}).items():
                    peaks[dev] = max(peaks.get(dev, 0), int(d.get("peak_bytes", 0)))
                for dev, how in (stats.get("worker_loading") or {}).items():
                    loading[dev] = dict(how, blocks=stats["remote_ranges"].get(dev))
        for name, dev in self.cuda.items():
            peaks[name] = max(peaks.get(name, 0), int(torch.cuda.max_memory_allocated(dev)))
        how = {}
        if self.meter.workers:             # what each worker measured of its own devices
            refresh_workers(self.meter.workers)
            for cluster in self.meter.workers.joined.values():
                for name, (b, said) in cluster.peaks().items():
                    peaks[name], how[name] = max(peaks.get(name, 0), b), said
        self.peaks = {dev: {self.name: b} for dev, b in peaks.items() if b > 0}
        self.how = {dev: said for dev, said in how.items() if dev in self.peaks}
        if self.name == "sample" and self.meter.record is not None:
            if loading:
                self.meter.record["worker_loading"] = loading
            self.meter.record["peaks"] = _merge(self.meter.record["peaks"], self.peaks)
            _note_how(self.meter.record, self.how)
        return False


def _note_how(record: dict, how: Dict[str, str]) -> None:
    """How each worker measured its peak (render_measured says it under the peaks)."""
    if how:
        record["peaks_measured"] = dict(record.get("peaks_measured") or {}, **how)


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


def current_prompt_id():
    """The id of the prompt the server is running (None without a server)."""
    try:
        from server import PromptServer
        return getattr(PromptServer.instance, "last_prompt_id", None)
    except Exception:
        return None


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
    VAE's decode (runtime/comfy/patchers/measure_hooks.py). Only the node's own copies are
    touched, never a given object."""
    if placed_model is not None:
        meter_sampling(placed_model, meter)
    if placed_vae is not None and placed_vae is not given_vae:
        meter_decode(placed_vae, meter)


def engine_sessions(placed: dict, replanner=None) -> Callable[[str], List[object]]:
    """phase -> the engine sessions (runtime/comfy sampling_session.py, engine_calls.py)
    whose placements that phase runs: the placed MODEL's (and auto-fit's re-placed
    copies') for sampling, the placed VAE's for decode, the placed CLIP's for encode
    (not timed: only its fallbacks are read)."""
    def sessions(phase: str) -> List[object]:
        if phase == "sample":
            objs = [placed.get("diffusion")]
            if replanner is not None:
                objs += [p for _, _, p in replanner.models]
        elif phase == "encode":
            objs = [placed.get("te")]
        else:
            objs = [placed.get("vae")]
        found = [engine_session(o) for o in objs if o is not None]
        return [s for s in found if s is not None]
    return sessions


def _placement_of(plan, component: str) -> Optional[dict]:
    """What a component's placement is in a plan, without its reasons and sizes."""
    c = (plan.to_dict() if plan is not None else {}).get("components", {}).get(component)
    if not c or not c.get("present"):
        return None
    stream = c.get("stream")
    return {"runtime": "&".join(c.get("runtime") or []), "params": c.get("params"),
            "split_mode": c.get("split_mode"), "blocks": c.get("blocks") or {},
            "stream": None if stream is None else
            {"resident": stream.get("resident_blocks"), "depth": stream.get("prefetch_depth")}}


def rederived(node_plan, ran_plan) -> List[dict]:
    """A `plan_rederived` record for each component the plan that ran places otherwise
    than the node's plan (made again at the run's first model call, with its working
    memory rehearsed): what was planned beside what ran."""
    out = []
    if node_plan is None or ran_plan is None or ran_plan is node_plan:
        return out
    for comp in ran_plan.components:
        planned, ran = _placement_of(node_plan, comp), _placement_of(ran_plan, comp)
        if planned is not None and ran is not None and planned != ran:
            out.append(make("plan_rederived", comp, planned, ran,
                            "the run's first model call, rehearsed, needs another placement "
                            "than the node planned before the workload was known",
                            field="placement"))
    return out

