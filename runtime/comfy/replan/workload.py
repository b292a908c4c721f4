"""Auto-fit inside ComfyUI plans the real workload (issue 8).

What a sampling run computes (latent size, frames, batch, steps, and whether CFG runs
cond and uncond as one batch) decides the working memory and the cost of every
placement. Apply Placement plans at node time from what it can know then: the LATENT
input when connected, else the sampler downstream in the prompt (its steps, cfg and
the width/height/batch of the node that makes its latent), else the defaults. When
sampling starts, SamplingReplanner (a WrappersMP.OUTER_SAMPLE wrapper on the placed MODEL)
reads the real workload from the sampler's arguments; when it differs from the one
planned for, it plans again and runs that plan: the diffusion model through a placed
copy swapped into the guider for this run, the VAE output re-placed in place (it
decodes after sampling). Text encoders ran before sampling: their placement stays
what was planned at node time (pinned in the re-plan). Every run shows the plan that
ran in the node.
"""
import json
import logging
import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Callable, Dict, Optional, Tuple

from ....placement.plan import Plan

if TYPE_CHECKING:
    from .rehearse_call import Rehearsal

AUTOFIT_KEY = "placement_autofit"      # wrapper and attachment key of the replanner
FOLLOWS_LATENT = ("diffusion", "vae")  # re-planned at sampling; the rest is pinned
_CACHE = 4                             # placed copies kept per replanner (one per plan)
log = logging.getLogger("comfyui-placement")


@dataclass(frozen=True)
class Workload:
    resolution: Tuple[int, int] = (1024, 1024)    # pixels (width, height)
    frames: int = 1
    batch: int = 1
    steps: int = 20
    cond_batch: int = 1                            # 2: cond and uncond in one batch (CFG)
    source: str = field(default="default", compare=False)
    text_tokens: Optional[int] = None              # the prompt's length; None: not known
    # the diffusion model's working memory rehearsed at this workload's first model call
    # (rehearse_call.py); None: not yet, the metadata's estimate stands in
    rehearsed_bytes: Optional[int] = field(default=None, compare=False)
    rehearsed_per_device: Tuple[Tuple[str, int], ...] = field(default=(), compare=False)
    rehearsed_input_bytes: int = field(default=0, compare=False)   # held on the main device
    # the first model call could not be rehearsed: plans keep the metadata's estimate
    # and refuse on it (no measurement follows)
    estimate_final: bool = field(default=False, compare=False)

    def plan_args(self) -> dict:
        """Keyword arguments of placement.resolve.plan for this workload (auto-fit)."""
        return {"resolution": tuple(self.resolution), "frames": self.frames,
                "batch": self.batch, "steps": self.steps, "cond_batch": self.cond_batch}

    def describe(self) -> str:
        w, h = self.resolution
        frames = f", {self.frames} frames" if self.frames > 1 else ""
        cfg = ", CFG: cond+uncond (x2)" if self.cond_batch > 1 else ", no uncond pass"
        tokens = f", {self.text_tokens} text tokens" if self.text_tokens else ""
        return f"{w}x{h}{frames}, batch {self.batch}, {self.steps} steps{cfg}{tokens}"

    def to_dict(self) -> dict:
        return {"resolution": list(self.resolution), "frames": self.frames,
                "batch": self.batch, "steps": self.steps, "cond_batch": self.cond_batch,
                "source": self.source,
                **({"text_tokens": self.text_tokens} if self.text_tokens else {}),
                **({"rehearsed_bytes": self.rehearsed_bytes}
                   if self.rehearsed_bytes is not None else {}),
                **({"rehearsed_per_device": dict(self.rehearsed_per_device)}
                   if self.rehearsed_per_device else {})}


def from_latent_shape(shape, spatial: int = 8, temporal: int = 1, steps: int = 20,
                      cond_batch: int = 1, source: str = "latent") -> Workload:
    """[B, C, H, W] or [B, C, T, H, W] latent -> pixels, frames and batch; a sequence
    latent [B, C, L] (Hunyuan3D's shape tokens, audio) counts as one row of L."""
    shape = [int(s) for s in shape]
    if len(shape) < 3:
        raise ValueError(f"a latent has 3, 4 or 5 dimensions, got shape {shape}")
    if len(shape) == 3:
        shape = [shape[0], shape[1], 1, shape[2]]
    batch, height, width = shape[0], shape[-2], shape[-1]
    frames = (shape[2] - 1) * max(1, int(temporal)) + 1 if len(shape) >= 5 else 1
    spatial = max(1, int(spatial))
    return Workload((max(8, width * spatial), max(8, height * spatial)), max(1, frames),
                    max(1, batch), max(1, int(steps)), cond_batch, source)


def latent_ratios(patcher) -> Tuple[int, int]:
    """(spatial, temporal) compression of the model's latent format (8, 1 by default)."""
    fmt = None
    try:
        fmt = patcher.get_model_object("latent_format")
    except Exception:
        fmt = getattr(getattr(patcher, "model", None), "latent_format", None)
    return (int(getattr(fmt, "spacial_downscale_ratio", 8) or 8),
            int(getattr(fmt, "temporal_downscale_ratio", 1) or 1))


def uses_uncond(cfg, conds, model_options) -> bool:
    """ComfyUI's sampling_function skips the uncond pass at cfg 1 (unless the cfg1
    optimisation is disabled) and when there is no negative."""
    if not conds or not conds.get("negative"):
        return False
    if cfg is None:
        return False
    if math.isclose(float(cfg), 1.0) and not (model_options or {}).get(
            "disable_cfg1_optimization", False):
        return False
    return True


def from_sampling(guider, noise, sigmas, latent_shapes=None) -> Workload:
    """The workload of the run a CFGGuider is about to do (OUTER_SAMPLE arguments). A
    nested latent (LTX-2's video and audio) reaches OUTER_SAMPLE packed into one row
    ([B, 1, N]) with its `latent_shapes`: it is sized by its first, the video."""
    spatial, temporal = latent_ratios(guider.model_patcher)
    steps = max(1, int(sigmas.shape[-1]) - 1)
    conds = getattr(guider, "conds", None) or getattr(guider, "original_conds", None)
    cond = 2 if uses_uncond(getattr(guider, "cfg", None), conds,
                            getattr(guider, "model_options", None)) else 1
    shape = tuple(latent_shapes[0]) if latent_shapes and len(latent_shapes) > 1 \
        else tuple(noise.shape)
    w = from_latent_shape(shape, spatial, temporal, steps, cond, "sampler")
    tokens = text_tokens(conds)
    return replace(w, text_tokens=tokens) if tokens else w


def text_tokens(conds) -> Optional[int]:
    """The longest prompt among the sampler's conditionings (their cross_attn length)."""
    longest = 0
    for entries in (conds or {}).values():
        for c in entries or ():
            t = c.get("cross_attn") if isinstance(c, dict) else None
            if getattr(t, "ndim", 0) >= 2:
                longest = max(longest, int(t.shape[-2]))
    return longest or None


# -- node time: what the prompt says ----------------------------------------------------
SAMPLER_INPUTS = ("steps", "latent_image")


def from_prompt(prompt: Optional[dict], node_id, latent_shape=None, ratios=(8, 1)
                ) -> Workload:
    """The workload the sampler fed by this node's MODEL output will run, as far as the
    API prompt tells: its steps and cfg (literal widgets), and the pixels of the node
    that makes its latent (EmptyLatentImage and kin: width/height/batch_size/length).
    `latent_shape` (the LATENT input's samples) wins for the size. Unknown parts keep
    the defaults; `source` says where the numbers came from."""
    base = Workload()
    found = []
    sampler = _sampler(prompt or {}, str(node_id)) if prompt and node_id is not None else None
    steps, cond = base.steps, base.cond_batch
    if sampler is not None:
        inputs = sampler.get("inputs", {})
        if isinstance(inputs.get("steps"), int) and inputs["steps"] >= 1:
            steps = inputs["steps"]
            found.append("steps")
        cfg = inputs.get("cfg")
        if isinstance(cfg, (int, float)) and not isinstance(cfg, bool):
            has_negative = isinstance(inputs.get("negative"), list)
            cond = 2 if has_negative and not math.isclose(float(cfg), 1.0) else 1
            found.append("cfg")
    if latent_shape is not None:
        w = from_latent_shape(latent_shape, ratios[0], ratios[1], steps, cond)
        return Workload(w.resolution, w.frames, w.batch, steps, cond,
                        "LATENT input" + (" + sampler " + "/".join(found) if found else ""))
    size = _latent_size(prompt, sampler) if sampler is not None else None
    if size is not None:
        (width, height), batch, frames = size
        found.append("latent size")
        return Workload((width, height), frames, batch, steps, cond,
                        "prompt: sampler " + "/".join(found))
    source = ("prompt: sampler " + "/".join(found) + "; size unknown, default") if found \
        else "default (no sampler found downstream)"
    return Workload(base.resolution, base.frames, base.batch, steps, cond, source)


# nodes that hand one of their inputs on as their output 0 (the model among them):
# ComfyUI's switch (the templates choose LoRA or not with it); a Reroute passes any
PASS_ON = {"ComfySwitchNode": ("on_true", "on_false")}
def _is_link_to(value, node_id: str, slot: int) -> bool:
    return (isinstance(value, list) and len(value) == 2 and str(value[0]) == node_id
            and value[1] == slot)


def _sampler(prompt: dict, node_id: str) -> Optional[dict]:
    """The first sampler (a node with steps and latent_image) reached from this node's
    MODEL output (0) through nodes that pass a model along (input 'model', or a switch
    or reroute); else, for a node whose model is not connected, the sampler whose latent
    its VAE output (2) decodes."""
    frontier, seen = [node_id], set()
    while frontier:
        src = frontier.pop(0)
        if src in seen:
            continue
        seen.add(src)
        for nid in sorted(prompt, key=str):
            node = prompt[nid]
            inputs = node.get("inputs") or {}
            cls = node.get("class_type")
            passed = inputs.values() if cls == "Reroute" else \
                [inputs.get(n) for n in PASS_ON.get(cls, ("model",))]
            if not any(_is_link_to(v, src, 0) for v in passed):
                continue
            if all(k in inputs for k in SAMPLER_INPUTS):
                return node
            frontier.append(str(nid))
    return _sampler_decoded_by(prompt, node_id)


def _sampler_decoded_by(prompt: dict, node_id: str) -> Optional[dict]:
    """The sampler whose latent a VAE decode fed by this node's VAE output (2) reads
    (directly, or through nodes that pass the latent on as 'samples')."""
    for nid in sorted(prompt, key=str):
        inputs = prompt[nid].get("inputs") or {}
        if not _is_link_to(inputs.get("vae"), node_id, 2):
            continue
        link, hops = inputs.get("samples"), 0
        while isinstance(link, list) and len(link) == 2 and hops < 8:
            src = prompt.get(str(link[0])) or {}
            src_inputs = src.get("inputs") or {}
            if all(k in src_inputs for k in SAMPLER_INPUTS):
                return src
            link, hops = src_inputs.get("samples"), hops + 1
    return None


def _latent_size(prompt: dict, sampler: dict):
    """The size of the empty latent the sampler starts from: its latent_image, or up
    through what handed that latent on (an earlier sampler of a two-stage pair)."""
    link = sampler.get("inputs", {}).get("latent_image")
    for _ in range(8):
        if not (isinstance(link, list) and len(link) == 2):
            return None
        node = prompt.get(str(link[0])) or prompt.get(link[0])
        inputs = (node or {}).get("inputs", {})
        width, height = inputs.get("width"), inputs.get("height")
        if isinstance(width, int) and isinstance(height, int):
            break
        link = inputs.get("latent_image", inputs.get("samples"))
    else:
        return None
    batch = inputs.get("batch_size", 1)
    frames = inputs.get("length", 1)
    return ((width, height), batch if isinstance(batch, int) and batch >= 1 else 1,
            frames if isinstance(frames, int) and frames >= 1 else 1)


# -- sampling time ---------------------------------------------------------------------
def placement_key(plan: Plan, component: str) -> str:
    """What a component's placement is, without the reasons (they quote the workload)
    or how many streamed blocks stay resident: the engine session lays its blocks out
    when it opens, from the plan it is handed (_hand_plan), so a prefix sized again for
    the rehearsed working memory runs in the same session."""
    c = plan.to_dict()["components"].get(component, {})
    key = {k: c.get(k) for k in ("runtime", "params", "split_mode", "blocks", "lora")}
    key["streamed"] = c.get("stream") is not None
    return json.dumps(key, sort_keys=True)


class SamplingReplanner:
    """One Apply Placement's plan, made again when a sampling run starts: for the run's
    real workload and the working memory rehearsed at its first model call (explicit
    plans too; with auto_fit the placement itself may change).

    replan(workload, pins) -> Plan plans again (pins: the node-time plan, whose
    components other than FOLLOWS_LATENT keep their placement); place(plan, {component:
    object}) -> {component: placed} places; show(workload, plan, why_not_rehearsed)
    tells the node."""

    def __init__(self, plan: Plan, workload: Workload, replan: Callable, place: Callable,
                 show: Callable, vae_input=None, vae_output=None):
        self.plan0, self.workload0 = plan, workload
        self.replan, self.place, self.show = replan, place, show
        self.plans: Dict[Workload, Plan] = {workload: plan}
        self.models: list = []           # [(plan key, base patcher, placed clone)]
        self.vae_input, self.vae_output = vae_input, vae_output
        self.vae_states: Dict[str, dict] = {}
        self.vae_key = self.first_vae_key = placement_key(plan, "vae")
        if vae_output is not None:
            self.vae_states[self.vae_key] = dict(vae_output.__dict__)
        self.last: Optional[Tuple[Workload, Plan]] = None
        self.runs = 0
        self.rehearsals: Dict[Workload, "Rehearsal"] = {}
        self.unrehearsable: Dict[Workload, str] = {}     # workload -> why not
        self._guider = None              # the run's guider (its MODEL's engine session)
        self._run_patcher = None         # the MODEL the run samples with (its LoRA patches)

    # ComfyUI copies attachments into clones with this hook: one replanner per node output.
    def on_model_patcher_clone(self):
        return self

    def attach(self, placed_model) -> None:
        """Wire this replanner to the placed MODEL: an attachment (clones share it) and
        its OUTER_SAMPLE wrapper, which sees each sampling run's arguments."""
        import comfy.patcher_extension as ext
        placed_model.set_attachments(AUTOFIT_KEY, self)
        placed_model.add_wrapper_with_key(ext.WrappersMP.OUTER_SAMPLE, AUTOFIT_KEY,
                                          self.outer_sample)

    def plan_for(self, workload: Workload) -> Plan:
        plan = self.plans.get(workload)
        if plan is None:
            plan = self.plans[workload] = self.replan(workload, self.plan0)
        return plan

    def known(self, workload: Workload) -> Workload:
        """`workload` with its rehearsed working memory when a run rehearsed it."""
        hit = self.rehearsals.get(workload)
        return workload if hit is None else replace(
            workload, rehearsed_bytes=hit.working_bytes, rehearsed_per_device=hit.per_device,
            rehearsed_input_bytes=hit.input_bytes)

    def outer_sample(self, executor, noise, latent_image, sampler, sigmas, *args, **kwargs):
        guider = executor.class_obj
        self._run_patcher = guider.model_patcher
        workload = self.known(from_sampling(guider, noise, sigmas,
                                            kwargs.get("latent_shapes")))
        plan = self.plan_for(workload)
        self.runs += 1
        run = (noise, latent_image, sampler, sigmas) + args
        probe = None
        if workload.rehearsed_bytes is None and workload not in self.unrehearsable:
            probe = _Probe(self, workload, plan)
        try:
            return self._run(executor, guider, workload, plan, run, kwargs, probe)
        except _Replan as again:
            # the first model call rehearsed the working memory and it places the
            # diffusion model otherwise: nothing was computed yet, sample with that plan
            log.info("placement: %s; sampling starts again with the new plan", again)
            return self._run(executor, guider, again.workload, again.plan, run, kwargs, None)

    def _run(self, executor, guider, workload, plan, run, kwargs, probe):
        self.last = (workload, plan)
        self._use_vae(plan)
        if probe is None:        # else the node is told once the rehearsal has planned
            self.show(workload, plan, self.unrehearsable.get(workload, ""))
        if placement_key(plan, "diffusion") != placement_key(self.plan0, "diffusion"):
            return self._swapped(executor, guider, plan, run, kwargs, probe)
        self._guider = guider
        self._hand_plan(plan)
        saved = guider.model_options
        guider.model_options = with_probe(saved, probe)
        try:
            return executor(*run, **kwargs)
        finally:
            guider.model_options = saved

    def rehearsed(self, workload: Workload, plan: Plan, base, args, kwargs) -> None:
        """The first model call of a run (APPLY_MODEL arguments, `base` the BaseModel):
        rehearse its working memory, plan with it, and go on, or sample again (_Replan)
        where the new plan places the diffusion model otherwise."""
        from .rehearse_call import plan_split, try_rehearse
        got, why = try_rehearse(base, args, kwargs, plan_split(plan),
                                workload.batch * workload.cond_batch, self._run_patcher)
        if got is None:
            self.unrehearsable[workload] = why
            log.warning("placement: the working memory of this run could not be "
                        "rehearsed (%s); the plan keeps the metadata's estimate", why)
            # a plan made without the estimate (it did not fit, and a measurement was to
            # follow) is made again with it: it runs inside the estimate, or is refused
            # here in one line before the model computes
            final = replace(workload, estimate_final=True)
            new = self.plans[workload] = self.replan(final, self.plan0)
            if placement_key(new, "diffusion") != placement_key(plan, "diffusion"):
                raise _Replan(final, new, None)
            self._hand_plan(new)
            self.show(workload, new, why)
            return
        self.rehearsals[workload] = got
        known = self.known(workload)
        new = self.plans[workload] = self.replan(known, self.plan0)
        got, known, new = self._split_rehearsed(workload, plan, new, got, known, base,
                                                args, kwargs)
        if placement_key(new, "diffusion") != placement_key(plan, "diffusion"):
            raise _Replan(known, new, got)
        self.last = (known, new)
        self._hand_plan(new)
        self._use_vae(new)
        self.show(known, new)

    def _split_rehearsed(self, workload, plan, new, got, known, base, args, kwargs):
        """A layer split's working memory is per device of its ranges, rehearsed for the
        ranges of `plan`; the plan made with it (`new`) may cut elsewhere (the device
        with more working memory gets fewer blocks), which moves working memory between
        the devices (Kandinsky5: the visual blocks, and their activations, all past the
        cut). Rehearse the new ranges and plan again until the ranges planned are the
        ranges rehearsed (three rounds at most; past them, each device keeps the most any
        rehearsal of those ranges put there). Returns (rehearsal, workload, plan)."""
        from .rehearse_call import plan_split, try_rehearse
        split, seen = plan_split(plan), [got]
        for _ in range(3):
            again = plan_split(new)
            if again is None or again == split:
                return got, known, new
            more, _ = try_rehearse(base, args, kwargs, again,
                                   workload.batch * workload.cond_batch, self._run_patcher)
            if more is None or not more.per_device:
                break
            split, got = again, more
            seen.append(got)
            self.rehearsals[workload] = got
            known = self.known(workload)
            new = self.plans[workload] = self.replan(known, self.plan0)
        if plan_split(new) is not None and plan_split(new) != split:
            most: Dict[str, int] = {}
            for r in seen:
                for d, b in r.per_device:
                    most[d] = max(most.get(d, 0), int(b))
            got = replace(got, per_device=tuple(
                (d, most.get(d, b)) for d, b in got.per_device))
            self.rehearsals[workload] = got
            known = self.known(workload)
            new = self.plans[workload] = self.replan(known, self.plan0)
        return got, known, new

    def _hand_plan(self, plan: Plan) -> None:
        """The node's placed MODEL samples this run (the same placement): its engine
        session, not open yet, runs this run's plan, so it keeps the working memory this
        workload needs (rehearsed, or estimated), not the node-time plan's."""
        from ..patchers.engine_patcher import KEY
        guider = self._guider
        session = guider.model_patcher.get_attachment(KEY) if guider is not None else None
        if session is not None and hasattr(session, "plan") and \
                getattr(session, "placed", None) is None:
            session.plan = plan
            from ..patchers.claims import resize_claims
            module = getattr(getattr(guider.model_patcher, "model", None),
                             "diffusion_model", None)
            if module is not None:
                resize_claims(guider.model_patcher, session, plan, module)

    def _placed_model(self, plan: Plan, base):
        import comfy.patcher_extension as ext
        key = placement_key(plan, "diffusion")
        for k, b, placed in self.models:
            if k == key and b is base:
                return placed
        placed = self.place(plan, {"diffusion": base})["diffusion"]
        placed.remove_wrappers_with_key(ext.WrappersMP.OUTER_SAMPLE, AUTOFIT_KEY)
        placed.remove_attachments(AUTOFIT_KEY)
        self.models.append((key, base, placed))
        del self.models[:-_CACHE]
        return placed

    def _swapped(self, executor, guider, plan, args, kwargs, probe=None):
        """Run this sampling with the placed copy for `plan` in the guider: its load and
        offload devices, and its wrappers (the engine's) in the sampling options."""
        import comfy.model_patcher
        import comfy.patcher_extension as ext
        import comfy.sampler_helpers
        from ..patchers.engine_patcher import KEY
        placed = self._placed_model(plan, guider.model_patcher)
        options = comfy.model_patcher.create_model_options_clone(placed.model_options)
        options.setdefault("transformer_options", {})
        comfy.sampler_helpers.prepare_model_patcher(placed, guider.conds, options)
        options = with_probe(options, probe)
        saved = guider.model_patcher, guider.model_options
        guider.model_patcher, guider.model_options = placed, options
        try:
            # the rest of the original chain runs inside the placed copy's own (engine)
            # OUTER_SAMPLE wrappers, which close its placement when the run ends
            own = list(placed.wrappers.get(ext.WrappersMP.OUTER_SAMPLE, {}).get(KEY, []))
            return ext.WrapperExecutor.new_class_executor(
                lambda *a, **k: executor(*a, **k), guider, own).execute(*args, **kwargs)
        finally:
            guider.model_patcher, guider.model_options = saved

    def _use_vae(self, plan: Plan) -> None:
        """The VAE output decodes after sampling: give it the placement of this plan (it
        is this node's own copy, re-placed from the VAE input) for its decodes. Its
        encodes keep the node-time placement: the re-plan sized the VAE for the decode of
        this run's latent, and a later node may encode at its own size (Qwen-Image Edit
        encodes its reference image at a megapixel, whatever the latent), which the
        node-time plan was made for."""
        if self.vae_output is None or self.vae_input is None:
            return
        key = placement_key(plan, "vae")
        if key == self.vae_key:
            return
        state = self.vae_states.get(key)
        if state is None:
            placed = self.place(plan, {"vae": self.vae_input})["vae"]
            state = self.vae_states[key] = dict(placed.__dict__)
        first = self.vae_states.get(self.first_vae_key)
        if key != self.first_vae_key and first is not None:
            node_time = object.__new__(type(self.vae_output))
            node_time.__dict__.update(first)
            state = dict(state, encode=node_time.encode, encode_tiled=node_time.encode_tiled)
        self.vae_output.__dict__.clear()
        self.vae_output.__dict__.update(state)
        self.vae_key = key


# -- the first model call of a run: its working memory rehearsed -------------------------
PROBE_KEY = "placement_rehearsal"


class _Replan(Exception):
    def __init__(self, workload: Workload, plan: Plan, rehearsal):
        super().__init__(
            "working memory not rehearsed: planned again with its estimate"
            if rehearsal is None else f"working memory rehearsed at {rehearsal.inputs}: "
                                      f"{rehearsal.working_bytes} bytes; the plan changed")
        self.workload, self.plan = workload, plan


class _Probe:
    """An APPLY_MODEL wrapper, first in the chain: at the run's first model call, before
    any placement opens, hands the call to the replanner to rehearse; then steps aside."""

    def __init__(self, replanner: "SamplingReplanner", workload: Workload, plan: Plan):
        self.replanner, self.workload, self.plan = replanner, workload, plan
        self.done = False

    def __call__(self, executor, *args, **kwargs):
        if not self.done:
            self.done = True
            self.replanner.rehearsed(self.workload, self.plan, executor.class_obj, args,
                                     kwargs)
        return executor(*args, **kwargs)


def with_probe(options: dict, probe: Optional[_Probe]) -> dict:
    """A copy of the sampling options whose APPLY_MODEL chain starts with `probe`."""
    if probe is None:
        return options
    import comfy.model_patcher
    import comfy.patcher_extension as ext
    options = comfy.model_patcher.create_model_options_clone(options)
    topts = options.setdefault("transformer_options", {})
    wrappers = dict(topts.get("wrappers", {}))
    wrappers[ext.WrappersMP.APPLY_MODEL] = {
        PROBE_KEY: [probe], **wrappers.get(ext.WrappersMP.APPLY_MODEL, {})}
    topts["wrappers"] = wrappers
    return options
