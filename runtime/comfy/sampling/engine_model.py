"""The diffusion MODEL run by the pack's engine: `place_model_with_engine(model, plan,
inventory)` returns the clone wired to its session (sampling_session.py's SamplingSession,
or batch_parallel.py's for parallel batch) through ComfyUI's extension points: the session as
an attachment, its OUTER_SAMPLE and APPLY_MODEL wrappers, ON_DETACH and the multi-GPU
deep-clone callback, and one stand-in patcher per device for the memory manager
(claims.py). How the session runs is sampling_session.py's docstring."""
from typing import List, Tuple

import torch

import comfy.patcher_extension as ext

from ....placement.errors import PlacementError
from ..files.gguf_models import is_gguf_module, missing_file_error
from ..files.model_file import diffusion_file
from ..patchers.claims import register_claims
from ..patchers.engine_patcher import KEY
from ..worker.worker_ranges import (
    check_patches,
    names_workers,
    remote_block_devices,
    remote_block_names,
    remote_setup,
)
from .batch_parallel import batch_parallel_note, session_class
from .family_containers import register as register_family_containers
from .sampling_session import engine_clone

register_family_containers()      # what its blocks are handed (SeedVR2's Cache)


def place_model_with_engine(model, plan, inventory, workers=None) -> Tuple[object, List[str]]:
    """`workers`: the joined workers (runtime/distributed/pool.py) a plan naming worker
    devices runs its ranges on (worker_ranges.py)."""
    cp = plan.components["diffusion"]
    device = inventory.get(cp.main_device)
    load = torch.device("cpu") if device.simulated else torch.device(device.torch_device)
    weights_file = diffusion_file(model)
    if cp.params == "disk" and not weights_file and is_gguf_module(model.model):
        raise missing_file_error(model.model)
    if cp.params == "disk" and not weights_file:
        raise PlacementError("diffusion: params disk needs the model's file, and this MODEL "
                             "does not come from a core loader that records it (Load "
                             "Diffusion Model, Load Checkpoint); use params cpu")
    remote = remote_setup(model, cp, workers, weights_file) if names_workers(cp) else {}
    clone, notes = engine_clone(model, load, torch.device("cpu"), "diffusion")
    session = session_class(cp)(plan, "diffusion", inventory, weights_file)
    session.bind(clone.model.diffusion_model)
    if remote:
        session.remote_options = remote
        session.remote_blocks = remote_block_names(clone.model.diffusion_model, cp)
        check_patches(clone.patches, session.remote_blocks)
    clone.set_attachments(KEY, session)
    clone.add_wrapper_with_key(ext.WrappersMP.OUTER_SAMPLE, KEY, session.outer_sample)
    clone.add_wrapper_with_key(ext.WrappersMP.APPLY_MODEL, KEY, session.apply_model)
    clone.add_callback_with_key(ext.CallbacksMP.ON_DETACH, KEY, session.on_detach)
    clone.add_callback_with_key(ext.CallbacksMP.ON_DEEPCLONE_MULTIGPU, KEY,
                                session.on_deepclone_multigpu)
    notes.extend(register_claims(clone, session, plan, inventory,
                                 clone.model.diffusion_model))
    on = "&".join(cp.runtime)
    mode = ("streamed" if cp.stream is not None else "placed") + \
        f" by the pack's engine on {on}"
    if cp.parallel == "batch":
        notes.append(batch_parallel_note(cp))
    elif cp.is_split:
        mode += f" ({cp.split_mode} split, main device {cp.main_device})"
    if cp.stream is not None:
        mode += (f" (first {cp.stream.resident_blocks} blocks resident, prefetch depth "
                 f"{cp.stream.prefetch_depth}, weights rest on {cp.params})")
    else:
        mode += f" (weights rest on {cp.params})"
    notes.append(f"diffusion: {mode}; LoRA patches applied at run time")
    for device, (first, last) in cp.blocks.items() if remote else ():
        if device in remote_block_devices(cp):
            link = inventory.get(device).description
            notes.append(f"diffusion: blocks {first}..{last} on {device} ({link}); only "
                         f"activations cross the network")
    simulated = [n for n in cp.runtime if inventory.get(n).simulated]
    if simulated:
        notes.append(f"diffusion: {', '.join(simulated)} simulated (diagnostic): compute on "
                     f"the cpu, capacity and copies modelled")
    return clone, notes
