"""Batch parallel inside ComfyUI's sampling (issue 13): the diffusion model's batch (CFG's
cond + uncond, batch size) split over several devices at once, each device under its own
placement, through the same extension points as the engine (sampling_session.py), never
a replacement of the sampler:

- the MODEL is the engine's clone (EngineLoad, claims per device, the session's
  WrappersMP.OUTER_SAMPLE / APPLY_MODEL wrappers, ON_DETACH);
- `BatchParallelSamplingSession.open` (at the first model call of a run, from APPLY_MODEL)
  makes one structural copy of the diffusion model (runtime/engine/shadow.py) and opens
  runtime.parallel.place_batch on it: one more copy and one placement per device, the
  packed host copy of streamed blocks in the module's store shared by every device;
- ComfyUI's `_apply_model` then calls that copy with the whole batch: the copy's forward
  cuts it into shares, runs them on their devices at once (one thread per device beyond
  the first) and concatenates the outputs in order. CFG's cond and uncond thus run at
  the same time on two devices; ComfyUI's CFG math after apply_model is unchanged.

ComfyUI's per-call options are cut by meaning (cut.py).
"""
from typing import Dict

import torch

from ...engine.shadow import Shadow
from ...host.hoststore import store_for
from ...parallel import place_batch
from .cut import cut_comfy_inputs
from .sampling_session import SamplingSession

class BatchParallelSamplingSession(SamplingSession):
    """The engine session of a batch-parallel diffusion model (see the module doc)."""

    def open(self, module) -> None:
        options = self.place_options(module)
        front = Shadow(module)               # the copy whose forward shares the batch
        placed = place_batch(front.module, self.plan, self.component, self.inventory,
                             host_store=store_for(module), repoint=front.repoint,
                             cut_inputs=cut_comfy_inputs, **options)
        with torch.inference_mode(False):    # normal tensors (SamplingSession.open)
            placed.__enter__()
        self.placed, self.shadow = placed, front
        self.runs += 1


def session_class(cp):
    return BatchParallelSamplingSession if cp.parallel == "batch" else SamplingSession


def batch_parallel_note(cp) -> str:
    return (f"diffusion: batch parallel over {', '.join(cp.runtime)}: a batch of 2 or more "
            f"(CFG's cond and uncond, batch size) is shared between them and computed at "
            f"once, each device running the whole model")


def shares_of_last_run(session) -> Dict[str, int]:
    """Batch items each device computed in the session's last run (stats 'items')."""
    return dict((session.last_stats or {}).get("items", {}))
