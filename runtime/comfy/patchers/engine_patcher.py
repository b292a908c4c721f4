"""The ModelPatcher flavour for components the pack's engine places.

ComfyUI's memory manager calls `patcher.load()` before every sampling run. A plain
patcher would then copy the weights to its load device (as many as fit) and fuse the
LoRA patches into them. For a component our engine streams (or rests on disk, or runs
on a simulated device) both are wrong: the engine decides what is on the device, and
LoRA patches must be applied to the block that arrived, never baked into the resting
copy. So the load takes ComfyUI's own low-VRAM path for every module, with nothing
loaded: weights stay where they rest, each castable layer keeps
`comfy_cast_weights=True` and gets its LoRA patches as `weight_function`s, which
ComfyUI's cast ops apply at forward time to whatever tensor the layer holds (the
engine's device copy). Outputs then equal ComfyUI's resident-and-fused run within
float tolerance (fused: one rounding after the patch; here the same math per forward).

The class is set on a clone (`clone.__class__`), and ComfyUI's `clone()` keeps the
class, so LoRA loaders and other patches applied after Apply Placement keep it.
ComfyUI's own pinning of the resting weights is skipped: the engine pins its own packed
host buffers (pinning the module's storage as well would hold the weights twice).
"""
import torch

from ....placement.errors import PlacementError
from . import weight_hooks

NOTHING = 1            # bytes: with this budget ComfyUI's load keeps every layer offloaded
KEY = "placement"      # key of the engine's wrappers, callbacks and attachment
CLAIMS_KEY = "placement_claims"   # additional models: the per-device claims (claims.py)

_CLASSES = {}


def engine_patcher_class(base):
    """`base` with the engine's load policy (cached, so clones share one class)."""
    if getattr(base, "placement_engine", False):
        return base
    cls = _CLASSES.get(base)
    if cls is None:
        cls = type(f"Placement{base.__name__}", (EngineLoad, base), {"engine_base": base})
        _CLASSES[base] = cls
    return cls


def strip_engine(clone) -> None:
    """Undo a previous Apply Placement's engine on a fresh clone (placing a placed model
    again): its class, wrappers, callbacks and session, so only the new plan runs."""
    import comfy.patcher_extension as ext
    if getattr(clone, "placement_engine", False):
        clone.__class__ = type(clone).engine_base
        clone.remove_additional_models(CLAIMS_KEY)     # the old plan's per-device claims
    for kind in (ext.WrappersMP.OUTER_SAMPLE, ext.WrappersMP.APPLY_MODEL):
        clone.remove_wrappers_with_key(kind, KEY)
    for kind in (ext.CallbacksMP.ON_DETACH, ext.CallbacksMP.ON_DEEPCLONE_MULTIGPU):
        clone.remove_callbacks_with_key(kind, KEY)
    clone.remove_attachments(KEY)


class RoundAsLoaded:
    """A patched weight rounded to its stored dtype, as ComfyUI's full load stores it,
    then given back in the dtype it computes in."""

    def __init__(self, key: str, dtype):
        import comfy.utils
        self.key, self.dtype = key, dtype
        self.seed = comfy.utils.string_to_seed(key)

    def __call__(self, weight):
        import comfy.float
        return comfy.float.stochastic_rounding(weight, self.dtype, seed=self.seed).to(
            weight.dtype)


class EngineLoad:
    """Mixin placed before comfy.model_patcher.ModelPatcher in the MRO."""
    placement_engine = True

    def load(self, device_to=None, lowvram_model_memory=0, force_patch_weights=False,
             full_load=False):
        # An earlier full load of the shared module (e.g. CLIP's, whose patcher force-casts)
        # can leave `prev_comfy_cast_weights` behind; ComfyUI's low-VRAM path then takes the
        # layer as "already low-VRAM" and would skip its LoRA weight functions.
        import comfy.model_patcher
        for m in self.model.modules():
            comfy.model_patcher.wipe_lowvram_weight(m)
        super().load(device_to, lowvram_model_memory=NOTHING, force_patch_weights=False,
                     full_load=False)
        self._reshaped = self._patch_reshaping_weights(device_to)
        self._round_as_loaded()
        self._check_runtime_patches()
        weight_hooks.install_slots(self)     # after ComfyUI's load laid the functions out

    def _round_as_loaded(self) -> None:
        """A patched weight is used as ComfyUI's full load stores it: ComfyUI patches a
        weight in float32 and rounds the result to the weight's own dtype (stochastic
        rounding, seeded by its key, for fp8: comfy.float.stochastic_rounding), while a
        patch applied as the layer computes (LowVramPatch) keeps the compute dtype's
        result. Wan VACE's fp8 weights with a CausVid LoRA differed by 3% of the output.
        A rounding step after each LowVramPatch of a weight stored in another dtype than
        float32 makes the two the same (on a CPU bit for bit; a GPU's LowVramPatch
        computes in its compute dtype first)."""
        import comfy.model_patcher
        for m in self.model.modules():
            for param in ("weight", "bias"):
                functions = getattr(m, f"{param}_function", None)
                if not isinstance(functions, list) or not functions:
                    continue
                out = []
                for f in functions:
                    out.append(f)
                    key = getattr(f, "key", None) if getattr(f, "is_lowvram_patch", False) \
                        else None
                    if key is None:
                        continue
                    stored, _, _ = comfy.model_patcher.get_key_weight(self.model, key)
                    if stored is not None and stored.dtype != torch.float32:
                        out.append(RoundAsLoaded(key, stored.dtype))
                functions[:] = out

    def _patch_reshaping_weights(self, device_to) -> set:
        """A patch that changes its weight's shape (a control LoRA widening Flux's img_in
        from 64 to 128 input channels) is applied at load, as ComfyUI applies it
        (`patch_weight_to_device`, which keeps the original in the patcher's backup and
        puts it back on unpatch): ComfyUI reads the patched shape before the forward
        (Flux's concat_cond), so the weight cannot wait for its layer to compute. Its
        run-time patch function is dropped, or the patch would apply twice."""
        import comfy.lora
        import comfy.model_patcher
        import comfy.utils
        reshaped = set()
        for key in list(self.patches):
            weight, _, _ = comfy.model_patcher.get_key_weight(self.model, key)
            if weight is None:
                continue
            shape = comfy.lora.calculate_shape(self.patches[key], weight, key)
            if shape is None or tuple(shape) == tuple(weight.shape):
                continue
            owner, _, param = key.rpartition(".")
            module = comfy.utils.get_attr(self.model, owner) if owner else self.model
            functions = getattr(module, f"{param}_function", None)
            if isinstance(functions, list):
                functions[:] = [f for f in functions if getattr(f, "key", None) != key]
            self.patch_weight_to_device(key, device_to=device_to)
            reshaped.add(key)
        return reshaped

    def _check_runtime_patches(self):
        """Every patched weight must belong to a castable layer, or its patch would be lost
        (a reshaping one was applied at load: _patch_reshaping_weights)."""
        import comfy.utils
        session = self.attachments.get(KEY)
        if getattr(session, "remote_blocks", None):      # worker_ranges.py
            from ..worker.worker_ranges import check_patches
            check_patches(self.patches, session.remote_blocks)
        for key in self.patches:
            if key in getattr(self, "_reshaped", ()):
                continue
            owner, _, _ = key.rpartition(".")
            try:
                module = comfy.utils.get_attr(self.model, owner) if owner else self.model
            except AttributeError:
                continue
            if not hasattr(module, "comfy_cast_weights"):
                raise PlacementError(
                    f"patch on {key!r}: its layer {type(module).__name__} is not one of "
                    f"ComfyUI's cast ops, so the patch cannot be applied at run time to a "
                    f"placed (streamed/disk/simulated) model; place the model without "
                    f"stream_layers/disk, or drop that patch")

    def model_size(self):
        # ComfyUI's memory manager frees room on the load device for model_size() minus
        # loaded_size(). With per-device claims registered (claims.py) the claims carry
        # the engine's device memory; this patcher's own load puts nothing there.
        if self.get_additional_models_with_key(CLAIMS_KEY):
            return 0
        return super().model_size()

    def pin_weight_to_device(self, key):
        return None

    # ComfyUI writes a hook's weight into the module in place, which the engine's
    # copies never see: the engine applies it as the layer computes (weight_hooks.py)
    def patch_hook_weight_to_device(self, hooks, combined_patches, key, original_weights,
                                    memory_counter):
        if key not in combined_patches:
            return None
        if weight_hooks.reads_resting_weights(self):
            return super().patch_hook_weight_to_device(hooks, combined_patches, key,
                                                       original_weights, memory_counter)
        return weight_hooks.apply_hook(self, combined_patches, key, original_weights)

    def unpatch_hooks(self, whitelist_keys_set=None):
        weight_hooks.clear_hooks(self, whitelist_keys_set)
        return super().unpatch_hooks(whitelist_keys_set)
