"""Auto-fit: the fastest placement of a whole model set that fits the devices' budgets.

Pure and deterministic (no torch, no comfy). `fit()` keeps every explicit choice of
the request and decides only what was left unset; the offload presets of SD.Next
(seed 004) are restrictions of the same search. docs/autofit.md explains the passes,
the cost model and the report.
"""
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Tuple

from .components import COMPONENTS
from .errors import PlacementError
from .fit_costs import CostModel, Workload
from .fit_report import build_plan, explain_failure
from .fit_rules import make_rules
from .fit_search import Search
from .fit_shapes import Geometry, headroom_of
from .layout import choose_depth
from .units import GiB, MiB, format_bytes

OFFLOAD_MODES = ("auto", "none", "model", "balanced", "sequential")


@dataclass
class FitOptions:
    """Knobs of the planner; every default is documented in docs/autofit.md."""
    offload_mode: str = "auto"           # auto | none | model | balanced | sequential
    balanced_threshold: float = 0.75     # balanced: plan at most this share of each GPU
    budget_margin: int = 512 * MiB       # a GPU without a budget gets free - margin
    host_budget: Optional[int] = None    # bytes of host RAM for weights; None: free - margin
    host_margin: int = 2 * GiB
    prefetch_depth: Optional[int] = None  # blocks in flight while one computes; None: the
                                          # smallest ring with little stall (auto_depths)
    steps: int = 20                      # sampling steps per generation
    resolution: Tuple[int, int] = (1024, 1024)
    frames: int = 1
    batch: int = 1
    throughput: Mapping[str, float] = field(default_factory=dict)   # FLOP/s by device or kind
    bandwidth: Mapping[str, float] = field(default_factory=dict)    # host->device B/s, same keys
    disk_bandwidth: Optional[float] = None                          # None: measured, else default
    peer_bandwidth: Optional[float] = None                          # GPU<->GPU B/s
    network_bandwidth: object = None     # B/s to remote workers: one figure, or {alias: B/s}
    headroom: Mapping[str, int] = field(default_factory=dict)       # component -> bytes
    activation_bytes: Mapping[str, int] = field(default_factory=dict)
    executor: str = "runtime"            # who runs the plan: runtime | comfyui (capabilities)
    cond_batch: int = 1                  # sampled forwards per step: 2 with CFG (cond+uncond)
    measured: object = "auto"            # machine_figures.Figures; auto: this machine's if detected

    def __post_init__(self):
        from .capabilities import check_executor
        self.executor = check_executor(self.executor)
        mode = str(self.offload_mode or "auto").strip().lower()
        if mode not in OFFLOAD_MODES:
            raise PlacementError(f"invalid offload_mode {self.offload_mode!r}; expected one of "
                                 f"{', '.join(OFFLOAD_MODES)}")
        self.offload_mode = mode
        if not 0 < float(self.balanced_threshold) <= 1:
            raise PlacementError(f"invalid balanced_threshold {self.balanced_threshold!r}; "
                                 f"expected a fraction in (0, 1]")
        for name in ("budget_margin", "host_margin"):
            if int(getattr(self, name)) < 0:
                raise PlacementError(f"invalid {name} {getattr(self, name)!r}; expected bytes >= 0")
        if self.host_budget is not None and int(self.host_budget) < 0:
            raise PlacementError(f"invalid host_budget {self.host_budget!r}; expected bytes >= 0")
        if self.prefetch_depth is not None and (
                not isinstance(self.prefetch_depth, int) or isinstance(self.prefetch_depth, bool)
                or not 0 <= self.prefetch_depth <= 8):
            raise PlacementError(f"invalid prefetch_depth {self.prefetch_depth!r}; expected "
                                 f"an integer 0..8, or None (chosen from the block mix)")
        for name in ("steps", "frames", "batch", "cond_batch"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise PlacementError(f"invalid {name} {value!r}; expected an integer >= 1")
        try:
            width, height = (int(v) for v in self.resolution)
        except (TypeError, ValueError):
            raise PlacementError(f"invalid resolution {self.resolution!r}; expected "
                                 f"(width, height) in pixels") from None
        if width < 8 or height < 8:
            raise PlacementError(f"invalid resolution {self.resolution!r}; expected at least 8x8")
        self.resolution = (width, height)
        if self.disk_bandwidth is not None and not float(self.disk_bandwidth) > 0:
            raise PlacementError(f"invalid disk_bandwidth {self.disk_bandwidth!r}; "
                                 f"expected bytes/s > 0")
        for comp in list(self.headroom) + list(self.activation_bytes):
            if comp not in COMPONENTS:
                raise PlacementError(f"unknown component {comp!r} in fit options; components "
                                     f"are: {', '.join(COMPONENTS)}")


def stream_prefix(info, budget_bytes: int, depth: int) -> Tuple[int, int, int]:
    """The largest resident prefix K for streaming `info` on a device with `budget_bytes`:
    K blocks + non-block weights + the prefetch ring (min(depth, streamed-1)+1 slots of
    the largest streamed block) + working memory must fit. Returns (K, streamed bytes
    per forward, resident bytes). K is 0 when not even the ring fits: the caller's
    accounting then reports the overrun (explicit placements are not second-guessed)."""
    geo = Geometry(info)
    if geo.n == 0:
        return 0, 0, geo.total
    k = geo.best_prefix(int(budget_bytes) - geo.headroom, max(0, int(depth))) or 0
    return k, geo.streamed_bytes(k), geo.non_block + geo.prefix[k]


def device_budgets(request, inventory, options: FitOptions):
    """Effective bytes per accelerator and for host RAM, with notes for the report."""
    budgets, notes = {}, []
    asked = getattr(request, "budgets", {}) or {}
    for dev in inventory.accelerators():
        given = asked.get(dev.name)
        if given is None:
            budget = max(0, dev.free_bytes - int(options.budget_margin))
            how = (f"free {format_bytes(dev.free_bytes)} - margin "
                   f"{format_bytes(options.budget_margin)}")
        else:
            budget = max(0, min(int(given), dev.free_bytes))
            how = "max_vram"
            if given > dev.free_bytes:
                notes.append(f"{dev.name}: max_vram {format_bytes(given)} is more than its free "
                             f"{format_bytes(dev.free_bytes)}; planning with the free memory")
                how = "free memory (max_vram above it)"
        if options.offload_mode == "balanced":
            cap = int(dev.total_bytes * float(options.balanced_threshold))
            if cap < budget:
                budget = cap
                how = (f"balanced: {options.balanced_threshold:.0%} of "
                       f"{format_bytes(dev.total_bytes)}")
        budgets[dev.name] = (budget, how)
    cpu = inventory.get("cpu")
    if options.host_budget is not None:
        host = (int(options.host_budget), "host_budget")
    elif asked.get("cpu") is not None:
        host = (max(0, min(int(asked["cpu"]), cpu.free_bytes)), "max_vram cpu")
    else:
        host = (max(0, cpu.free_bytes - int(options.host_margin)),
                f"free {format_bytes(cpu.free_bytes)} - margin {format_bytes(options.host_margin)}")
    return budgets, host, notes


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
    from .machine_figures import figures_for
    measured = figures_for(inventory) if options.measured == "auto" else options.measured
    model = CostModel(inventory.devices, options.throughput, options.bandwidth,
                      options.disk_bandwidth, options.peer_bandwidth, measured,
                      options.network_bandwidth)
    choices = getattr(request, "choices", {}) or {}
    from .capabilities import check_choice, supported
    real_gpus = [d.name for d in inventory.accelerators() if not d.simulated]
    geos, work, rules = {}, {}, {}
    for comp in COMPONENTS:
        if comp not in infos:
            continue
        info = infos[comp]
        geos[comp] = Geometry(info, options.headroom.get(comp))
        work[comp] = Workload(info, options.resolution, options.frames, options.batch,
                              options.steps, options.activation_bytes.get(comp),
                              cond_batch=options.cond_batch)
        choice = choices.get(comp) or _unset_choice()
        _check_choice(comp, choice, inventory)
        check_choice(comp, choice.runtime, choice.params, choice.split_mode, inventory,
                     options.executor)
        rules[comp] = make_rules(choice, geos[comp], options.offload_mode, gpus,
                                 supported(options.executor, comp), real_gpus)
    from .fit_tiles import tiles_for
    tiles = {c: tiles_for(infos[c], geos[c].headroom, options.resolution, options.frames)
             for c in geos if "tiled_decode" in supported(options.executor, c)}
    if options.prefetch_depth is None:
        auto = auto_depths(geos, work, rules, gpus, model)
        depth = {c: d for c, (d, _) in auto.items()}
    else:
        auto, depth = {}, options.prefetch_depth
    search = Search(geos, work, rules, gpus, {g: budgets[g][0] for g in gpus}, host[0], model,
                    depth, tiles)
    best = search.run() if geos else ((0.0, 0, 0.0, 0), {}, [[0] * len(gpus) for _ in range(4)])
    if best is None:
        raise explain_failure(search, options, budgets, host, inventory)
    result = build_plan(search, best, request, inventory, infos, options, budgets, host, notes)
    if getattr(measured, "problem", ""):
        result.warnings.append(measured.problem)
    _depth_reasons(result, auto, options.prefetch_depth)
    for device, note in model.notes:        # step corrections: said where they acted
        for cp in result.components.values():
            if device in (cp.runtime or []):
                cp.reasons.append(note)
    return result


AUTO_STALL_SHARE = 0.02       # auto depth: the smallest ring losing at most this of a step
AUTO_MAX_DEPTH = 8


def auto_depths(geos, work, rules, gpus, model) -> Dict[str, Tuple[int, List[float]]]:
    """Per component the ring depth to plan at when prefetch_depth is not set: the
    smallest whose predicted stall (layout.ring_schedule over its blocks, all streamed,
    at each GPU's throughput and link) is <= AUTO_STALL_SHARE of the step, the deepest
    any GPU needs; with the stall share per depth up to it. The search still prices
    every depth from it down to 0 (a deeper ring holds fewer resident blocks) and keeps
    the fastest."""
    from .fit_pricing import block_seconds
    out = {}
    seen = {}       # equal GPUs (same throughput and link) give the same answer
    for c, geo in geos.items():
        if geo.n < 2:
            out[c] = (1, [])
            continue
        source = "disk" if rules[c].params == "disk" else "cpu"
        best = (1, [])
        for g in gpus:
            bw = model.source_bandwidth(g, source)
            if not bw or bw <= 0:
                continue
            key = (c, model.throughput[g], bw)
            if key not in seen:
                comp, trans, sizes, _ = block_seconds(geo, work[c].flop / model.throughput[g],
                                                      0, bw)
                seen[key] = choose_depth(comp, trans, sizes, AUTO_MAX_DEPTH, AUTO_STALL_SHARE)
            got = seen[key]
            if got[0] > best[0]:
                best = got
            elif not best[1]:
                best = got
        out[c] = best
    return out


def _depth_reasons(result, auto, asked) -> None:
    """A reason line per streamed component: the depth and why, before the decision's
    line (which stays last: the editor and the table show the last reason)."""
    for c, cp in result.components.items():
        if cp.stream is None:
            continue
        d = cp.stream.prefetch_depth
        if asked is not None:
            _before_last(cp.reasons, f"prefetch depth {d}: prefetch_depth {asked} as set"
                         + (" (the fastest depth up to it)" if d != asked else ""))
            continue
        want, shares = auto.get(c, (d, []))
        by = ", ".join(f"{i}: {s:.0%}" for i, s in enumerate(shares, start=1))
        why = (f"the smallest ring whose predicted stall is <= {AUTO_STALL_SHARE:.0%} of the "
               f"step" if shares and shares[-1] <= AUTO_STALL_SHARE
               else "the ring with the least predicted stall")
        line = f"prefetch depth {want}: {why}" + (f" (stall by depth {by})" if by else "")
        if d != want:
            line += (f"; planned at depth {d}: a shallower ring leaves room for more "
                     f"resident blocks and was priced faster")
        _before_last(cp.reasons, line)


def _before_last(reasons, line) -> None:
    reasons.insert(max(0, len(reasons) - 1), line)


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
