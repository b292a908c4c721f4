"""Parallelism in an explicit plan (issue 13): `parallel batch` for a component whose
runtime names several devices. Pure data: placement.resolve calls these; the runtime
(runtime/parallel) executes them.

Batch parallel runs the whole component on every runtime device, each with its own
placement (the plan's params and stream apply to each device), and gives each device
a share of every forward's batch. So it needs two or more runtime devices, its weights
are never split, and each device must hold (or stream) the whole component.
"""
from typing import Dict, Optional

from .errors import PlacementError


def batch_parallel(cp) -> None:
    """Mark ComponentPlan `cp` (runtime and params already resolved) batch-parallel."""
    if len(cp.runtime) < 2:
        raise PlacementError(
            f"{cp.component}: parallel batch needs two or more runtime devices and the "
            f"backend gives {'&'.join(cp.runtime)}; name them, e.g. backend "
            f"{cp.component}=cuda0&cuda1")
    cp.parallel = "batch"
    cp.blocks = {}
    cp.reasons.append(f"batch parallel over {', '.join(cp.runtime)}: the whole "
                      f"{cp.component} on each device, the batch shared between them")


def smallest_budget(cp, budgets: Dict[str, Optional[int]]) -> Optional[int]:
    """The budget every device of a batch-parallel component must fit (None: none set)."""
    given = [budgets.get(d) for d in cp.runtime if budgets.get(d) is not None]
    return min(given) if given else None


def refuse_with_auto_fit(request) -> None:
    asked = [c for c, ch in request.choices.items() if getattr(ch, "parallel", None) == "batch"]
    if asked:
        raise PlacementError(
            f"{', '.join(asked)}: parallel batch is not decided by auto_fit yet; turn "
            f"auto_fit off and name the devices (backend {asked[0]}=cuda0&cuda1, "
            f"split_mode {asked[0]}=batch)")
