"""Auto-fit: the fastest placement of a whole model set that fits the devices' budgets.

Pure and deterministic (no torch, no comfy). `fit()` keeps every explicit choice of
the request and decides only what was left unset; the offload presets of SD.Next
(seed 004) are restrictions of the same search. The package, by question:
  options.py   the knobs and each device's budget      rules.py    what may be decided
  costs.py     the cost model's figures                geometry.py one component's bytes
  kinds/       one module per kind of placement: its candidates, price and reasons
  option.py    the common core of a priced placement   context.py  what kinds price with
  search.py    compares and chooses                    depth.py    the ring's depth
  report.py    the plan and its reasons                failure.py  why nothing fits
  floors.py    the leaves the search need not price
docs/autofit.md explains the passes, the cost model and the report.
"""
from typing import Mapping, Optional

from ..components import COMPONENTS
from ..errors import PlacementError
from .costs import ComponentWork, CostModel
from .depth import auto_depths, depth_reasons
from .failure import explain_failure
from .geometry import geometry_of, headroom_of, stream_prefix
from .option import PHASE_ORDER
from .options import OFFLOAD_MODES, FitOptions, device_budgets
from .report import build_plan
from .rules import make_rules
from .search import Search


def _unset_choice():
    from types import SimpleNamespace
    return SimpleNamespace(runtime=None, params=None, split_mode=None)


def fit(request, inventory, infos: Mapping[str, object], options: Optional[FitOptions] = None):
    """Plan `infos` ({component: ComponentInfo}) on `inventory`. `request` is
    placement.resolve.Request (choices per component, budgets per device); whatever a
    choice leaves None is decided here. Raises PlacementError when nothing fits."""
    options = options or FitOptions(offload_mode=getattr(request, "offload_mode", "auto"))
    for comp, info in infos.items():
        if comp not in COMPONENTS or getattr(info, "component", comp) != comp:
            raise PlacementError(f"auto-fit got component {comp!r} described as "
                                 f"{getattr(info, 'component', None)!r}; components are: "
                                 f"{', '.join(COMPONENTS)}")
    budgets, host, notes = device_budgets(request, inventory, options)
    gpus = [d.name for d in inventory.accelerators()]
    from ..machine_figures import figures_for
    measured = figures_for(inventory) if options.measured == "auto" else options.measured
    model = CostModel(inventory.devices, options.throughput, options.bandwidth,
                      options.disk_bandwidth, options.peer_bandwidth, measured,
                      options.network_bandwidth)
    choices = getattr(request, "choices", {}) or {}
    from ..capabilities import check_choice, supported
    real_gpus = [d.name for d in inventory.accelerators() if not d.simulated]
    geos, work, rules = {}, {}, {}
    for comp in COMPONENTS:
        if comp not in infos:
            continue
        info = infos[comp]
        geos[comp] = geometry_of(info, options.headroom.get(comp))
        work[comp] = ComponentWork(info, options.resolution, options.frames, options.batch,
                              options.steps, options.activation_bytes.get(comp),
                              cond_batch=options.cond_batch)
        choice = choices.get(comp) or _unset_choice()
        _check_choice(comp, choice, inventory)
        check_choice(comp, choice.runtime, choice.params, choice.split_mode, inventory,
                     options.executor)
        rules[comp] = make_rules(choice, geos[comp], options.offload_mode, gpus,
                                 supported(options.executor, comp), real_gpus)
    from .tiles import tiles_for
    tiles = {c: tiles_for(infos[c], geos[c].headroom, options.resolution, options.frames)
             for c in geos if "tiled_decode" in supported(options.executor, c)}
    if options.prefetch_depth is None:
        auto = auto_depths(geos, work, rules, gpus, model)
        depth = {c: d for c, (d, _) in auto.items()}
    else:
        auto, depth = {}, options.prefetch_depth
    search = Search(geos, work, rules, gpus, {g: budgets[g][0] for g in gpus}, host[0], model,
                    depth, tiles, workspace=inventory.workspace_bytes())
    best = search.run() if geos else ((0.0, 0, 0.0, 0), {},
                                            [[0] * len(gpus) for _ in PHASE_ORDER])
    if best is None:
        raise explain_failure(search, options, budgets, host, inventory)
    result = build_plan(search, best, request, inventory, infos, options, budgets, host, notes)
    if getattr(measured, "problem", ""):
        result.warnings.append(measured.problem)
    depth_reasons(result, auto, options.prefetch_depth)
    for device, note in model.notes:        # step corrections: said where they acted
        for cp in result.components.values():
            if device in (cp.runtime or []):
                cp.reasons.append(note)
    return result


def _check_choice(comp, choice, inventory) -> None:
    names = set(inventory.names)
    for name in list(choice.runtime or []) + ([choice.params] if choice.params not in
                                               (None, "cpu", "disk") else []):
        if name not in names:
            raise PlacementError(f"{comp}: device {name!r} is not in the inventory; devices: "
                                 f"{', '.join(inventory.names)}")
    if choice.split_mode not in (None, "layer", "row"):
        raise PlacementError(f"invalid split mode {choice.split_mode!r} for {comp}; expected "
                             f"layer or row")


__all__ = ["FitOptions", "fit", "stream_prefix", "device_budgets", "OFFLOAD_MODES",
           "headroom_of"]
