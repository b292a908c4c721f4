"""What does placement cost when nothing streams? Everything resident on a simulated
device (its memory is host memory, so compute is the same CPU work) vs the plain
module, Flux architecture, hidden 1024, 8 blocks, 1024 tokens, on the CPU.
    overhead = placed / plain - 1        (target <= 3%)
Runs alternate (placed, plain, placed, ...) so a shared machine's noise hits both.

    python benchmarks/hook_overhead.py [--rounds 5]
"""
import argparse
import copy
import time

import torch

from _common import flux, inventory, med, plan
from comfyui_placement.runtime import place


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=1024)
    args = ap.parse_args()
    model, inp = flux(hidden=1024, heads=8, double=4, single=4, img_tokens=args.tokens,
                      txt_tokens=0 or 64)
    placed_model = copy.deepcopy(model)

    def run(m):
        with torch.no_grad():
            t0 = time.perf_counter()
            m(**inp)
            return time.perf_counter() - t0

    plain, placed_t, ratios = [], [], []
    with place(placed_model, plan("cuda0"), "diffusion", inventory()) as placed:
        run(model), run(placed_model)                        # warm up
        for _ in range(args.rounds):
            a = run(placed_model)
            b = run(model)
            c = run(placed_model)
            placed_t += [a, c]
            plain.append(b)
            ratios.append((a + c) / 2 / b)
    n_hooks = 2 + len(placed.block_modules)
    print(f"model: Flux architecture, hidden 1024, 8 blocks, {args.tokens} image + 64 text "
          f"tokens, fp32, torch threads {torch.get_num_threads()}; {n_hooks} hooks")
    print(f"plain  {med(plain) * 1e3:9.1f} ms/forward (median of {len(plain)})")
    print(f"placed {med(placed_t) * 1e3:9.1f} ms/forward (median of {len(placed_t)}), "
          f"everything resident on simulated cuda0")
    print(f"overhead: median of per-round ratios {100 * (med(ratios) - 1):+.2f}% "
          f"(ratio of medians {100 * (med(placed_t) / med(plain) - 1):+.2f}%)")


if __name__ == "__main__":
    main()
