"""The plan the user wrote, without auto-fit: resolved exactly, sized to keep every budget.

Nothing is decided for the user beyond the documented defaults (runtime auto, params =
runtime device, split layer), but what the plan holds is sized so that it runs inside
each device's room (placement/room.py: the budget or the free memory, less one margin):
the resident prefix of a streamed component, a split's block ranges and row shards all
leave room for the component's working memory (its estimate at the workload's size,
or inside ComfyUI what its first call rehearsed). Where what must sit on a device plus
that working memory cannot fit, the plan is refused here in one line: what, where, by
how much, and one change that fixes it. A run never finds out by running out of memory.
"""
import dataclasses
from typing import Dict, List, Optional

from .components import COMPONENTS, PHASES
from .devices import Inventory
from .errors import PlacementError
from .layout import (batch_parallel_bytes, layer_split_bytes, one_device_bytes, owner_of,
                     row_split_applies, row_split_held, row_unsharded)
from .plan import ComponentPlan, DevicePlan, Plan, StreamPlan
from .room import margin_for
from .units import format_bytes

# Components whose blocks the runtime streams when stream_layers is on without auto-fit
# (as sd.cpp, plus text encoders: a T5-XXL or an LLM on a small GPU).
STREAMED_BY_DEFAULT = ("diffusion", "te")
DEFAULT_PREFETCH_DEPTH = 1


def device_plans(inventory: Inventory, budgets: Dict[str, Optional[int]]) -> List[DevicePlan]:
    return [DevicePlan(d.name, d.kind, d.total_bytes, d.free_bytes, budgets.get(d.name),
                       description=d.description,
                       margin_bytes=margin_for(d, budget=budgets.get(d.name)))
            for d in inventory.devices]


def working_memory(info) -> Optional[int]:
    """The component's working memory where it computes (its estimate, kernel workspace
    included, or what its first call rehearsed); None: not known before it runs, since
    its architecture is not known (a fixed reserve is a guess, not a reason to refuse a
    plan: place() rehearses the first call and sizes the placement from it)."""
    from .metadata.headroom import FIXED
    if info is None or info.headroom_bytes is None or \
            (info.headroom_basis or "").startswith(FIXED):
        return None
    return max(0, int(info.headroom_bytes))


def _set_working_memory(cp: ComponentPlan, info) -> None:
    cp.headroom_bytes = working_memory(info)
    if info is not None and cp.headroom_bytes is None:
        cp.reasons.append("working memory not planned: its architecture is not known, so "
                          "the run measures it (place() rehearses the first call)")
    if cp.headroom_bytes is not None and info.headroom_per_device:
        cp.headroom_per_device = {d: max(0, int(b)) for d, b in info.headroom_per_device
                                  if d in cp.runtime}


def explicit_plan(request, inventory: Inventory, infos) -> Plan:
    """The plan, or the one-line refusal. A component whose working memory the run
    measures before any weight moves (ComponentInfo.headroom_measured_later) and whose
    estimate alone makes the plan not fit is planned with its working memory unknown
    (said in its reasons and the plan's warnings); the run's re-plan with what it
    measured keeps the budget, or refuses then, in one line, before any weight moves."""
    try:
        return _explicit_plan(request, inventory, infos)
    except PlacementError as refusal:
        later = [c for c, i in infos.items() if i is not None and
                 i.headroom_measured_later and working_memory(i) is not None]
        if not later:
            raise
        try:
            plan = _explicit_plan(request, inventory, infos, unknown=set(later))
        except PlacementError:
            raise refusal from None       # the weights alone do not fit either
    for comp in later:
        estimate = format_bytes(working_memory(infos[comp]))
        plan.components[comp].reasons.append(
            f"working memory measured at the first model call: the estimate "
            f"({estimate}) does not fit beside the weights here; the run is "
            f"planned again with what the first call needs, or refused then in one line "
            f"before any weight moves")
        plan.warnings.append(f"{comp}: the working-memory estimate ({estimate}) does not "
                             f"fit this plan; the first model call measures it")
    return plan


def _explicit_plan(request, inventory: Inventory, infos, unknown=frozenset()) -> Plan:
    """parallel batch / pipeline are marked by placement/parallel.py (refused in one line
    where the runtime names one device, or pipeline with a row split). `unknown`:
    components planned without their working memory (explicit_plan)."""
    default = inventory.default_device().name
    warnings = list(request.warnings)
    devices = device_plans(inventory, request.budgets)
    by_name = {d.name: d for d in devices}
    comps: Dict[str, ComponentPlan] = {}
    for comp in COMPONENTS:
        choice = request.choices[comp]
        info = infos.get(comp)
        runtime = choice.runtime or [default]
        reasons = [f"runtime {'&'.join(runtime)} "
                   f"({'asked' if choice.runtime else 'auto: ' + _auto_reason(inventory)})"]
        params = choice.params or runtime[0]
        reasons.append(f"params {params} ({'asked' if choice.params else 'with the runtime'})")
        cp = ComponentPlan(comp, runtime, params, choice.split_mode or "layer",
                           present=info is not None,
                           total_bytes=info.total_bytes if info else 0, reasons=reasons)
        _set_working_memory(cp, info)
        if comp in unknown:
            cp.headroom_bytes, cp.headroom_per_device = None, {}
        if choice.parallel == "batch":
            from .parallel import batch_parallel
            batch_parallel(cp)
        elif choice.parallel == "pipeline":
            from .parallel import pipeline_split
            pipeline_split(cp)
        _streaming(cp, request, by_name, info)
        if cp.is_split and cp.parallel != "batch":
            _split_ranges(cp, by_name, info)
        if cp.parallel == "pipeline" and cp.blocks and len(cp.blocks) < 2:
            warnings.append(f"{comp}: parallel pipeline has one stage: every block's range "
                            f"is on {next(iter(cp.blocks))} ({len(info.blocks)} block(s)), "
                            f"so it runs as a plain layer split")
        _sizes(cp, info, by_name)
        comps[comp] = cp
    _fill_the_room(comps, infos, by_name, request)
    refuse_what_the_runtime_refuses(devices, comps, infos)
    phases = _account(devices, comps, infos, warnings)
    plan = Plan(devices, comps, warnings)
    plan.extra["device_phases"] = phases     # what planned_bytes is the max of (the editor draws it)
    return plan


def _auto_reason(inventory: Inventory) -> str:
    d = inventory.default_device()
    return {"gpu": "first GPU", "igpu": "no GPU, integrated GPU"}.get(d.kind, "no GPU, CPU")


def _work(cp: ComponentPlan, device: Optional[str] = None) -> int:
    """Working memory planned on `device` (default: the main device)."""
    return cp.headroom_on(device or cp.main_device)


def _streaming(cp: ComponentPlan, request, by_name, info) -> None:
    """stream_layers without auto-fit: stream diffusion and text encoders that compute on
    an accelerator. Streaming needs the weights to rest off the device; like sd.cpp we
    then rest them in host memory, but we say so. With a budget, the resident prefix is
    the largest that leaves the ring and the working memory room; a prefetch ring that
    does not fit beside the working memory falls back to synchronous loads (depth 0),
    said in the reasons."""
    if not request.stream_layers or cp.component not in STREAMED_BY_DEFAULT:
        return
    if by_name[cp.main_device].kind == "cpu":
        cp.reasons.append("not streamed: it computes on the CPU")
        return
    if cp.params in cp.runtime:
        cp.params = "cpu"
        cp.reasons.append("stream_layers needs weights off the device: params -> cpu")
    resident, depth = 0, DEFAULT_PREFETCH_DEPTH
    budget = request.budgets.get(cp.main_device)
    devices = cp.runtime if cp.parallel == "batch" else [cp.main_device]
    if cp.parallel == "batch":               # every device streams: the smallest budget
        from .parallel import smallest_budget
        budget = smallest_budget(cp, request.budgets)
    if info is not None and info.blocks and (not cp.is_split or cp.parallel == "batch"):
        from .fit.geometry import Geometry
        geo = Geometry(info, headroom=max(_work(cp, d) for d in devices))
        room = min(by_name[d].room_bytes - _work(cp, d) for d in devices)
        if budget is not None:
            resident = geo.best_prefix(room, depth)
        if geo.best_prefix(room, depth) is None:
            # the least a stream holds: one block at a time (refused below where even
            # that does not fit, with the smallest shortfall)
            depth = 0
            cp.reasons.append(f"prefetch off (depth 0): a ring of two blocks does not fit "
                              f"beside {format_bytes(geo.headroom)} of working memory on "
                              f"{cp.main_device}" + (", one block at a time does"
                                                      if geo.best_prefix(room, 0) is not None
                                                      else ""))
        resident = resident or 0
    cp.stream = StreamPlan(resident, depth)
    if cp.is_split and cp.parallel != "batch":
        cp.reasons.append(f"streamed: each device of the split streams the tail of its "
                          f"range, prefetch depth {depth}")
        return
    cp.reasons.append(f"streamed on {cp.main_device}: first {resident} blocks resident, "
                      f"prefetch depth {depth}" + ("" if budget is not None or not resident
                                                   else " (no budget set)"))


def _fill_the_room(comps: Dict[str, ComponentPlan], infos, by_name, request) -> None:
    """stream_layers with no budget on the diffusion model's devices: its resident prefix
    fills the device's room (free memory less the margin) less its working memory and
    what the other components of its phase hold there, so streaming alone uses the card
    (batch parallel: the smallest such room, every device streams the same prefix). Only
    the diffusion model: it runs every step, where a resident block saves a copy per
    step; a text encoder runs once. A budget (or a layer split, which sizes each range's
    prefix to its device) is left as sized; so is a working memory still to be measured
    (the first call's re-plan fills it then)."""
    cp, info = comps.get("diffusion"), infos.get("diffusion")
    if (cp is None or info is None or not cp.present or cp.stream is None
            or cp.parallel not in ("none", "batch") or (cp.is_split and cp.parallel != "batch")
            or not info.blocks or cp.headroom_bytes is None):
        return
    devices = cp.runtime if cp.parallel == "batch" else [cp.main_device]
    if any(request.budgets.get(d) is not None or by_name[d].kind == "cpu" for d in devices):
        return
    from .fit.geometry import Geometry
    phase, depth = PHASES["diffusion"], cp.stream.prefetch_depth
    neighbours = [o for o in comps.values() if o is not cp and o.present
                  and infos.get(o.component) is not None and PHASES[o.component] == phase]
    rooms, others = [], {}
    for d in devices:
        others[d] = sum(_held(o, infos[o.component], by_name).get(d, 0) for o in neighbours)
        rooms.append(capacity(by_name[d]) - _work(cp, d) - others[d])
    geo = Geometry(info, headroom=max(_work(cp, d) for d in devices))
    k = geo.best_prefix(min(rooms), depth)
    if k is None or k <= cp.stream.resident_blocks:
        return
    cp.stream = dataclasses.replace(cp.stream, resident_blocks=k)
    _sizes(cp, info, by_name)
    main = cp.main_device
    where = main if len(devices) == 1 else f"each of {', '.join(devices)}"
    with_others = f" and {format_bytes(max(others.values()))} of other {phase} components" \
        if any(others.values()) else ""
    cp.reasons = [r for r in cp.reasons if not r.startswith(f"streamed on {main}: first ")]
    cp.reasons.append(f"streamed on {main}: first {k} of {len(info.blocks)} blocks resident, "
                      f"prefetch depth {depth} (no budget: they fill {where}'s free memory "
                      f"less its margin, {format_bytes(_work(cp))} of working memory"
                      f"{with_others}; set max_vram {main} to leave room for other programs)")


def _split_ranges(cp: ComponentPlan, by_name, info) -> None:
    """Block ranges that fit each device's room (its room less the working memory, the
    main device's less the non-block weights too), cut as near the rooms' proportion as
    that allows; where none fits, in proportion to the rooms (each device then streams
    the tail of its range, or the plan is refused below)."""
    from .ranges import fitting_ranges, proportional_ranges
    if info is None or not info.blocks:
        cp.reasons.append(f"{cp.split_mode} split over {', '.join(cp.runtime)} "
                          f"(ranges set when the model is known)")
        return
    if len(info.blocks) == 1:
        # nothing to cut (no recognised blocks): stable-diffusion.cpp's rule, the whole
        # module on the first listed device
        cp.blocks = {cp.runtime[0]: [0, 0]}
        cp.reasons.append(f"{cp.split_mode} split over {', '.join(cp.runtime)}: no blocks "
                          f"to split, so it runs whole on {cp.runtime[0]} (the first listed)")
        return
    rooms = [max(0, by_name[d].room_bytes - _work(cp, d)) for d in cp.runtime]
    rooms[0] = max(0, rooms[0] - info.non_block_bytes)   # the main device holds those
    sizes = [b.nbytes for b in info.blocks]
    ranges = fitting_ranges(sizes, cp.runtime, rooms)
    how = "to fit each device's room"
    if ranges is None:
        ranges = proportional_ranges(sizes, cp.runtime, [float(r) for r in rooms])
        how = "in proportion to each device's room (the blocks do not fit whole)"
    cp.blocks = ranges
    work = ", ".join(f"{d} {format_bytes(_work(cp, d))}" for d in cp.runtime)
    cp.reasons.append(f"{cp.split_mode} split over {', '.join(cp.runtime)} {how}, after "
                      f"the working memory ({work}) and the non-block weights on "
                      f"{cp.runtime[0]}: " + ", ".join(
                          f"{d} blocks {r[0]}-{r[1]}" for d, r in cp.blocks.items()))


def _split_prefixes(cp: ComponentPlan, info, by_name) -> bool:
    """A streamed layer split: each device keeps resident the largest prefix of its range
    that fits its room beside the ring (the runtime's rule, layout.range_prefix: budget or
    free memory, less working memory and margin, the main device's less the non-block
    weights), so the plan says what the run keeps. False: not such a split."""
    from .layout import range_prefix
    if cp.stream is None or not cp.is_split or cp.parallel == "batch" or \
            cp.split_mode == "row" or not cp.blocks or not info.blocks:
        return False
    sizes = [b.nbytes for b in info.blocks]
    owner = owner_of(cp.blocks, cp.runtime, len(sizes))
    if owner is None:
        return False
    depth = max(0, cp.stream.prefetch_depth)
    resident, streamed, per_device = info.non_block_bytes, 0, {}
    for d, name in enumerate(cp.runtime):
        mine = [s for s, o in zip(sizes, owner) if o == d]
        if not mine:
            continue
        room = capacity(by_name[name]) - _work(cp, name) - \
            (info.non_block_bytes if d == 0 else 0)
        k = range_prefix(mine, room, depth, True)
        k = 0 if k is None else k          # refused below, by the least it needs
        per_device[name] = [k, len(mine)]
        resident += sum(mine[:k])
        streamed += sum(mine[k:])
    cp.stream = StreamPlan(sum(k for k, _ in per_device.values()), depth,
                           per_device=per_device)
    cp.resident_bytes, cp.streamed_bytes = resident, streamed
    cp.reasons.append("streamed split: " + ", ".join(
        f"{n} keeps {k} of its {of} blocks resident" for n, (k, of) in per_device.items()))
    return True


def _sizes(cp: ComponentPlan, info, by_name=None) -> None:
    if info is None:
        return
    if by_name is not None and _split_prefixes(cp, info, by_name):
        return
    if cp.stream is not None:
        blocks = info.blocks
        k = cp.stream.resident_blocks
        cp.resident_bytes = info.non_block_bytes + sum(b.nbytes for b in blocks[:k])
        cp.streamed_bytes = sum(b.nbytes for b in blocks[k:])
    else:
        cp.resident_bytes = info.total_bytes    # while its phase runs


def capacity(dev: DevicePlan) -> int:
    """The runtime's ledger capacity on a device (runtime/target.open_target): its room."""
    return dev.room_bytes


def _rooms(cp: ComponentPlan, by_name) -> List[int]:
    """Room for weights on each runtime device: its room less the working memory."""
    return [capacity(by_name[d]) - _work(cp, d) for d in cp.runtime]


def _held(cp: ComponentPlan, info, by_name) -> Dict[str, int]:
    """Weight and ring bytes the runtime allocates on each device for `cp`, by its own
    arithmetic (placement/layout.py). A device over its room is one the runtime
    refuses; its figure is then the least the runtime would need there."""
    sizes = [max(0, int(b.nbytes)) for b in info.blocks]
    non_block = max(0, int(info.total_bytes) - sum(sizes))
    depth = max(0, cp.stream.prefetch_depth) if cp.stream is not None else 0
    if cp.parallel == "batch":              # a whole copy (or stream) on every device
        stream = (cp.stream.resident_blocks, depth) if cp.stream is not None else None
        return dict(zip(cp.runtime, batch_parallel_bytes(non_block, sizes,
                                                         [stream] * len(cp.runtime))))
    if cp.is_split and cp.split_mode == "row" and row_split_applies(info):
        held = row_split_held(info, _rooms(cp, by_name))
        return dict(zip(cp.runtime, held)) if held is not None else \
            {cp.main_device: row_unsharded(info)}
    owner = owner_of(cp.blocks, cp.runtime, len(sizes)) if cp.is_split and cp.blocks \
        else None
    if owner is None:
        stream = (cp.stream.resident_blocks, depth) if cp.stream is not None and sizes \
            else None
        return {cp.main_device: one_device_bytes(non_block, sizes, stream)}
    held = layer_split_bytes(non_block, sizes, owner, _rooms(cp, by_name), depth,
                             cp.stream is not None)
    return {d: b for d, b in zip(cp.runtime, held) if b or d == cp.main_device}


def _fix(cp: ComponentPlan, info, dev: DevicePlan, need: int, work: int,
         devices: List[DevicePlan] = ()) -> str:
    """One change that makes what `cp` needs on `dev` fit (a budget raised past the
    free memory would not: the runtime caps it there; a split only where another
    accelerator of the inventory can take a range)."""
    name = dev.name
    others = [d.name for d in devices if d.kind != "cpu" and d.name != name]
    raise_it = f"raise max_vram {name} to {format_bytes(need + dev.margin_bytes)} or more"
    can_raise = need + dev.margin_bytes <= dev.free_bytes
    if dev.kind == "cpu":
        return raise_it if dev.budget_bytes is not None and can_raise else \
            f"free host memory, or run {cp.component} on a GPU"
    if cp.is_split and cp.split_mode == "row" and row_split_applies(info):
        return raise_it if can_raise else \
            "use split_mode layer with stream_layers (a row split does not stream)"
    if cp.stream is None and cp.component in STREAMED_BY_DEFAULT and info.blocks:
        return "turn on stream_layers" + (" (each device streams its range)"
                                          if cp.is_split else "")
    if not cp.is_split and info.blocks and cp.component in STREAMED_BY_DEFAULT and others:
        split = f"split it (e.g. {cp.component}={name}&{others[0]})"
        return f"{raise_it}, or {split}" if can_raise else split
    if can_raise:
        return raise_it
    if work and cp.component in ("diffusion", "vae", "controlnet"):
        return f"free {format_bytes(need + dev.margin_bytes - dev.free_bytes)} on {name}, " \
               f"or lower the resolution, frames or batch (its working memory is " \
               f"{format_bytes(work)})"
    instead = "give it fewer blocks (add a device to the split)" if cp.is_split else \
        f"run it on the CPU (backend {cp.component}=cpu)"
    return f"free {format_bytes(need + dev.margin_bytes - dev.free_bytes)} on {name}, or " \
           f"{instead}"


def _what(cp: ComponentPlan, info) -> str:
    if cp.parallel == "batch":
        return "its copy of the model" + (" (streamed)" if cp.stream is not None else "")
    if cp.is_split and cp.split_mode == "row" and row_split_applies(info):
        return "its row shards and unsharded weights"
    if cp.stream is not None and not cp.is_split:
        return "its streaming ring and resident blocks"
    return "its block range" if cp.is_split else "its weights"


def _room_words(dev: DevicePlan) -> str:
    what = "budget" if dev.budget_bytes is not None and \
        (dev.kind == "cpu" or dev.budget_bytes <= dev.free_bytes) else "free memory"
    amount = dev.budget_bytes if what == "budget" else dev.free_bytes
    margin = f" less its {format_bytes(dev.margin_bytes)} margin" if dev.margin_bytes else ""
    return f"the {what} of {dev.name} ({format_bytes(amount)}{margin}) leaves " \
           f"{format_bytes(dev.room_bytes)}"


def _refuse_no_shard_room(cp: ComponentPlan, info, by_name) -> None:
    """A row split whose main device's unsharded weights leave no device room for a
    shard: runtime/engine.room_weights refuses it."""
    if not (cp.is_split and cp.split_mode == "row" and cp.parallel != "batch" and
            row_split_applies(info)) or row_split_held(info, _rooms(cp, by_name)) is not None:
        return
    main = by_name[cp.main_device]
    need = row_unsharded(info) + _work(cp)
    raise PlacementError(
        f"{main.name}: {cp.component} keeps {format_bytes(row_unsharded(info))} of unsharded "
        f"weights and {format_bytes(_work(cp))} of working memory there and no device of "
        f"{'&'.join(cp.runtime)} has room left for a row shard: {_room_words(main)}, short "
        f"by {format_bytes(need - capacity(main) + 1)} or more; raise max_vram {main.name}, "
        f"or give another device of the split memory")


def _computes_there(cp: ComponentPlan, device: str) -> bool:
    """Whether `cp` computes on `device` (its working memory is there): the main device
    always; in a layer split a device with a block range; row and batch splits on each."""
    if device not in cp.runtime:
        return False
    if device == cp.main_device or not cp.is_split or not cp.blocks or \
            cp.parallel == "batch" or cp.split_mode == "row":
        return True
    return device in cp.blocks


def refuse_what_the_runtime_refuses(devices: List[DevicePlan],
                                    comps: Dict[str, ComponentPlan], infos) -> None:
    """An explicit plan whose weights, ring and working memory cannot fit where it puts
    them (each device's room: its budget, else its free memory, less its margin; on the
    host the budget as given) is refused here, in one line naming the device, what does
    not fit, by how much and one change that fixes it. The working memory of a phase is
    the largest of the components that compute on the device in it (they run one after
    another). The host is checked where a component computes there (its ledger);
    weights resting in RAM for a GPU are not allocated by the runtime (the module holds
    them), so RAM short of them is warned about (_account), not refused."""
    by_name = {d.name: d for d in devices}
    held: Dict[tuple, List[tuple]] = {}
    work: Dict[tuple, tuple] = {}
    for cp in comps.values():
        info = infos.get(cp.component)
        if not cp.present or info is None or any(d not in by_name for d in cp.runtime):
            continue
        _refuse_no_shard_room(cp, info, by_name)
        phase = PHASES[cp.component]
        for d, b in _held(cp, info, by_name).items():
            if b > 0:
                held.setdefault((d, phase), []).append((b, cp))
        for d in cp.runtime:
            if _computes_there(cp, d) and _work(cp, d) > work.get((d, phase), (0, None))[0]:
                work[(d, phase)] = (_work(cp, d), cp)
    order = {d.name: i for i, d in enumerate(devices)}
    for key in sorted(set(held) | set(work), key=lambda k: (order[k[0]], k[1])):
        name, phase = key
        dev = by_name[name]
        parts = held.get(key, [])
        w, wcp = work.get(key, (0, None))
        limit = capacity(dev)
        total = sum(b for b, _ in parts) + w
        if total <= limit:
            continue
        b, cp = max(parts, key=lambda x: x[0]) if parts else (0, wcp)
        info = infos.get(cp.component)
        others = f" (with {format_bytes(total - b - w)} of other {phase} components)" \
            if len(parts) > 1 else ""
        working = f" and {format_bytes(w)} of working memory for {wcp.component}" \
            if w else ""
        raise PlacementError(
            f"{name}: {cp.component} needs {format_bytes(b)} for {_what(cp, info)}"
            f"{working} there{others} but {_room_words(dev)}, short by "
            f"{format_bytes(total - limit)}; {_fix(cp, info, dev, total, w, devices)}")


def _account(devices: List[DevicePlan], comps: Dict[str, ComponentPlan], infos,
             warnings: List[str]) -> Dict[str, Dict[str, int]]:
    """Planned bytes per device at its busiest phase (every byte it holds: weights,
    ring, a split's range on the host too, and working memory), and a warning where
    host RAM is short of the weights resting there. Returns the bytes per device and
    phase they are the maximum of."""
    by_name = {d.name: d for d in devices}
    per_phase: Dict[str, Dict[str, int]] = {}
    for cp in comps.values():
        if not cp.present:
            continue
        info = infos.get(cp.component)
        share = _held(cp, info, by_name) if info is not None else \
            {cp.main_device: cp.resident_bytes}
        for d, b in share.items():
            if by_name[d].kind == "cpu" and not cp.is_split:
                continue                # counted below: resting there, or read from disk
            per_phase.setdefault(d, {}).setdefault(PHASES[cp.component], 0)
            per_phase[d][PHASES[cp.component]] += b
    # host RAM: weights resting on the cpu stay there for the session; a component the
    # cpu computes from disk holds its weights there while its phase runs
    host = sum(cp.total_bytes for cp in comps.values() if cp.present and cp.params == "cpu")
    read = {}
    for cp in comps.values():
        if cp.present and cp.params == "disk" and cp.main_device == "cpu":
            phase = PHASES[cp.component]
            read[phase] = read.get(phase, 0) + cp.total_bytes
    resting = {}
    for dev in devices:
        if dev.kind != "cpu":
            continue
        placed = per_phase.pop(dev.name, {})
        # a split's range on the host is a copy the runtime makes beside the resting ones
        phases = set(placed) | set(read)
        if host or phases:
            per_phase[dev.name] = {p: host + read.get(p, 0) + placed.get(p, 0)
                                   for p in phases} or {"session": host}
            resting[dev.name] = host
    work: Dict[str, Dict[str, tuple]] = {}
    for cp in comps.values():
        if not cp.present or cp.headroom_bytes is None:
            continue
        for d in cp.runtime:            # the host too, where the component computes there
            if d in by_name and _computes_there(cp, d):
                phase = PHASES[cp.component]
                if _work(cp, d) > work.get(d, {}).get(phase, (0, ""))[0]:
                    work.setdefault(d, {})[phase] = (_work(cp, d), cp.component)
    for d, phases in work.items():
        for phase, (w, _) in phases.items():
            mine = per_phase.setdefault(d, {})
            # the host's weights resting there for the session are there in every phase
            mine[phase] = mine.get(phase, mine.get("session", 0)) + w
    for name, phases in per_phase.items():
        dev = by_name[name]
        dev.planned_bytes = max(phases.values())
        limit = capacity(dev)
        if dev.planned_bytes <= limit:
            continue
        # what refuse_what_the_runtime_refuses leaves: the host's resting weights, and
        # components described by size only (no blocks known to check)
        what = "budget" if dev.budget_bytes is not None else "free memory"
        if dev.kind == "cpu":
            warnings.append(f"{name}: plan needs {format_bytes(dev.planned_bytes)} "
                            f"({format_bytes(resting.get(name, 0))} of weights resting "
                            f"there) but the {what} is {format_bytes(limit)}; turn on "
                            f"auto_fit, put params on disk, or free host memory")
        else:
            warnings.append(f"{name}: plan needs {format_bytes(dev.planned_bytes)} but its "
                            f"room is {format_bytes(limit)}; turn on auto_fit or "
                            f"stream_layers")
    return per_phase
