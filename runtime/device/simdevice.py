"""The simulated accelerator: device memory is host memory, but its capacity is the
ledger's (see runtime/device/ledger.py) and a host-to-device copy lands only after the modelled
time (bytes / bandwidth + latency), on a worker thread, like a DMA engine. Until then
the destination keeps its old bytes, so a consumer that skips `wait` computes with
stale weights: the race tests rely on it.

Compute runs eagerly on the host, so when a compute mark is taken everything issued
before it has finished; marks need no event.
"""
import time
from dataclasses import dataclass
from typing import Optional

import torch

from .transfer import ALREADY_DONE, CopyWorker, Ticket, Transfer, drain_workers, raise_if_failed


@dataclass(frozen=True)
class Link:
    """The modelled host-to-device link. bandwidth None: as fast as the memcpy."""
    bandwidth: Optional[float] = 25e9     # bytes per second (PCIe 4 x16, pinned, in practice)
    latency: float = 10e-6                # seconds per copy

    def seconds(self, nbytes: int) -> float:
        if self.bandwidth is None:
            return 0.0
        return self.latency + nbytes / self.bandwidth


class SimTransfer(Transfer):
    """Disk reads run on their own thread ahead of the copy engine (a disk and a DMA
    engine work at the same time). A staging buffer is free again when its slot's
    block has been waited for, which is before the ring submits the next read into it.
    `reads_into_dst`: for the host as compute device, disk reads land in the slot."""
    pin_host = False

    def __init__(self, name: str, link: Link = Link(), reads_into_dst: bool = False):
        self.device = torch.device("cpu")
        self.link = link
        self.reads_into_dst = reads_into_dst
        self._busy_until = 0.0
        self._memcpy_rate = 5e9           # bytes/s, learned from the copies carried out
        # an unthrottled link has no modelled time to wait out: copy in the caller, with
        # no thread handoff (the host as compute device, and hook-overhead benchmarks)
        self._inline = link.bandwidth is None
        self._worker = None if self._inline else CopyWorker(name, self._copy)
        self._reader = None
        self._name = name

    def alloc(self, nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8)

    def submit(self, dst, src, read=None, after=None) -> Ticket:
        if self._inline and read is None and self._reader is None:
            ticket = Ticket(dst.numel(), ALREADY_DONE)   # carried out here, no handoff
            try:
                dst.copy_(src)
            except BaseException as exc:  # surfaced at wait(), like a worker's failure
                ticket.error = exc
            return ticket
        ticket = Ticket(dst.numel())
        if read is not None and self._reader is None:
            self._reader = CopyWorker(f"{self._name}-disk", self._read)
        if self._reader is not None:      # one path for all, so copies stay in order
            self._reader.put(ticket, (dst, src, read))
            self._reader.forget_done()
        else:
            self._worker.put(ticket, (dst, src))
            self._worker.forget_done()
        return ticket

    def _read(self, ticket, dst, src, read):
        if read is not None:
            read(dst if self.reads_into_dst else src)   # at the disk's real speed
        if read is not None and self.reads_into_dst:
            return True
        if self._inline:
            dst.copy_(src)
            return True
        self._worker.put(ticket, (dst, src))
        return False

    def _copy(self, ticket, dst, src):
        start = max(time.perf_counter(), self._busy_until)
        landing = start + self.link.seconds(ticket.nbytes)
        # the host memcpy is part of the modelled time: start it so it ends at landing
        delay = landing - time.perf_counter() - ticket.nbytes / self._memcpy_rate
        if delay > 0:
            time.sleep(delay)             # the bytes are on the wire: dst is still old
        t0 = time.perf_counter()
        dst.copy_(src)
        t1 = time.perf_counter()
        if ticket.nbytes >= 1 << 20 and t1 > t0:
            self._memcpy_rate = 0.8 * self._memcpy_rate + 0.2 * ticket.nbytes / (t1 - t0)
        if t1 < landing:                  # the memcpy beat its estimate: a copy never
            time.sleep(landing - t1)      # lands before its modelled time
        self._busy_until = max(landing, time.perf_counter())

    def compute_mark(self):
        return None

    def wait(self, ticket: Ticket) -> None:
        ticket.done.wait()
        if ticket.error is not None:
            self.failed_seen = True
            raise_if_failed(ticket)

    def drain(self) -> None:
        try:
            drain_workers([self._reader, self._worker], quiet=self.failed_seen)
        finally:
            self.failed_seen = False

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
        if self._worker is not None:
            self._worker.close()
