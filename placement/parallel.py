"""Parallelism in an explicit plan (issue 13): `parallel batch` or `parallel pipeline`
for a component whose runtime names several devices. Pure data: placement.resolve calls
these; the runtime (runtime/parallel, runtime/split/pipeline.py) executes them.

Batch parallel runs the whole component on every runtime device, each with its own
placement (the plan's params and stream apply to each device), and gives each device
a share of every forward's batch. So it needs two or more runtime devices, its weights
are never split, and each device must hold (or stream) the whole component.

Pipeline is a layer split (split mode layer, block ranges per device as usual) whose
stages run a forward's batch in shares one behind the other: stage 2 computes share 1
while stage 1 computes share 2. So it needs two or more runtime devices and a layer
split (a row split has no stages); a batch of 1 runs as the plain layer split.

With auto_fit, parallel batch is decided by the planner (placement/fit/kinds/
batch_parallel.py and pipeline.py, under placement/fit/rules.py): asked, it is the only placement priced for the component (on the named
devices, or the GPUs auto-fit picks); unset, it is priced beside the plain placements
and the pipelined layer split and chosen when predicted fastest; parallel none forbids
both. Parallel pipeline asked with auto_fit prices only pipelined layer splits (over the
named devices, or the GPUs auto-fit picks).
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


def pipeline_split(cp) -> None:
    """Mark ComponentPlan `cp` (runtime and params already resolved) as a pipelined layer
    split; its ranges are set afterwards like any layer split's."""
    if len(cp.runtime) < 2:
        raise PlacementError(
            f"{cp.component}: parallel pipeline needs two or more runtime devices (a layer "
            f"split's stages) and the backend gives {'&'.join(cp.runtime)}; name them, e.g. "
            f"backend {cp.component}=cuda0&cuda1")
    if cp.split_mode != "layer":
        raise PlacementError(
            f"{cp.component}: parallel pipeline runs a layer split's stages and split mode "
            f"{cp.split_mode} has none; use split_mode layer or drop parallel pipeline")
    cp.parallel = "pipeline"
    cp.reasons.append(f"pipelined layer split over {', '.join(cp.runtime)}: the stages run "
                      f"a batch's shares one behind the other (a batch of 1 runs as the "
                      f"plain layer split)")


def smallest_budget(cp, budgets: Dict[str, Optional[int]]) -> Optional[int]:
    """The budget every device of a batch-parallel component must fit (None: none set)."""
    given = [budgets.get(d) for d in cp.runtime if budgets.get(d) is not None]
    return min(given) if given else None


def check_with_auto_fit(request) -> None:
    """parallel batch or pipeline asked with auto_fit: the backend, when given, must name
    two or more GPUs (auto-fit decides everything else against the budgets, fit/rules.py)."""
    for comp, ch in request.choices.items():
        mode = getattr(ch, "parallel", None)
        if mode not in ("batch", "pipeline") or not ch.runtime:
            continue
        if "cpu" in ch.runtime or len(ch.runtime) < 2:
            raise PlacementError(
                f"{comp}: parallel {mode} needs two or more GPUs and the backend gives "
                f"{'&'.join(ch.runtime)}; name two or more GPUs (backend {comp}=cuda0&cuda1) "
                f"or leave the backend to auto-fit, or drop parallel {mode}")
