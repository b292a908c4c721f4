"""A diffusion model run by the pack's engine (runtime.place) inside ComfyUI's sampler.

`place_model_with_engine(model, plan, inventory)` (engine_model.py) returns a clone of
the MODEL that:
- loads through ComfyUI's memory manager without moving its weights or fusing its
  LoRA patches (engine_patcher.EngineLoad);
- holds one placement (runtime.place) for a whole sampling run: opened at the first
  model call (after ComfyUI's load, WrappersMP.APPLY_MODEL) and closed when the run
  ends (WrappersMP.OUTER_SAMPLE), also when it raised or was interrupted, and when
  ComfyUI detaches (unloads) the model. Resident blocks thus stay across steps and are
  released before VAE decode.
- never places the module it shares with the given MODEL: each run places a structural
  copy (runtime/engine/shadow.py: own modules and tensor objects over the same memory), and
  ComfyUI's apply_model runs on a view of its BaseModel whose diffusion_model is that
  copy. Hooks, rebinding and the inference flag only ever touch the copy.
- keeps the packed host copy of the streamed blocks across runs (runtime/host/hoststore.py,
  one store per module): a second run packs nothing (stats "host_pack_bytes" 0). Where
  that copy is pageable the module's tensors are pointed into it (one copy in RAM). It
  is dropped when ComfyUI unloads the model (ON_DETACH with unpatch_all: free_memory,
  unload_all_models) and when a placement that streams other blocks opens on the module.
- keeps a worker's block range loaded across runs the same way (runtime/distributed/
  kept.py): a second run with the same range, file and weights moves and hashes nothing
  (stats "worker_loading"); the ranges go when ComfyUI unloads the model or a plan
  stops naming that worker device.

ComfyUI's memory manager sees the device memory of the placement through one stand-in
patcher per device, an additional model of the clone (claims.py): it frees room for it
before a run, and when it needs the room back the session leaves the placement.

The session is an attachment of the clone ("placement"), so clones made after Apply
Placement (a LoRA loader, a patch node) share it; `session.last_stats` holds the
ledger figures of the last run (runtime.place stats()).
"""
import logging
import types
import uuid
import weakref
from typing import List, Optional

import torch

import comfy.patcher_extension as ext

from ....placement.errors import PlacementError
from ....placement.report import short_bytes
from ...engine.fallbacks import describe, make
from ...distributed.kept import free as free_kept
from ...engine.shadow import Shadow
from ...host.hoststore import drop_store, store_for
from ...place import place
from ..files.model_file import file_key_map
from ..patchers.engine_patcher import engine_patcher_class, strip_engine
from ..patchers.patch_errors import patches_must_apply
from ..patchers.retarget import plain_clone
from ..patchers.row_lora import row_lora_options
from ..patchers.weight_hooks import install_slots
from .cut import cut_comfy_inputs
from .skips import with_skip_follow

log = logging.getLogger("comfyui-placement")
RUN_STATS = 16          # stats of the last placements a session keeps
# diffusion module -> the session placing it (the last bound), for a call of a model
# made under another model's wrappers (SamplingSession.another_model)
_BOUND: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def run_on_copy(executor, base, view, args, kwargs):
    """Go on with ComfyUI's APPLY_MODEL chain with `view` (a BaseModel running the
    placed copy) in place of `base`: the next wrappers and `_apply_model` see the view.
    An executor of another shape (a future ComfyUI) falls back to pointing `base` at the
    copy for this one call."""
    original = getattr(executor, "original", None)
    if getattr(original, "__self__", None) is base and hasattr(executor, "wrappers"):
        nxt = ext.WrapperExecutor.new_class_executor(
            types.MethodType(original.__func__, view), view, executor.wrappers, executor.idx)
        return nxt(*args, **kwargs)
    modules = base._modules
    own = modules["diffusion_model"]
    modules["diffusion_model"] = view.diffusion_model
    try:
        return executor(*args, **kwargs)
    finally:
        modules["diffusion_model"] = own


class SamplingSession:
    """The plan for one MODEL and, during a sampling run, its live placement."""

    def __init__(self, plan, component: str, inventory, weights_file: Optional[str]):
        self.plan = plan
        self.component = component
        self.inventory = inventory
        self.weights_file = weights_file
        self.placed = None
        self.shadow: Optional[Shadow] = None   # the copy the open placement runs
        self._base_view = None                 # (BaseModel, its view running the copy)
        self.last_stats = None
        self.run_stats: List[dict] = []        # stats of each placement (last RUN_STATS)
        self.runs = 0
        self.releases: List[str] = []     # devices ComfyUI asked room on (claims.py)
        # worker ranges (worker_ranges.py): place() options and the blocks workers run
        self.remote_options: dict = {}
        self.remote_blocks: List[str] = []
        self._module = None                    # weakref to the module it places (bind)
        self._companions: List["SamplingSession"] = []   # other models' sessions run here

    # ComfyUI copies attachments into clones with this hook; one session per module.
    def on_model_patcher_clone(self):
        return self

    def bind(self, module) -> None:
        """This session places `module` (the MODEL's diffusion model)."""
        self._module = weakref.ref(module)
        _BOUND[module] = self

    def outer_sample(self, executor, *args, **kwargs):
        try:
            return executor(*args, **kwargs)
        finally:
            self.close()
            for other in self._companions:
                other.close()
            self._companions = []

    def apply_model(self, executor, *args, **kwargs):
        base = executor.class_obj
        own = self._module() if self._module is not None else None
        if own is not None and base.diffusion_model is not own:
            return self.another_model(executor, base, args, kwargs)
        if self.placed is None:
            patcher = getattr(base, "current_patcher", None)
            if patcher is not None:     # before the copy: its layers share the slots
                install_slots(patcher)
            self.open(base.diffusion_model)
        if self.placed.crosses_devices:     # a layer split: skips cross devices
            args, kwargs = with_skip_follow(args, kwargs, self.placed.follow)
        with patches_must_apply(self.component):
            return run_on_copy(executor, base, self.base_view(base), args, kwargs)

    def another_model(self, executor, base, args, kwargs):
        """A call of a model this session does not place, under its wrapper: ComfyUI's
        Dual Model CFG Guider runs its negative model with the positive model's options
        (their wrappers). That model's own session runs it (closed when this run ends);
        a model the pack does not place (or this session's own placed copy, seen by a
        wrapper further down the chain) goes on along ComfyUI's path."""
        other = _BOUND.get(base.diffusion_model)
        if other is None or other is self:
            return executor(*args, **kwargs)
        if other not in self._companions:
            self._companions.append(other)
        return other.apply_model(executor, *args, **kwargs)

    def base_view(self, base):
        """A shallow copy of ComfyUI's BaseModel whose diffusion_model is the placed copy
        (the BaseModel itself is shared by every clone and never changed)."""
        hit = self._base_view
        if hit is None or hit[0] is not base or hit[2] is not self.shadow:
            view = base.__class__.__new__(base.__class__)
            view.__dict__.update(base.__dict__)
            view.__dict__["_modules"] = {**base._modules,
                                         "diffusion_model": self.shadow.module}
            hit = self._base_view = (base, view, self.shadow)
        return hit[1]

    def on_detach(self, patcher, unpatch_all):
        self.close()
        # ComfyUI unloads the model (free_memory, unload_all_models: unpatch_all): its
        # packed host copy goes. Other detaches keep it: load_models_gpu detaches the
        # model it is about to load again (unpatch_all False), and so does a garbage
        # collected clone (ModelPatcher.__del__).
        if unpatch_all:
            drop_store(patcher.model.diffusion_model)
            free_kept(patcher.model.diffusion_model)    # and its ranges on workers

    def on_deepclone_multigpu(self, patcher, clone):
        # Core's MultiGPU CFG Split runs a full copy per GPU on threads; they would share
        # this one placement.
        raise PlacementError(
            f"{self.component}: a model placed by the pack's engine (streamed, split, on "
            f"disk or simulated) cannot be combined with MultiGPU CFG Split; split it with "
            f"Backend Assignment instead (e.g. diffusion=cuda0&cuda1)")

    def release_for_comfy(self, device: str) -> None:
        """ComfyUI's memory manager wants room on `device` (claims.py): leave the
        placement, which gives every device's memory back (the engine cannot release one
        device alone). The next model call opens it again; a call already under way
        finishes on ComfyUI's cast path, from the weights where they rest. Outside a
        run nothing is held and nothing happens."""
        if self.placed is None:
            return
        self.close()
        self.releases.append(device)
        note_cast_path(self.last_stats, self.plan, self.component, device, "model call",
                       "the next model call places it again")

    def place_options(self, module) -> dict:
        """runtime.place options every placement of `module` needs (params disk: the file;
        worker ranges: the workers, the builder and the file, kept loaded for `module`
        between runs; the copy's released block tensors are not read back, the copy goes
        at close)."""
        remote = dict(self.remote_options)
        if remote:
            remote.update(keep_for=module, restore_released=False)
        if self.plan.components[self.component].params != "disk":
            return remote
        if not self.weights_file:
            raise PlacementError(f"{self.component}: params disk needs the model's file "
                                 f"and this MODEL does not come from a core loader "
                                 f"that records it (Load Diffusion Model, Load "
                                 f"Checkpoint); use params cpu")
        return dict({"weights_file": self.weights_file,
                     "key_map": file_key_map(self.weights_file, module)}, **remote)

    def open(self, module) -> None:
        options = self.place_options(module)
        if not self.remote_options:       # ranges kept for `module` by an earlier plan go
            free_kept(module)
        cp = self.plan.components[self.component]
        if cp.parallel == "pipeline":        # shares cut transformer_options by meaning
            options["cut_inputs"] = cut_comfy_inputs
        shadow = Shadow(module)              # the engine places a copy, never `module`
        # row split: ComfyUI's LoRA patches on the sharded Linears go in as lora= (row_lora)
        with row_lora_options(shadow.module, cp) as lora_options:
            # ComfyUI's first model call was rehearsed and planned for (rehearse_call.py)
            placed = place(shadow.module, self.plan, self.component, self.inventory,
                           host_store=store_for(module), repoint=shadow.repoint,
                           rehearse=False, **options, **lora_options)
            # ComfyUI samples under inference_mode; buffers made there would be inference
            # tensors, which the engine's copy thread (outside inference mode) may not write.
            with torch.inference_mode(False):
                placed.__enter__()
        self.placed, self.shadow = placed, shadow
        self.runs += 1

    def close(self) -> None:
        placed, self.placed = self.placed, None
        if placed is None:
            return
        with torch.inference_mode(False):
            placed.__exit__(None, None, None)
        self.shadow = self._base_view = None
        self.last_stats = placed.stats()
        self.run_stats = (self.run_stats + [self.last_stats])[-RUN_STATS:]
        for name, d in self.last_stats["devices"].items():
            log.info("placement %s on %s: peak %s of %s, %s copied in",
                     self.component, name, short_bytes(d.get("peak_bytes", 0)),
                     short_bytes(d.get("capacity_bytes", 0)), short_bytes(d.get("h2d_bytes", 0)))


def note_cast_path(stats: dict, plan, component: str, device: str, call: str,
                   after: str) -> dict:
    """ComfyUI asked for memory on `device` in the middle of a placed call: the placement
    was left and the rest of the call ran on ComfyUI's cast path. A runtime fallback
    (runtime/engine/fallbacks.py) in the stats of the placement that was left, and a warning in
    the log; the node shows it (nodes/measured.py)."""
    runtime = "&".join(plan.components[component].runtime)
    record = make("comfy_cast_path", component, f"placed by the pack's engine on {runtime}",
                  "ComfyUI's cast path from the resting weights",
                  f"ComfyUI asked for memory on {device} during a {call}; the placement "
                  f"gave its memory back and the rest of that call computed from the "
                  f"weights where they rest; {after}", device=device)
    stats.setdefault("fallbacks", []).append(record)
    log.warning("placement %s", describe(record))
    return record


def engine_clone(patcher, load_device, offload_device, what: str):
    """A clone with the engine's load policy. DynamicVRAM patchers are rebuilt as plain
    ones (the engine, not DynamicVRAM, decides what is on the device)."""
    notes: List[str] = []
    if patcher.is_dynamic():
        clone = plain_clone(patcher, what, "for the pack's engine")
        notes.append(f"{what}: DynamicVRAM off for this copy (the pack's engine places it)")
    else:
        clone = patcher.clone()
    strip_engine(clone)
    clone.__class__ = engine_patcher_class(type(clone))
    clone.load_device = load_device
    clone.offload_device = offload_device
    # ComfyUI then unpatches weights a sibling clone fused, before our load (retarget.py)
    clone.patches_uuid = uuid.uuid4()
    return clone, notes
