"""Auto-fit rules: what the search may decide for one component.

The user's explicit choice (runtime, params, split mode) and the offload preset say
which kinds of placement are allowed; the executor's row of the capability table
(placement/capabilities.py) then removes whatever that executor cannot run, so the
search never proposes a plan the runtime or the ComfyUI adapter would refuse.
"""
from types import SimpleNamespace
from typing import Optional, Sequence

from ..errors import PlacementError
from ..remote_devices import is_remote
from .geometry import Geometry


class Rules:
    """What the search may decide for one component (the user's choice and the preset)."""
    __slots__ = ("runtime", "params", "split_mode", "persist_res", "persist_split", "float_res",
                 "stream", "float_split", "split_stream", "cpu", "prefix_zero",
                 "params_elsewhere", "gpus", "disk", "row_fallback", "batch", "pipeline",
                 "only")

    def __init__(self):
        for name in self.__slots__:
            setattr(self, name, False)
        self.runtime = None
        self.params = None
        self.split_mode = "layer"
        self.gpus = None          # GPU names the executor runs this component on; None: all
        self.disk = True          # params may move to disk when host RAM is short
        self.row_fallback = False  # split_mode row asked, but no matrix is big enough
        # batch parallel may be priced (batch), a layer split may pipeline the batch's
        # shares (pipeline); `only`: the one kind (kinds/) asked, nothing else is priced
        self.batch = self.pipeline = False
        self.only = None

    @property
    def floating(self) -> bool:
        return self.float_res or self.stream or self.float_split or self.cpu


def make_rules(choice, geo: Geometry, preset: str, gpus: Sequence[str],
               caps=None, real_gpus: Optional[Sequence[str]] = None) -> Rules:
    """Translate (runtime, params, split_mode) + preset into the placements allowed, then
    keep only what the executor runs for this component (`caps`: its capabilities from
    placement/capabilities.py; None: everything). `real_gpus`: the GPUs that are not
    simulated (used when the executor cannot run the component on a simulated one)."""
    if caps is not None and "simulated" not in caps and real_gpus is not None:
        gpus = [g for g in gpus if g in real_gpus]
        only = list(gpus)
    else:
        only = None
    parallel = getattr(choice, "parallel", None)
    if parallel == "batch":
        return _batch_rules(choice, geo, preset, gpus, caps, real_gpus)
    if parallel == "pipeline":
        return _pipeline_rules(choice, geo, preset, gpus, caps, real_gpus)
    if (choice.split_mode or "layer") == "row" and not row_shardable(geo):
        # runtime/split/row.py shards only Linears of at least 256x256 and splits by layer
        # otherwise: plan what will run
        from types import SimpleNamespace
        choice = SimpleNamespace(runtime=choice.runtime, params=choice.params,
                                 split_mode="layer")
        r = _rules(choice, geo, preset, gpus)
        r.row_fallback = True
    else:
        r = _rules(choice, geo, preset, gpus)
    # parallel none forbids both; unset: priced where the executor runs them
    r.batch = parallel is None and (caps is None or "batch_parallel" in caps) and \
        r.runtime is None and r.params in (None, "cpu") and geo.comp in PARALLEL_COMPONENTS
    r.pipeline = parallel is None and (caps is None or "pipeline_split" in caps) and \
        r.split_mode == "layer" and geo.comp in PARALLEL_COMPONENTS
    if caps is None:
        return r
    if "remote_range" not in caps:     # worker devices (w1.cuda0) only where the executor runs them
        only = [g for g in (only if only is not None else gpus) if not is_remote(g)]
    if only is not None:
        r.gpus = only
        if not only and r.runtime is None:
            r.cpu = True      # no GPU this component can run on: it computes on the CPU
    if "stream" not in caps:
        r.stream = False
        r.prefix_zero = False
    if f"{r.split_mode}_split" not in caps:
        r.persist_split = r.float_split = False
    if "split_stream" not in caps or "layer_split" not in caps:
        r.split_stream = False
    if "cpu_params" not in caps:
        r.float_res = r.stream = r.float_split = r.split_stream = False
    if preset == "sequential" and not (r.stream or r.float_res or r.float_split or r.cpu
                                       or r.persist_res or r.persist_split
                                       or r.params_elsewhere) \
            and (r.runtime is None or len(r.runtime) == 1):
        r.float_res = "cpu_params" in caps       # sequential, not streamable here: whole
    r.disk = "disk" in caps
    if not (r.persist_res or r.persist_split or r.floating or r.params_elsewhere):
        r.cpu = r.runtime is None or r.runtime == ["cpu"]
    return r


# Components whose forward's batch shares may divide: the sampled ones (their batch is
# batch x cond_batch, CFG's cond and uncond counted; costs.ComponentWork.items).
PARALLEL_COMPONENTS = ("diffusion", "controlnet")


def _asked(choice, comp: str, mode: str, caps, needed) -> tuple:
    """What parallel batch and pipeline asked with auto-fit both refuse: an executor
    without the capabilities `needed`, a backend that names fewer than two GPUs. Returns
    the asked runtime list (None: auto-fit picks) and the one-line advice."""
    runtime = list(choice.runtime) if choice.runtime else None
    accepted = (f"name two or more GPUs (backend {comp}=cuda0&cuda1) or leave the backend "
                f"to auto-fit, or drop parallel {mode}")
    if caps is not None and not set(needed) <= set(caps):
        raise PlacementError(f"{comp}: parallel {mode} is not run by this executor for "
                             f"{comp}; drop parallel {mode}")
    if runtime is not None and ("cpu" in runtime or len(runtime) < 2):
        raise PlacementError(f"{comp}: parallel {mode} needs two or more GPUs and the "
                             f"backend gives {'&'.join(runtime)}; {accepted}")
    return runtime, accepted


def _batch_rules(choice, geo: Geometry, preset: str, gpus: Sequence[str], caps,
                 real_gpus) -> Rules:
    """parallel batch asked with auto-fit: the whole component on each of two or more
    GPUs (the runtime list when given, else auto-fit picks them), resident or streamed
    on each as the preset allows; nothing else is priced, so it is honoured or the fit
    fails saying why."""
    comp = geo.comp
    runtime, accepted = _asked(choice, comp, "batch", caps, {"batch_parallel"})
    if choice.params not in (None, "cpu", "disk") and (runtime is None
                                                       or choice.params not in runtime):
        raise PlacementError(f"{comp}: parallel batch keeps a copy on each device; params "
                             f"{choice.params} is not one of them: use params cpu or one of "
                             f"the runtime devices")
    if choice.params == "disk":
        raise PlacementError(f"{comp}: parallel batch streams from one shared host copy, not "
                             f"from disk; use params cpu or leave params to auto-fit")
    if len(gpus) < 2 and runtime is None:
        raise PlacementError(f"{comp}: parallel batch needs two or more GPUs and the "
                             f"inventory has {len(gpus)}; {accepted}")
    one = SimpleNamespace(runtime=None, params=choice.params if choice.params == "cpu"
                          else None, split_mode=None, parallel=None)
    r = make_rules(one, geo, preset, gpus, caps, real_gpus)
    if choice.params not in (None, "cpu"):        # a runtime device: resident on each
        r.persist_res, r.float_res, r.stream = True, False, False
    r.runtime = runtime
    r.params = choice.params
    r.persist_split = r.float_split = r.split_stream = r.cpu = False
    r.params_elsewhere = False
    r.batch = True
    r.pipeline = False
    r.only = "batch_parallel"
    return r


def _pipeline_rules(choice, geo: Geometry, preset: str, gpus: Sequence[str], caps,
                    real_gpus) -> Rules:
    """parallel pipeline asked with auto-fit: a layer split over two or more GPUs (the
    runtime list when given, else auto-fit picks them) whose stages run a batch's shares
    one behind the other. Only resident layer splits (held for the session, or loaded
    while the phase runs) are pipelined by the cost model, so nothing else is priced: it
    is honoured or the fit fails saying why (kinds/pipeline.py `failure`)."""
    comp = geo.comp
    if (choice.split_mode or "layer") != "layer":
        raise PlacementError(f"{comp}: parallel pipeline runs a layer split's stages and "
                             f"split mode {choice.split_mode} has none; use split_mode layer "
                             f"or drop parallel pipeline")
    runtime, accepted = _asked(choice, comp, "pipeline", caps,
                               {"pipeline_split", "layer_split"})
    if choice.params not in (None, "cpu", "disk") and (runtime is None
                                                       or choice.params not in runtime):
        raise PlacementError(f"{comp}: parallel pipeline splits {comp} over the runtime "
                             f"devices; params {choice.params} is not one of them: name it in "
                             f"the backend ({comp}={choice.params}&...) or use params cpu")
    if geo.n < 2:
        raise PlacementError(f"{comp}: parallel pipeline needs two or more blocks to split "
                             f"into stages and {comp} has {geo.n}; drop parallel pipeline")
    one = SimpleNamespace(runtime=runtime, params=choice.params, split_mode="layer",
                          parallel=None)
    r = make_rules(one, geo, preset, gpus, caps, real_gpus)
    usable = r.gpus if r.gpus is not None else gpus
    if runtime is None and len(usable) < 2:
        raise PlacementError(f"{comp}: parallel pipeline needs two or more GPUs and the "
                             f"inventory has {len(usable)}"
                             f"{' this executor runs it on' if r.gpus is not None else ''}; "
                             f"{accepted}")
    if not (r.persist_split or r.float_split):
        # presets that take turns whole (model, sequential) split only a named device
        # list: a pipeline asked is such a list, left to auto-fit
        r.float_split = caps is None or "cpu_params" in caps
        if choice.params not in (None, "cpu", "disk"):
            r.persist_split, r.float_split = True, False
    r.persist_res = r.float_res = r.stream = r.split_stream = r.cpu = False
    r.params_elsewhere = r.prefix_zero = False
    r.split_mode = "layer"
    r.batch = False
    r.pipeline = True
    r.only = "pipeline"
    return r


ROW_MIN_ELEMENTS = 256 * 256     # runtime/split/row.py MIN_ROWS x MIN_COLS


def row_shardable(geo: Geometry) -> bool:
    """Whether a row split can shard this component: some block holds at least one
    256x256 matrix (a block smaller than that cannot)."""
    from .costs import bytes_per_param
    per = bytes_per_param(geo.info.dtype, geo.info.quant)
    return geo.n > 0 and geo.largest_block >= ROW_MIN_ELEMENTS * per


def _rules(choice, geo: Geometry, preset: str, gpus: Sequence[str]) -> Rules:
    r = Rules()
    runtime = list(choice.runtime) if choice.runtime else None
    params = choice.params
    r.split_mode = choice.split_mode or "layer"
    r.params = params
    splittable = geo.n >= 2
    streamable = geo.n >= 2
    offload_params = params in ("cpu", "disk")
    if runtime is not None and "cpu" in runtime:
        if len(runtime) > 1:
            raise PlacementError(f"auto-fit cannot split {geo.comp} over the cpu and GPUs "
                                 f"({'&'.join(runtime)}); name GPUs only, or cpu alone")
        r.runtime = ["cpu"]
        r.cpu = True
        return r
    if runtime is not None:
        r.runtime = runtime
    if params is not None and params not in ("cpu", "disk"):
        # weights rest on a named GPU for the session
        if runtime is None or runtime == [params] or (len(runtime) > 1 and params in runtime):
            if runtime is None:
                r.runtime = [params]
            if len(r.runtime) > 1:
                r.persist_split = True
            else:
                r.persist_res = True
        else:
            r.params_elsewhere = True
        return r
    split_only = runtime is not None and len(runtime) > 1
    single_only = runtime is not None and len(runtime) == 1
    may_split = splittable and not single_only and (split_only or len(gpus) >= 2)
    if preset == "none":
        if not offload_params:
            r.persist_res = not split_only
            r.persist_split = may_split
        else:
            r.float_res = not split_only
            r.float_split = may_split
    elif preset == "model":
        r.float_res = not split_only
        r.float_split = split_only and splittable
    elif preset == "sequential":
        r.stream = streamable and not split_only
        r.float_res = not streamable and not split_only
        r.float_split = split_only and splittable
        r.prefix_zero = True
    else:   # auto, balanced
        if not offload_params:
            r.persist_res = not split_only
            r.persist_split = may_split
        r.float_res = not split_only
        r.stream = streamable and not split_only
        r.float_split = may_split
        # a row split cannot stream (its shards are whole matrices): a component too big
        # for a row split over the GPUs streams as a layer split over them instead of
        # leaving all but one idle (kinds/split_stream.py says so)
        r.split_stream = may_split
        r.cpu = runtime is None
    if not gpus and runtime is None:
        r.cpu = True            # no accelerator: every preset computes on the CPU
    return r
