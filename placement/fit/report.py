"""Auto-fit results as a Plan people can read: a reason in words per decision (each kind
of placement words its own, kinds/*.py), the predicted times and traffic, and a
per-device table like llama.cpp's --fit."""
from typing import Dict, List

from ..components import COMPONENTS, PHASES
from ..plan import ComponentPlan, DevicePlan, Plan
from ..room import margin_for
from .kinds.base import ACTION, ms
from .option import PHASE_ORDER
from .search import Search


def reasons_for(search: Search, o, use, options, chosen=None) -> List[str]:
    """Why `o`: what was asked, the kind's decision line(s), then what bears on it (an
    asked split it yields to, disk, the offload mode); the parallel line goes before the
    decision (the editor and the table show the last reason)."""
    rule = search.rules[o.comp]
    out = []
    if rule.runtime is not None:
        out.append(f"runtime {'&'.join(rule.runtime)} (asked)")
    if rule.params is not None:
        out.append(f"params {rule.params} (asked)")
    at = len(out)
    out += o.kind.reasons(search, o, use)
    yields = _yields_to_asked_split(search, o, chosen or {})
    if yields:
        out.append(yields)
    if o.source == "disk" and rule.params != "disk":
        out.append(o.kind.disk_reason(search, o))
    if options.offload_mode != "auto":
        out.append(f"offload_mode {options.offload_mode}")
    line = parallel_line(search, o)
    if line:
        out.insert(at, line)
    return out


_FAMILY = {"none": "plain", "batch": "batch parallel", "pipeline": "pipelined split"}


def alternatives_of(search: Search, c: str) -> Dict[str, float]:
    """Predicted seconds per forward of the best plain, batch-parallel and pipelined
    placement of `c`, each with every GPU to itself (fit's lower bounds)."""
    return {_FAMILY[f]: o.forward_s for f, o in
            sorted((getattr(search, "alternatives", {}) or {}).get(c, {}).items())}


def parallel_line(search: Search, o) -> str:
    """What parallelism was chosen for a component whose batch may be shared, and the
    predicted forward of each alternative."""
    c = o.comp
    rule = search.rules[c]
    alts = (getattr(search, "alternatives", {}) or {}).get(c, {})
    if search.work[c].items < 2 or not (rule.batch or rule.pipeline) or len(alts) < 2:
        return ""
    others = "; ".join(f"{_FAMILY[f]} {ms(a.forward_s)} ({a.kind.where(a)})"
                       for f, a in sorted(alts.items()) if f != o.parallel)
    asked = rule.only is not None
    line = (f"parallel: {_FAMILY[o.parallel]} ({'asked' if asked else 'predicted fastest'}), "
            f"{ms(o.forward_s)} per forward; alternatives, each with every GPU to itself: "
            f"{others}")
    if not asked and any(a.cost < o.cost * (1 - 1e-9) for a in alts.values()):
        line += ("; the faster alone does not fit beside the rest of the plan (GPU or host "
                 "RAM budgets)")
    return line


def _yields_to_asked_split(search: Search, o, chosen) -> str:
    """A turn-taking component on a GPU that an asked split also uses: say that it takes
    turns so the split gets that GPU (an explicit split is never starved by a component
    auto-fit may move)."""
    if o.persistent or o.runtime == ["cpu"] or search.rules[o.comp].params is not None:
        return ""
    mine = set(o.runtime)
    for other, x in sorted(chosen.items()):
        asked = search.rules[other].runtime
        if other == o.comp or x.phase == o.phase or not asked or len(asked) < 2:
            continue
        shared = [n for n in asked if n in mine]
        if shared:
            return (f"takes turns on {'&'.join(shared)}: the asked split of {other} over "
                    f"{'&'.join(asked)} has it while {ACTION[PHASE_ORDER[x.phase]]} runs")
    return ""


def build_plan(search: Search, best, request, inventory, infos, options, budgets, host, notes):
    key, chosen, use = best
    default = inventory.default_device().name
    choices = getattr(request, "choices", {}) or {}
    comps: Dict[str, ComponentPlan] = {}
    for comp in COMPONENTS:
        info = infos.get(comp)
        o = chosen.get(comp)
        if o is None:
            choice = choices.get(comp)
            runtime = list(choice.runtime) if choice is not None and choice.runtime else [default]
            params = (choice.params if choice is not None else None) or runtime[0]
            comps[comp] = ComponentPlan(comp, runtime, params,
                                        (choice.split_mode if choice is not None else None)
                                        or "layer", reasons=["not loaded: nothing to fit"])
            continue
        rule = search.rules[comp]
        # an explicit device list is kept as written, even where a device got no block
        split = o.kind.decision == "split"
        runtime = list(rule.runtime) if rule.runtime and split else list(o.runtime)
        cp = ComponentPlan(comp, runtime, o.source,
                           getattr(choices.get(comp), "split_mode", None) or "layer",
                           present=True, total_bytes=search.geos[comp].total,
                           resident_bytes=o.resident_bytes, streamed_bytes=o.streamed_bytes,
                           reasons=reasons_for(search, o, use, options, chosen))
        cp.headroom_bytes = search.geos[comp].headroom
        cp.held_bytes = held_bytes_of(search, o)
        o.kind.to_plan(search, o, cp)
        comps[comp] = cp

    devices, table = [], []
    host_peak = Search._host_peak(chosen) if chosen else 0
    for dev in inventory.devices:
        if dev.name in search.gidx:
            d = search.gidx[dev.name]
            per_phase = {p: use[i][d] for i, p in enumerate(PHASE_ORDER)}
            budget, how = budgets[dev.name]
            headroom = _headroom_at_peak(search, chosen, use, d)
        else:
            budget, how = host
            per_phase = {p: 0 for p in PHASE_ORDER}
            for o in chosen.values():
                per_phase[PHASE_ORDER[o.phase]] += o.host_use
            persist = sum(o.host_persist for o in chosen.values())
            per_phase = {p: b + persist for p, b in per_phase.items()}
            headroom = max((o.host_use for o in chosen.values() if o.runtime == ["cpu"]),
                           default=0)
        planned = max(per_phase.values()) if per_phase else 0
        # the device's room is `budget`; the plan states it as budget and margin, the
        # margin kept free inside (placement/room.py), so the runtime's ledger gets both
        margin = 0 if dev.kind == "cpu" else margin_for(
            dev, int(options.budget_margin), (getattr(request, "budgets", {}) or {}).get(
                dev.name))
        devices.append(DevicePlan(dev.name, dev.kind, dev.total_bytes, dev.free_bytes,
                                  budget + margin, planned, dev.description,
                                  search.model.throughput.get(dev.name),
                                  margin_bytes=margin))
        table.append({"name": dev.name, "kind": dev.kind, "total_bytes": dev.total_bytes,
                      "free_bytes": dev.free_bytes, "budget_bytes": budget, "budget_from": how,
                      "planned_bytes": planned, "phases": per_phase,
                      "headroom_bytes": headroom, "slack_bytes": budget - planned,
                      "deficit_bytes": max(0, planned - budget)})
    warnings = list(notes)
    for comp, info in infos.items():
        warnings += [f"{comp}: {w}" for w in getattr(info, "warnings", ())]
    for comp, o in sorted(chosen.items()):
        if o.kind.decision != "split" or comps[comp].split_mode != "layer":
            continue
        if search.rules[comp].row_fallback:
            warnings.append(f"{comp}: split_mode row asked, but no block holds a matrix of "
                            f"at least 256x256 to shard (the runtime would split by layer); "
                            f"planned a layer split")
        elif search.rules[comp].split_mode == "row":
            warnings.append(f"{comp}: split_mode row asked, but a row split over "
                            f"{'&'.join(o.runtime)} cannot hold it and a row split does not "
                            f"stream; planned a streaming layer split over them instead")
    sample = [o for o in chosen.values() if PHASES[o.comp] == "sample"]
    plan = Plan(devices, comps, warnings)
    plan.extra["device_table"] = table
    plan.extra["fit"] = {
        "offload_mode": options.offload_mode,
        "objective": "predicted seconds per generation (1 encode, steps x sample, 1 decode)",
        "steps": options.steps, "resolution": list(options.resolution),
        "frames": options.frames, "batch": options.batch,
        "prefetch_depth": options.prefetch_depth,
        "predicted": {
            "generation_s": key[0],
            "sample_step_s": sum(o.forward_s for o in sample),
            "step_s": key[0] / options.steps,
            "streamed_bytes_per_step": sum(o.streamed_bytes for o in sample),
            "traffic_bytes_per_generation": key[3],
            "hops_per_generation": key[1],
            "host_bytes": host_peak,
        },
        "components": {c: {
            "decision": o.kind.decision, "kind": o.kind.name, "persistent": o.persistent,
            "phase": PHASES[c],
            "forward_s": o.forward_s, "compute_s": o.compute_s, "transfer_s": o.transfer_s,
            "forwards": o.runs, "load_s": o.load_s, "loaded_bytes": o.loaded_bytes,
            "hops": o.hops, "headroom_bytes": search.geos[c].headroom,
            "alternatives_forward_s": alternatives_of(search, c),
            **o.kind.fit_json(search, o),
            "held_bytes": held_bytes_of(search, o),
        } for c, o in sorted(chosen.items())},
        "cost_model": dict(search.model.describe(), links=search.model.links(search.gpus)),
        "search": {"leaves": search.leaves},
    }
    return plan


def held_bytes_of(search, o) -> Dict[str, int]:
    """Bytes the option holds per GPU while its phase runs (session weights + phase use)."""
    return {search.gpus[d]: b for d, b in
            sorted({**o.use, **{k: v + o.use.get(k, 0) for k, v in o.persist.items()}}.items())}


def _headroom_at_peak(search, chosen, use, d) -> int:
    """Working memory planned on device d in its busiest phase."""
    peak = max(range(len(PHASE_ORDER)), key=lambda p: (use[p][d], -p))
    return sum(search.geos[o.comp].headroom for o in chosen.values()
               if o.phase == peak and d in o.use)
