"""What does a prompt cost when a worker's range stays loaded, against reloading it?

One Flux-architecture model (random weights, --range-gib of it in the worker's range),
a worker process on loopback, and "prompts": enter the placement, one forward, leave it.
  hashed   keep_for=None, the file's timestamp moved just before (os.utime to another
           old time): both sides read, prove and hash the range again, the worker places
           it, the exit unloads it: what every prompt paid before ranges were kept
  reload   keep_for=None, the file untouched: the same, less the hashing (both
           processes remember a file's tensor digests while it is unchanged,
           runtime/distributed/digests.py)
  first    keep_for=owner, the first prompt: the same work, and the range stays loaded
  second   keep_for=owner again: the worker is asked whether it still holds the range;
           nothing read, hashed or moved on either side
Each variant's prompt is timed whole (enter + forward + exit), placed as ComfyUI's
sampling session places it (a structural copy of the module); rounds alternate the
variants; the fastest round of each is reported, medians beside it, and the forward of
the whole model on this process alone ("forward") as the floor of a prompt.

Assumes: the worker on this machine, reading the same file (its page cache warm after
the first read, as on a worker whose disk cache holds the file: a cold disk makes
reloading slower still, never faster); the same torch thread count in both processes
(--threads); the forward is a small part of a prompt here on purpose (few tokens): the
ratio is about loading. second/reload can only be below 1.0: it does the same forward
and strictly less loading work.

    python benchmarks/worker_range_reload.py [--range-gib 1.2] [--rounds 3]
"""
import argparse
import os
import statistics
import sys
import tempfile
import time

import torch

from _common import flux
from comfyui_placement.runtime.blocks.find import find_blocks
from comfyui_placement.runtime.distributed import Cluster, remote_range
from comfyui_placement.runtime.engine.shadow import Shadow
from distributed_split import SECRET_ENV, start_worker


def block_bytes(block) -> int:
    return sum(t.numel() * t.element_size() for t in block.parameters())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--range-gib", type=float, default=1.2)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=4)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from safetensors.torch import save_file
    probe, _ = flux(args.hidden, args.hidden // 64, 1, 1, 16, 8)
    per_block = block_bytes(find_blocks(probe)[-1][1])
    single = max(2, int(args.range_gib * (1 << 30) // per_block) + 1)
    model, inp = flux(args.hidden, args.hidden // 64, 1, single, 16, 8)
    blocks = find_blocks(model)
    last = len(blocks) - 1
    span = (1, last)
    nbytes = sum(block_bytes(b) for _, b in blocks[1:])
    tmp = tempfile.mkdtemp(prefix="range-reload-bench-")
    path = os.path.join(tmp, "flux.safetensors")
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, path)
    old = time.time() - 60                      # a settled file, as a real model's
    os.utime(path, (old, old))
    proc, address = start_worker(tmp, args.threads)
    os.environ[SECRET_ENV] = "bench"
    print(f"range: blocks 1..{last}, {nbytes / 2**30:.2f} GiB; torch threads "
          f"{args.threads} in both processes")

    def prompt(cluster, keep_for):
        """As ComfyUI's sampling session runs a prompt: a structural copy of the module
        placed (runtime/engine/shadow.py), its released block tensors not read back."""
        t0 = time.perf_counter()
        shadow = Shadow(model)
        with remote_range(shadow.module, span, cluster["w1.cpu"], path, keep_for=keep_for,
                          restore_released=False) as rr:
            with torch.no_grad():
                shadow.module(**inp)
        return time.perf_counter() - t0, rr.stats()["loading"]

    class Owner:
        pass

    times = {"forward": [], "hashed": [], "reload": [], "first": [], "second": []}
    try:
        with Cluster(f"w1={address}", secret=b"bench", timeout_s=600) as cluster:
            prompt(cluster, None)                       # warm: page cache, imports
            for _ in range(args.rounds):
                t0 = time.perf_counter()
                with torch.no_grad():
                    model(**inp)
                times["forward"].append(time.perf_counter() - t0)
                old -= 60                               # another signature, same bytes
                os.utime(path, (old, old))
                s, hashed = prompt(cluster, None)
                times["hashed"].append(s)
                s, _ = prompt(cluster, None)
                times["reload"].append(s)
                owner = Owner()
                s, first = prompt(cluster, owner)
                times["first"].append(s)
                s, second = prompt(cluster, owner)
                times["second"].append(s)
                assert second["kept"] and second["moved_bytes"] == 0 and \
                    second["read_bytes"] == 0 and second["hashed_bytes"] == 0, second
                from comfyui_placement.runtime.distributed import kept
                kept.free(owner)
    finally:
        proc.kill()
        proc.wait()
        os.remove(path)
        os.rmdir(tmp)
    best = {k: min(v) for k, v in times.items()}
    for k, v in times.items():
        print(f"{k:7s} {best[k]:8.3f} s per prompt (median {statistics.median(v):.3f} s)")
    print(f"first prompt loaded: {first['read_bytes'] / 2**30:.2f} GiB read, "
          f"{first['hashed_bytes'] / 2**30:.2f} GiB hashed, "
          f"{first['moved_bytes'] / 2**30:.2f} GiB moved on the worker; "
          f"{first['compared_bytes'] / 2**30:.2f} GiB compared on the main")
    print(f"second prompt: kept={second['kept']}, nothing read, hashed or moved")
    print(f"after the file moved: {hashed['hashed_bytes'] / 2**30:.2f} GiB hashed on the "
          f"worker, {hashed['main_hashed_bytes'] / 2**30:.2f} GiB on the main")
    print(f"ratio second/hashed {best['second'] / best['hashed']:.4f}, second/reload "
          f"{best['second'] / best['reload']:.4f} (first/reload "
          f"{best['first'] / best['reload']:.3f})")


if __name__ == "__main__":
    sys.exit(main())
