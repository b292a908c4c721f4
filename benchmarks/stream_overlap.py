"""Does streaming hide the transfers? On the simulated device, with a link modelled so
that one step's transfers take about as long as one step's compute:
    ratio = streamed step time / max(compute, transfer)     (target <= 1.10, depth >= 1)
depth 0 (synchronous) is printed beside it; it should be near compute + transfer.

Two models: uniform blocks (every block the same compute per byte) and Flux's mix of
double blocks (fewer FLOP per byte: transfer-heavy) and single blocks (compute-heavy),
where a deeper ring absorbs the imbalance. The ring is a byte budget
(placement/layout.ring_bytes: the most bytes depth + 1 consecutive streamed blocks
take, what the planner predicts); the table prints its size and how many blocks run
ahead of the one computing (fewest-most over the positions). The planner's default
depth is 1.
The variants run on copies of one model, each placed on its own simulated device, and
are timed in alternating rounds (this machine is shared, so interleaving keeps noise
out of the ratios). A round runs a few consecutive steps and includes waiting for the
copies the last step started ahead (conservative).

    python benchmarks/stream_overlap.py [--rounds 5] [--hidden 384]
"""
import argparse
import copy
import time

import torch

from _common import flux, inventory, med, plan
from comfyui_placement.runtime import find_blocks, place
from comfyui_placement.runtime.simdevice import Link

DEPTHS = (0, 1, 2, 4)


def main():
    args = parse()
    if args.threads:
        torch.set_num_threads(args.threads)
    configs = [(f"uniform blocks: {args.single + args.double} single blocks", 0,
                args.single + args.double),
               (f"mixed blocks: {args.double} double + {args.single} single", args.double,
                args.single)]
    for title, double, single in configs:
        print(f"== {title}")
        measure(args, double, single)


def parse():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--steps", type=int, default=2, help="consecutive steps per round")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--double", type=int, default=4)
    ap.add_argument("--single", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=256)
    # On a GPU the copy engine uses no compute; the simulated one does its memcpy on a
    # CPU core, so by default compute gets one core and the copy worker the other.
    ap.add_argument("--threads", type=int, default=1,
                    help="torch compute threads (0: torch's default); the simulated copy "
                         "engine's memcpy needs a core of its own to look like a DMA engine")
    ap.add_argument("--transfer-share", type=float, default=1.0,
                    help="modelled transfer time as a share of compute time")
    return ap.parse_args()


def measure(args, double, single):
    model, inp = flux(args.hidden, args.hidden // 64, double, single, args.tokens)
    inv = inventory(",".join(f"cuda{i}=16GiB" for i in range(len(DEPTHS) + 1)))

    def run(m):
        with torch.no_grad():
            m(**inp)

    blocks = [b for _, b in find_blocks(model)]
    sizes = [sum(p.numel() * p.element_size() for p in b.parameters()) for b in blocks]
    streamed = sum(sizes)

    resident = place(model, plan("cuda0", device="cuda0"), "diffusion", inv)
    with resident:                                  # calibrate the link on compute
        run(model)
        t0 = time.perf_counter()
        for _ in range(args.steps):
            run(model)
        compute0 = (time.perf_counter() - t0) / args.steps
    link = Link(bandwidth=streamed / (compute0 * args.transfer_share), latency=20e-6)

    def modelled(lk):
        return sum(lk.seconds(n) for n in sizes)

    variants = [("resident", model, place(model, plan("cuda0", device="cuda0"), "diffusion",
                                          inv))]
    for i, depth in enumerate(DEPTHS, start=1):
        m = copy.deepcopy(model)
        variants.append((f"depth {depth}", m, place(m, plan("cpu", stream=(0, depth),
                                                            device=f"cuda{i}"),
                                                     "diffusion", inv, link=link)))
    times = {name: [] for name, _, _ in variants}
    ratios = {name: [] for name, _, _ in variants}
    same_run = {name: [] for name, _, _ in variants}
    serial = {name: [] for name, _, _ in variants}
    h2d = {}
    for _, m, placed in variants:
        placed.__enter__()
    try:
        for _, m, _ in variants:
            run(m)                                  # warm up, learn the block order
        for _ in range(args.rounds):
            round_times = {}
            for name, m, placed in variants:
                before = placed.stats()["devices"]
                waited = placed.streamer.wait_seconds if placed.streamer else 0.0
                t0 = time.perf_counter()
                for _ in range(args.steps):
                    run(m)
                if placed.streamer is not None:
                    placed.streamer.drain()
                round_times[name] = (time.perf_counter() - t0) / args.steps
                if placed.streamer is not None:   # compute of this very run: not waiting
                    waited = (placed.streamer.wait_seconds - waited) / args.steps
                    same_run[name].append((round_times[name], round_times[name] - waited))
                times[name].append(round_times[name])
                after = placed.stats()["devices"]
                dev = next(iter(after))
                h2d[name] = (after[dev]["h2d_bytes"] - before[dev]["h2d_bytes"]) / args.steps
                if name == "resident":            # the machine is shared: follow its speed
                    link = Link(streamed / (round_times[name] * args.transfer_share), 20e-6)
                    for _, _, p in variants[1:]:
                        p.target.transfer.link = link
                    transfer = modelled(link)
            for name in round_times:
                c = round_times["resident"]
                ratios[name].append(round_times[name] / max(c, transfer))
                serial[name].append(round_times[name] / (c + transfer))
                if same_run[name]:
                    step, busy = same_run[name][-1]
                    same_run[name][-1] = step / max(busy, transfer)
    finally:
        for _, _, placed in variants:
            placed.__exit__(None, None, None)

    compute = med(times["resident"])
    print(f"model: Flux architecture, hidden {args.hidden}, {len(blocks)} blocks streamed "
          f"(K=0), {args.tokens} image tokens, {streamed / 2**20:.1f} MiB per step; "
          f"torch threads {torch.get_num_threads()}; {args.rounds} rounds x {args.steps} steps")
    print(f"compute (all resident) {compute * 1e3:.1f} ms/step (median); the link is re-set "
          f"each round so that transfer alone = compute of that round; a simulated copy "
          f"lands exactly at its modelled time (its memcpy inside it, never earlier), so "
          f"transfer = the modelled time; ratios are per round, median shown; the resident "
          f"row is compute / max(compute, transfer), just under 1 because the link's "
          f"per-copy latency makes transfer a little longer than compute")
    print("step/max(c,t): c = the resident run of the same round; same-run: c = this run's "
          "step minus the time it waited for copies")
    print(f"{'variant':>9} {'ms/step':>9} {'step/max(c,t)':>14} {'step/(c+t)':>11} "
          f"{'same-run':>9} {'h2d MiB/step':>13} {'ring MiB':>9} {'ahead':>6}")
    for name, _, placed in variants:
        t = med(times[name])
        st = placed.streamer
        ring = f"{st.ring_bytes / 2**20:9.1f} {min(st.ahead)}-{max(st.ahead):<4}" if st else ""
        print(f"{name:>9} {t * 1e3:>9.1f} {med(ratios[name]):>14.3f} "
              f"{med(serial[name]):>11.3f} "
              f"{med(same_run[name]) if same_run[name] else 0:>9.3f} {h2d[name] / 2**20:>13.1f}"
              f" {ring}")


if __name__ == "__main__":
    main()
