"""params=disk read throughput, cold cache, against a plain sequential read of the same
file, side by side in one run.

What it measures (best of --rounds, who goes first alternating per round):
  plain sequential read   the whole file read front to back with one thread, in pieces
                          the size of the buffer below, into that buffer
  engine block reader     each streamed block's runs read with WeightFile.read_runs (the
                          call the streamer's worker makes: several preads in flight)
                          into that same buffer
  engine, one at a time   the same with no reader threads, one preadv per run (how it
                          read before)
  engine into ring slots  the block reader as the streamer uses it at depth 2: each
                          block into its own offset of one ring-sized staging buffer
                          (placement/layout.ring_layout), no extra copy
  ratio = engine bytes/s / plain bytes/s                  (target >= 0.90)
then the same block by block: each engine read of a block paired with a plain read of
the same byte range right next to it in time (order rotating), median of the ratios:
steadier than best-of-N when others share the disk. Last, one streamed forward with
params=disk on a simulated device with an unthrottled link (depth 2): block bytes/s of
a whole step including compute and the simulated device's copy, for scale only.

What it assumes:
- The page cache is dropped for the file before every timed read (fsync, then
  posix_fadvise(POSIX_FADV_DONTNEED)); the drop is checked with mincore (the file's
  pages still cached) and by timing a warm re-read against a cold read. If the drop
  has no effect the output says so and the figures are warm-cache figures.
- "Disk" is whatever backs --dir. In a virtual machine the host may cache the image,
  so a cold read here can be faster than the physical device.
- Both reads go into one torch uint8 host buffer (the largest block's size), allocated
  and touched before any timing: same allocation, same page size, no first-touch faults.

    python benchmarks/disk_read.py [--dir /tmp] [--rounds 5] [--pieces 512K,4M]
"""
import argparse
import ctypes
import mmap
import os
import statistics
import tempfile
import time

import numpy as np
import torch
from safetensors.torch import save_file

from _common import flux, inventory, plan
from comfyui_placement.placement.layout import ring_bytes, ring_layout
from comfyui_placement.runtime import find_blocks, place
from comfyui_placement.runtime.host.residency import Group
from comfyui_placement.runtime.device.simdevice import Link
from comfyui_placement.runtime.weights.weightfile import DiskLayout, open_weight_file


def drop_cache(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)                               # dirty pages cannot be dropped
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def cached_fraction(path):
    """Share of the file's pages in the page cache (mincore on a read-only mapping; no
    page is touched), or None where mincore cannot be called."""
    size = os.path.getsize(path)
    try:
        mincore = ctypes.CDLL(None, use_errno=True).mincore
    except (OSError, AttributeError):
        return None
    mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    vec = (ctypes.c_ubyte * pages)()
    with open(path, "rb") as fh:
        mm = mmap.mmap(fh.fileno(), size, prot=mmap.PROT_READ)
    try:
        view = np.frombuffer(mm, dtype=np.uint8)
        failed = mincore(ctypes.c_void_p(view.ctypes.data), size, vec) != 0
        del view
    finally:
        mm.close()
    return None if failed else sum(v & 1 for v in vec) / pages


def plain_read(path, buf: torch.Tensor) -> int:
    """Read the whole file front to back, one thread, in pieces the size of `buf`."""
    view = memoryview(buf.numpy()).cast("B")
    n = 0
    with open(path, "rb", buffering=0) as fh:
        while True:
            got = fh.readinto(view)
            if not got:
                return n
            n += got


def plain_span(path, off, n, buf: torch.Tensor) -> int:
    """Read bytes [off, off + n) of the file front to back, one thread, into `buf`."""
    view = memoryview(buf.numpy()).cast("B")
    got = 0
    with open(path, "rb", buffering=0) as fh:
        fh.seek(off)
        while got < n:
            k = fh.readinto(view[got:n])
            if not k:
                break
            got += k
    return got


def parse_size(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper()
    return int(float(text[:-1]) * units[text[-1]]) if text[-1] in units else int(text)


def timed_cold(path, fn):
    drop_cache(path)
    t0 = time.perf_counter()
    n = fn()
    return n / (time.perf_counter() - t0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default=tempfile.gettempdir())
    ap.add_argument("--rounds", type=int, default=5, help="best of this many cold reads")
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--pieces", default="",
                    help="extra engine rows with these piece sizes, e.g. 256K,4M")
    args = ap.parse_args()
    model, inp = flux(hidden=args.hidden, heads=8, double=4, single=4, img_tokens=16,
                      txt_tokens=8)
    from diffusers.utils import logging as diffusers_logging
    diffusers_logging.set_verbosity_error()        # the bf16 cast notice is not news here
    model = model.to(torch.bfloat16)
    inp = {k: v.to(torch.bfloat16) if torch.is_tensor(v) and v.is_floating_point() else v
           for k, v in inp.items()}
    path = os.path.join(args.dir, "placement-disk-bench.safetensors")
    save_file(model.state_dict(), path)
    size = os.path.getsize(path)
    try:
        blocks = find_blocks(model)
        files = {"engine block reader": open_weight_file(path),
                 "engine, one at a time": open_weight_file(path, readers=0, chunk=1 << 40)}
        for p in filter(None, args.pieces.split(",")):
            files[f"engine, {p} pieces"] = open_weight_file(path, chunk=parse_size(p))
        wf = files["engine block reader"]
        layouts = []
        for name, b in blocks:
            tensors = list(b.parameters())
            names = [[f"{name}.{n}"] for n, _ in b.named_parameters()]
            key = lambda i, names=names: wf.entries[names[i][0]][2]   # noqa: E731
            g = Group(name, tensors, names, key)
            layouts.append((g, DiskLayout(g, wf, lambda k: k, True)))
        buf = torch.empty(max(g.nbytes for g, _ in layouts), dtype=torch.uint8)
        buf.fill_(0)                      # touched once: no page faults in a timed read
        block_bytes = sum(g.nbytes for g, _ in layouts)
        sizes = [g.nbytes for g, _ in layouts]
        ring = ring_layout(sizes, ring_bytes(sizes, 2), 2)
        staging = torch.zeros(ring.ring, dtype=torch.uint8)    # touched, like buf

        def engine(f, into_ring=False):
            def read():
                for (g, layout), off in zip(layouts, ring.offsets):
                    f.read_runs(layout.runs, staging[off:off + g.nbytes] if into_ring
                                else buf)
                return block_bytes
            return read

        # does dropping work here? cold vs warm, and pages cached after a drop
        warm, cold, left = [], [], []
        for _ in range(2):
            plain_read(path, buf)
            t0 = time.perf_counter()
            plain_read(path, buf)
            warm.append(size / (time.perf_counter() - t0))
            drop_cache(path)
            left.append(cached_fraction(path))
            cold.append(timed_cold(path, lambda: plain_read(path, buf)))

        rows = {"plain sequential read": [], **{name: [] for name in files},
                "engine into ring slots": []}
        runs = [("plain sequential read", lambda: plain_read(path, buf))]
        runs += [(name, engine(f)) for name, f in files.items()]
        runs.append(("engine into ring slots", engine(wf, into_ring=True)))
        for r in range(args.rounds):
            order = runs[r % len(runs):] + runs[:r % len(runs)]   # rotate who goes first
            for name, fn in order:
                rows[name].append(timed_cold(path, fn))
        # the same, block by block: each engine read paired with a plain read of the
        # same byte range right next to it in time, so both see the same disk load
        per_block = {name: [] for name in files}
        for r in range(args.rounds):
            for i, (g, layout) in enumerate(layouts):
                lo = min(f for f, _, _ in layout.runs)
                hi = max(f + n for f, _, n in layout.runs)
                trio = [("plain", lambda: plain_span(path, lo, hi - lo, buf))]
                trio += [(name, lambda f=f, layout=layout:
                          f.read_runs(layout.runs, buf) or g.nbytes)
                         for name, f in files.items()]
                k = (r + i) % len(trio)
                rates = {name: timed_cold(path, fn) for name, fn in trio[k:] + trio[:k]}
                for name in files:
                    per_block[name].append(rates[name] / rates["plain"])
        for f in files.values():
            f.close()

        inv = inventory()
        disk_plan = plan("disk", stream=(0, 2))
        forward = []
        for _ in range(args.rounds):
            drop_cache(path)
            with place(model, disk_plan, "diffusion", inv, weights_file=path,
                       link=Link(bandwidth=None), device_check=False) as placed:
                t0 = time.perf_counter()
                with torch.no_grad():
                    model(**inp)
                dt = time.perf_counter() - t0
                placed.streamer.drain()
            forward.append(block_bytes / dt)
    finally:
        os.remove(path)

    def gbs(x):
        return f"{x / 1e9:6.2f} GB/s"

    print(f"file: {size / 2**20:.0f} MiB bf16 safetensors (Flux architecture, hidden "
          f"{args.hidden}, 4 double + 4 single blocks, {block_bytes / 2**20:.0f} MiB in "
          f"blocks, largest block {buf.numel() / 2**20:.0f} MiB = the buffer) in {args.dir}")
    print(f"best of {args.rounds} cold reads each; the page cache dropped for the file "
          f"before every timed read")
    shown = ", ".join("n/a" if x is None else f"{100 * x:.1f}%" for x in left)
    print(f"page cache check: warm re-read {gbs(max(warm))}, cold read {gbs(max(cold))}; "
          f"file pages still cached right after a drop: {shown}")
    dropped = all(x is not None and x < 0.05 for x in left)
    if not dropped or max(cold) > 0.8 * max(warm):
        print("WARNING: dropping the page cache has little or no effect here; the figures "
              "below are NOT cold-cache figures")
    plain = rows["plain sequential read"]
    base = max(plain)
    print("ratio to plain: best of N over best of N; and the median over rounds of the "
          "ratio to that round's plain read (same few seconds, less drift)")
    for name, vals in rows.items():
        paired = statistics.median(v / p for v, p in zip(vals, plain))
        print(f"{name:>24}: {gbs(max(vals))}   ratio to plain {max(vals) / base:.3f}   "
              f"paired median {paired:.3f}   (all GB/s: "
              f"{' '.join(f'{v / 1e9:.2f}' for v in vals)})")
    print(f"per block ({len(layouts)} blocks x {args.rounds} rounds, each read paired with a "
          f"plain read of the same byte range, order rotating): median ratio to plain")
    for name, vals in per_block.items():
        print(f"{name:>24}: {statistics.median(vals):.3f}   (quartiles "
              f"{' '.join(f'{q:.2f}' for q in statistics.quantiles(vals, n=4))})")
    print(f"{'streamed forward (disk)':>24}: {gbs(max(forward))}   whole step incl. compute "
          f"and the simulated copy, for scale")


if __name__ == "__main__":
    main()
