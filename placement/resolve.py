"""Resolve a PlacementSpec against an inventory into a Plan.

Without auto_fit the plan is exactly what the user asked for (issue 2); with it,
placement.fit decides what the user left unset. Both start from the same Request.
"""
import copy
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from .capabilities import DEFAULT_EXECUTOR, check_executor, check_plan
from .components import COMPONENTS
from .devices import Inventory
from .errors import PlacementError
from .layout import (batch_parallel_bytes, layer_split_bytes, one_device_bytes, owner_of,
                     row_split_applies, row_split_held, row_unsharded)
from .plan import ComponentPlan, DevicePlan, Plan, StreamPlan
from .spec import PlacementSpec
from .units import format_bytes

# Components whose blocks the runtime streams when stream_layers is on without auto-fit
# (as sd.cpp, plus text encoders: a T5-XXL or an LLM on a small GPU).
STREAMED_BY_DEFAULT = ("diffusion", "te")
DEFAULT_PREFETCH_DEPTH = 1


@dataclass
class Choice:
    """What the user asked for one component, resolved against the inventory."""
    runtime: Optional[List[str]]      # device names (len > 1: a split); None: unset
    params: Optional[str]             # device name | 'cpu' | 'disk'; None: unset
    split_mode: Optional[str]         # 'layer' | 'row'; None: unset
    parallel: Optional[str] = None    # 'batch' | 'pipeline' | 'none'; None: unset (none)


@dataclass
class Request:
    choices: Dict[str, Choice]
    budgets: Dict[str, Optional[int]]  # device -> bytes; None: no budget given
    stream_layers: bool
    warnings: List[str] = field(default_factory=list)
    offload_mode: str = "auto"
    # what fell back, as data (the editor shows these, it never parses the warnings):
    # {"component": name or None, "field": backend | params | max_vram, "asked": token,
    #  "why": the device error}; the plan JSON carries them as "fallbacks"
    fallbacks: List[dict] = field(default_factory=list)


def _resolve_name(inventory: Inventory, token: str, strict: bool, where: str,
                  warnings: List[str], fallback: str = "falling back to auto",
                  fallbacks: Optional[List[dict]] = None, component: Optional[str] = None,
                  field_name: str = "backend") -> Optional[str]:
    try:
        return inventory.resolve(token).name
    except PlacementError as exc:
        if strict:
            raise
        warnings.append(f"{where}: {exc}; {fallback}")
        if fallbacks is not None:
            fallbacks.append({"component": component, "field": field_name, "asked": token,
                              "why": str(exc)})
        return None


def _resolve_runtime(inventory, tokens, strict, where, warnings, fallbacks=None,
                     component=None) -> Optional[List[str]]:
    if tokens is None:
        return None
    names = []
    for token in tokens:
        name = _resolve_name(inventory, token, strict, where, warnings, fallbacks=fallbacks,
                             component=component)
        if name is None:
            continue
        if name in names:
            raise PlacementError(f"{where}: invalid device list {'&'.join(tokens)!r}: "
                                 f"{name} is named twice")
        names.append(name)
    return names or None


def _resolve_budget(inventory: Inventory, value: int, device: str) -> Optional[int]:
    if value == 0:
        return None
    if value > 0:
        return value
    free = inventory.get(device).free_bytes
    if free + value < 0:
        raise PlacementError(f"max_vram {device}={format_bytes(value)} resolves below zero: "
                             f"{device} has {format_bytes(free)} free; give a negative "
                             f"budget above -{format_bytes(free)}, a positive one, or 0 (off)")
    return free + value


def resolve_request(spec: PlacementSpec, inventory: Inventory, strict: bool = True) -> Request:
    if not isinstance(spec, PlacementSpec):
        raise PlacementError(f"expected a PlacementSpec, got {type(spec).__name__}")
    warnings: List[str] = []
    fallbacks: List[dict] = []
    choices = {}
    for comp in COMPONENTS:
        runtime = _resolve_runtime(inventory, spec.runtime.for_component(comp), strict,
                                   f"backend for {comp}", warnings, fallbacks, comp)
        params_token = spec.params.for_component(comp)
        params = params_token
        if params_token not in (None, "disk"):
            params = _resolve_name(inventory, params_token, strict,
                                   f"params backend for {comp}", warnings,
                                   fallbacks=fallbacks, component=comp, field_name="params")
        choices[comp] = Choice(runtime, params, spec.split.for_component(comp),
                               spec.parallelism.for_component(comp))

    budgets: Dict[str, Optional[int]] = {d.name: None for d in inventory.devices}
    if spec.budgets.default is not None:       # a bare number: every accelerator
        for d in inventory.accelerators():
            budgets[d.name] = _resolve_budget(inventory, spec.budgets.default, d.name)
    for token, value in spec.budgets.modules.items():
        name = _resolve_name(inventory, token, strict, "max_vram key", warnings,
                             "that budget is ignored", fallbacks, None, "max_vram")
        if name is not None:
            budgets[name] = _resolve_budget(inventory, value, name)
    return Request(choices, budgets, spec.stream_layers, warnings, spec.offload_mode,
                   fallbacks)


def describe_components(components, resolution=(1024, 1024), frames=1, batch=1):
    """{component: path | [paths] | nn.Module | ComponentInfo} -> {component: ComponentInfo}."""
    if not components:
        return {}
    from .components import canonical_component
    from .metadata import describe_component
    infos = {}
    for key, sources in components.items():
        comp = canonical_component(key)
        if not isinstance(sources, (list, tuple)):
            sources = [sources]
        infos[comp] = describe_component(comp, list(sources), resolution=resolution,
                                         frames=frames, batch=batch)
    return infos


def device_plans(inventory: Inventory, budgets: Dict[str, Optional[int]]) -> List[DevicePlan]:
    return [DevicePlan(d.name, d.kind, d.total_bytes, d.free_bytes, budgets.get(d.name),
                       description=d.description) for d in inventory.devices]


def plan(spec: PlacementSpec, inventory: Inventory, components=None, strict: bool = True,
         *, resolution=(1024, 1024), frames: int = 1, batch: int = 1,
         executor: str = DEFAULT_EXECUTOR, pins: Optional[Dict[str, ComponentPlan]] = None,
         **fit_options) -> Plan:
    """Resolve `spec` for the seven components. `components` describes what is loaded
    ({component: path | [paths] | nn.Module | ComponentInfo}); with auto_fit it is what
    the planner fits, without it sizes only fill in the report and the warnings.
    `executor` is who runs the plan ('runtime': runtime.place, 'comfyui': the ComfyUI
    adapter): auto-fit proposes only what it runs (placement/capabilities.py), and an
    explicit request it cannot run is a PlacementError naming what is missing.
    `pins` ({component: ComponentPlan}, auto-fit only): placements already made (inside
    ComfyUI the text encoders ran before sampling re-plans); kept as they are."""
    from .lora import decide_lora
    executor = check_executor(executor)
    request = resolve_request(spec, inventory, strict)
    infos = with_workspace(describe_components(components, resolution, frames, batch),
                           inventory)
    pins = {c: cp for c, cp in (pins or {}).items() if c in infos} if spec.auto_fit else {}
    for comp, cp in pins.items():
        request.choices[comp] = Choice(list(cp.runtime), cp.params, cp.split_mode)
    if spec.auto_fit:
        from .parallel import check_with_auto_fit
        check_with_auto_fit(request)
        from .fit import FitOptions, fit
        options = FitOptions(offload_mode=spec.offload_mode, resolution=resolution,
                             frames=frames, batch=batch, executor=executor, **fit_options)
        result = fit(request, inventory, infos, options)
        result.warnings[:0] = request.warnings
    else:
        if fit_options:
            raise PlacementError(f"option(s) {', '.join(sorted(fit_options))} need auto_fit")
        result = explicit_plan(request, inventory, infos)
        result.warnings.extend(_unused_without_auto_fit(spec, inventory, request))
        result.warnings.extend(_unused_budgets(result, inventory, request))
    if request.fallbacks:
        result.extra["fallbacks"] = [dict(f) for f in request.fallbacks]
    decide_lora(result, infos, spec.lora_mode)
    for comp, info in infos.items():          # GGUF: the type(s) its weights rest in
        if info.quant and comp in result.components:
            result.components[comp].quant = info.quant
    for comp, cp in pins.items():
        result.components[comp] = copy.deepcopy(cp)
    # what was described; inside ComfyUI also what the spec names per module (Backend
    # Assignment plans before the models are connected: its error comes at queue time)
    named = set(spec.runtime.modules) | set(spec.params.modules) | set(spec.split.modules) \
        if executor == "comfyui" else set()
    check_plan(result, inventory, executor,
               [c for c, cp in result.components.items() if cp.present or c in named])
    result.extra.setdefault("executor", executor)
    return result


def _unused_without_auto_fit(spec: PlacementSpec, inventory: Inventory, request: Request):
    """What the user set that an explicit plan does not use: said, never dropped silently."""
    out = []
    if spec.offload_mode != "auto":
        out.append(f"offload_mode {spec.offload_mode} is an auto-fit preset and is not used "
                   f"without auto_fit; turn on auto_fit or drop it")
    for d in inventory.devices:
        if d.kind == "cpu" and request.budgets.get(d.name) is not None:
            out.append(f"max_vram {d.name}= is not used by an explicit plan (host RAM is "
                       f"budgeted by auto_fit only); turn on auto_fit or drop it")
    return out


def _unused_budgets(result: Plan, inventory: Inventory, request: Request):
    """A GPU budget no component of an explicit plan runs or rests on: said, not dropped."""
    used = set()
    for cp in result.components.values():
        if cp.present or not any(c.present for c in result.components.values()):
            used.update(cp.runtime)
            used.add(cp.params)
    return [f"max_vram {d.name}= is not used: no component of this plan runs or rests on "
            f"{d.name}; place one there or drop it"
            for d in inventory.devices
            if d.kind != "cpu" and request.budgets.get(d.name) is not None and d.name not in used]


def with_workspace(infos, inventory: Inventory):
    """Each working-memory estimate with the inventory's kernel workspace in place of
    the default one (a simulated device that allocates none: its tensors alone)."""
    from dataclasses import replace
    workspace = inventory.workspace_bytes()
    if workspace is None:
        return infos
    out = {}
    for comp, info in infos.items():
        if info.headroom_bytes is not None and info.workspace_bytes and \
                info.workspace_bytes != workspace:
            shift = workspace - info.workspace_bytes
            info = replace(info, headroom_bytes=int(info.headroom_bytes) + shift,
                           workspace_bytes=workspace,
                           headroom_per_device=tuple((d, max(0, b + shift)) for d, b in
                                                     info.headroom_per_device),
                           headroom_basis=info.headroom_basis.replace(
                               f"+ {format_bytes(info.workspace_bytes)} workspace",
                               f"+ {format_bytes(workspace)} workspace"))
        out[comp] = info
    return out


def explicit_plan(request: Request, inventory: Inventory, infos) -> Plan:
    """The plan the user wrote, resolved exactly; nothing is decided for them beyond the
    documented defaults (runtime auto, params = runtime device, split layer). parallel
    batch / pipeline are marked by placement/parallel.py (refused in one line where the
    runtime names one device, or pipeline with a row split)."""
    default = inventory.default_device().name
    warnings = list(request.warnings)
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
        if choice.parallel == "batch":
            from .parallel import batch_parallel
            batch_parallel(cp)
        elif choice.parallel == "pipeline":
            from .parallel import pipeline_split
            pipeline_split(cp)
        _streaming(cp, request, inventory, info)
        if cp.is_split and cp.parallel != "batch":
            _split_ranges(cp, request, inventory, info)
        if cp.parallel == "pipeline" and cp.blocks and len(cp.blocks) < 2:
            warnings.append(f"{comp}: parallel pipeline has one stage: every block's range "
                            f"is on {next(iter(cp.blocks))} ({len(info.blocks)} block(s)), "
                            f"so it runs as a plain layer split")
        _sizes(cp, info)
        comps[comp] = cp
    devices = device_plans(inventory, request.budgets)
    refuse_what_the_runtime_refuses(devices, comps, infos)
    phases = _account(devices, comps, infos, warnings)
    plan = Plan(devices, comps, warnings)
    plan.extra["device_phases"] = phases     # what planned_bytes is the max of (the editor draws it)
    return plan


def _auto_reason(inventory: Inventory) -> str:
    d = inventory.default_device()
    return {"gpu": "first GPU", "igpu": "no GPU, integrated GPU"}.get(d.kind, "no GPU, CPU")


def _streaming(cp: ComponentPlan, request: Request, inventory: Inventory, info) -> None:
    """stream_layers without auto-fit: stream diffusion and text encoders that compute on
    an accelerator. Streaming needs the weights to rest off the device; like sd.cpp we
    then rest them in host memory, but we say so."""
    if not request.stream_layers or cp.component not in STREAMED_BY_DEFAULT:
        return
    if inventory.get(cp.main_device).kind == "cpu":
        cp.reasons.append("not streamed: it computes on the CPU")
        return
    if cp.params in cp.runtime:
        cp.params = "cpu"
        cp.reasons.append("stream_layers needs weights off the device: params -> cpu")
    resident = 0
    budget = request.budgets.get(cp.main_device)
    if cp.parallel == "batch":               # every device streams: the smallest budget
        from .parallel import smallest_budget
        budget = smallest_budget(cp, request.budgets)
    if info is not None and info.blocks and budget is not None and \
            (not cp.is_split or cp.parallel == "batch"):
        from .fit import stream_prefix
        resident = stream_prefix(info, budget, DEFAULT_PREFETCH_DEPTH)[0]
    cp.stream = StreamPlan(resident, DEFAULT_PREFETCH_DEPTH)
    cp.reasons.append(f"streamed on {cp.main_device}: first {resident} blocks resident, "
                      f"prefetch depth {DEFAULT_PREFETCH_DEPTH}")


def _split_ranges(cp: ComponentPlan, request: Request, inventory: Inventory, info) -> None:
    from .ranges import proportional_ranges
    weights = []
    for name in cp.runtime:
        budget = request.budgets.get(name)
        weights.append(float(budget if budget is not None else inventory.get(name).free_bytes))
    if info is None or not info.blocks:
        cp.reasons.append(f"{cp.split_mode} split over {', '.join(cp.runtime)} "
                          f"(ranges set when the model is known)")
        return
    weights[0] = max(0.0, weights[0] - info.non_block_bytes)   # the main device holds those
    cp.blocks = proportional_ranges([b.nbytes for b in info.blocks], cp.runtime, weights)
    cp.reasons.append(f"{cp.split_mode} split over {', '.join(cp.runtime)} in proportion to "
                      f"budgets (less the non-block weights on {cp.runtime[0]}): " + ", ".join(f"{d} blocks {r[0]}-{r[1]}"
                                              for d, r in cp.blocks.items()))


def _sizes(cp: ComponentPlan, info) -> None:
    if info is None:
        return
    if cp.stream is not None:
        blocks = info.blocks
        k = cp.stream.resident_blocks
        cp.resident_bytes = info.non_block_bytes + sum(b.nbytes for b in blocks[:k])
        cp.streamed_bytes = sum(b.nbytes for b in blocks[k:])
    else:
        cp.resident_bytes = info.total_bytes    # while its phase runs


def capacity(dev: DevicePlan) -> int:
    """The runtime's ledger capacity on a device (runtime/target.open_target): its budget
    capped by its free memory; the host's budget stands as given."""
    if dev.budget_bytes is None:
        return dev.free_bytes
    return dev.budget_bytes if dev.kind == "cpu" else min(dev.budget_bytes, dev.free_bytes)


def _rooms(cp: ComponentPlan, by_name) -> List[int]:
    """Room for weights on each runtime device: an explicit plan reserves no working
    memory (runtime/engine.py takes the plan's headroom, None here)."""
    return [capacity(by_name[d]) - int(cp.headroom_bytes or 0) for d in cp.runtime]


def _held(cp: ComponentPlan, info, by_name) -> Dict[str, int]:
    """Weight and ring bytes the runtime allocates on each device for `cp`, by its own
    arithmetic (placement/layout.py). A device over its capacity is one the runtime
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


def _fix(cp: ComponentPlan, info, dev: DevicePlan, need: int) -> str:
    """One change that makes the weights fit on device `dev` (a budget raised past the
    free memory would not: the runtime caps it there)."""
    name = dev.name
    raise_it = f"raise max_vram {name} to {format_bytes(need)} or more"
    can_raise = need <= dev.free_bytes
    if dev.kind == "cpu":
        return raise_it if dev.budget_bytes is not None and can_raise else \
            f"free host memory, or run {cp.component} on a GPU"
    if cp.is_split and cp.split_mode == "row" and row_split_applies(info):
        return raise_it if can_raise else \
            "use split_mode layer with stream_layers (a row split does not stream)"
    if cp.stream is None and cp.component in STREAMED_BY_DEFAULT and info.blocks:
        return "turn on stream_layers" + (" (each device streams its range)"
                                          if cp.is_split else "")
    if not cp.is_split and info.blocks:
        split = f"split it (e.g. {cp.component}={name}&<another GPU>)"
        return f"{raise_it}, or {split}" if can_raise else split
    return raise_it if can_raise else \
        f"free {format_bytes(need - dev.free_bytes)} on {name}, or give it fewer blocks " \
        f"(add a device to the split)"


def _what(cp: ComponentPlan, info) -> str:
    if cp.is_split and cp.split_mode == "row" and row_split_applies(info):
        return "its row shards and unsharded weights"
    if cp.stream is not None and not cp.is_split:
        return "its streaming ring and resident blocks"
    return "its block range" if cp.is_split else "its weights"


def _refuse_no_shard_room(cp: ComponentPlan, info, by_name) -> None:
    """A row split whose main device's unsharded weights leave no device room for a
    shard: runtime/engine.share_weights refuses it."""
    if not (cp.is_split and cp.split_mode == "row" and cp.parallel != "batch" and
            row_split_applies(info)) or row_split_held(info, _rooms(cp, by_name)) is not None:
        return
    main = by_name[cp.main_device]
    need = row_unsharded(info)
    room = capacity(main) - int(cp.headroom_bytes or 0)
    raise PlacementError(
        f"{main.name}: {cp.component} keeps {format_bytes(need)} of unsharded weights there "
        f"and no device of {'&'.join(cp.runtime)} has room left for a row shard: "
        f"{main.name}'s capacity is {format_bytes(capacity(main))}, short by "
        f"{format_bytes(need - room + 1)} or more; raise max_vram {main.name}, or give "
        f"another device of the split memory")


def refuse_what_the_runtime_refuses(devices: List[DevicePlan],
                                    comps: Dict[str, ComponentPlan], infos) -> None:
    """An explicit plan whose weights cannot be allocated where it puts them (the
    resident part, a ring, a split range or a row shard, the non-block weights) under
    the device's capacity (its budget, else its free memory; on the host the budget as
    given, as the runtime's ledger) is refused here, in one line naming the device,
    what does not fit, by how much and one change that fixes it; the runtime would
    refuse it at load. Working memory comes on top: an explicit plan that leaves too
    little for it is warned about (_account), since its size is known only when the
    run starts. The host is checked where a component computes there (its ledger);
    weights resting in RAM for a GPU are not allocated by the runtime (the module
    holds them), so RAM short of them is warned about, not refused."""
    from .components import PHASES
    by_name = {d.name: d for d in devices}
    held: Dict[tuple, List[tuple]] = {}
    for cp in comps.values():
        info = infos.get(cp.component)
        if not cp.present or info is None or any(d not in by_name for d in cp.runtime):
            continue
        _refuse_no_shard_room(cp, info, by_name)
        for d, b in _held(cp, info, by_name).items():
            if b > 0:
                held.setdefault((d, PHASES[cp.component]), []).append((b, cp))
    for (name, phase), parts in held.items():
        dev = by_name[name]
        limit = capacity(dev)
        total = sum(b for b, _ in parts)
        if total <= limit:
            continue
        b, cp = max(parts, key=lambda x: x[0])
        what = "budget" if dev.budget_bytes is not None and limit == dev.budget_bytes \
            else "free memory"
        others = f" (with {format_bytes(total - b)} of other {phase} components)" \
            if len(parts) > 1 else ""
        info = infos.get(cp.component)
        raise PlacementError(
            f"{name}: {cp.component} needs {format_bytes(b)} for {_what(cp, info)} there"
            f"{others} but the {what} of {name} is {format_bytes(limit)}, short by "
            f"{format_bytes(total - limit)}; {_fix(cp, info, dev, total)}")


def _account(devices: List[DevicePlan], comps: Dict[str, ComponentPlan], infos,
             warnings: List[str]) -> Dict[str, Dict[str, int]]:
    """Planned bytes per device at its busiest phase, and a warning per budget overrun.
    Returns the bytes per device and phase they are the maximum of."""
    from .components import PHASES
    by_name = {d.name: d for d in devices}
    per_phase: Dict[str, Dict[str, int]] = {}
    for cp in comps.values():
        if not cp.present:
            continue
        info = infos.get(cp.component)
        share = _held(cp, info, by_name) if info is not None else \
            {cp.main_device: cp.resident_bytes}
        for d, b in share.items():
            if by_name[d].kind == "cpu":
                continue
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
    for dev in devices:
        if dev.kind == "cpu" and (host or read):
            per_phase[dev.name] = {p: host + b for p, b in read.items()} or {"session": host}
    # the working memory each component needs where it computes (its estimate, kernel
    # workspace included): part of what the device holds in that phase. The engine
    # reserves none for an explicit plan, so a plan past the budget with it is told.
    work: Dict[str, Dict[str, tuple]] = {}
    for cp in comps.values():
        info = infos.get(cp.component)
        if not cp.present or info is None or info.headroom_bytes is None:
            continue
        per_device = dict(info.headroom_per_device)
        for d in cp.runtime:            # the host too, where the component computes there
            if d in by_name:
                phase = PHASES[cp.component]
                need = int(per_device.get(d, info.headroom_bytes))
                if need > work.get(d, {}).get(phase, (0, ""))[0]:
                    work.setdefault(d, {})[phase] = (need, cp.component)
    weights = {d: dict(p) for d, p in per_phase.items()}
    for d, phases in work.items():
        for phase, (w, _) in phases.items():
            mine = per_phase.setdefault(d, {})
            # the host's weights resting there for the session are there in every phase
            mine[phase] = mine.get(phase, mine.get("session", 0)) + w
    for name, phases in per_phase.items():
        dev = by_name[name]
        dev.planned_bytes = max(phases.values())
        limit = capacity(dev)
        what = 'budget' if limit == dev.budget_bytes else 'free memory'
        if dev.planned_bytes <= limit:
            continue
        phase = max(phases, key=phases.get)
        mine = weights.get(name, {})
        held = mine.get(phase, mine.get("session", 0))
        if held > limit:
            warnings.append(f"{name}: plan needs {format_bytes(dev.planned_bytes)} but the "
                            f"{what} is {format_bytes(limit)}; turn on auto_fit or "
                            f"stream_layers")
            continue
        w, comp = work[name][phase]
        warnings.append(f"{name}: plan needs {format_bytes(held)} of weights and about "
                        f"{format_bytes(w)} of working memory for {comp} "
                        f"({format_bytes(held + w)}), but the {what} is "
                        f"{format_bytes(limit)}; an explicit plan reserves no working "
                        f"memory: turn on auto_fit, stream_layers, or leave room on {name}")
    return per_phase
