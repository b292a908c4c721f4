"""What does placement cost when nothing streams? Everything resident on a simulated
device (its memory is host memory, so compute is the same CPU work) vs the plain
module, Flux architecture, hidden 1024, 8 blocks, 1024 tokens, on the CPU.
    overhead = placed / plain - 1        (target <= 3%)
Runs alternate (placed first, then plain first, ...) so a shared machine's noise
hits both; the minimum of each is the least disturbed run.

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
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--tokens", type=int, default=1024)
    args = ap.parse_args()
    model, inp = flux(hidden=1024, heads=8, double=4, single=4, img_tokens=args.tokens,
                      txt_tokens=64)
    placed_model = copy.deepcopy(model)

    def run(m):
        with torch.no_grad():
            t0 = time.perf_counter()
            m(**inp)
            return time.perf_counter() - t0

    plain, placed_t, ratios = [], [], []
    with place(placed_model, plan("cuda0"), "diffusion", inventory()) as placed:
        run(model), run(placed_model)                        # warm up
        for r in range(args.rounds):
            first, second = (placed_model, model) if r % 2 == 0 else (model, placed_model)
            a, b = run(first), run(second)
            p_t, m_t = (a, b) if first is placed_model else (b, a)
            placed_t.append(p_t)
            plain.append(m_t)
            ratios.append(p_t / m_t)
    n_hooks = 2 + len(placed.block_modules)
    print(f"model: Flux architecture, hidden 1024, 8 blocks, {args.tokens} image + 64 text "
          f"tokens, fp32, torch threads {torch.get_num_threads()}; {n_hooks} hooks "
          f"(root pre/post, one pre-hook per block)")
    print(f"plain  min {min(plain) * 1e3:9.1f}  median {med(plain) * 1e3:9.1f} ms/forward")
    print(f"placed min {min(placed_t) * 1e3:9.1f}  median {med(placed_t) * 1e3:9.1f} ms/forward"
          f" (everything resident on simulated cuda0)")
    print(f"overhead: ratio of minima {100 * (min(placed_t) / min(plain) - 1):+.2f}%, "
          f"median of per-round ratios {100 * (med(ratios) - 1):+.2f}% "
          f"({args.rounds} alternating rounds; this machine is shared, the minima are the "
          f"least disturbed runs)")


if __name__ == "__main__":
    main()
