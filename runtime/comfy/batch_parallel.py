"""Batch parallel inside ComfyUI's sampling (issue 13): the diffusion model's batch (CFG's
cond + uncond, batch size) split over several devices at once, each device under its own
placement, through the same extension points as the engine (engine.py), never a
replacement of the sampler:

- the MODEL is the engine's clone (EngineLoad, shares per device, the session's
  WrappersMP.OUTER_SAMPLE / APPLY_MODEL wrappers, ON_DETACH);
- `BatchParallelSession.open` (at the first model call of a run, from APPLY_MODEL)
  makes one structural copy of the diffusion model (runtime/shadow.py) and opens
  runtime.parallel.place_batch on it: one more copy and one placement per device, the
  packed host copy of streamed blocks in the module's store shared by every device;
- ComfyUI's `_apply_model` then calls that copy with the whole batch: the copy's forward
  cuts it into shares, runs them on their devices at once (one thread per device beyond
  the first) and concatenates the outputs in order. CFG's cond and uncond thus run at
  the same time on two devices; ComfyUI's CFG math after apply_model is unchanged.

ComfyUI's per-call options: `transformer_options` is cut by meaning, not by shape
(`cut_comfy_inputs`): `sigmas` per item, the per-chunk lists `cond_or_uncond` and `uuids`
to the chunks a share's items come from; everything else in it (patches, sample_sigmas,
wrappers) goes whole to every share. Other inputs (x, timestep, context, y, guidance,
control's tensors) are cut where their leading size is the batch.
"""
from typing import Dict, List

import torch

from ...runtime.hoststore import store_for
from ...runtime.parallel import place_batch
from ...runtime.parallel.shares import cut_all
from ...runtime.shadow import Shadow
from .engine import EngineSession

PER_CHUNK = ("cond_or_uncond", "uuids")      # one entry per conditioning chunk
PER_ITEM = ("sigmas",)                      # one entry per batch item


def cut_transformer_options(to: dict, batch: int, start: int, stop: int) -> dict:
    """A share's transformer_options: a shallow copy with the per-item and per-chunk
    entries cut to items start:stop (chunks are equal runs of the batch, as
    samplers.calc_cond_batch concatenates them)."""
    out = dict(to)
    for key in PER_ITEM:
        v = to.get(key)
        if isinstance(v, torch.Tensor) and v.dim() > 0 and v.shape[0] == batch:
            out[key] = v[start:stop]
    for key in PER_CHUNK:
        v = to.get(key)
        if isinstance(v, list) and v and batch % len(v) == 0:
            per = batch // len(v)
            out[key] = v[start // per:(stop + per - 1) // per]
    return out


def cut_comfy_inputs(args, kwargs, batch: int, start: int, stop: int):
    to = kwargs.get("transformer_options")
    rest = {k: v for k, v in kwargs.items() if k != "transformer_options"}
    share_args, share_kwargs = cut_all(args, rest, batch, start, stop)
    if isinstance(to, dict):
        share_kwargs["transformer_options"] = cut_transformer_options(to, batch, start, stop)
    elif "transformer_options" in kwargs:
        share_kwargs["transformer_options"] = to
    return share_args, share_kwargs


class BatchParallelSession(EngineSession):
    """The engine session of a batch-parallel diffusion model (see the module doc)."""

    def open(self, module) -> None:
        options = self.place_options(module)
        front = Shadow(module)               # the copy whose forward shares the batch
        placed = place_batch(front.module, self.plan, self.component, self.inventory,
                             host_store=store_for(module), repoint=front.repoint,
                             cut_inputs=cut_comfy_inputs, **options)
        with torch.inference_mode(False):    # device buffers: normal tensors (engine.py)
            placed.__enter__()
        self.placed, self.shadow = placed, front
        self.runs += 1


def session_class(cp):
    return BatchParallelSession if cp.parallel == "batch" else EngineSession


def planned_bytes(cp, one_device_bytes: int) -> List[int]:
    """Every device holds what one device of this plan holds (its own whole placement)."""
    return [one_device_bytes] * len(cp.runtime)


def describe(cp) -> str:
    return (f"diffusion: batch parallel over {', '.join(cp.runtime)}: a batch of 2 or more "
            f"(CFG's cond and uncond, batch size) is shared between them and computed at "
            f"once, each device running the whole model")


def shares_of_last_run(session) -> Dict[str, int]:
    """Batch items each device computed in the session's last run (stats 'items')."""
    return dict((session.last_stats or {}).get("items", {}))
