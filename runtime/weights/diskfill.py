"""params=disk, the resident groups: the engine (runtime/engine/core.py `_fill`) reads each one
from the model file straight into its device buffer, on a real GPU through a host staging
buffer with several reads in flight. Streamed blocks are read per forward into the ring's
staging (runtime/stream with `Source(read=...)`); nothing else stays in host memory."""
from typing import Callable, Iterator, List, Sequence, Tuple

import torch

from ...placement.errors import PlacementError
from ..host.residency import Group
from .weightfile import DiskLayout, WeightFile

CHUNK = 64 * 1024 ** 2          # staging for one-time resident reads onto a real GPU

# (file offset, destination offset, staging offset, nbytes)
Staged = Tuple[int, int, int, int]


def fill_from_file(file: WeightFile, layout: DiskLayout, group: Group, buf: torch.Tensor,
                   resting: Callable, staging: Callable) -> None:
    """Fill a device buffer with a group: its tensors in the file read straight in, the
    others (non-persistent buffers) copied from the module."""
    views = group.views(buf)
    for i in layout.from_module:
        src = resting(group.tensors[i])
        if src.is_meta:
            raise PlacementError(f"{group.names[i][0]!r} is not in the weights file and the "
                                 f"module holds no value for it")
        views[i].copy_(src)
    if buf.device.type == "cpu":
        file.read_runs(layout.runs, buf)
        return
    read_staged(file, layout.runs, buf, staging(min(CHUNK, max(1, group.nbytes))))
    torch.cuda.synchronize(buf.device)


def read_staged(file: WeightFile, runs: Sequence[Tuple[int, int, int]], buf: torch.Tensor,
                chunk: torch.Tensor) -> None:
    """Runs read into `buf` through a host staging buffer: as many runs as fit are read
    in one read_runs call (several reads in flight), then copied over."""
    for batch in staged(runs, chunk.numel()):
        file.read_runs([(f, s, n) for f, _, s, n in batch], chunk)
        for _, b, s, n in merged_copies(batch):
            buf[b:b + n].copy_(chunk[s:s + n])


def staged(runs: Sequence[Tuple[int, int, int]], cap: int) -> Iterator[List[Staged]]:
    """(file offset, destination offset, nbytes) runs packed into batches of at most
    `cap` staging bytes, runs longer than the room left cut where it ends."""
    batch: List[Staged] = []
    used = 0
    for f, b, n in runs:
        done = 0
        while done < n:
            m = min(cap - used, n - done)
            batch.append((f + done, b + done, used, m))
            used += m
            done += m
            if used == cap:
                yield batch
                batch, used = [], 0
    if batch:
        yield batch


def merged_copies(batch: Sequence[Staged]) -> List[Staged]:
    """Neighbouring pieces that are also neighbours in the destination: one copy."""
    out: List[Staged] = []
    for piece in batch:
        if out and out[-1][1] + out[-1][3] == piece[1] and out[-1][2] + out[-1][3] == piece[2]:
            f, b, s, n = out[-1]
            out[-1] = (f, b, s, n + piece[3])
        else:
            out.append(piece)
    return out
