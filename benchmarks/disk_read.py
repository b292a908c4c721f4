"""Disk residency read throughput vs a plain sequential read of the same file, in the
same run, page cache dropped for the file before every measurement (posix_fadvise).
Both read into one torch host buffer (the largest block's size), allocated and touched
before any timing: same allocation, same page size, no first-touch faults in either.
    ratio = engine bytes/s / plain bytes/s        (target >= 0.90)
Measured twice: the engine's block reader alone (each streamed block read into a
staging slot, as the copy worker does) and a whole streamed forward with params=disk
on a simulated device with an unthrottled link (depth 2; compute and the
simulated device copy included, overlapped with the reads).

    python benchmarks/disk_read.py [--dir /tmp] [--rounds 3]
"""
import argparse
import os
import tempfile
import time

import torch
from safetensors.torch import save_file

from _common import flux, inventory, med, plan
from comfyui_placement.runtime import find_blocks, place
from comfyui_placement.runtime.residency import Group
from comfyui_placement.runtime.weightfile import DiskLayout, open_weight_file
from comfyui_placement.runtime.simdevice import Link


def drop_cache(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def plain_read(path, buf: torch.Tensor):
    """A plain sequential read of the whole file in chunks the size of `buf`, into `buf`:
    the same kind of buffer (a torch host tensor allocated outside the timed call, so
    the same page size and no first-touch faults) the engine reads into."""
    view = memoryview(buf.numpy()).cast("B")
    n = 0
    with open(path, "rb", buffering=0) as fh:
        while True:
            got = fh.readinto(view)
            if not got:
                return n
            n += got


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default=tempfile.gettempdir())
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args()
    model, inp = flux(hidden=1024, heads=8, double=4, single=4, img_tokens=16, txt_tokens=8)
    path = os.path.join(args.dir, "placement-disk-bench.safetensors")
    save_file(model.state_dict(), path)
    size = os.path.getsize(path)
    try:
        blocks = find_blocks(model)
        wf = open_weight_file(path)
        layouts = []
        for name, b in blocks:
            tensors = list(b.parameters())
            names = [[f"{name}.{n}"] for n, _ in b.named_parameters()]
            key = lambda i, names=names: wf.entries[names[i][0]][2]   # noqa: E731
            g = Group(name, tensors, names, key)
            layouts.append((g, DiskLayout(g, wf, lambda k: k, True)))
        staging = torch.empty(max(g.nbytes for g, _ in layouts), dtype=torch.uint8)
        staging.fill_(0)                  # touched once: no page faults in a timed read
        chunk = staging                   # the plain read uses the very same buffer
        block_bytes = sum(g.nbytes for g, _ in layouts)

        def engine_read():
            for g, layout in layouts:
                wf.read_runs(layout.runs, staging)
            return block_bytes

        inv = inventory()
        disk_plan = plan("disk", stream=(0, 2))

        def streamed_forward():
            drop_cache(path)
            with place(model, disk_plan, "diffusion", inv, weights_file=path,
                       link=Link(bandwidth=None)) as placed:
                t0 = time.perf_counter()
                with torch.no_grad():
                    model(**inp)
                dt = time.perf_counter() - t0
                placed.streamer.drain()
            return block_bytes, dt

        rows = {"plain sequential read": [], "engine block reader": [],
                "streamed forward (disk)": []}
        cold_warm = []
        pair = [("plain sequential read", lambda: plain_read(path, chunk)),
                ("engine block reader", engine_read)]
        for r in range(args.rounds):
            for name, fn in pair if r % 2 == 0 else pair[::-1]:   # alternate who goes first
                drop_cache(path)
                t0 = time.perf_counter()
                n = fn()
                rows[name].append(n / (time.perf_counter() - t0))
            t0 = time.perf_counter()
            plain_read(path, chunk)                  # warm: shows whether the drop worked
            cold_warm.append(size / (time.perf_counter() - t0))
            n, dt = streamed_forward()
            rows["streamed forward (disk)"].append(n / dt)
        wf.close()
    finally:
        os.remove(path)
    base = med(rows["plain sequential read"])
    print(f"file: {size / 2**20:.0f} MiB safetensors (Flux architecture, hidden 1024, "
          f"8 blocks, {block_bytes / 2**20:.0f} MiB in blocks) in {args.dir}; "
          f"{args.rounds} rounds, page cache dropped before each cold read")
    print(f"page cache check: warm re-read {med(cold_warm) / 1e9:.2f} GB/s vs cold "
          f"{base / 1e9:.2f} GB/s")
    for name, vals in rows.items():
        print(f"{name:>24}: {med(vals) / 1e9:6.2f} GB/s   ratio to plain {med(vals) / base:.3f}")


if __name__ == "__main__":
    main()
