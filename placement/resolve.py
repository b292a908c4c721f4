"""Resolve a PlacementSpec against an inventory into a Plan.

Without auto_fit the plan is exactly what the user asked for (issue 2); with it,
placement.fit decides what the user left unset. Both start from the same Request.
"""
import copy
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from . import controlnet_with_diffusion
from .capabilities import DEFAULT_EXECUTOR, check_executor, check_plan
from .components import COMPONENTS
from .devices import Inventory
from .errors import PlacementError
from .explicit import explicit_plan
from .plan import ComponentPlan, Plan
from .spec import PlacementSpec
from .units import format_bytes


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
    _budgets_against_the_devices(spec, inventory, budgets, warnings)
    return Request(choices, budgets, spec.stream_layers, warnings, spec.offload_mode,
                   fallbacks)


def _budgets_against_the_devices(spec: PlacementSpec, inventory: Inventory,
                                 budgets: Dict[str, Optional[int]], warnings: List[str]):
    """A budget is checked against the device it is for: above the card's memory it is
    capped there (the plan uses the card's size), said in one line; a GPU budget on a
    machine with no GPU is said, never dropped."""
    if spec.budgets.default is not None and not inventory.accelerators():
        warnings.append(f"max_vram {str(spec.max_vram).strip()!r} budgets GPUs and this "
                        f"machine has none (devices: "
                        f"{', '.join(d.name for d in inventory.devices)}): it is not used")
    for name, budget in budgets.items():
        dev = inventory.get(name)
        if budget is None or dev.kind == "cpu" or budget <= dev.total_bytes:
            continue
        what = f", {dev.description}" if getattr(dev, "description", "") else ""
        warnings.append(f"max_vram {name}={format_bytes(budget)} is above {name}'s memory "
                        f"({format_bytes(dev.total_bytes)}{what}): the plan uses "
                        f"{format_bytes(dev.total_bytes)}; lower max_vram {name} to "
                        f"{format_bytes(dev.total_bytes)} or less")
        budgets[name] = dev.total_bytes


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
        if executor == "comfyui":       # the ControlNet beside the diffusion model
            result = controlnet_with_diffusion.together(
                result, lambda device: fit(_pinned(request, device), inventory, infos,
                                           options), infos)
        result.warnings[:0] = request.warnings
        _name_worker_figures(result, inventory, fit_options)
    else:
        if fit_options:
            raise PlacementError(f"option(s) {', '.join(sorted(fit_options))} need auto_fit")
        if executor == "comfyui":        # a ControlNet elsewhere: its residuals hop here
            infos = controlnet_with_diffusion.with_residuals(
                infos, request.choices, inventory.default_device().name)
        result = explicit_plan(request, inventory, infos)
        if executor == "comfyui":
            controlnet_with_diffusion.note(result)
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


def _name_worker_figures(result: Plan, inventory: Inventory, fit_options: dict) -> None:
    """Where each figure auto-fit priced a worker's devices with came from
    (placement/worker_report.py): the plan's `worker_figures`."""
    from .machine_figures import figures_for
    from .remote_devices import is_remote
    if not any(is_remote(d.name) for d in inventory.devices):
        return
    from .worker_report import worker_figures
    measured = fit_options.get("measured", "auto")
    measured = figures_for(inventory) if measured == "auto" else measured
    model = (result.extra.get("fit") or {}).get("cost_model") or {}
    result.extra["worker_figures"] = worker_figures(inventory, model, fit_options, measured)


def _pinned(request: Request, device: str) -> Request:
    """`request` with the ControlNet and the diffusion model asked to run on `device`
    (params and split mode still auto-fit's where the user left them)."""
    out = copy.deepcopy(request)
    for comp in ("controlnet", "diffusion"):
        asked = out.choices.get(comp) or Choice(None, None, None)
        out.choices[comp] = Choice([device], asked.params, None, asked.parallel)
    return out


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
