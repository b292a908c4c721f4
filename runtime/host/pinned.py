"""Pinned host memory, exact and bounded.

torch's pinned allocator (`pin_memory=True`) rounds every request up to a power of two
and caches what is freed: one buffer per Flux block pins 38 GiB for 22 GiB of blocks.
Here a pinned buffer is an ordinary host allocation of exactly the bytes asked for,
page-locked in place with `cudaHostRegister` (through `torch.cuda.cudart()`), and
unregistered when the last tensor viewing it is gone: the buffer's owner is the numpy
array under the tensor's storage, so the storage's lifetime is the pin's lifetime.

One `PinnedAccount` per process counts the pinned bytes in use and caps them (a
fraction of host RAM: half on Linux, a quarter on Windows, where page-locked memory is
scarcer). Past the cap a request is refused and the caller falls back to pageable
memory. On a machine without CUDA the same path runs with a no-op register, so the
accounting is tested on CPU.
"""
import sys
import threading
from typing import Callable, Optional, Tuple

import numpy as np
import torch


def default_cap(total_ram: Optional[int] = None) -> int:
    if total_ram is None:
        from ...placement.detect import host_memory
        total_ram = host_memory()[0]
    return int(total_ram) // (4 if sys.platform == "win32" else 2)


def _cuda_register() -> Tuple[Callable[[int, int], None], Callable[[int], None]]:
    cudart = torch.cuda.cudart()

    def register(ptr: int, nbytes: int) -> None:
        err = cudart.cudaHostRegister(ptr, nbytes, 0)
        if int(err) != 0:
            raise RuntimeError(f"cudaHostRegister of {nbytes} bytes failed (error {int(err)})")

    def unregister(ptr: int) -> None:
        cudart.cudaHostUnregister(ptr)

    return register, unregister


class _Owner:
    """Owns one exact-size host allocation; unpins and uncounts it when collected."""
    __slots__ = ("array", "ptr", "nbytes", "account", "unregister", "__weakref__")

    def __init__(self, nbytes: int, account: "PinnedAccount", register, unregister):
        self.array = np.empty(max(1, nbytes), dtype=np.uint8)
        self.ptr = self.array.ctypes.data
        self.nbytes = nbytes
        register(self.ptr, self.array.nbytes)
        self.account = account
        self.unregister = unregister

    @property
    def __array_interface__(self):
        return {"shape": (self.nbytes,), "typestr": "|u1", "version": 3,
                "data": (self.ptr, False)}

    def __del__(self):
        try:
            self.unregister(self.ptr)
        except Exception:                 # CUDA already torn down (interpreter exit)
            pass
        finally:
            self.account._give_back(self.nbytes)


class PinnedAccount:
    """Pinned bytes in use by this pack, process-wide, and their cap."""

    def __init__(self, cap_bytes: Optional[int] = None, register=None, unregister=None):
        self.cap = default_cap() if cap_bytes is None else int(cap_bytes)
        self.in_use = 0
        self.peak = 0
        self._lock = threading.Lock()
        self._register, self._unregister = register, unregister

    def _functions(self):
        if self._register is None:
            try:
                self._register, self._unregister = _cuda_register()
            except (AssertionError, AttributeError, RuntimeError) as exc:   # no CUDA here
                raise RuntimeError(f"no CUDA runtime to pin with ({exc})") from None
        return self._register, self._unregister

    def alloc(self, nbytes: int, cap: Optional[int] = None) -> Optional[torch.Tensor]:
        """A pinned uint8 tensor of exactly `nbytes`, or None past the cap (`cap`: a
        caller's own, lower limit on the process-wide bytes in use)."""
        limit = self.cap if cap is None else min(self.cap, cap)
        with self._lock:
            if self.in_use + nbytes > limit:
                return None
            self.in_use += nbytes
            self.peak = max(self.peak, self.in_use)
        try:
            register, unregister = self._functions()
            owner = _Owner(nbytes, self, register, unregister)
        except BaseException:
            self._give_back(nbytes)
            raise
        return torch.from_numpy(np.asarray(owner))   # the storage keeps the owner alive

    def _give_back(self, nbytes: int) -> None:
        with self._lock:
            self.in_use -= nbytes


_account: Optional[PinnedAccount] = None


def account() -> PinnedAccount:
    global _account
    if _account is None:
        _account = PinnedAccount()
    return _account


def set_account(acc: Optional[PinnedAccount]) -> Optional[PinnedAccount]:
    """Replace the process-wide account (tests); returns the previous one."""
    global _account
    prev, _account = _account, acc
    return prev
