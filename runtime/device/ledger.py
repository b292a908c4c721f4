"""Bytes held on one device by one placed component: what the budget bounds and what
stats() reports.

Every device allocation the runtime makes goes through `reserve`, so going past the
capacity raises the error a real device raises (torch.OutOfMemoryError), before the
memory is taken. Activations are the tensors the runtime sees entering each block; on a
simulated device the working memory is measured instead (workmeter.py: every tensor the
forward computes, alive), and the block-input estimate gives way to it (`metered`).
"""
import threading

import torch

from ...placement.units import format_bytes

CATEGORIES = ("resident", "slots", "activations", "working")


def out_of_memory(device: str, asked: int, held: int, capacity: int, what: str):
    return torch.OutOfMemoryError(
        f"{device}: out of memory allocating {format_bytes(asked)} for {what} "
        f"({format_bytes(held)} held, capacity {format_bytes(capacity)})")


class Ledger:
    def __init__(self, device: str, capacity: int):
        self.device = device
        self.capacity = int(capacity)
        self.held = dict.fromkeys(CATEGORIES, 0)
        self.peak_bytes = 0
        self.activation_peak_bytes = 0
        self.working_peak_bytes = 0
        self.metered = False            # a WorkMeter measures the working memory here
        self.h2d_bytes = 0
        self.h2d_copies = 0
        self._lock = threading.Lock()

    @property
    def total(self) -> int:
        h = self.held
        return h["resident"] + h["slots"] + h["activations"] + h["working"]

    def reserve(self, category: str, nbytes: int, what: str) -> None:
        with self._lock:
            total = self.total + nbytes
            if total > self.capacity:
                raise out_of_memory(self.device, nbytes, self.total, self.capacity, what)
            self.held[category] += nbytes
            if total > self.peak_bytes:
                self.peak_bytes = total

    def release(self, category: str, nbytes: int) -> None:
        with self._lock:
            self.held[category] -= nbytes
            assert self.held[category] >= 0, (category, self.held[category])

    def set_inputs(self, nbytes: int) -> None:
        """The forward's inputs now live on the device: made before it ran, so a meter
        never sees them, and counted here either way."""
        self._set_activations(nbytes, "forward inputs")

    def set_activations(self, nbytes: int, what: str = "activations") -> None:
        """The runtime's estimate of the activations now live on the device (replaces the
        previous figure). Where a meter measures the working memory, the estimate gives
        way: only a reset to 0 (the forward ended) is taken."""
        if self.metered and nbytes:
            return
        self._set_activations(nbytes, what)

    def _set_activations(self, nbytes: int, what: str) -> None:
        if nbytes == self.held["activations"]:
            return
        with self._lock:
            total = self.total - self.held["activations"] + nbytes
            if total > self.capacity:
                raise out_of_memory(self.device, nbytes, self.total - self.held["activations"],
                                    self.capacity, what)
            self.held["activations"] = nbytes
            if total > self.peak_bytes:
                self.peak_bytes = total
            if nbytes > self.activation_peak_bytes:
                self.activation_peak_bytes = nbytes

    def set_working(self, nbytes: int, what: str = "working memory") -> None:
        """The bytes a metered forward has computed and still holds here (workmeter.py)."""
        with self._lock:
            total = self.total - self.held["working"] + nbytes
            if nbytes > self.held["working"] and total > self.capacity:
                raise out_of_memory(self.device, nbytes - self.held["working"],
                                    self.total, self.capacity, what)
            self.held["working"] = nbytes
            if total > self.peak_bytes:
                self.peak_bytes = total
            if nbytes > self.working_peak_bytes:
                self.working_peak_bytes = nbytes

    def count_h2d(self, nbytes: int) -> None:
        self.h2d_bytes += nbytes      # called from the thread that submits copies only
        self.h2d_copies += 1

    def stats(self) -> dict:
        return {"peak_bytes": self.peak_bytes, "h2d_bytes": self.h2d_bytes,
                "h2d_copies": self.h2d_copies, "capacity_bytes": self.capacity,
                "resident_bytes": self.held["resident"], "slot_bytes": self.held["slots"],
                "activation_peak_bytes": self.activation_peak_bytes,
                **({"working_peak_bytes": self.working_peak_bytes} if self.metered else {})}
