"""The diffusion MODEL's block ranges on worker machines (ALIAS.DEVICE in its runtime,
e.g. cpu&w1.cpu): what the pack's engine needs to run them there. The workers are the
ones Backend Assignment's `workers` input joined (runtime/distributed/pool.py); each
worker builds the model with ComfyUI's own detection from its copy of the file
(remote_model.py) and reads only its range.

A LoRA patch on a block a worker runs would not be applied there (the worker computes
from its file): such a patch is refused with one line, never dropped."""
from typing import List

import torch

from ....placement.errors import PlacementError
from ....placement.remote_devices import is_remote
from ...blocks.find import find_blocks


def names_workers(cp) -> bool:
    return any(is_remote(d) for d in cp.runtime)


def remote_setup(model, cp, workers, weights_file) -> dict:
    """place() options for the plan's worker ranges (cluster, builder, files)."""
    runtime = "&".join(cp.runtime)
    if workers is None or not workers.joined:
        raise PlacementError(f"diffusion: runtime {runtime} names worker devices, and no "
                             f"worker is joined; give Backend Assignment's workers input "
                             f"(e.g. w1=10.0.0.2:7860)")
    if not weights_file:
        raise PlacementError("diffusion: a worker reads its range from its own copy of the "
                             "model file, and this MODEL does not come from a loader that "
                             "records its file (Load Diffusion Model, Load Checkpoint, a "
                             "GGUF loader)")
    from .remote_model import remote_options
    return dict(remote_options(model, weights_file), cluster=workers, inputs=block_inputs)


def remote_block_devices(cp) -> List[str]:
    return [d for d in cp.runtime if is_remote(d)]


def remote_block_names(module, cp) -> List[str]:
    """The blocks the plan gives to workers, as the module names them."""
    names = [n for n, _ in find_blocks(module)]
    out = []
    for device, (first, last) in cp.blocks.items():
        if is_remote(device):
            out += names[int(first):int(last) + 1]
    return out


def check_patches(patch_keys, remote_blocks, prefix: str = "diffusion_model.") -> None:
    """Refuse a patch (a LoRA) on a block a worker runs: it would be silently lost."""
    starts = tuple(f"{prefix}{b}." for b in remote_blocks)
    for key in patch_keys:
        if str(key).startswith(starts):
            raise PlacementError(
                f"patch on {key!r}: that block runs on a worker, which computes from its "
                f"own copy of the file, so the patch (a LoRA) would not be applied there; "
                f"keep the model on this machine's devices to use the patch")


# transformer_options entries that are the main process's own bookkeeping: the model's
# loop applies them around each block call here (patches_replace wraps the call that
# reaches the worker), so a block on a worker has nothing to do with them
MAIN_SIDE = ("patches_replace", "wrappers", "callbacks", "uuids", "model_options",
             "sample_sigmas", "sigmas", "cond_or_uncond")
# entries that change what a block computes inside it: refused when set, never dropped
INSIDE_BLOCK = ("patches", "optimized_attention_override")


def block_inputs(args, kwargs):
    """A block call as it crosses to a worker: transformer_options without the main
    side's entries; an entry that changes the block's own computation (an attention
    patch, an attention override) is refused in one line, never silently lost."""
    to = kwargs.get("transformer_options")
    if not isinstance(to, dict):
        return args, kwargs
    kept = {}
    for key, value in to.items():
        if key in MAIN_SIDE:
            continue
        if key in INSIDE_BLOCK:
            if value:
                raise PlacementError(
                    f"transformer_options[{key!r}] changes what a block computes, and a "
                    f"worker runs its blocks without it; remove that model patch or keep "
                    f"the model on this machine's devices")
            continue
        if not _sendable(value):
            raise PlacementError(
                f"transformer_options[{key!r}] ({type(value).__name__}) cannot be sent to "
                f"a worker's blocks; remove what set it or keep the model on this "
                f"machine's devices")
        kept[key] = value
    return args, dict(kwargs, transformer_options=kept)


def _sendable(value) -> bool:
    if value is None or isinstance(value, (bool, int, float, str, torch.Tensor)):
        return True
    if isinstance(value, (list, tuple)):
        return all(_sendable(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, (str, int)) and _sendable(v) for k, v in value.items())
    return False
