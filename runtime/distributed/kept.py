"""Worker ranges kept loaded between placements, for an owner (ComfyUI's diffusion
module): the next placement of the same owner, range, file and weights asks the worker
whether it still holds the range and moves and hashes nothing; the host store does the
same for streamed blocks (runtime/host/hoststore.py).

A kept range remembers what proved it: the request that loaded it (builder, blocks,
tensor keys, file and its signature, device) and where the owner's local tensors of its
blocks were when they were compared with the file (their storage address, offset, shape,
strides, dtype and device). Another plan, file or set of local tensors (a LoRA fused into
them) does not match and loads again; the worker then takes what it still holds of that
file and reads only the rest (runtime/distributed/held.py).

A kept range goes when its owner is unloaded or garbage (free(owner), or found dead at the
next call), when a placement of the owner no longer names that worker device
(free(owner, keep=...)), when a placement of another owner loads on the same worker
device (the plan budgeted that device for one model), and with its link.
"""
import threading
import weakref
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

import torch

from ...placement.errors import PlacementError

Fingerprint = tuple


@dataclass
class KeptRange:
    owner: "weakref.ref"
    device: str                        # the worker device as the plan names it (w1.cpu)
    range_id: int
    request: str                       # what loaded it (remote.py's request key)
    sig: tuple                         # the main's file signature then (digests.py)
    proven: Dict[str, Fingerprint] = field(default_factory=dict)
    nbytes: int = 0


_lock = threading.Lock()
_kept: "weakref.WeakKeyDictionary[object, List[KeptRange]]" = weakref.WeakKeyDictionary()


def fingerprint(t: torch.Tensor) -> Optional[Fingerprint]:
    """Where a local tensor's values are: equal fingerprints, same memory (None for a
    tensor with no values of its own: on the meta device)."""
    if t.device.type == "meta":
        return None
    return (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape),
            tuple(t.stride()), t.dtype, str(t.device))


def find(link, owner, device: str) -> Optional[KeptRange]:
    with _lock:
        for k in _kept.get(link, ()):
            if k.owner() is owner and k.device == device:
                return k
    return None


def remember(link, kept: KeptRange) -> None:
    with _lock:
        entries = _kept.setdefault(link, [])
        entries[:] = [k for k in entries if k.range_id != kept.range_id] + [kept]


def on_device(link, device: str) -> List[int]:
    """The ids of every range kept on this worker device (any owner)."""
    with _lock:
        return [k.range_id for k in _kept.get(link, ()) if k.device == device]


def forget(link, range_ids: Sequence[int]) -> None:
    """The worker dropped these ranges (a load replaced them)."""
    with _lock:
        if link in _kept:
            _kept[link] = [k for k in _kept[link] if k.range_id not in set(range_ids)]


def free(owner=None, keep: Sequence[tuple] = (), timeout_s: float = 30.0) -> int:
    """Unload the ranges kept for `owner` (None: none but the dead owners'), except those
    in `keep` ((link, range id) pairs), and those of owners that are gone. Returns how many went; a
    worker that cannot be told (its link broke) drops them itself with the link."""
    with _lock:
        going = []
        for link, entries in list(_kept.items()):
            for k in entries:
                dead = k.owner() is None
                if dead or (owner is not None and k.owner() is owner and
                            (link, k.range_id) not in keep):
                    going.append((link, k))
            gone = {id(k) for _, k in going}
            _kept[link] = [k for k in entries if id(k) not in gone]
    for link, k in going:
        if link.broken is None:
            try:
                link.request({"op": "unload", "range": k.range_id}, timeout_s)
            except PlacementError:
                pass                  # the link is marked lost; the worker drops it all
    return len(going)


def held(owner) -> List[KeptRange]:
    """The ranges kept for `owner` (what the node and the tests read)."""
    with _lock:
        return [k for entries in _kept.values() for k in entries if k.owner() is owner]
