"""ComfyUI's memory manager sees the device memory the pack's engine holds.

A MODEL the engine places (sampling_session.py) gets one stand-in patcher per accelerator of
its plan, an `EngineClaim`, registered with `set_additional_models(CLAIMS_KEY, ...)`.
ComfyUI's sampler loads a model's additional models together with it
(`prepare_sampling` -> `load_models_gpu([model] + models)`), so each claim becomes a
`LoadedModel` on its device, and ComfyUI's own code does the rest:
- before a run it frees room on every claim's device for `model_size()` (the bytes the
  plan holds there) - and nothing for the main patcher itself, whose own load puts
  nothing on the device (`EngineLoad.model_size` is 0 when claims are registered);
- while the placement is open `loaded_size()` is what the engine's ledger holds on that
  device (resident weights + ring slots); outside a run it is 0, since the engine gives
  everything back when sampling ends (sampling_session.py);
- when ComfyUI needs room there (`free_memory`, `unload_all_models`) it calls the
  claim's `partially_unload` / `detach`: the engine releases the placement (every
  device: it cannot give back one device's claim alone) and the next model call loads
  again.

Planned bytes per device (`planned_claims`), resident weights plus stream ring slots,
without activation headroom (ComfyUI adds its own activation estimate to every device it
frees room on):
- a plan made by auto-fit: the component plan's held_bytes less the
  component's "headroom_bytes" (the planner's figure, headroom included);
- otherwise what the engine will allocate for the plan and the module
  (runtime/footprint.py: the module's sizes through placement/layout.py, the byte model
  the planner and the engine use).
Devices of kind cpu get no claim: ComfyUI does not manage the host's memory this way.

The VAE and the text encoders placed by the engine (engine_calls.py) get claims the same
way, sized from the module the engine places per call. ComfyUI loads them with
`load_models_gpu([patcher], memory_required=...)` alone (CLIP.load_model, VAE.decode /
encode), never with additional models; but load_models_gpu also loads every model that
`patcher.model_patches_models()` names (the models a patcher's patches need with it).
Their patcher's class (`LoadsClaims`, set on the placed copy and kept by its clones)
adds its claims there, so ComfyUI's own load before each call frees room on every
claim's device (claim + its activation estimate), lists the claims while the call runs,
and can ask for the room back (the call's placement is then left: CallSession).
"""
from typing import Dict, List, Optional, Tuple

import torch

import comfy.model_patcher

from ....placement.remote_devices import is_remote
from ...footprint import footprint
from ...placed import PlacedEngine
from .engine_patcher import CLAIMS_KEY      # additional_models key; one claim per device


# -- what the plan holds on each device ---------------------------------------------------
def planned_claims(plan, component: str, inventory, module) -> Tuple[Dict[str, int], str]:
    """{device name: bytes} for the accelerators of the component's runtime, and the
    basis in words."""
    cp = plan.components[component]
    # a worker's device is that machine's memory, not this ComfyUI's to manage
    gpus = [d for d in cp.runtime if plan.device(d).kind != "cpu" and not is_remote(d)]
    if cp.held_bytes:
        headroom = int(cp.headroom_bytes or 0)
        held = {d: max(0, int(b) - headroom) for d, b in cp.held_bytes.items()}
        return {d: held.get(d, 0) for d in gpus}, "auto-fit held bytes less headroom"
    # the engine's own byte model (placement/layout.py) over the module's sizes
    out, basis = footprint(module, plan, component, inventory)
    return {d: out[d] for d in gpus}, basis


# -- what the open placement holds -----------------------------------------------------------
def held_bytes(placed: Optional[PlacedEngine], device: str) -> int:
    """Resident weights + ring slots the placement's ledger holds on `device` now."""
    return 0 if placed is None else placed.held_bytes(device)


# -- the stand-in patcher --------------------------------------------------------------------
class ClaimToken(torch.nn.Module):
    """The `.model` of a claim: ComfyUI keys a loaded model on it (clones of one claim
    have the same token, so ComfyUI unloads the old clone when it loads a new one)."""

    def __init__(self, component: str, device: str):
        super().__init__()
        self.component = component
        self.device_name = device

    def extra_repr(self) -> str:
        return f"{self.component} on {self.device_name}"


class EngineClaim(comfy.model_patcher.ModelPatcher):
    """One device's claim of an engine placement, as ComfyUI's memory manager sees it.
    Holds no weights: sizes come from the plan and the engine's ledger."""

    def __init__(self, session, device: str, torch_device, planned: int, token=None):
        token = token if token is not None else ClaimToken(session.component, device)
        super().__init__(token, torch_device, torch.device("cpu"), size=planned)
        self.session = session
        self.device_name = device
        self.planned_bytes = int(planned)

    def __repr__(self) -> str:
        return (f"EngineClaim({self.session.component} on {self.device_name}, "
                f"{self.planned_bytes} bytes planned)")

    # ComfyUI's accounting
    def model_size(self):
        return self.planned_bytes

    def loaded_size(self):
        return held_bytes(self.session.placed, self.device_name)

    def current_loaded_device(self):
        return self.load_device

    def clone(self, *args, **kwargs):
        n = EngineClaim(self.session, self.device_name, self.load_device, self.planned_bytes,
                        token=self.model)
        n.parent = self
        n.clone_base_uuid = self.clone_base_uuid
        return n

    # ComfyUI's load / unload requests
    def partially_load(self, device_to, extra_memory=0, force_patch_weights=False):
        return 0         # the engine allocates at the first model call (sampling_session)

    def load(self, *args, **kwargs):
        return None      # no weights of its own; the engine places them (as partially_load)

    def partially_unload(self, device_to, memory_to_free=0, force_patch_weights=False):
        before = self.loaded_size()
        self.session.release_for_comfy(self.device_name)
        return before - self.loaded_size()

    def detach(self, unpatch_all=True):
        self.session.release_for_comfy(self.device_name)
        return self.model

    def deepclone_multigpu(self, new_load_device=None, models_cache=None):
        # core deep-clones additional models before its ON_DEEPCLONE_MULTIGPU callbacks
        self.session.on_deepclone_multigpu(self, None)


def register_claims(clone, session, plan, inventory, module) -> List[str]:
    """Give `clone` (the placed MODEL, or the placed VAE's / CLIP's patcher) one
    EngineClaim per accelerator of the plan. Returns notes for the plan display."""
    sizes, basis = planned_claims(plan, session.component, inventory, module)
    claims = []
    for name, nbytes in sizes.items():
        if nbytes <= 0:
            continue
        dev = inventory.get(name)
        torch_device = torch.device("cpu") if dev.simulated else torch.device(dev.torch_device)
        claims.append(EngineClaim(session, name, torch_device, nbytes))
    if not claims:
        clone.remove_additional_models(CLAIMS_KEY)
        return []
    clone.set_additional_models(CLAIMS_KEY, claims)
    from ....placement.units import format_bytes
    listed = ", ".join(f"{s.device_name} {format_bytes(s.planned_bytes)}" for s in claims)
    return [f"{session.component}: ComfyUI's memory manager accounts {listed} ({basis})"]


def resize_claims(patcher, session, plan, module) -> None:
    """The plan a sampling run re-made (the same placement, the working memory its first
    call rehearsed: a row split's shards or a stream's prefix may differ) sizes the
    claims ComfyUI already holds, so what it accounts stays what the engine will hold."""
    claims = [s for s in (getattr(patcher, "additional_models", {}) or {}).get(CLAIMS_KEY, [])
              if isinstance(s, EngineClaim)]
    if not claims:
        return
    sizes, _ = planned_claims(plan, session.component, session.inventory, module)
    for claim in claims:
        if claim.device_name in sizes:
            claim.planned_bytes = int(sizes[claim.device_name])


# -- components ComfyUI loads without additional models (VAE, text encoders) -----------------
class LoadsClaims:
    """Mixin before the engine's patcher class: ComfyUI's `load_models_gpu([patcher])`
    loads the claims with the patcher, as its sampler does for a MODEL's additional
    models."""

    def model_patches_models(self):
        return super().model_patches_models() + \
            list(self.get_additional_models_with_key(CLAIMS_KEY))

    def get_free_memory(self, device):
        # VAE.decode/encode size their batches from this right after the load; the engine
        # puts the weights on the device only when the call starts, so what they will
        # take there is not free for the batch.
        pending = sum(max(0, s.model_size() - s.loaded_size())
                      for s in self.get_additional_models_with_key(CLAIMS_KEY)
                      if s.load_device == device)
        return super().get_free_memory(device) - pending


_LOADS_SHARES = {}


def load_claims_with(patcher) -> None:
    """Give `patcher` (a fresh engine clone: engine.engine_clone) the LoadsClaims
    behaviour. Its clones keep the class; a later Apply Placement resets it
    (engine_patcher.strip_engine goes back to `engine_base`, and drops the claims)."""
    base = type(patcher)
    if issubclass(base, LoadsClaims):
        return
    cls = _LOADS_SHARES.get(base)
    if cls is None:
        cls = type(f"{base.__name__}Claims", (LoadsClaims, base), {})
        _LOADS_SHARES[base] = cls
    patcher.__class__ = cls
