"""Components called outside the sampler (VAE, text encoders), placed by the pack's
engine per call.

ComfyUI's VAE calls `first_stage_model.decode(...)` / `.encode(...)` directly, and CLIP
calls `cond_stage_model.encode_token_weights(tokens)`. The placed copy gets a proxy in
that attribute: each such call runs the method through a small nn.Module (so the
engine's root hooks see the call's inputs) inside one placement (runtime.place, which
streams the blocks when the plan says so), left when the call returns or raises.
An out-of-memory on the device's budget (the ledger counts the weights and the call's
inputs) thus reaches ComfyUI's own handler in VAE.decode, which retries tiled; each
tile is a smaller call that fits. The module itself is shared with the given VAE and
never changed: each call places a structural copy of it (runtime/engine/shadow.py), and the
proxy and the wrapper only belong to the placed VAE. Streamed blocks' packed host copy
is kept across calls (runtime/host/hoststore.py) and dropped when ComfyUI unloads the copy.

This path runs VAE plans ComfyUI's patcher cannot (simulated devices, params disk);
each call loads the weights for that call, which is what params cpu/disk means for a
VAE anyway (stable-diffusion.cpp's offload), at the price of a reload per tile.

ComfyUI's memory manager sees each call's device memory through per-device claims
(claims.py), loaded by ComfyUI's own `load_models_gpu([patcher])` before the call: it
frees room for them on every device of the plan and lists them; when it wants the room
back during a call, the call's placement is left (`release_for_comfy`) and the call
finishes from the resting weights.
"""
import copy
import logging
import os
from typing import List, Tuple

import torch

from ....placement.errors import PlacementError
from ...blocks.moves import map_tensors
from ...engine.shadow import Shadow
from ...host.hoststore import drop_store, store_for
from ...place import place
from ..files.te_files import clip_disk_source, clip_files
from ..patchers.claims import load_claims_with, register_claims
from ..patchers.engine_patcher import KEY
from ..patchers.patch_errors import patches_must_apply
from ..patchers.row_lora import row_lora_options
from ..sampling.sampling_session import engine_clone, note_cast_path
from ..sampling.skips import joins_follow

log = logging.getLogger("comfyui-placement")
WRAPPED = "inner."               # name prefix of the module's tensors inside the wrapper


class MethodCall(torch.nn.Module):
    """forward = one method of `inner` (decode, encode)."""

    def __init__(self, inner: torch.nn.Module, method: str):
        super().__init__()
        self.inner = inner
        self.method = method

    def forward(self, *args, **kwargs):
        return getattr(self.inner, self.method)(*args, **kwargs)


class CallDoesNotFit(PlacementError):
    """A call's rehearsed need passes its device's room (CallSession._refuse_short)."""


def _tensors(args, kwargs):
    found = []
    map_tensors(lambda t: found.append(t) or t, (args, kwargs))
    return found


class CallSession:
    """One plan for one component; a placement per call, stats of each call kept."""

    def __init__(self, plan, component: str, inventory, weights_file=None, key_map=None,
                 host_when_short=()):
        self.plan = plan
        self.component = component
        # the methods whose call, when its rehearsed need passes its device's room, runs
        # on the host before any weight moves (_on_the_host): a text encoder's caller has
        # no out-of-memory fallback; a VAE's encode retried tiled on an out-of-memory gives
        # another latent (0.19 of its largest value on Qwen-Image Edit's reference image),
        # which changes the whole sample. A decode keeps ComfyUI's tiled retry (each tile
        # a smaller call): its seams are the image's own.
        self.host_when_short = tuple(host_when_short)
        self.inventory = inventory
        self.weights_file = weights_file
        self.key_map = key_map
        self.calls: List[dict] = []          # {"method", "outcome", "stats"}
        self.placed = None                   # the placement of the call under way
        self._record = None                  # and its entry in `calls`
        self.releases: List[str] = []        # devices ComfyUI asked room on (claims.py)
        self.module = None                   # the module calls run a copy of

    def release_for_comfy(self, device: str) -> None:
        """ComfyUI's memory manager wants room on `device` (an EngineClaim's unload): leave
        the call's placement, which gives every device's memory back. The call goes on
        from the weights where they rest (ComfyUI's cast path); the next call places
        again. Between calls nothing is held and nothing happens."""
        placed, self.placed = self.placed, None
        if placed is None:
            return
        record = self._record
        self._leave(placed, record)
        self.releases.append(device)
        note_cast_path(record["stats"], self.plan, self.component, device,
                       record.get("method", "call"), "the next call places it again")

    def on_deepclone_multigpu(self, patcher, clone):
        raise PlacementError(f"{self.component}: a component placed by the pack's engine "
                             f"cannot be deep-cloned per GPU (MultiGPU); place it with "
                             f"Backend Assignment instead")

    def _leave(self, placed, record) -> None:
        with torch.inference_mode(False):
            placed.__exit__(None, None, None)
        record["stats"] = placed.stats()

    def on_detach(self, patcher, unpatch_all):
        """ComfyUI unloads the placed copy: the packed host copy goes (sampling_session.py
        says which detaches keep it)."""
        if unpatch_all and self.module is not None:
            drop_store(self.module)

    def call(self, module, method: str, args, kwargs):
        # the engine places a structural copy (runtime/engine/shadow.py), never `module`
        self.module = module
        shadow = Shadow(module)
        wrapper = MethodCall(shadow.module, method)
        options = {}
        if self.plan.components[self.component].params == "disk":
            if not self.weights_file:
                raise PlacementError(f"{self.component}: params disk needs the model's file, "
                                     f"and this object does not record it; use params cpu")
            inner_map = self.key_map or (lambda k: k)
            options = {"weights_file": self.weights_file,
                       "key_map": lambda k: inner_map(k[len(WRAPPED):])}
        cp = self.plan.components[self.component]
        record = {"method": method, "outcome": "raised"}
        try:
            options.update(self._rehearsed(module, wrapper, method, args, kwargs, record))
        except CallDoesNotFit as short:
            return self._on_the_host(module, method, args, kwargs, record, str(short))
        # row split: ComfyUI's LoRA patches on the sharded Linears go in as lora= (row_lora)
        with row_lora_options(wrapper, cp) as lora_options:
            # the call was rehearsed above (rehearse_call.py): no second rehearsal
            placed = place(wrapper, self.plan, self.component, self.inventory,
                           host_store=store_for(module), repoint=shadow.repoint,
                           rehearse=False, **options, **lora_options)
            self.calls.append(record)
            with torch.inference_mode(False):
                placed.__enter__()
        self.placed, self._record = placed, record
        try:
            with patches_must_apply(self.component), joins_follow(placed):
                out = wrapper(*args, **kwargs)
            record["outcome"] = "ok"
            return out
        except torch.OutOfMemoryError:
            record["outcome"] = "out of memory"
            raise
        finally:
            if self.placed is placed:        # not already left for ComfyUI
                self.placed = None
                self._leave(placed, record)


    def _rehearsed(self, module, wrapper, method: str, args, kwargs, record) -> dict:
        """The call rehearsed on the meta device at its real inputs (rehearse_call.py), as
        the diffusion model's first call is: its working memory, plus its inputs on the
        main device and the kernel workspace, is what the engine reserves for this call
        (place's headroom_bytes) in place of the metadata's estimate, and what the call's
        plan holds per device (`record["planned"]`: weights and ring by the engine's byte
        model, runtime/footprint.py, plus that working memory), the figure the node shows
        as planned. A call that cannot run weightless keeps the plan's estimate and says
        why in `record["unrehearsed"]`."""
        from ...footprint import footprint
        from ..replan.rehearse_call import plan_split, try_rehearse_method
        got, why = try_rehearse_method(module, method, args, kwargs,
                                       plan_split(self.plan, self.component))
        if got is None:
            record["unrehearsed"] = why
            log.warning("placement %s: the working memory of %s could not be rehearsed (%s); "
                        "the plan's estimate stands", self.component, method, why)
            return {}
        cp = self.plan.components[self.component]
        workspace = int(self.inventory.workspace_bytes() or 0)
        per_device = dict(got.per_device)
        headroom = {d: workspace + int(per_device.get(d, got.working_bytes))
                    + (got.input_bytes if d == cp.main_device else 0) for d in cp.runtime}
        weights, _ = footprint(wrapper, self.plan, self.component, self.inventory,
                               headroom=max(headroom.values()))
        record["rehearsal"] = dict(got.to_dict(), workspace_bytes=workspace,
                                   headroom_bytes=headroom,
                                   estimate_bytes=cp.headroom_bytes)
        record["planned"] = {d: int(weights.get(d, 0)) + headroom[d] for d in cp.runtime
                             if self.plan.device(d).kind != "cpu"}
        if method in self.host_when_short:
            self._refuse_short(method, cp, weights, headroom, record["planned"])
        return {"headroom_bytes": headroom}

    def _on_the_host(self, module, method: str, args, kwargs, record, why: str):
        """A call its device cannot hold, by the working memory rehearsed at its inputs,
        runs on the host instead, unplaced: the module's own weights rest there (the
        engine moves only its copy), its LoRA patches apply as ComfyUI's cast path
        applies them, and no device memory is used past the plan. Said in a warning and
        in the call's record (the node's stats); its result goes back to the caller's
        device. As the diffusion model's run is planned again when its first call's
        rehearsal does not fit (workload.py), this call is: onto the host."""
        caller = next((t.device for t in _tensors(args, kwargs)), None)
        host = torch.device("cpu")
        a = map_tensors(lambda t: t.to(host), args)
        k = map_tensors(lambda t: t.to(host), kwargs)
        log.warning("placement %s: %s; this call runs on the cpu", self.component, why)
        record.update(fallback=f"ran on the cpu: {why}")
        self.calls.append(record)
        out = getattr(module, method)(*a, **k)
        record["outcome"] = "ok (on the cpu)"
        if caller is None or caller == host:
            return out
        return map_tensors(lambda t: t.to(caller), out)

    def _refuse_short(self, method: str, cp, weights, headroom, planned) -> None:
        """One device holding every weight for the call (resident or staged): the
        engine checks weights + working memory against the room only after its own
        rehearsal (one_device.py), which the call's rehearsal above replaces; so the
        check is made here, in one line, before any weight moves. A stream re-sizes its
        prefix in the room left and a split its ranges: the engine refuses those."""
        if cp.stream is not None or cp.is_split or cp.parallel == "batch":
            return
        from ....placement.units import format_bytes as fb
        from ...footprint import capacity
        for d, need in planned.items():
            room = capacity(self.plan, self.inventory, d)
            if need > room:
                raise CallDoesNotFit(
                    f"{self.component}: {method} needs {fb(need)} on {d} "
                    f"({fb(weights.get(d, 0))} of weights beside {fb(headroom[d])} of "
                    f"working memory rehearsed at this call's inputs; the plan kept "
                    f"{fb(cp.headroom_on(d))}), but its room is {fb(room)}, short by "
                    f"{fb(need - room)}; give {d} more room (max_vram), stream the "
                    f"{self.component}'s blocks (stream_layers, params cpu) or run it "
                    f"on the cpu")

    def planned_by_device(self, methods=None) -> dict:
        """{device: bytes} the last rehearsed call (of `methods`, default any) planned, the
        largest over the calls of that method made one after another (a tiled decode's
        tiles); empty: none was rehearsed."""
        out, method = {}, None
        for c in reversed(self.calls):
            if methods is not None and c["method"] not in methods:
                if method is None:
                    continue
                break
            if method is not None and c["method"] != method:
                break
            if c.get("planned"):
                method = c["method"]
                for d, b in c["planned"].items():
                    out[d] = max(out.get(d, 0), int(b))
        return out


class EngineModuleProxy:
    """Stands in for a module on the placed copy: the named methods go through the
    engine, everything else is the module's own."""

    def __init__(self, module, session: CallSession, methods=("decode", "encode")):
        object.__setattr__(self, "_module", module)
        object.__setattr__(self, "_session", session)
        object.__setattr__(self, "_methods", tuple(methods))

    def __getattr__(self, name):
        value = getattr(self._module, name)
        if name in self._methods and callable(value):
            return lambda *a, **k: self._session.call(self._module, name, a, k)
        return value

    def __setattr__(self, name, value):
        raise PlacementError(f"the placed {self._session.component} is read-only "
                             f"(tried to set {name!r}); change the model before placement")


def place_vae_with_engine(vae, plan, inventory) -> Tuple[object, List[str]]:
    cp = plan.components["vae"]
    if cp.stream is not None or cp.is_split:
        raise PlacementError("vae: streaming or splitting the VAE is not supported; it "
                             "runs whole on one device (tiled on out-of-memory)")
    device = inventory.get(cp.main_device)
    load = torch.device("cpu") if device.simulated else torch.device(device.torch_device)
    placed = copy.copy(vae)
    placed.patcher, notes = engine_clone(vae.patcher, load, torch.device("cpu"), "vae")
    session = CallSession(plan, "vae", inventory, weights_file=_vae_file(vae),
                          host_when_short=("encode",))
    placed.patcher.set_attachments("placement", session)
    _callbacks(placed.patcher, session)
    placed.first_stage_model = EngineModuleProxy(placed.patcher.model, session)
    notes.extend(_claims(placed.patcher, session, plan, inventory, "decode"))
    placed.device = load
    notes.append(f"vae: placed by the pack's engine on {cp.main_device} for each "
                 f"decode/encode (weights rest on {cp.params}); tiled on out-of-memory")
    if device.simulated:
        notes.append(f"vae: {cp.main_device} simulated (diagnostic): compute on the cpu, "
                     f"capacity and copies modelled")
    return placed, notes


def place_clip_with_engine(clip, plan, inventory) -> Tuple[object, List[str]]:
    """CLIP (text encoders): streamed (or placed whole) per encode call."""
    cp = plan.components["te"]
    weights_file = key_map = None
    if cp.params == "disk":
        # blocks stream from the one file holding them all, matched exactly (te_files.py)
        weights_file, key_map = clip_disk_source(clip.patcher.model, clip_files(clip.patcher))
    device = inventory.get(cp.main_device)
    load = torch.device("cpu") if device.simulated else torch.device(device.torch_device)
    placed = clip.clone()
    placed.patcher, notes = engine_clone(clip.patcher, load, torch.device("cpu"), "te")
    session = CallSession(plan, "te", inventory, weights_file=weights_file, key_map=key_map,
                          host_when_short=("encode_token_weights",))
    placed.patcher.set_attachments("placement", session)
    _callbacks(placed.patcher, session)
    placed.cond_stage_model = EngineModuleProxy(placed.patcher.model, session,
                                                ("encode_token_weights",))
    notes.extend(_claims(placed.patcher, session, plan, inventory, "encode_token_weights"))
    mode = "streamed" if cp.stream is not None else "placed"
    if cp.is_split:
        mode = f"{cp.split_mode} split" + (" and streamed" if cp.stream is not None else "")
    rest = cp.params if weights_file is None else \
        f"disk, blocks read from {os.path.basename(weights_file)}"
    notes.append(f"te: {mode} by the pack's engine on {'&'.join(cp.runtime)} for each encode "
                 f"(weights rest on {rest}); LoRA patches applied at run time")
    simulated = [n for n in cp.runtime if inventory.get(n).simulated]
    if simulated:
        notes.append(f"te: {', '.join(simulated)} simulated (diagnostic): compute on the "
                     f"cpu, capacity and copies modelled")
    return placed, notes


def _callbacks(patcher, session) -> None:
    import comfy.patcher_extension as ext
    patcher.add_callback_with_key(ext.CallbacksMP.ON_DETACH, KEY, session.on_detach)


def _claims(patcher, session, plan, inventory, method: str) -> List[str]:
    """Per-device claims of the placed copy's patcher, sized on the module as each call
    places it (wrapped), loaded by ComfyUI with the patcher (claims.LoadsClaims)."""
    notes = register_claims(patcher, session, plan, inventory,
                            MethodCall(patcher.model, method))
    load_claims_with(patcher)
    return notes


def _vae_file(vae):
    init = getattr(vae.patcher, "cached_patcher_init", None)
    if init and getattr(init[0], "__name__", "") == "load_vae_patcher":
        return init[1][0]
    return None
