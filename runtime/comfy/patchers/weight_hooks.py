"""ComfyUI's weight hooks (Create Hook LoRA on a conditioning, Set CLIP Hooks, hook
keyframes) on a component the pack's engine places.

ComfyUI applies a weight hook while it samples or encodes by writing the patched weight
into the module's own parameter in place (ModelPatcher.patch_hooks): for each group of
conds that carries other hooks, again at each keyframe, and the original back after.
The engine computes with weights it brought where the plan says (resident copies on a
device, a streamed block's ring slot, blocks read from the file), which never see that
write: the image came out as if the hook were not there (a hook LoRA on a model
streamed from disk: within 1e-5 of the run without it).

So the engine's patcher (engine_patcher.EngineLoad) does not write a hook's weight: it
hands the hook's patches to a `HookedWeight`, the first of the layer's weight functions,
which ComfyUI's cast ops apply to whatever tensor the layer computes with (the engine's
device copy), as they apply LoRA patches at run time. The slot is put there at load for
every key a hook patches, and again before the sampling session copies the module (the
placement's structural copy shares it, so what ComfyUI sets between two model calls is
what the next call computes with), and it gives the
weight back unchanged while no hook is applied. The math is ComfyUI's: the patch in
float32 on the stored weight, rounded to the stored dtype (comfy.float.stochastic_rounding
seeded by the key), before the run-time LoRA patches, as ComfyUI's low-VRAM load orders
them.

Where the slot cannot stand in for the write, the hook is refused in one line, never
lost: a block a worker runs (its copy of the file is on another machine), a row split
(a layer holds a shard of the weight) and a quantized GGUF weight (ComfyUI-GGUF's layer
dequantizes it without running weight functions). A placement that computes on the cpu with the
weights resting there, unstreamed and unsplit, reads the very tensors ComfyUI writes:
ComfyUI's own write runs there."""
import torch

from ....placement.errors import PlacementError

KEY = "placement"       # the session's attachment (engine_patcher.KEY)


class HookedWeight:
    """A weight (or bias) function: the weight hooks' patches on `key` while ComfyUI has
    them applied, else the weight as it comes."""
    is_hook_slot = True

    def __init__(self, key: str, stored_dtype: torch.dtype):
        import comfy.utils
        self.key, self.stored_dtype = key, stored_dtype
        self.seed = comfy.utils.string_to_seed(key)
        self.patches = None             # set by patch_hooks, cleared by unpatch_hooks
        self.original = None            # {key: ComfyUI's original weight entry}

    def set(self, patches, original=None) -> None:
        self.patches, self.original = patches, original

    def clear(self) -> None:
        self.patches = self.original = None

    def __call__(self, weight):
        patches = self.patches
        if not patches:
            return weight
        import comfy.float
        import comfy.lora
        out = comfy.lora.calculate_weight(patches, weight.to(torch.float32, copy=True),
                                          self.key, original_weights=self.original)
        out = comfy.float.stochastic_rounding(out, self.stored_dtype, seed=self.seed)
        return out.to(weight.dtype)


def _plan_of(patcher):
    session = patcher.attachments.get(KEY)
    plan = getattr(session, "plan", None)
    component = getattr(session, "component", None) or "model"
    cp = plan.components.get(component) if plan is not None else None
    return session, component, cp


def reads_resting_weights(patcher) -> bool:
    """Whether the engine computes with the module's own host tensors (ComfyUI's in-place
    write is seen as it is)."""
    _, _, cp = _plan_of(patcher)
    return cp is not None and list(cp.runtime) == ["cpu"] and cp.params == "cpu" \
        and cp.stream is None


def _layer(patcher, key: str):
    import comfy.utils
    owner, _, param = key.rpartition(".")
    module = comfy.utils.get_attr(patcher.model, owner) if owner else patcher.model
    return module, param


def _refuse(component: str, key: str, why: str):
    return PlacementError(
        f"{component}: a weight hook (Create Hook LoRA, Set CLIP Hooks) patches {key}, "
        f"{why}; apply the LoRA with Load LoRA (LoraLoader / LoraLoaderModelOnly) instead")


def slot_for(patcher, key: str, install: bool = True) -> HookedWeight:
    """The layer's HookedWeight for `key`, put first among its weight functions when it
    has none (install) ; raises in one line where a slot cannot stand in for the write."""
    session, component, cp = _plan_of(patcher)
    if cp is not None and cp.is_split and cp.split_mode == "row":
        raise _refuse(component, key, "and a row split computes each layer from shards "
                      "of its weight, which the hook's patch does not fit: weight hooks "
                      "under a row split are not implemented")
    remote = getattr(session, "remote_blocks", None)
    if remote:
        from ..worker.worker_ranges import check_patches
        try:
            check_patches([key], remote)
        except PlacementError:
            raise _refuse(component, key, "in a block a worker runs from its own copy "
                          "of the file, where the hook would never apply") from None
    module, param = _layer(patcher, key)
    functions = getattr(module, f"{param}_function", None)
    if not hasattr(module, "comfy_cast_weights") or not isinstance(functions, list):
        raise _refuse(component, key, f"a weight of {type(module).__name__}, which is not "
                      f"one of ComfyUI's cast ops, so the engine cannot apply the hook as "
                      f"the layer computes")
    stored = getattr(module, param)
    quantized = getattr(module, "is_ggml_quantized", None)
    if (callable(quantized) and quantized()) or not stored.dtype.is_floating_point:
        raise _refuse(component, key, "a quantized weight (GGUF), which its layer "
                      "dequantizes without running the weight functions the engine "
                      "applies a hook with: weight hooks on quantized weights are not "
                      "implemented")
    for f in functions:
        if getattr(f, "is_hook_slot", False) and f.key == key:
            return f
    if not install:
        raise _refuse(component, key, "registered after the placement opened on the "
                      "module, whose copy has no slot for it")
    slot = HookedWeight(key, stored.dtype)
    functions.insert(0, slot)
    return slot


def hooked_keys(patcher) -> dict:
    """key -> every registered hook's patches on it (ComfyUI keeps hook_ref -> key ->
    patches)."""
    out = {}
    for patches in (getattr(patcher, "hook_patches", None) or {}).values():
        for key, more in patches.items():
            out.setdefault(key, []).extend(more)
    return out


def install_slots(patcher) -> int:
    """A slot for every key a registered hook patches (at load, and before a placement
    copies the module); the number of slots."""
    if reads_resting_weights(patcher):
        return 0
    keys = sorted(hooked_keys(patcher))
    for key in keys:
        slot_for(patcher, key)
    return len(keys)


def apply_hook(patcher, combined_patches, key: str, original_weights) -> None:
    """ComfyUI's patch_hook_weight_to_device for the engine: the patches go to the slot."""
    session, _, _ = _plan_of(patcher)
    opened = getattr(session, "placed", None) is not None
    slot = slot_for(patcher, key, install=not opened)
    original = None
    if original_weights is not None and key in original_weights:
        original = {key: original_weights.pop(key)}   # ComfyUI deletes it once used
    slot.set(combined_patches[key], original)
    active = patcher.__dict__.setdefault("_hook_slots", {})
    active[key] = slot


def clear_hooks(patcher, whitelist=None) -> None:
    """ComfyUI's unpatch_hooks for the engine's slots (`whitelist`: only these keys)."""
    active = patcher.__dict__.get("_hook_slots") or {}
    for key in list(active):
        if whitelist is None or key in whitelist:
            active.pop(key).clear()
