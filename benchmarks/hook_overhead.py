"""What does placement cost per block, apart from the copies? Measured per block, on a
model so small that its forward takes about a millisecond (hidden 64, 8 blocks, 16
tokens), so the cost of hooks and scheduling is not hidden under seconds of compute:
    overhead per block = (placed forward - plain forward) / blocks     (target <= 30 us)
Two placed variants, each a copy of the same model:
- resident: everything on a simulated device (its memory is host memory, so compute is
  the same CPU work): the hooks alone.
- streamed: every block streamed (K=0, depth 1) over an unthrottled simulated link:
  hooks + ring scheduling + handing each copy to the simulated copy engine + the
  block's memcpy (about 0.1 MiB, a few microseconds here; on a GPU the DMA engine's).
Plain and placed forwards alternate in batches, so load on this shared machine hits
both alike; the median of per-batch differences is reported, and the spread (min-max).

    python benchmarks/hook_overhead.py [--rounds 30] [--batch 20]
"""
import argparse
import copy
import time

import torch

from _common import flux, inventory, med, plan
from comfyui_placement.runtime import place
from comfyui_placement.runtime.simdevice import Link


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--batch", type=int, default=20, help="forwards per timed batch")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model, inp = flux(hidden=64, heads=2, double=4, single=4, img_tokens=16, txt_tokens=8)
    resident_model, streamed_model = copy.deepcopy(model), copy.deepcopy(model)
    inv = inventory("cuda0=1GiB,cuda1=1GiB")

    def batch(m):
        with torch.no_grad():
            t0 = time.perf_counter()
            for _ in range(args.batch):
                m(**inp)
            return (time.perf_counter() - t0) / args.batch

    diffs = {"resident": [], "streamed": []}
    plain_times = []
    with place(resident_model, plan("cuda0", device="cuda0"), "diffusion", inv) as res, \
            place(streamed_model, plan("cpu", stream=(0, 1), device="cuda1"), "diffusion",
                  inv, link=Link(bandwidth=None, latency=0.0)) as st:
        n_blocks = len(res.block_modules)
        for m in (model, resident_model, streamed_model):
            batch(m)                                        # warm up
        for r in range(args.rounds):
            order = [model, resident_model, streamed_model]
            if r % 2:
                order.reverse()
            t = {id(m): batch(m) for m in order}
            plain = t[id(model)]
            plain_times.append(plain)
            diffs["resident"].append((t[id(resident_model)] - plain) / n_blocks)
            diffs["streamed"].append((t[id(streamed_model)] - plain) / n_blocks)
        streamed_blocks = st.stats().get("streamed_blocks", n_blocks)
    print(f"model: Flux architecture, hidden 64, {n_blocks} blocks, 16 + 8 tokens, fp32, "
          f"torch threads {torch.get_num_threads()}; plain forward {med(plain_times) * 1e3:.2f}"
          f" ms (median of {args.rounds} batches of {args.batch})")
    for name, vals in diffs.items():
        extra = f" ({streamed_blocks} blocks streamed)" if name == "streamed" else ""
        print(f"{name:>9}: {med(vals) * 1e6:7.1f} us per block (median), spread "
              f"{min(vals) * 1e6:.1f} to {max(vals) * 1e6:.1f}{extra}")


if __name__ == "__main__":
    main()
