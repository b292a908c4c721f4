"""Pipelined layer split: a forward's batch is cut into shares that flow through the
stages (the devices' block ranges) one behind the other, so stage 2 computes share 1
while stage 1 computes share 2.

The component plan has parallel "pipeline", split_mode layer and two or more runtime
devices. The engine is a LayerSplit (same ranges, residency, streaming, hops, stats)
whose module forward is overridden while placed: a batch of 2 or more is cut
(parallel/batch_cut.py) into `shares` contiguous shares (default: one per item), each run
by the module's own forward on its own thread. A turnstile per stage lets share s
enter stage k only after share s-1 left it, so every stage computes the shares in
order (a streamed stage's ring serves them as consecutive forwards) and different
stages work at once. A batch of 1 runs as the plain layer split, in the caller's thread.

The root hooks run once for the whole batch (load, inputs to the main device, output
back); per-forward copies of activations are per thread (moves.Mover). The first error
of any share is raised (later ones as notes); the other shares are stopped at their
next stage boundary and joined before it is raised, also on KeyboardInterrupt.
"""
import contextlib
import threading
import time
from typing import Callable, List, Optional

import torch

from ...placement.errors import PlacementError
from ..engine.forward_override import ForwardOverride
from ..parallel.batch_cut import autocast_now, batch_size, cut_all, gather, share_counts
from .layer import LayerSplit


class _Stopped(BaseException):
    """Raised in a share's thread when another share failed: unwinds it quietly."""


class PipelinedSplit(LayerSplit):
    mode = "layer"
    _rehearses = False      # shares run at once: one call's rehearsal is not their peak

    def __init__(self, module, plan, component, inventory, *, shares: Optional[int] = None,
                 cut_inputs: Optional[Callable] = None, **options):
        if shares is not None and int(shares) < 1:
            raise PlacementError(f"{component}: shares must be >= 1, got {shares}")
        self.max_shares = None if shares is None else int(shares)
        # (args, kwargs, batch, start, stop) -> a share's (args, kwargs); ComfyUI's engine
        # passes the cut that knows transformer_options (comfy/batch_parallel.py)
        self.cut_inputs = cut_inputs or cut_all
        super().__init__(module, plan, component, inventory, **options)
        self.pipeline_forwards = 0
        self.last_shares = 0
        self._gate = threading.Condition()
        self._turn: List[int] = []
        self._abort = False
        self._share = threading.local()
        self._override = None

    # -- hooks ------------------------------------------------------------------------
    def _attach(self) -> None:
        owner = self.owner
        starts = [i for i in range(len(owner)) if i == 0 or owner[i] != owner[i - 1]]
        self.stage_starts = starts
        self.stage_of_start = {i: k for k, i in enumerate(starts)}
        self.stage_device = [owner[i] for i in starts]
        by_device = {s.target.name: s for s in self.streamers}
        self.stage_streamer = [by_device.get(self.targets[d].name) for d in self.stage_device]
        super()._attach()
        # a split has output listeners, so the events hooked every block's end
        self.events.on_output.append(self._leave_last)
        self._install()

    def _enter_listeners(self) -> list:
        # gates first: they must run before the split's and the streamer's
        return [self._gate_enter]

    def _gate_enter(self, gi: int) -> None:
        k = self.stage_of_start.get(gi)
        if k is not None:
            self._enter(k)

    def _detach(self) -> None:
        self._uninstall()
        super()._detach()

    def _install(self) -> None:
        self._inner = self.module.forward           # the module's own (bound) forward
        self._override = ForwardOverride(self.module, self._forward)

    def _uninstall(self) -> None:
        if self._override:
            self._override.restore()
        self._override = None

    def _enter(self, k: int) -> None:
        share = self._share
        s = getattr(share, "index", None)
        if s is None:                               # a plain (batch 1) forward
            return None
        self._pass_before(k, s)
        with self._gate:
            # `<`, not `!=`: a share that meets a stage again (a block run twice) must
            # not wait for itself
            while self._turn[k] < s and not self._abort:
                self._gate.wait()
            if self._abort:
                raise _Stopped()
        if k not in share.entered:
            share.entered.add(k)
            streamer = self.stage_streamer[k]
            if streamer is not None:
                streamer.begin_forward()
        return None

    def _pass_before(self, k: int, s: int) -> None:
        """Share s is past every stage before k (also one whose blocks it skipped):
        the next share may enter them."""
        held = [j for j in range(k) if self._turn[j] <= s]
        if not held:
            return
        for j in held:
            streamer = self.stage_streamer[j]
            if streamer is not None and j in self._share.entered:
                streamer.end_forward()              # this share's pass through the ring
        with self._gate:
            for j in held:
                self._turn[j] = max(self._turn[j], s + 1)
            self._gate.notify_all()

    def _leave_last(self, gi: int, output, last: bool):
        if gi != len(self.owner) - 1 or not last:
            return None
        s = getattr(self._share, "index", None)
        if s is not None:
            self._pass_before(len(self.stage_starts), s)
        return None

    # -- the forward --------------------------------------------------------------------
    def _forward(self, *args, **kwargs):
        batch = batch_size(args, kwargs)
        if not batch or batch < 2:
            return self._inner(*args, **kwargs)
        n = min(batch, self.max_shares or batch)
        if n < 2:
            return self._inner(*args, **kwargs)
        counts = share_counts(batch, [1.0] * n)
        bounds, start = [], 0
        for c in counts:
            bounds.append((start, start + c))
            start += c
        self._turn = [0] * len(self.stage_starts)
        self._abort = False
        self._pipelined = True
        modes = (torch.is_grad_enabled(), torch.is_inference_mode_enabled(), autocast_now())
        outputs: List = [None] * n
        errors: List[tuple] = []
        lock = threading.Lock()

        def run(s: int, a: int, b: int) -> None:
            self._share.index = s
            self._share.entered = set()
            try:
                grad, inference, autocast = modes
                with torch.inference_mode(inference), torch.set_grad_enabled(grad), \
                        contextlib.ExitStack() as stack:
                    for device_type, dtype in autocast:
                        stack.enter_context(torch.autocast(device_type, dtype=dtype))
                    main = self.targets[0]
                    if main.is_cuda:
                        stack.enter_context(torch.cuda.device(main.device))
                    share_args, share_kwargs = self.cut_inputs(args, kwargs, batch, a, b)
                    outputs[s] = self._inner(*share_args, **share_kwargs)
            except _Stopped:
                pass
            except BaseException as e:              # noqa: B902 - re-raised by the caller
                with lock:
                    errors.append((time.perf_counter(), s, e))
                self._stop()
            finally:
                if not self._abort:                 # stages this share did not reach
                    self._pass_before(len(self._turn), s)
                self.mover.end_forward()            # this thread's copies
                self._share.index = None

        threads = [threading.Thread(target=run, args=(s, a, b), daemon=True,
                                    name=f"pipeline share {s}")
                   for s, (a, b) in enumerate(bounds)]
        interrupt = None
        try:
            for t in threads:
                t.start()
        except BaseException as exc:                # noqa: B902 - raised below
            interrupt = exc
            self._stop()
        for t in threads:
            while t.is_alive():
                try:
                    t.join(0.05)    # wakes to see a signal (Windows, interrupt_main)
                except BaseException as exc:        # an interrupt while waiting: stop all
                    interrupt = interrupt or exc
                    self._stop()
        if interrupt is not None:
            errors.append((time.perf_counter(), -1, interrupt))
        if errors:
            self._after_error()
            errors.sort(key=lambda e: (e[0], e[1]))
            first = errors[0][2]
            for _, s, later in errors[1:]:
                if later is not first and hasattr(first, "add_note"):
                    first.add_note(f"pipelined split: share {s} also failed: {later!r}")
            raise first
        self.pipeline_forwards += 1
        self.last_shares = n
        main = None if self.mover.simulated else self.targets[0].device
        return gather(outputs, main)

    def _stop(self) -> None:
        with self._gate:
            self._abort = True
            self._gate.notify_all()

    def _after_error(self) -> None:
        """The root post-hook will not run: activations off the ledgers, rings reset at
        the next forward's begin (as after a plain forward that raised)."""
        self._pipelined = False
        for t in self.targets:
            t.ledger.set_activations(0)

    def _root_post(self, module, args, output):
        try:
            return super()._root_post(module, args, output)
        finally:
            self._pipelined = False     # the shares ended the rings' forwards themselves

    def _more_stats(self) -> dict:
        out = super()._more_stats()
        out["pipeline"] = {"shares": getattr(self, "last_shares", 0),
                           "forwards": getattr(self, "pipeline_forwards", 0)}
        return out
