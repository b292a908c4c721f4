"""The planner's knobs (FitOptions) and the budgets they give each device."""
from dataclasses import dataclass, field
from typing import Mapping, Optional, Tuple

from ..components import COMPONENTS
from ..errors import PlacementError
from ..room import MARGIN, device_room, margin_for
from ..units import GiB, format_bytes

OFFLOAD_MODES = ("auto", "none", "model", "balanced", "sequential")


@dataclass
class FitOptions:
    """Knobs of the planner; every default is documented in docs/autofit.md."""
    offload_mode: str = "auto"           # auto | none | model | balanced | sequential
    balanced_threshold: float = 0.75     # balanced: plan at most this share of each GPU
    budget_margin: int = MARGIN          # a real accelerator keeps it free inside its room
    host_budget: Optional[int] = None    # bytes of host RAM for weights; None: free - margin
    host_margin: Optional[int] = None    # None: host_reserve(free), stable-diffusion.cpp's rule
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
        from ..capabilities import check_executor
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
            if getattr(self, name) is not None and int(getattr(self, name)) < 0:
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


def host_reserve(free_bytes: int) -> int:
    """Host RAM auto-fit leaves for other work: the larger of 2 GiB and 10% of what is
    free (stable-diffusion.cpp's docs/backend.md; a big host runs more beside us)."""
    return max(2 * GiB, int(free_bytes) // 10)


def device_budgets(request, inventory, options: FitOptions):
    """Effective bytes per accelerator and for host RAM, with notes for the report."""
    budgets, notes = {}, []
    asked = getattr(request, "budgets", {}) or {}
    for dev in inventory.accelerators():
        given = asked.get(dev.name)
        margin = margin_for(dev, int(options.budget_margin), given)
        less = f" - margin {format_bytes(margin)}" if margin else ""
        budget = device_room(given, dev.free_bytes, margin)
        if given is None:
            how = f"free {format_bytes(dev.free_bytes)}{less}"
        else:
            how = f"max_vram{less}"
            if given > dev.free_bytes:
                notes.append(f"{dev.name}: max_vram {format_bytes(given)} is more than its free "
                             f"{format_bytes(dev.free_bytes)}; planning with the free memory")
                how = f"free memory (max_vram above it){less}"
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
        margin = host_reserve(cpu.free_bytes) if options.host_margin is None \
            else int(options.host_margin)
        host = (max(0, cpu.free_bytes - margin),
                f"free {format_bytes(cpu.free_bytes)} - margin {format_bytes(margin)}")
    return budgets, host, notes
