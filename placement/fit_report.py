"""Auto-fit results as a Plan people can read: a reason in words per decision, the
predicted times and traffic, and a per-device table like llama.cpp's --fit; and, when
nothing fits, one line saying by how much and what would make it fit."""
from typing import Dict, List

from .components import COMPONENTS, PHASES
from .errors import PlacementError
from .fit_search import PHASE_ORDER, Search
from .plan import ComponentPlan, DevicePlan, Plan, StreamPlan
from .units import format_bytes as fmt

_ACTION = {"encode": "text encode", "sample": "sampling", "decode": "decode",
           "upscale": "upscale"}


def _ms(seconds: float) -> str:
    if seconds >= 10:
        return f"{seconds:.1f} s"
    if seconds >= 1:
        return f"{seconds:.2f} s"
    return f"{seconds * 1000:.1f} ms"


def _room_without(search: Search, use, o, d: int) -> int:
    """What device d offers `o`'s component in its phase, the others' use taken off."""
    mine = o.persist.get(d, 0) + o.use.get(d, 0)
    return search.budget[d] - (use[o.phase][d] - mine)


def _per(o) -> str:
    return "per step" if o.runs > 1 else "per forward"


def reasons_for(search: Search, o, use, options, chosen=None) -> List[str]:
    c, geo, rule = o.comp, search.geos[o.comp], search.rules[o.comp]
    out = []
    yields = _yields_to_asked_split(search, o, chosen or {})
    if rule.runtime is not None:
        out.append(f"runtime {'&'.join(rule.runtime)} (asked)")
    if rule.params is not None:
        out.append(f"params {rule.params} (asked)")
    size = f"{c} {fmt(geo.total)} + {fmt(geo.headroom)} working memory"
    phase = _ACTION[PHASES[c]]
    at = len(out)
    if o.kind == "resident" and o.tile is not None:
        d = search.gidx[o.runtime[0]]
        room = _room_without(search, use, o, d)
        t = o.tile.edge
        frames = f" x {o.tile.frames} frames" if o.tile.frames else ""
        where = (f"resident on {o.runtime[0]} for the session" if o.persistent else
                 f"on {o.runtime[0]} while {phase} runs, params on {o.params}")
        out.append(f"{size} (full frame) > {o.runtime[0]} room {fmt(room)} -> decoded in "
                   f"{t}x{t} px{frames} tiles (ComfyUI's tiled decode, {fmt(o.tile.headroom)} working "
                   f"memory, {o.tile.work:.1f}x the full-frame pixels: {_ms(o.compute_s)}), "
                   f"{where}; the cpu only when the smallest tile does not fit")
    elif o.kind == "resident":
        d = search.gidx[o.runtime[0]]
        room = _room_without(search, use, o, d)
        if o.persistent:
            out.append(f"{size} <= {o.runtime[0]} room {fmt(room)} -> resident on "
                       f"{o.runtime[0]} for the session")
        else:
            out.append(f"{size} <= {o.runtime[0]} room {fmt(room)} while {phase} runs -> on "
                       f"{o.runtime[0]} only then; params rest on {o.params}, "
                       f"{fmt(o.loaded_bytes)} loaded per generation ({_ms(o.load_s)})"
                       + _why_turns(search, use, o, d))
    elif o.kind == "stream":
        d = search.gidx[o.runtime[0]]
        room = _room_without(search, use, o, d)
        hidden = "hidden under" if o.transfer_s <= o.compute_s else "longer than"
        fits = geo.total + geo.headroom <= room
        if rule.prefix_zero:
            head = f"{size}; offload_mode sequential streams every block"
        elif fits:
            head = (f"{size} fits {o.runtime[0]} room {fmt(room)}, but streaming overlaps its "
                    f"load with compute")
        else:
            head = f"{size} > {o.runtime[0]} room {fmt(room)}"
        out.append(f"{head} -> streamed on {o.runtime[0]}, "
                   f"{o.resident_blocks} of {geo.n} blocks resident, {fmt(o.streamed_bytes)} "
                   f"{_per(o)} streamed from {o.params} (prefetch depth {o.depth}: transfer "
                   f"{_ms(o.transfer_s)} {hidden} compute {_ms(o.compute_s)})")
    elif o.kind == "batch":
        names = "&".join(o.runtime)
        shares = ", ".join(f"{n} {k}" for n, k in o.shares.items())
        if o.each_device == "stream":
            each = (f"streamed on each ({o.resident_blocks} of {geo.n} blocks resident, "
                    f"{fmt(o.streamed_bytes)} {_per(o)} over each device's own link, "
                    f"prefetch depth {o.depth}) from one shared host copy on {o.params}")
        elif o.persistent:
            each = "resident on each for the session"
        else:
            each = (f"on each only while {phase} runs, loaded from one shared host copy on "
                    f"{o.params}")
        out.append(("parallel batch asked; " if rule.batch_only else "")
                   + f"batch of {search.work[c].items} per forward -> batch parallel over "
                   f"{names}: the whole {c} on each device, {each}; items per device "
                   f"{shares}; {_ms(o.forward_s)} per forward vs {_ms(o.serial_s)} on "
                   f"{o.runtime[0]} alone")
    elif o.kind == "split":
        most = max((_room_without(search, use, o, search.gidx[n]) for n in o.runtime), default=0)
        where = "persistent" if o.persistent else f"while {phase} runs, params on {o.params}"
        if o.per_device is not None:
            parts = ", ".join(f"{n} blocks {a}-{b} ({o.per_device[n][0]} resident)"
                              for n, (a, b) in zip(o.runtime, o.ranges))
            streaming = o.runtime[:1] if o.layout == "remote" else \
                o.runtime[len(o.runtime) - o.layout:]
            if o.layout == "remote":
                how = (f"{o.runtime[0]} streaming its range over its own link, "
                       f"{'&'.join(o.runtime[1:])} holding the last blocks on the other "
                       f"machine{'s' if len(o.runtime) > 2 else ''} (activations cross the "
                       f"network twice per forward)")
            elif o.layout == len(o.runtime):
                how = ("in proportion to room, each GPU streaming the tail of its range over "
                       "its own link")
            elif len(streaming) == 1:
                how = (f"{'&'.join(o.runtime[:-1])} filled and fully resident, "
                       f"{streaming[0]} streaming the rest")
            else:
                how = (f"{'&'.join(o.runtime[:-len(streaming)])} filled and fully resident, "
                       f"{'&'.join(streaming)} sharing the rest in proportion to room, each "
                       f"streaming the tail of its range over its own link")
            if rule.split_mode == "row":
                out.append(f"split_mode row needs {fmt(geo.total)} held on "
                           f"{'&'.join(o.runtime)} and a row split cannot stream")
            out.append(f"{size} > what {'&'.join(o.runtime)} hold together -> layer split, "
                       f"{how} ({parts}), params on {o.params}; "
                       f"{fmt(o.streamed_bytes)} {_per(o)} streamed (prefetch depth {o.depth}), "
                       f"{o.hops} hops")
        elif o.ranges is not None:
            parts = ", ".join(f"{n} blocks {a}-{b}" for n, (a, b) in zip(o.runtime, o.ranges))
            why = ("parallel pipeline asked" if rule.pipeline_only
                   else f"{size} > most room on one GPU {fmt(most)}")
            out.append(f"{why} -> layer split over "
                       f"{'&'.join(o.runtime)} in proportion to room ({parts}; "
                       f"{o.runtime[0]} also holds the non-block weights), {where}; "
                       f"{o.hops} hops {_per(o)} ({_ms(o.transfer_s)})")
        else:
            held = {n: o.persist.get(search.gidx[n]) or
                    o.use.get(search.gidx[n], 0) - geo.headroom for n in o.runtime}
            shares = ", ".join(f"{n} {fmt(b)}" for n, b in held.items())
            out.append(f"row split over {'&'.join(o.runtime)} (split_mode row): every block's "
                       f"matrices sliced in proportion to room ({shares}), {where}; "
                       f"{_ms(o.transfer_s)} exchanges {_per(o)}")
    else:
        if rule.runtime == ["cpu"]:
            out.append(f"runs on cpu as asked, {_ms(o.compute_s)} {_per(o)}")
        else:
            need = geo.total + geo.headroom
            if geo.n >= 2:
                need = min(need, geo.stream_weights(0, 0) + geo.headroom)
            if not search.gpus:
                out.append(f"no GPU in the inventory -> runs on cpu, {_ms(o.compute_s)} {_per(o)}")
            else:
                most = max(search.budget[d] - use[o.phase][d] for d in range(search.G))
                on_gpu = (rule.gpus is None or len(rule.gpus) > 0) and any(
                    (rule.persist_res, rule.float_res, rule.stream, rule.persist_split,
                     rule.float_split))
                if on_gpu and need <= most:   # it had room: the cost model chose the cpu
                    out.append(f"{c} needs at least {fmt(need)} on a GPU and {fmt(most)} is "
                               f"left, but the cpu is predicted faster ({_ms(o.compute_s)} "
                               f"{_per(o)}, no copies) -> runs on cpu")
                else:
                    out.append(f"{c} needs at least {fmt(need)} on a GPU, the most left beside "
                               f"the rest is {fmt(most)} -> runs on cpu (last resort), "
                               f"{_ms(o.compute_s)} {_per(o)}")
    if o.parallel == "pipeline" and search.work[c].items < 2:
        out.append(f"parallel pipeline asked; batch of {search.work[c].items} per forward -> "
                   f"pipelined, run as the plain split until a forward brings 2 or more "
                   f"(then the stages run the shares one behind the other)")
    elif o.parallel == "pipeline":
        out.append(("parallel pipeline asked; " if rule.pipeline_only else "")
                   + f"batch of {search.work[c].items} per forward -> pipelined: the stages "
                   f"run the batch's shares one behind the other, {_ms(o.forward_s)} per "
                   f"forward vs {_ms(o.serial_s)} for the plain split")
    if yields:
        out.append(yields)
    if o.source == "disk" and rule.params != "disk":
        if o.kind == "stream":
            geo_k = o.resident_blocks
            in_ram = geo.prefix[geo_k + o.host_blocks] - geo.prefix[geo_k]
            out.append(f"host RAM budget {fmt(search.host_budget)} cannot hold every "
                       f"offloaded component -> params on disk, RAM first: {o.host_blocks} of "
                       f"{geo.n - geo_k} streamed blocks ({fmt(in_ram)}) rest in host RAM, "
                       f"{fmt(o.streamed_bytes - in_ram)} read from disk {_per(o)}; the "
                       f"resident prefix is read from disk each {phase} ({_ms(o.load_s)})")
        else:
            out.append(f"host RAM budget {fmt(search.host_budget)} cannot hold every offloaded "
                       f"component -> params on disk, re-read each {phase} ({_ms(o.load_s)})")
    if options.offload_mode != "auto":
        out.append(f"offload_mode {options.offload_mode}")
    line = parallel_line(search, o)
    if line:
        out.insert(at, line)          # the decision's line stays after it
    return out


_FAMILY = {"none": "plain", "batch": "batch parallel", "pipeline": "pipelined split"}


def _where(o) -> str:
    if o.kind == "batch":
        return f"{o.each_device} on {'&'.join(o.runtime)}"
    if o.kind == "split":
        return f"split over {'&'.join(o.runtime)}"
    return f"{o.kind} on {'&'.join(o.runtime)}"


def alternatives_of(search: Search, c: str) -> Dict[str, float]:
    """Predicted seconds per forward of the best plain, batch-parallel and pipelined
    placement of `c`, each with every GPU to itself (fit's lower bounds)."""
    return {_FAMILY[f]: o.forward_s for f, o in
            sorted((getattr(search, "alternatives", {}) or {}).get(c, {}).items())}


def parallel_line(search: Search, o) -> str:
    """What parallelism was chosen for a component whose batch may be shared, and the
    predicted forward of each alternative (the last reason line: the table shows it)."""
    c = o.comp
    rule = search.rules[c]
    alts = (getattr(search, "alternatives", {}) or {}).get(c, {})
    if search.work[c].items < 2 or not (rule.batch or rule.pipeline) or len(alts) < 2:
        return ""
    others = "; ".join(f"{_FAMILY[f]} {_ms(a.forward_s)} ({_where(a)})"
                       for f, a in sorted(alts.items()) if f != o.parallel)
    why = "asked" if rule.batch_only or rule.pipeline_only else "predicted fastest"
    line = (f"parallel: {_FAMILY[o.parallel]} ({why}), {_ms(o.forward_s)} per forward; "
            f"alternatives, each with every GPU to itself: {others}")
    if not (rule.batch_only or rule.pipeline_only) and \
            any(a.cost < o.cost * (1 - 1e-9) for a in alts.values()):
        line += ("; the faster alone does not fit beside the rest of the plan (GPU or host "
                 "RAM budgets)")
    return line


def _yields_to_asked_split(search: Search, o, chosen) -> str:
    """A turn-taking component on a GPU that an asked split also uses: say that it takes
    turns so the split gets that GPU (an explicit split is never starved by a component
    auto-fit may move)."""
    if o.persistent or o.kind == "cpu" or search.rules[o.comp].params is not None:
        return ""
    mine = set(o.runtime)
    for other, x in sorted(chosen.items()):
        asked = search.rules[other].runtime
        if other == o.comp or x.phase == o.phase or not asked or len(asked) < 2:
            continue
        shared = [n for n in asked if n in mine]
        if shared:
            return (f"takes turns on {'&'.join(shared)}: the asked split of {other} over "
                    f"{'&'.join(asked)} has it while {_ACTION[PHASE_ORDER[x.phase]]} runs")
    return ""


def _why_turns(search: Search, use, o, d: int) -> str:
    """Why a component that takes turns does not stay on its GPU for the session."""
    geo = search.geos[o.comp]
    for p, phase in enumerate(PHASE_ORDER):
        if p == o.phase:
            continue
        if use[p][d] + geo.total > search.budget[d]:
            return (f" (kept there it would leave {phase} {fmt(search.budget[d] - use[p][d])} "
                    f"of the {fmt(geo.total)} it needs)")
    if not search.rules[o.comp].persist_res:
        return ""
    return " (cheaper overall than keeping it there)"


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
        runtime = list(rule.runtime) if rule.runtime and o.kind == "split" else list(o.runtime)
        split_mode = o.split_mode if o.kind == "split" else \
            getattr(choices.get(comp), "split_mode", None) or "layer"
        cp = ComponentPlan(comp, runtime, o.params, split_mode,
                           present=True, total_bytes=search.geos[comp].total,
                           resident_bytes=o.resident_bytes, streamed_bytes=o.streamed_bytes,
                           reasons=reasons_for(search, o, use, options, chosen))
        cp.headroom_bytes = search.geos[comp].headroom
        cp.held_bytes = held_bytes_of(search, o)
        if o.kind == "stream" or o.per_device is not None:
            # a split that streams: resident_blocks counts every device's resident prefix,
            # per_device has {device: [resident, of blocks]}
            cp.stream = StreamPlan(o.resident_blocks, o.depth, o.host_blocks,
                                   {n: list(v) for n, v in (o.per_device or {}).items()})
        if o.tile is not None:
            cp.tile = o.tile.edge
            cp.tile_frames = o.tile.frames
        if o.kind == "split" and o.ranges is not None:
            # the main device may hold only the non-block weights: no range, no key
            cp.blocks = {n: [a, b] for n, (a, b) in zip(o.runtime, o.ranges) if b >= a}
        if o.kind == "batch":
            cp.parallel = "batch"
            cp.split_mode = getattr(choices.get(comp), "split_mode", None) or "layer"
            if o.each_device == "stream":
                cp.stream = StreamPlan(o.resident_blocks, o.depth, 0)
        elif o.parallel == "pipeline":
            cp.parallel = "pipeline"
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
            headroom = max((o.host_use for o in chosen.values() if o.kind == "cpu"), default=0)
        planned = max(per_phase.values()) if per_phase else 0
        devices.append(DevicePlan(dev.name, dev.kind, dev.total_bytes, dev.free_bytes, budget,
                                  planned, dev.description,
                                  search.model.throughput.get(dev.name)))
        table.append({"name": dev.name, "kind": dev.kind, "total_bytes": dev.total_bytes,
                      "free_bytes": dev.free_bytes, "budget_bytes": budget, "budget_from": how,
                      "planned_bytes": planned, "phases": per_phase,
                      "headroom_bytes": headroom, "slack_bytes": budget - planned,
                      "deficit_bytes": max(0, planned - budget)})
    warnings = list(notes)
    for comp, info in infos.items():
        warnings += [f"{comp}: {w}" for w in getattr(info, "warnings", ())]
    for comp, o in sorted(chosen.items()):
        if search.rules[comp].row_fallback and o.kind == "split":
            warnings.append(f"{comp}: split_mode row asked, but no block holds a matrix of "
                            f"at least 256x256 to shard (the runtime would split by layer); "
                            f"planned a layer split")
        elif search.rules[comp].split_mode == "row" and o.kind == "split" and \
                o.split_mode != "row":
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
            "decision": o.kind, "persistent": o.persistent, "phase": PHASES[c],
            "forward_s": o.forward_s, "compute_s": o.compute_s, "transfer_s": o.transfer_s,
            "forwards": o.runs, "load_s": o.load_s, "loaded_bytes": o.loaded_bytes,
            "hops": o.hops, "headroom_bytes": search.geos[c].headroom,
            "parallel": o.parallel,
            "items_per_device": None if o.shares is None else dict(o.shares),
            "serial_forward_s": o.serial_s or None,
            "alternatives_forward_s": alternatives_of(search, c),
            "stream_per_device": None if o.per_device is None else
            {n: list(v) for n, v in o.per_device.items()},
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


def explain_failure(search: Search, options, budgets, host, inventory=None) -> PlacementError:
    """One line: which resource binds (which GPU or host RAM), in which phase, by how
    much, and one change that exists (a CLI flag, freeing memory, the offload mode)."""
    mode = options.offload_mode
    hint = {"none": "use offload_mode auto (or balanced/sequential) to let it stream or take turns",
            "model": "use offload_mode auto to stream what does not fit whole",
            "sequential": "raise max_vram or free GPU memory",
            "balanced": "raise balanced_threshold or use offload_mode auto",
            "auto": "raise max_vram or free GPU memory, or leave the placement to auto-fit"}[mode]
    source = host[1] if isinstance(host, tuple) and len(host) > 1 else ""
    host_hint = {"host_budget": "raise host_budget",
                 "max_vram cpu": "raise max_vram cpu= (--max-vram cpu=SIZE)"}.get(
        source, "free host memory")
    lbs = getattr(search, "lbs", None) or search.lower_bounds()
    most = max(search.budget, default=0)
    for c in search.comps:
        if lbs[c] != float("inf"):
            continue
        geo, rule = search.geos[c], search.rules[c]
        if rule.batch_only:
            return _batch_failure(search, c, options, budgets, host, inventory)
        if rule.pipeline_only:
            return _pipeline_failure(search, c, options, budgets, host, inventory)
        need = geo.total + geo.headroom
        how = "whole"
        if rule.stream and geo.n >= 2:
            k0 = geo.stream_weights(0, 0) + geo.headroom
            if k0 < need:
                need, how = k0, "streamed with no resident block"
        split_devs = search._devices(c) if (rule.float_split or rule.persist_split) else []
        if len(split_devs) >= 2:
            # a split over all its GPUs: every one also holds the working memory
            together = geo.total + len(split_devs) * geo.headroom
            have = sum(search.budget[d] for d in split_devs)
            names = "&".join(search.gpus[d] for d in split_devs)
            if together - have < need - most:
                return PlacementError(
                    f"auto-fit: {c} ({fmt(geo.total)}) fits nowhere under offload_mode "
                    f"{mode}: split over {names} it needs at least {fmt(together)} together "
                    f"(working memory {fmt(geo.headroom)} on each) and their budgets hold "
                    f"{fmt(have)}, short by {fmt(together - have)} for "
                    f"{_ACTION[PHASES[c]]}; {hint}")
        asked = ""
        if rule.runtime is not None or rule.params is not None:
            asked = (f" as asked (runtime {'&'.join(rule.runtime or ['auto'])}, "
                     f"params {rule.params or 'auto'})")
        if rule.runtime == ["cpu"] or (not search.gpus and rule.cpu):
            return PlacementError(
                f"auto-fit: {c} needs {fmt(geo.total + geo.headroom)} of host RAM to run on "
                f"the cpu{asked} but the host budget is {fmt(search.host_budget)}; "
                f"{host_hint}")
        gpu = _roomiest(search, c)
        short = max(0, need - most)
        change = hint
        if mode in ("auto", "sequential") and gpu is not None:
            change = _gpu_change(gpu, short, budgets, options, inventory) + \
                (", or leave the placement to auto-fit" if asked else "")
        where = f" ({gpu}, for {_ACTION[PHASES[c]]})" if gpu is not None else ""
        return PlacementError(
            f"auto-fit: {c} ({fmt(geo.total)}) fits nowhere under offload_mode {mode}{asked}: "
            f"it needs at least {fmt(need)} on a GPU ({how}, working memory "
            f"{fmt(geo.headroom)}) and the largest budget is {fmt(most)}{where}, short by "
            f"{fmt(short)}; {change}")
    # the binding resource: host RAM when more of it alone makes the plan fit (more GPU
    # memory would only hide it), else the GPUs
    host_only = _host_shortfall(search, gpu_extra=0)
    if host_only is not None:
        return PlacementError(
            f"auto-fit: host RAM budget {fmt(search.host_budget)} cannot hold the weights that "
            f"must rest there in every phase (short by {fmt(host_only)}); {host_hint}, or "
            f"{_host_alternative(search)}")
    one = _one_gpu_shortfall(search)
    if one is not None:
        gpu, extra, phase = one
        what = (f"{search.comps[0]} does not fit" if len(search.comps) == 1 else
                "the components fit one at a time but not together")
        on = "the GPU" if len(search.gpus) == 1 else gpu
        change = hint if mode not in ("auto", "sequential") else \
            _gpu_change(gpu, extra, budgets, options, inventory)
        return PlacementError(
            f"auto-fit: {what} under offload_mode {mode}; it would fit with {fmt(extra)} "
            f"more on {on} ({gpu} binds in {phase}); {change}")
    extra = _shortfall(search)
    if extra is not None:
        what = (f"{search.comps[0]} does not fit" if len(search.comps) == 1 else
                "the components fit one at a time but not together")
        gpus = "the GPU" if len(search.gpus) == 1 else "every GPU"
        return PlacementError(
            f"auto-fit: {what} under offload_mode {mode}; it would fit with {fmt(extra)} "
            f"more on {gpus}; {hint}")
    host_need = _host_shortfall(search)
    if host_need is not None:
        return PlacementError(
            f"auto-fit: host RAM budget {fmt(search.host_budget)} cannot hold the weights that "
            f"must rest there (short by {fmt(host_need)}); {host_hint}, or leave params to "
            f"auto-fit so they can rest on disk")
    return PlacementError(f"auto-fit: no placement fits under offload_mode {mode}; {hint}")


def _batch_failure(search: Search, c: str, options, budgets, host, inventory):
    """parallel batch asked and it fits nowhere: each device must hold or stream the
    whole component, and the shared host copy must fit host RAM."""
    geo, rule = search.geos[c], search.rules[c]
    devs = [search.gidx[n] for n in rule.runtime if n in search.gidx] if rule.runtime \
        else sorted(search._devices(c), key=lambda d: -search.budget[d])[:2]
    names = "&".join(search.gpus[d] for d in devs) or "two GPUs"
    if len(devs) < 2:
        return PlacementError(f"auto-fit: {c}: parallel batch needs two or more GPUs it may "
                              f"run on and there are {len(devs)}; drop parallel batch")
    need = geo.total + geo.headroom
    how = "whole"
    if rule.stream and geo.n >= 2:
        need, how = min(need, geo.stream_weights(0, 0) + geo.headroom), \
            "streamed with no resident block"
    low = min(devs, key=lambda d: search.budget[d])
    if need > search.budget[low]:
        return PlacementError(
            f"auto-fit: {c}: parallel batch over {names} needs at least {fmt(need)} on each "
            f"device ({how}, working memory {fmt(geo.headroom)}) and {search.gpus[low]} has "
            f"{fmt(search.budget[low])}, short by {fmt(need - search.budget[low])}; "
            f"{_gpu_change(search.gpus[low], need - search.budget[low], budgets, options, inventory)}"
            f", or drop parallel batch")
    return PlacementError(
        f"auto-fit: {c}: parallel batch over {names} needs its one shared host copy "
        f"({fmt(geo.total)}) in host RAM beside the rest (budget {fmt(search.host_budget)}), "
        f"or room on each device; raise the host budget, or drop parallel batch")


def _pipeline_failure(search: Search, c: str, options, budgets, host, inventory):
    """parallel pipeline asked and it fits nowhere: a pipeline is a resident layer split
    (the cost model does not pipeline a streamed one), so the GPUs must hold the whole
    component together, each also its working memory; a split taking turns also needs
    its host copy in host RAM."""
    geo = search.geos[c]
    devs = search._split_sets(c, search.budget)
    devs = devs[-1] if devs else [d for d in search._devices(c)]
    names = "&".join(search.gpus[d] for d in devs) or "two GPUs"
    if len(devs) < 2:
        return PlacementError(f"auto-fit: {c}: parallel pipeline needs two or more GPUs it "
                              f"may run on and there are {len(devs)}; drop parallel pipeline")
    together = geo.total + len(devs) * geo.headroom
    have = sum(search.budget[d] for d in devs)
    if together > have:
        return PlacementError(
            f"auto-fit: {c}: parallel pipeline over {names} holds the whole {c} "
            f"({fmt(geo.total)}) across them, at least {fmt(together)} with working memory "
            f"{fmt(geo.headroom)} on each, and their budgets hold {fmt(have)}, short by "
            f"{fmt(together - have)} (a streamed split is not pipelined); raise max_vram or "
            f"free GPU memory, or drop parallel pipeline")
    return PlacementError(
        f"auto-fit: {c}: parallel pipeline over {names} fits neither beside the rest of the "
        f"plan on the GPUs nor taking turns with its host copy ({fmt(geo.total)}) in host RAM "
        f"(budget {fmt(search.host_budget)}); raise the host budget or max_vram, or drop "
        f"parallel pipeline")


def _host_alternative(search: Search) -> str:
    """What else frees host RAM: params asked on the cpu could rest on disk; otherwise
    what holds RAM computes on the cpu (its weights must be in RAM), so GPU room helps."""
    asked = [c for c in search.comps if search.rules[c].params == "cpu"]
    if asked:
        return (f"leave params of {', '.join(asked)} to auto-fit so they can rest on "
                f"disk")
    return ("give a GPU room to run what now computes on the cpu (a component computing "
            "on the cpu holds its weights in host RAM)")


def _roomiest(search: Search, c: str):
    """The GPU with the largest budget among those `c` may use (None: no GPU)."""
    devs = search._devices(c) or list(range(search.G))
    if not devs:
        return None
    return search.gpus[max(devs, key=lambda d: (search.budget[d], -d))]


def _gpu_change(gpu: str, extra: int, budgets, options, inventory=None) -> str:
    """The one change that gives `gpu` `extra` more bytes, with the options that exist."""
    budget, how = budgets.get(gpu, (0, ""))
    target = budget + extra
    if inventory is not None:
        dev = inventory.get(gpu)
        if target > dev.total_bytes:
            return (f"{gpu} ({fmt(dev.total_bytes)}) cannot give that much even empty: it "
                    f"needs a larger GPU")
        if target > dev.free_bytes:
            return (f"free {fmt(target - dev.free_bytes)} on {gpu} and raise its budget "
                    f"(--max-vram {gpu}=SIZE)" if how == "max_vram" else
                    f"free {fmt(extra)} more on {gpu} (its budget is its free memory less "
                    f"the {fmt(options.budget_margin)} margin)")
    if how == "max_vram":
        return f"raise max_vram {gpu}= to at least {fmt(target)} (--max-vram {gpu}=SIZE)"
    if how.startswith("balanced"):
        return f"raise balanced_threshold or use offload_mode auto (it gives {gpu} more)"
    return (f"free {fmt(extra)} more on {gpu} (its budget is its free memory less the "
            f"{fmt(options.budget_margin)} margin)")


def _one_gpu_shortfall(search: Search):
    """(gpu, bytes, phase): the least memory one GPU alone needs for the plan to fit, and
    the phase that binds there; None when no single GPU's memory makes it fit."""
    best, seen = None, set()
    for d in range(search.G):
        sig = (search.budget[d], search.tp[d], search.bw[d])
        if sig in seen:
            continue
        seen.add(sig)
        high = sum(g.total + 2 * g.headroom for g in search.geos.values())
        extra = _bisect(lambda x: _retry(search, gpu_extra={d: x}), high)
        if extra is not None and (best is None or extra < best[1]):
            best = (d, extra)
    if best is None:
        return None
    d, extra = best
    trial = _trial(search, gpu_extra={d: extra})
    found = trial.run()
    phase = "every phase"
    if found is not None:
        use = found[2]
        over = [p for p in range(len(PHASE_ORDER)) if use[p][d] > search.budget[d]]
        if over and len(over) < len(PHASE_ORDER):
            phase = " and ".join(_ACTION[PHASE_ORDER[p]] for p in over)
    return search.gpus[d], extra, phase


def _trial(search: Search, gpu_extra=0, host_extra: int = 0) -> Search:
    """The same fit with more memory: `gpu_extra` bytes on every GPU, or {gpu index:
    bytes}."""
    more = gpu_extra if isinstance(gpu_extra, dict) else \
        {d: gpu_extra for d in range(search.G)}
    return Search(search.geos, search.work, search.rules, search.gpus,
                  {g: b + more.get(d, 0) for d, (g, b) in
                   enumerate(zip(search.gpus, search.budget))},
                  search.host_budget + host_extra, search.model, search.depth,
                  search.tiles)


def _retry(search: Search, gpu_extra=0, host_extra: int = 0) -> bool:
    return _trial(search, gpu_extra, host_extra).run() is not None


def _bisect(fits, high: int):
    if not fits(high):
        return None
    low = 0
    while high - low > (1 << 20):                 # to the MiB
        mid = (low + high) // 2
        if fits(mid):
            high = mid
        else:
            low = mid
    return high


def _shortfall(search: Search):
    if not search.gpus:
        return None
    high = sum(g.total + 2 * g.headroom for g in search.geos.values())
    return _bisect(lambda x: _retry(search, gpu_extra=x), high)


def _host_shortfall(search: Search, gpu_extra=None):
    high = sum(g.total + g.headroom for g in search.geos.values())
    big = sum(g.total + 2 * g.headroom for g in search.geos.values())
    more = big if gpu_extra is None else gpu_extra
    return _bisect(lambda x: _retry(search, gpu_extra=more, host_extra=x), high)
