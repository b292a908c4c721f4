"""What does placement cost per block, apart from the copies themselves? Hooks +
scheduling, measured per block on a model whose blocks are nearly free (64 blocks, each
one Linear(8, 8) on one token: a few microseconds of compute), so the per-block cost is
not hidden under compute and the noise of this shared machine averages out over many
blocks and forwards:
    overhead per block = (placed forward - plain forward) / blocks     (target <= 30 us)
Variants, each on its own copy of the same model:
- no-op hook: a forward pre-hook that does nothing on every block: the floor that
  torch's hook dispatch costs whatever the hook does (for comparison).
- resident: everything on a simulated device (its memory is host memory, so compute is
  the same CPU work): the placement's hooks (activation accounting).
- streamed: every block streamed (K=0, depth 1) over an unthrottled simulated link,
  whose copy is carried out by the calling thread when submitted (no thread handoff,
  as CUDA issues copies from the compute thread): hooks + ring scheduling + issuing
  the copy + the copy's memcpy, which is 80 + 32 bytes here (on a GPU the DMA
  engine's work, not the compute thread's).
All four run in alternating order within each round (load on this shared machine hits
them alike); per round the difference to the plain forward of the same round is taken;
the median over rounds is reported with the spread (min-max).

    python benchmarks/hook_overhead.py [--rounds 30] [--forwards 200] [--blocks 64]
"""
import argparse
import copy
import time

import torch
from torch import nn

from _common import inventory, med, plan
from comfyui_placement.runtime import place
from comfyui_placement.runtime.device.simdevice import Link


class Stack(nn.Module):
    def __init__(self, blocks: int, width: int):
        super().__init__()
        self.inp = nn.Linear(width, width)
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(blocks))

    def forward(self, x):
        x = self.inp(x)
        for layer in self.layers:
            x = layer(x)
        return x


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--forwards", type=int, default=200, help="forwards per timed batch")
    ap.add_argument("--blocks", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    plain = Stack(args.blocks, 8).eval()
    x = torch.randn(1, 8)
    noop, resident, streamed = (copy.deepcopy(plain) for _ in range(3))
    for layer in noop.layers:
        layer.register_forward_pre_hook(lambda module, inputs: None)
    inv = inventory("cuda0=1GiB,cuda1=1GiB")

    def batch(m):
        t0 = time.perf_counter_ns()
        for _ in range(args.forwards):
            m(x)
        return (time.perf_counter_ns() - t0) / args.forwards

    models = {"plain": plain, "no-op hook": noop, "resident": resident, "streamed": streamed}
    diffs = {name: [] for name in models if name != "plain"}
    plain_times = []
    with place(resident, plan("cuda0", device="cuda0"), "diffusion", inv, device_check=False), \
            place(streamed, plan("cpu", stream=(0, 1), device="cuda1"), "diffusion", inv,
                  link=Link(bandwidth=None, latency=0.0), device_check=False) as st, torch.no_grad():
        assert st.stats()["streamed_blocks"] == args.blocks
        for m in models.values():
            batch(m)                                        # warm up, learn the order
        for r in range(args.rounds):
            order = list(models.items())
            if r % 2:
                order.reverse()
            t = {name: batch(m) for name, m in order}
            plain_times.append(t["plain"])
            for name in diffs:
                diffs[name].append((t[name] - t["plain"]) / args.blocks / 1e3)
        copies = st.stats()["devices"]["cuda1"]["h2d_copies"]
    print(f"model: {args.blocks} blocks of Linear(8, 8) on 1 token, fp32, torch threads "
          f"{torch.get_num_threads()}; plain forward {med(plain_times) / 1e3:.1f} us "
          f"(median of {args.rounds} rounds of {args.forwards} forwards); streamed: "
          f"{copies} copies, one per block per forward")
    for name, vals in diffs.items():
        print(f"{name:>10}: {med(vals):6.1f} us per block (median), spread "
              f"{min(vals):.1f} to {max(vals):.1f}")


if __name__ == "__main__":
    main()
