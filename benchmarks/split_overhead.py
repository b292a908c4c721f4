"""What does splitting one model over several devices cost, on the simulated devices?

1. Layer split overhead: per-step time against one device plus the modelled hops,
       ratio = split step time / (one-device compute + hop time)      (target <= 1.05)
   where hop time is the modelled link time of every hop copy of the step
   (latency + bytes / bandwidth each). Run with a fast link (PCIe 4 peer copies, where
   hops are a negligible share of the step: that row checks the split's own overhead),
   a fixed slow one, and a "staged" link set from a measurement so that the hops take
   --hop-share (30%) of one device's step, like a consumer machine without peer access
   hopping through host memory: that row checks that hops cost what they should.
2. Bytes moved per step for the same share of the model off the main device:
   layer split (activations at range boundaries), row split (each sharded Linear's input
   out and partial output back), and streaming that share's blocks onto one device.

Every variant runs on its own copy of one model, placed on its own simulated devices,
timed in alternating rounds, each round starting with the next variant (this machine
is shared; interleaving keeps noise out of the ratios). Ratios use the fastest round of each variant (the least disturbed by
other processes); the median-based ratio is printed beside it, and the CPU time the
main thread spent per step against one device's (hooks, hop copies and spin-waits of
short modelled hops; robust to a busy machine). Torch runs on one thread by default
so that other processes disturb the timing less.

    python benchmarks/split_overhead.py [--rounds 5] [--hidden 384] [--tokens 256]
"""
import argparse
import copy
import time

import torch

from _common import flux, inventory, med, plan
from comfyui_placement.placement.plan import ComponentPlan, DevicePlan, Plan
from comfyui_placement.runtime import find_blocks, place
from comfyui_placement.runtime.device.simdevice import Link
from comfyui_placement.runtime.split import place_split

PCIE4 = Link(bandwidth=25e9, latency=10e-6)


def split_plan(devices, mode, total=16 << 30, budgets=None):
    budgets = budgets or [total] * len(devices)
    return Plan([DevicePlan(d, "gpu", total, total, b) for d, b in zip(devices, budgets)],
                {"diffusion": ComponentPlan("diffusion", list(devices), devices[0],
                                            split_mode=mode)})


def staged_link(model, run, inv, share):
    """A hop link on which a layer split over two devices spends `share` of one device's
    compute on its hops: measured on a throwaway copy (hop bytes per step, one-device
    step time), so that the hops are a visible part of the step."""
    m = copy.deepcopy(model)
    with place(m, plan("cuda15", device="cuda15"), "diffusion", inv, device_check=False):
        run(m)
        t0 = time.perf_counter()
        for _ in range(3):
            run(m)
        compute = (time.perf_counter() - t0) / 3
    with place_split(m, split_plan(["cuda15", "cuda16"], "layer"), "diffusion", inv,
                     hop_link=PCIE4, device_check=False) as placed:
        run(m)
        st = placed.stats()
    latency = 10e-6
    budget = max(share * compute - st["hops"] * latency, 1e-6)
    return Link(bandwidth=st["hop_bytes"] / budget, latency=latency)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--double", type=int, default=4)
    ap.add_argument("--single", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--slow-link-gbps", type=float, default=0.5,
                    help="bandwidth of the slow modelled peer link, GB/s")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    ap.add_argument("--hop-share", type=float, default=0.3,
                    help="'layer x2 staged': its hop link is set so that the hops take this "
                         "share of one device's step (a consumer machine without peer "
                         "access, hopping through host memory)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model, inp = flux(args.hidden, args.hidden // 64, args.double, args.single, args.tokens)
    slow = Link(bandwidth=args.slow_link_gbps * 1e9, latency=10e-6)
    inv = inventory(",".join(f"cuda{i}=64GiB" for i in range(17)))

    def run(m):
        with torch.no_grad():
            m(**inp)

    blocks = [b for _, b in find_blocks(model)]
    sizes = [sum(p.numel() * p.element_size() for p in b.parameters()) for b in blocks]

    variants = []

    def add(name, placer, *a, **k):
        m = copy.deepcopy(model)
        variants.append((name, m, placer(m, *a, **k)))

    add("one device", place, plan("cuda0", device="cuda0"), "diffusion", inv)
    add("hooks only", place_split, split_plan(["cuda11", "cuda12"], "layer",
                                              budgets=[16 << 30, 0]), "diffusion", inv)
    add("layer x2", place_split, split_plan(["cuda1", "cuda2"], "layer"), "diffusion", inv,
        hop_link=PCIE4)
    add("layer x3", place_split, split_plan(["cuda3", "cuda4", "cuda5"], "layer"),
        "diffusion", inv, hop_link=PCIE4)
    add("layer x2 slow", place_split, split_plan(["cuda6", "cuda7"], "layer"), "diffusion",
        inv, hop_link=slow)
    add("row x2", place_split, split_plan(["cuda8", "cuda9"], "row"), "diffusion", inv,
        hop_link=PCIE4)
    staged = staged_link(model, run, inv, args.hop_share)
    add("layer x2 staged", place_split, split_plan(["cuda13", "cuda14"], "layer"),
        "diffusion", inv, hop_link=staged)
    times = {name: [] for name, _, _ in variants}
    cpu = {name: [] for name, _, _ in variants}
    moved = {}
    for _, _, placed in variants:
        placed.__enter__()
    # the share layer x2 puts on its second device, streamed onto one device instead
    ranges = variants[2][2].stats()["ranges"]
    k = ranges["cuda1"][1] + 1
    add("stream share", place, plan("cpu", stream=(k, 1), device="cuda10"), "diffusion", inv,
        link=PCIE4)
    times["stream share"], cpu["stream share"] = [], []
    variants[-1][2].__enter__()
    try:
        for _, m, _ in variants:
            run(m)                                  # warm up, learn the block order
        for r in range(args.rounds):
            for name, m, placed in variants[r % len(variants):] + variants[:r % len(variants)]:
                before = placed.stats()
                t0, c0 = time.perf_counter(), time.thread_time()
                for _ in range(args.steps):
                    run(m)
                streamer = getattr(placed, "streamer", None)
                if streamer is not None:
                    streamer.drain()
                times[name].append((time.perf_counter() - t0) / args.steps)
                cpu[name].append((time.thread_time() - c0) / args.steps)
                after = placed.stats()
                h2d = sum(d["h2d_bytes"] for d in after["devices"].values()) - \
                    sum(d["h2d_bytes"] for d in before["devices"].values())
                moved[name] = dict(
                    hop_bytes=(after["hop_bytes"] - before["hop_bytes"]) / args.steps,
                    h2d_bytes=h2d / args.steps,
                    hops=(after["hops"] - before["hops"]) / args.steps,
                    hop_s=(after.get("hop_seconds_modelled", 0.0)
                           - before.get("hop_seconds_modelled", 0.0)) / args.steps)
    finally:
        for _, _, placed in variants:
            placed.__exit__(None, None, None)

    compute = min(times["one device"])
    compute_med = med(times["one device"])
    print(f"model: Flux architecture, hidden {args.hidden}, {len(blocks)} blocks "
          f"({sum(sizes) / 2**20:.1f} MiB), {args.tokens} image tokens; torch threads "
          f"{torch.get_num_threads()}; {args.rounds} rounds x {args.steps} steps")
    print(f"one device: {compute * 1e3:.1f} ms/step; layer x2 ranges {ranges}; peer link "
          f"PCIe4 {PCIE4.bandwidth / 1e9:.0f} GB/s, slow {slow.bandwidth / 1e9:.2f} GB/s, "
          f"staged {staged.bandwidth / 1e9:.4f} GB/s (hops {args.hop_share:.0%} of a step), "
          f"10 us latency")
    print(f"{'variant':>14} {'ms/step':>9} {'hops':>6} {'hop ms':>8} "
          f"{'step/(c+hops)':>14} {'(median)':>9} {'cpu/cpu1':>9} {'hop MiB':>9} "
          f"{'h2d MiB':>9} {'moved MiB':>10}")
    for name, _, _ in variants:
        t = min(times[name])
        mv = moved[name]
        ratio = t / (compute + mv["hop_s"])
        ratio_med = med(times[name]) / (compute_med + mv["hop_s"])
        print(f"{name:>14} {t * 1e3:>9.1f} {mv['hops']:>6.0f} {mv['hop_s'] * 1e3:>8.2f} "
              f"{ratio:>14.3f} {ratio_med:>9.3f} {min(cpu[name]) / min(cpu['one device']):>9.3f}"
              f" {mv['hop_bytes'] / 2**20:>9.2f} "
              f"{mv['h2d_bytes'] / 2**20:>9.2f} "
              f"{(mv['hop_bytes'] + mv['h2d_bytes']) / 2**20:>10.2f}")
    print("step/(c+hops): layer split target <= 1.05. 'hooks only': a layer split whose "
          "second device has no budget (every block on the main device, hooks but no hop). "
          "'moved' = bytes over links per step (hops between devices + host-to-device "
          "copies); 'stream share' streams onto one device the blocks layer x2 keeps "
          "resident on its second device.")


if __name__ == "__main__":
    main()
