"""The one restore path: every engine (one device, layer split, row split) gives a
module back through `put_back`, so "restored exactly" is one piece of code, tested on
its own (tests/runtime/test_restore.py).

While placed, a module's tensors keep their identity and only their `.data` points at
device buffers; each has a resting value (its own data from before, or for streamed
host groups a view of the packed buffer that holds the weights once). Putting back
rebinds each tensor to its resting value, on the device it was on before.
"""
from typing import Iterable, Optional, Tuple

import torch

from ..host.residency import rebind

Resting = Tuple[torch.Tensor, torch.Tensor, Optional[torch.device]]


def put_back(entries: Iterable[Resting]) -> None:
    """entries: (tensor, resting value, device it was on; None: the value's own). Every
    tensor is put back even when one fails; the first failure is raised after."""
    first = None
    for t, rest, device in entries:
        try:
            if device is not None and rest.device != device:
                rest = rest.to(device)
            rebind(t, rest)
        except BaseException as exc:     # the others still go back
            first = first or exc
    if first is not None:
        raise first
