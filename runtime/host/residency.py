"""Where weights rest and how a group of them is laid out for one-copy transfers.

A `Group` is a set of tensors (a block's parameters and buffers, or all non-block
ones) packed into one flat byte buffer: largest element size first, so every tensor
starts aligned to its own element size and the flat size is exactly the tensors'
bytes. The module's tensors are bound (`t.data = view`) to views of a device buffer
or ring slot once; a block then arrives with one copy and no per-parameter work.

Resting places:
- cpu: one flat host buffer per streamed group, pinned when the compute device is
  CUDA (a capped number of bytes; past the cap pageable, with a warning). The
  module's own storage is packed into it group by group, so host RAM holds the
  weights once. Never pins mmap-backed pages (we pin only our own buffers).
- disk: a safetensors or GGUF file read by byte ranges straight into a staging slot;
  nothing stays in RAM but the slots and the page cache. Quantized GGUF tensors go
  raw into modules that keep them raw (uint8); there is no dequantization here.
"""
import warnings
from typing import Callable, List, Optional, Sequence

import torch

from ...placement.units import format_bytes


def rebind(t: torch.Tensor, value: torch.Tensor) -> None:
    """Point tensor `t` (a Parameter or buffer, identity kept) at `value`'s memory.
    `.data` cannot cross to or from the meta device; swap_tensors can."""
    try:
        t.data = value
    except RuntimeError:
        if isinstance(t, torch.nn.Parameter):
            value = torch.nn.Parameter(value, requires_grad=t.requires_grad)
        torch.utils.swap_tensors(t, value)


class Group:
    """Tensors packed into one flat buffer. `names[i]` are the module names of tensor i."""

    def __init__(self, name: str, tensors: Sequence[torch.Tensor],
                 names: Sequence[Sequence[str]], order_key: Optional[Callable] = None):
        self.name = name
        idx = sorted(range(len(tensors)),
                     key=lambda i: (-tensors[i].element_size(),
                                    order_key(i) if order_key else i))
        self.tensors = [tensors[i] for i in idx]
        self.names = [list(names[i]) for i in idx]
        self.dtypes = [t.dtype for t in self.tensors]
        # size(), not .shape: a GGUF tensor subclass reports its dequantized shape there
        self.shapes = [tuple(t.size()) for t in self.tensors]
        self.offsets, self.sizes, off = [], [], 0
        for t in self.tensors:
            n = t.numel() * t.element_size()
            self.offsets.append(off)
            self.sizes.append(n)
            off += n
        self.nbytes = off

    def views(self, buf: torch.Tensor) -> List[torch.Tensor]:
        return [buf[o:o + n].view(d).view(s) for o, n, d, s in
                zip(self.offsets, self.sizes, self.dtypes, self.shapes)]

    def bind(self, buf: torch.Tensor) -> None:
        for t, v in zip(self.tensors, self.views(buf)):
            rebind(t, v)

    def pack(self, buf: torch.Tensor, sources: Sequence[torch.Tensor]) -> None:
        for v, src in zip(self.views(buf), sources):
            v.copy_(src)


# -- pinned host memory --------------------------------------------------------------
class PinnedPool:
    """Pins our own host buffers at their exact size through the process-wide account
    (runtime/host/pinned.py: registered in place, unpinned and uncounted when the last view
    is gone), up to `cap_bytes` pinned in use; past it, pageable with one warning, which
    `warning` keeps for stats()."""

    def __init__(self, enabled: bool, cap_bytes: int, account=None):
        self.enabled = enabled
        self.cap = cap_bytes
        self._account = account
        self.pageable_bytes = 0
        self.warning: Optional[str] = None

    @property
    def account(self):
        if self._account is None:
            from .pinned import account
            self._account = account()
        return self._account

    @property
    def pinned_bytes(self) -> int:
        """Pinned host bytes in use now (the pack's, process-wide: host stores included)."""
        return self.account.in_use if self.enabled else 0

    def alloc(self, nbytes: int) -> torch.Tensor:
        return self.alloc_flagged(nbytes)[0]

    def alloc_flagged(self, nbytes: int):
        """(buffer, pinned)."""
        if self.enabled:
            try:
                buf = self.account.alloc(nbytes, self.cap)
                if buf is not None:
                    return buf, True
                self._warn(f"pinned host memory cap {format_bytes(min(self.cap, self.account.cap))} "
                           f"reached")
            except RuntimeError as exc:
                self._warn(f"pinning failed ({exc})")
        self.pageable_bytes += nbytes
        return torch.empty(nbytes, dtype=torch.uint8), False

    def _warn(self, why: str) -> None:
        if self.warning is None:
            self.warning = (f"{why}: the rest of the weights rest in pageable memory, "
                            f"copies from it are slower")
            warnings.warn(self.warning, RuntimeWarning, stacklevel=3)


def _find_malloc_trim():
    try:
        import ctypes
        import ctypes.util
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc.malloc_trim
    except (OSError, AttributeError):
        return None                     # not glibc: nothing to do


_malloc_trim = _find_malloc_trim()


def give_back_freed_host_memory() -> None:
    """glibc keeps freed heap memory (its mmap threshold rises after large frees), so
    packing weights into new buffers would leave the old copies in RSS; trim returns
    them to the OS."""
    if _malloc_trim is not None:
        _malloc_trim(0)


def default_pinned_cap() -> int:
    """Half the host RAM (a quarter on Windows): pinned pages cannot be swapped."""
    from .pinned import default_cap
    return default_cap()
