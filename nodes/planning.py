"""Planning from inside ComfyUI: the pack's plan() fed with the loaded objects.

Apply Placement plans every connected component together (auto-fit must see the whole
set). Each is described from its torch module (names, shapes and dtypes only, no
weights read), so the plan knows its blocks; an object the metadata reader cannot
describe is still planned, by its size alone.
"""
import copy
import os
import threading
from collections import OrderedDict
from typing import Dict, Optional

from ..placement.errors import PlacementError
from ..placement.metadata import ComponentInfo, describe_component
from ..placement.resolve import plan as resolve_plan
from .common import SIMULATE_ENV

# Plans made here run inside ComfyUI: auto-fit proposes only what the adapter executes
# (placement/capabilities.py), explicit requests it cannot run are errors at queue time.
EXECUTOR = "comfyui"


def make_plan(spec, inventory, objects: Optional[Dict[str, object]] = None,
              strict: bool = False, workload=None, pins=None):
    """`workload` (runtime/comfy/workload.Workload): what sampling will compute; its
    size sets every component's working memory, and with auto_fit its steps and CFG
    batch the costs. `pins`: components already placed (auto-fit keeps them)."""
    size = {} if workload is None else {"resolution": tuple(workload.resolution),
                                        "frames": workload.frames, "batch": workload.batch}
    infos = {comp: describe_object(comp, obj, workload) for comp, obj in
             (objects or {}).items() if obj is not None}
    extra = {}
    if workload is not None and spec.auto_fit:
        extra = {"steps": workload.steps, "cond_batch": workload.cond_batch, "pins": pins}
    result = resolve_plan(spec, inventory, components=infos or None, strict=strict,
                          executor=EXECUTOR, **size, **extra)
    if workload is not None:
        result.extra["workload"] = workload.to_dict()
    return result


# -- one plan per spec per prompt --------------------------------------------------------
# Backend Assignment's spec is planned once when the prompt is validated and that plan is
# what its execute shows and passes on (a copy: note_workers adds to it). A new prompt
# (prompt_inputs.remember_prompt) forgets them, so every prompt plans for the machine as
# it is then; an error is kept like a plan, so execute refuses with validation's words.
_SPEC_PLANS: "OrderedDict[tuple, tuple]" = OrderedDict()
_KEEP = 64
_LOCK = threading.Lock()          # the server validates while the executor runs


def forget_spec_plans() -> None:
    with _LOCK:
        _SPEC_PLANS.clear()


def spec_plan(spec, strict: bool, workers: str, inventory_for):
    """(plan, joined workers) for the spec alone, planned once per prompt:
    `inventory_for()` -> (inventory, joined) is asked only when it is not planned yet."""
    # the simulated inventory is a choice (an environment variable), not a drift: a new
    # one plans again; free memory moving between validation and execution does not
    key = (repr(spec), bool(strict), str(workers or "").strip(),
           os.environ.get(SIMULATE_ENV, ""))
    with _LOCK:
        hit = _SPEC_PLANS.get(key)
    if hit is None:
        try:
            inventory, joined = inventory_for()
            hit = (make_plan(spec, inventory, strict=strict), joined)
        except PlacementError as exc:
            hit = (exc, None)
        with _LOCK:
            _SPEC_PLANS[key] = hit
            while len(_SPEC_PLANS) > _KEEP:
                _SPEC_PLANS.popitem(last=False)
    plan, joined = hit
    if isinstance(plan, PlacementError):
        raise PlacementError(str(plan))
    return copy.deepcopy(plan), joined


def torch_module(obj):
    """The nn.Module holding a ComfyUI object's weights."""
    patcher = getattr(obj, "patcher", None) or getattr(obj, "control_model_wrapped", None)
    if patcher is None and hasattr(obj, "model_size") and hasattr(obj, "model"):
        patcher = obj                                   # MODEL is the patcher itself
    module = getattr(patcher, "model", None) if patcher is not None else obj
    # a diffusion BaseModel keeps the network (whose keys name the blocks) inside
    return getattr(module, "diffusion_model", module)


# torch dtypes as the tensor tables name them (placement/metadata/tensors.py)
DTYPE_NAMES = {"torch.float32": "f32", "torch.float64": "f64", "torch.float16": "f16",
               "torch.bfloat16": "bf16"}


def compute_dtype(obj):
    """The dtype a ComfyUI object computes in where its weights are stored in another:
    ComfyUI's manual cast (bf16 weights computed in float32 on a CPU, or in float16 on a
    GPU without bf16). None: its weights' own."""
    patcher = getattr(obj, "patcher", None) or getattr(obj, "control_model_wrapped", None)
    if patcher is None and hasattr(obj, "model_size") and hasattr(obj, "model"):
        patcher = obj
    model = getattr(patcher, "model", None) if patcher is not None else None
    return DTYPE_NAMES.get(str(getattr(model, "manual_cast_dtype", None)))


def describe_object(component: str, obj, workload=None) -> ComponentInfo:
    # detectors (runtime/detector.Detectors) hold one model or a BBOX/SEGM pair's two
    modules = obj.modules() if component == "detector" else [torch_module(obj)]
    label = f"comfy:{type(obj).__name__}"
    size = {} if workload is None else {"resolution": tuple(workload.resolution),
                                        "frames": workload.frames, "batch": workload.batch}
    try:
        info = describe_component(component, modules, **size,
                                  compute_dtype=compute_dtype(obj))
        if component == "diffusion" and getattr(workload, "rehearsed_bytes", None) is not None:
            return with_rehearsal(info, workload.rehearsed_bytes,
                                  getattr(workload, "rehearsed_per_device", ()),
                                  getattr(workload, "rehearsed_input_bytes", 0))
        if workload is not None and component in ("diffusion", "controlnet"):
            info = with_cond_batch(info, workload.cond_batch)
        if component == "controlnet":
            info = with_control_kind(info, obj)
        if component == "te":
            info = with_generation(info, obj)
        if component == "diffusion" and workload is not None and \
                not getattr(workload, "estimate_final", False):
            # sampling rehearses the first model call and plans again with what it
            # measured, before the run computes (runtime/comfy/replan/workload.py): the
            # estimate is not a reason to refuse the plan (placement/explicit.py)
            from dataclasses import replace
            info = replace(info, headroom_measured_later=True)
        return info
    except PlacementError as exc:
        return ComponentInfo(component, sum(module_bytes(m) for m in modules),
                             sources=(label,),
                             warnings=(f"{component}: described by size only ({exc})",))


def with_control_kind(info: ComponentInfo, control) -> ComponentInfo:
    """A ControlNet that computes with the diffusion model's own modules cannot run
    apart from it (its residuals cannot hop): named so, the planner keeps them together
    (placement/controlnet_with_diffusion.py)."""
    from dataclasses import replace
    from ..runtime.comfy.sampling.control_hops import uses_diffusion_weights
    from ..placement.controlnet_with_diffusion import WITH_DIFFUSION_WEIGHTS
    if uses_diffusion_weights(control):
        return replace(info, arch=WITH_DIFFUSION_WEIGHTS)
    return info


# text encoders whose encode writes tokens one by one (ACE-Step 1.5's audio codes): each
# step's logits read the token embedding whole (tied embeddings), in the compute dtype
GENERATING_TEXT_ENCODERS = ("ACE15TEModel",)


def with_generation(info: ComponentInfo, clip) -> ComponentInfo:
    """A text encoder that generates while it encodes: its working memory holds the
    compute-dtype copy of its token embedding the logits read (a generation loop cannot
    be rehearsed weightless: its tokens drive it)."""
    from dataclasses import replace
    from ..placement.units import format_bytes
    model = getattr(clip, "cond_stage_model", None)
    if info.headroom_bytes is None or not any(
            c.__name__.startswith(GENERATING_TEXT_ENCODERS) for c in type(model).__mro__):
        return info
    embedding = max((p for n, p in model.named_parameters() if n.endswith("embed_tokens.weight")),
                    key=lambda p: p.numel(), default=None)
    if embedding is None:
        return info
    size = 4 if compute_dtype(clip) == "f32" else embedding.element_size()
    extra = embedding.numel() * size
    return replace(info, headroom_bytes=info.headroom_bytes + extra,
                   headroom_basis=f"{info.headroom_basis} + its token embedding read by each "
                                  f"generated token's logits ({format_bytes(extra)})")


def with_rehearsal(info: ComponentInfo, working: int, per_device=(), inputs: int = 0
                   ) -> ComponentInfo:
    """The working memory a run's first model call rehearsed (runtime/comfy/
    rehearse_call.py): the tensors it computes at their peak (per device for a layer
    split) and its inputs (on the main device), plus the kernel workspace, in place of
    the estimate."""
    from dataclasses import replace
    from ..placement.metadata import headroom as hr
    from ..placement.units import format_bytes
    where = "; " + ", ".join(f"{d} {format_bytes(b)}" for d, b in per_device) \
        if per_device else ""
    main = per_device[0][0] if per_device else None
    return replace(info, headroom_bytes=hr.WORKSPACE + int(working) + int(inputs),
                   workspace_bytes=hr.WORKSPACE,
                   headroom_per_device=tuple(
                       (d, hr.WORKSPACE + int(b) + (int(inputs) if d == main else 0))
                       for d, b in per_device),
                   headroom_basis=f"rehearsed at this run's shapes: {format_bytes(working)}"
                                  f"{where} + {format_bytes(inputs)} of inputs + "
                                  f"{format_bytes(hr.WORKSPACE)} workspace")


def with_cond_batch(info: ComponentInfo, cond_batch: int) -> ComponentInfo:
    """The metadata's activation estimate assumes the architecture's usual CFG batch
    (headroom.DIT cfg, 2 for UNets); scale it to the sampler's real one."""
    from dataclasses import replace
    from ..placement.metadata import headroom as hr
    if info.headroom_bytes is None:
        return info
    if info.arch in hr.DIT:
        assumed = hr.DIT[info.arch].cfg
    elif info.arch in hr.UNETS:
        assumed = 2
    else:
        return info                       # a fixed reserve: nothing to scale
    if assumed == cond_batch:
        return info
    act = max(0, info.headroom_bytes - hr.WORKSPACE)
    scaled = hr.WORKSPACE + act * cond_batch // assumed
    return replace(info, headroom_bytes=scaled,
                   headroom_basis=f"{info.headroom_basis}; scaled x{cond_batch}/{assumed} "
                                  f"for the sampler's CFG batch")


def module_bytes(module) -> int:
    if not hasattr(module, "parameters"):
        return 0
    return sum(p.numel() * p.element_size() for p in module.parameters())
