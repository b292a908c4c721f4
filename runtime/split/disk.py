"""params=disk for a layer split: each device's resident groups are read from the model
file once per placement, its streamed blocks are read into staging slots per forward
(runtime/stream with `Source(read=...)`), nothing else stays in host memory."""
from typing import Callable

import torch

from ...placement.errors import PlacementError
from ..residency import Group
from ..weightfile import DiskLayout, WeightFile

CHUNK = 64 * 1024 ** 2          # staging for one-time resident reads onto a real GPU


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
    chunk = staging(min(CHUNK, max(1, group.nbytes)))
    for f_off, b_off, n in layout.runs:
        done = 0
        while done < n:
            m = min(chunk.numel(), n - done)
            file.read_runs([(f_off + done, 0, m)], chunk)
            buf[b_off + done:b_off + done + m].copy_(chunk[:m])
            done += m
    torch.cuda.synchronize(buf.device)


def reader(file: WeightFile, runs):
    def read(buf: torch.Tensor) -> None:
        file.read_runs(runs, buf)
    return read
