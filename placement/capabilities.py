"""What each executor runs, per component: the one table the planner, the adapter and
the checks read (pure data, no torch, no comfy).

Two executors run plans:
- "runtime": the pack's plain Python runtime (`place()` on any nn.Module; the CLI and
  the Python API plan for it);
- "comfyui": the ComfyUI adapter (runtime/comfy): ComfyUI's own patchers for what a
  load/offload device pair expresses, the pack's engine for the rest, and only for the
  components the engine is wired to.

A plan uses capabilities (`needs()`); a plan is executable when its executor's row for
the component has them all (`missing()`). Auto-fit only proposes what the table allows
(placement/fit/rules.py reads it through `supported()`); an explicit plan that needs more is refused
by `check_component()` with a one-line error naming what is missing.
"""
from typing import Dict, FrozenSet, List

from .components import COMPONENTS
from .errors import PlacementError
from .remote_devices import is_remote

EXECUTORS = ("runtime", "comfyui")
DEFAULT_EXECUTOR = "runtime"

# capability -> how it reads in an error message
WHAT = {
    "stream": "block streaming (stream_layers)",
    "disk": "params disk",
    "layer_split": "a layer split over several devices",
    "row_split": "a row split over several devices",
    "split_stream": "streaming inside a layer split",
    "row_split_stream": "streaming with a row split",
    "row_split_disk": "params disk with a row split",
    "cpu_params": "weights resting on the cpu while computing on an accelerator",
    "peer_params": "weights resting on another GPU than the one computing",
    "simulated": "a simulated device",
    "lora_runtime": "runtime LoRA (lora_mode runtime)",
    "batch_parallel": "batch parallel over several devices (parallel batch)",
    "pipeline_split": "a pipelined layer split (parallel pipeline)",
    "tiled_decode": "a tiled VAE decode (tile)",
    "remote_range": "a block range on a worker machine (ALIAS.DEVICE, e.g. w1.cuda0)",
}
CAPABILITIES = tuple(WHAT)

# Components ComfyUI patches with LoRA; runtime LoRA is a need only for these.
LORA_COMPONENTS = ("diffusion", "te")

_ENGINE = frozenset({"stream", "disk", "layer_split", "row_split", "split_stream",
                     "cpu_params", "simulated", "lora_runtime"})
_PATCHER = frozenset({"cpu_params", "peer_params", "tiled_decode"})

TABLE: Dict[str, Dict[str, FrozenSet[str]]] = {
    # runtime.place runs every component; row split reads shards from memory and does
    # not stream; params rest on cpu, disk or the runtime device (runtime/place.py).
    "runtime": {comp: _ENGINE | {"batch_parallel", "pipeline_split", "remote_range"}
                for comp in COMPONENTS},
    # runtime/comfy: the engine runs diffusion and te fully and the VAE whole on one
    # device (disk, simulated); everything else goes through ComfyUI's patchers.
    "comfyui": {
        "diffusion": _ENGINE | _PATCHER | {"batch_parallel",     # runtime/comfy/batch_parallel
                                           "pipeline_split",     # comfy/sampling_session.py
                                           "remote_range"},      # comfy/worker_ranges.py
        "te": _ENGINE | _PATCHER,
        # tiles: ComfyUI's own decode_tiled on the placed copy (runtime/comfy/apply/vae_tiles.py)
        "vae": frozenset({"disk", "simulated", "tiled_decode"}) | _PATCHER,
        "controlnet": _PATCHER,
        "clip_vision": _PATCHER,
        "upscaler": _PATCHER,
        "photomaker": _PATCHER,
        # an ADetailer detector (Impact Pack's BBOX/SEGM_DETECTOR): moved whole to its
        # runtime device for each detection (runtime/comfy/detector.py)
        "detector": frozenset({"cpu_params", "peer_params"}),
    },
}
# What ComfyUI's own patcher expresses (a load/offload device pair); a component
# needing anything else inside ComfyUI runs on the pack's engine.
PATCHER_RUNS = {"comfyui": _PATCHER}


def check_executor(executor: str) -> str:
    name = str(executor or DEFAULT_EXECUTOR).strip().lower()
    if name not in TABLE:
        raise PlacementError(f"unknown executor {executor!r}; expected one of "
                             f"{', '.join(EXECUTORS)}")
    return name


def supported(executor: str, component: str) -> FrozenSet[str]:
    return TABLE[check_executor(executor)].get(component, frozenset())


def allows(executor: str, component: str, capability: str) -> bool:
    return capability in supported(executor, component)


def _simulated(inventory, name: str) -> bool:
    try:
        return bool(inventory.get(name).simulated)
    except PlacementError:
        return False


def needs(cp, inventory) -> List[str]:
    """The capabilities a ComponentPlan uses, in a stable order."""
    out = []
    if cp.parallel == "batch":          # whole on each device: no split of the weights
        out.append("batch_parallel")
        if cp.stream is not None:
            out.append("stream")
    elif cp.is_split:
        out.append(f"{cp.split_mode}_split")
        if cp.parallel == "pipeline":
            out.append("pipeline_split")
        if cp.stream is not None:
            out.append("split_stream" if cp.split_mode == "layer" else "row_split_stream")
    elif cp.stream is not None:
        out.append("stream")
    if cp.params == "disk":
        out.append("disk")
        if cp.is_split and cp.split_mode == "row":
            out.append("row_split_disk")
    elif cp.params == "cpu":
        if cp.main_device != "cpu":
            out.append("cpu_params")
    elif cp.params not in cp.runtime:
        out.append("peer_params")
    names = list(cp.runtime) + ([cp.params] if cp.params not in ("cpu", "disk") else [])
    if any(_simulated(inventory, n) for n in names):
        out.append("simulated")
    if cp.lora == "runtime" and cp.component in LORA_COMPONENTS:
        out.append("lora_runtime")
    if getattr(cp, "tile", None):
        out.append("tiled_decode")
    if any(is_remote(n) for n in cp.runtime):
        out.append("remote_range")
    return out


def missing(cp, inventory, executor: str) -> List[str]:
    """What `cp` needs that `executor` does not run for its component."""
    executor = check_executor(executor)
    have = supported(executor, cp.component)
    used = needs(cp, inventory)
    out = [n for n in used if n not in have]
    patcher = PATCHER_RUNS.get(executor)
    if patcher is not None and "peer_params" in used:
        # weights resting on another GPU are a patcher feature; the engine rests them
        # in host memory or on disk
        engine = [n for n in used if n not in patcher and n != "lora_runtime"]
        if engine and "peer_params" not in out:
            out.append("peer_params")
    return out


def engine_needs(cp, inventory, executor: str = "comfyui") -> List[str]:
    """What in this plan the executor's plain patcher cannot express (its engine runs it).
    Runtime LoRA alone also needs the engine: the patcher fuses LoRA into weights it loads
    whole."""
    patcher = PATCHER_RUNS.get(check_executor(executor), frozenset())
    return [n for n in needs(cp, inventory) if n not in patcher]


def choice_needs(component: str, runtime, params, split_mode, inventory) -> List[str]:
    """The capabilities an explicit request already implies before anything is decided
    (runtime None / params None: left to auto-fit)."""
    runtime = list(runtime or [])
    out = []
    if len(runtime) > 1:
        out.append(f"{split_mode or 'layer'}_split")
    if params == "disk":
        out.append("disk")
        if len(runtime) > 1 and split_mode == "row":
            out.append("row_split_disk")
    elif params == "cpu":
        if runtime and runtime[0] != "cpu":
            out.append("cpu_params")
    elif params is not None and runtime and params not in runtime:
        out.append("peer_params")
    names = runtime + ([params] if params not in (None, "cpu", "disk") else [])
    if any(_simulated(inventory, n) for n in names):
        out.append("simulated")
    if any(is_remote(n) for n in runtime):
        out.append("remote_range")
    return out


def check_choice(component: str, runtime, params, split_mode, inventory,
                 executor: str) -> None:
    """Raise for an explicit request `executor` cannot run for `component`."""
    have = supported(executor, component)
    lacking = [n for n in choice_needs(component, runtime, params, split_mode, inventory)
               if n not in have]
    if lacking:
        raise PlacementError(describe_missing(component, lacking, executor, runtime) +
                             f"; {_advice(lacking)}")


def describe_missing(component: str, names, executor: str, runtime=None) -> str:
    executor = check_executor(executor)
    where = "inside ComfyUI" if executor == "comfyui" else "by the plain runtime"
    have = sorted(supported(executor, component), key=CAPABILITIES.index)
    runs = ", ".join(WHAT[n] for n in have) if have else "nothing beyond one device"
    what = []
    for n in names:
        devices = f" ({'&'.join(runtime)})" if runtime and len(runtime) > 1 and \
            n.endswith("_split") else ""
        what.append(WHAT[n] + devices)
    return (f"{component}: {' and '.join(what)} is not executed for "
            f"{component} {where} (it runs there: {runs})")


def check_component(cp, inventory, executor: str) -> None:
    """Raise a one-line PlacementError naming what `executor` lacks for `cp`."""
    lacking = missing(cp, inventory, executor)
    if lacking:
        raise PlacementError(describe_missing(cp.component, lacking, executor, cp.runtime) +
                             f"; {_advice(lacking)}")


def _advice(lacking) -> str:
    if "remote_range" in lacking:
        return "keep it on this machine's devices (workers run diffusion model ranges)"
    if "simulated" in lacking:
        return "put it on a real device (e.g. cpu) or let auto_fit place it"
    if "peer_params" in lacking:
        return "rest its weights on cpu or on its runtime device"
    if "row_split_stream" in lacking or "row_split_disk" in lacking:
        return "use split_mode layer, or params cpu without stream_layers"
    return "place it on one device with params cpu or that device, or let auto_fit place it"


def check_plan(plan, inventory, executor: str, components=None) -> None:
    """Check every component of `plan` named in `components` (default: the present ones)."""
    for name, cp in plan.components.items():
        if (components is None and cp.present) or (components is not None
                                                    and name in components):
            check_component(cp, inventory, executor)


__all__ = ["EXECUTORS", "DEFAULT_EXECUTOR", "TABLE", "WHAT", "CAPABILITIES",
           "LORA_COMPONENTS", "PATCHER_RUNS", "allows", "supported", "needs", "missing",
           "engine_needs", "check_component", "check_choice", "choice_needs", "check_plan", "check_executor"]
