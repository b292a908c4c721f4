"""Asynchronous host-to-device copies: the one interface the streaming engine uses.

A `Transfer` belongs to one device and owns its copy queue (a CUDA copy stream, or the
simulated device's copy engine). Rules every implementation keeps:
- `submit` returns a `Ticket`; compute may read `dst` only after `wait(ticket)`.
- `after=compute_mark()` makes the copy wait until compute issued before the mark has
  finished, so a slot is overwritten only once the block that read it is done.
- a `read` callable fills the host `src` (a staging buffer) from disk on the copy
  worker before the copy; a staging buffer is refilled only after its previous copy
  has finished.
- `drain()` returns when every submitted copy has landed.
No record_stream tricks: buffers live as long as the placement and are freed after
`drain()`.
"""
import queue
import threading
from typing import Callable, Optional

import torch


class Ticket:
    __slots__ = ("done", "error", "reported", "event", "nbytes")

    def __init__(self, nbytes: int, done: Optional[threading.Event] = None):
        # host side: the copy was carried out / issued. A copy done before submit
        # returns shares one set event (no Event made and set per copy in the hot path)
        self.done = threading.Event() if done is None else done
        self.error = None
        self.reported = False             # its error was raised once (at wait): not again
        self.event = None                 # CUDA: event on the copy stream
        self.nbytes = nbytes


class Transfer:
    """Interface. `device` is where compute tensors live (cpu for a simulated device)."""
    device: torch.device
    pin_host: bool = False              # whether host buffers should be pinned
    failed_seen: bool = False           # wait() raised a failure since the last drain()
    reads_into_dst: bool = False        # disk reads land in dst itself (no staging)

    def alloc(self, nbytes: int) -> torch.Tensor:
        raise NotImplementedError

    def alloc_host(self, nbytes: int, pin: bool) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=pin)

    def submit(self, dst: torch.Tensor, src: torch.Tensor,
               read: Optional[Callable[[torch.Tensor], None]] = None, after=None) -> Ticket:
        raise NotImplementedError

    def compute_mark(self):
        raise NotImplementedError

    def wait(self, ticket: Ticket) -> None:
        raise NotImplementedError

    def drain(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


class CopyWorker:
    """One thread that runs copy jobs in submission order (a copy engine). `run` returns
    False when it handed the ticket on to a later stage (which then completes it)."""

    def __init__(self, name: str, run: Callable):
        self._run = run
        self._jobs: "queue.SimpleQueue" = queue.SimpleQueue()
        self._pending = []
        self._thread = threading.Thread(target=self._loop, name=f"copy-{name}", daemon=True)
        self._thread.start()

    def put(self, ticket: Ticket, job) -> None:
        self._pending.append(ticket)
        self._jobs.put((ticket, job))

    def _loop(self):
        while True:
            item = self._jobs.get()
            if item is None:
                return
            ticket, job = item
            try:
                if self._run(ticket, *job) is False:
                    continue
            except BaseException as exc:   # surfaced to the waiter, never lost
                ticket.error = exc
            ticket.done.set()

    def drain(self) -> None:
        """Wait for every job; raise the first failure nobody has seen yet (one error per
        fault: a copy whose error `wait` raised is not raised again here)."""
        pending, self._pending = self._pending, []
        for t in pending:
            t.done.wait()
        for t in pending:
            if t.error is not None and not t.reported:
                raise_if_failed(t)

    def forget_done(self) -> None:
        if len(self._pending) > 64:
            self._pending = [t for t in self._pending     # a failure stays until seen
                             if not t.done.is_set() or (t.error is not None and not t.reported)]

    def close(self, timeout: float = 10.0) -> None:
        """Stop the thread after the jobs queued before. A thread still running after
        `timeout` (a read stuck on a dead disk) is an error, never a silent leak."""
        self._jobs.put(None)
        self._thread.join(timeout=timeout)
        if self._thread.is_alive():
            raise RuntimeError(f"{self._thread.name}: the copy thread did not stop within "
                               f"{timeout:g} s (a disk read or copy is stuck); it is left "
                               f"running and holds its buffers")


def drain_workers(workers, quiet: bool = False) -> None:
    """Drain every worker (all of them, even after one raised); raise the first failure
    unless `quiet` (a failure was already raised at wait: later copies of the same run
    failing after it are its consequences, one error per fault)."""
    first = None
    for w in workers:
        if w is None:
            continue
        try:
            w.drain()
        except BaseException as exc:
            first = first or exc
    if first is not None and not quiet:
        raise first


ALREADY_DONE = threading.Event()        # shared by tickets complete when submitted: never clear
ALREADY_DONE.set()


def raise_if_failed(ticket: Ticket) -> None:
    if ticket.error is not None:
        ticket.reported = True
        raise RuntimeError(f"asynchronous copy failed: {ticket.error!r}") from ticket.error


class CudaTransfer(Transfer):
    """A copy stream per device; events order copies against compute. Copies from host
    memory are issued on the copy stream by the calling (compute) thread itself: no
    thread handoff and no host synchronization in the hot path, the GIL stays with
    kernel launches. Only disk reads, which block, go through a worker thread (which
    then issues their copies)."""
    pin_host = True

    def __init__(self, device: str):
        self.device = torch.device(device)
        self.stream = torch.cuda.Stream(self.device)
        self._staging_events = []         # (first, end) addresses of a staging range, event
        self._worker = None               # started by the first disk read

    def alloc(self, nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8, device=self.device)

    def submit(self, dst, src, read=None, after=None) -> Ticket:
        if read is None:
            ticket = Ticket(dst.numel(), ALREADY_DONE)
            self._issue(ticket, dst, src, after)
            return ticket
        ticket = Ticket(dst.numel())
        if self._worker is None:
            self._worker = CopyWorker(str(self.device), self._read_then_copy)
        self._worker.put(ticket, (dst, src, read, after))
        self._worker.forget_done()
        return ticket

    def _issue(self, ticket, dst, src, after):
        with torch.cuda.stream(self.stream):
            if after is not None:
                self.stream.wait_event(after)
            dst.copy_(src, non_blocking=True)
            ticket.event = torch.cuda.Event()
            ticket.event.record(self.stream)

    def _read_then_copy(self, ticket, dst, src, read, after):
        # staging is a ring too (blocks at their own offsets): before reading into a
        # range, the DMAs still reading any overlapping range must have finished
        lo = src.data_ptr()
        hi = lo + src.numel()
        kept = []
        for a, b, event in self._staging_events:
            if a < hi and lo < b:
                event.synchronize()
            elif not event.query():
                kept.append((a, b, event))
        read(src)
        self._issue(ticket, dst, src, after)
        kept.append((lo, hi, ticket.event))
        self._staging_events = kept

    def compute_mark(self):
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(self.device))
        return event

    def wait(self, ticket: Ticket) -> None:
        ticket.done.wait()                # the copy is issued (an unrecorded event is no wait)
        if ticket.error is not None:
            self.failed_seen = True
            raise_if_failed(ticket)
        torch.cuda.current_stream(self.device).wait_event(ticket.event)

    def drain(self) -> None:
        try:
            drain_workers([self._worker], quiet=self.failed_seen)
        finally:
            self.failed_seen = False
            self.stream.synchronize()

    def close(self) -> None:
        if self._worker is not None:
            self._worker.close()
