"""Does streaming hide the transfers? On the simulated device, with a link modelled so
that one step's transfers take `--transfer-share` x one step's compute:
    ratio = streamed step / max(compute, transfer)     (target <= 1.10 at the planner's depth)
depth 0 (synchronous) is printed beside it; it should be near compute + transfer.

The denominator is the model all resident (nothing streamed), timed in the same
alternating rounds, same threads, same warm buffers: the physical floor of a streamed
step. A ratio a little under 1.0 is this machine's noise (the resident row's own ratio
shows its size), not streaming beating the floor.

One more row, "res+copies", is information, not a denominator: the model all resident
while the simulated copy engine carries out the same copies at the same pace (a
pre-hook on each block issues the next block's copy into a scratch buffer, never waited
for). The simulated engine does its memcpy on a CPU core of this machine, which may slow
compute (memory bandwidth, the shared core); a GPU's DMA engine does not. Its ratio
says how much of a streamed step's excess that load alone explains here. (It was the
denominator for a while; streamed runs measured below it, 0.95-0.98, because its copies
land in the very weights the blocks read, which the ring's slots do not: not the same
conditions, so it is no floor.)

Two models: uniform blocks, and Flux's mix (4 double + 8 single blocks, double blocks
2.4x the bytes of single ones as in Flux, equal FLOP per token). The planner's depth is
`placement.layout.choose_depth` on what the planner assumes (each block's compute
from layout's rule -- equal per block for both mixes --, transfer per block = bytes /
link); it is printed with the stall it predicts, and the table marks its row. The ring
is a byte budget (placement/layout.ring_bytes); the table prints its size and how many
blocks run ahead of the one computing (fewest-most over the positions).
The variants run on copies of one model, each placed on its own simulated device, and
are timed in alternating rounds (this machine is shared, so interleaving keeps noise
out of the ratios). A round runs one untimed step from a drained ring, then times a
few consecutive steps: the steady state of sampling, where each step starts with the
copies the step before issued ahead and ends with its own issued for the next (timing
the drain of those would charge up to `ahead` blocks' transfer to a round: +4% per
block ahead with 12 blocks over 2 steps). The first step of a sampling run pays the
ring's fill once (the depth 0 row's cost for its first `ahead` blocks).

    python benchmarks/stream_overlap.py [--rounds 5] [--hidden 256] [--transfer-share 0.8]
"""
import argparse
import copy
import time

import torch

from _common import flux, inventory, med, plan
from comfyui_placement.placement.layout import choose_depth, ring_schedule
from comfyui_placement.runtime import find_blocks, place
from comfyui_placement.runtime.device.simdevice import Link, SimTransfer

DEPTHS = (0, 1, 2, 4)
LATENCY = 20e-6


def main():
    args = parse()
    if args.threads:
        torch.set_num_threads(args.threads)
    configs = [(f"uniform blocks: {args.single + args.double} single blocks", 0,
                args.single + args.double),
               (f"mixed blocks: {args.double} double + {args.single} single", args.double,
                args.single)]
    print(f"assumes: steady-state steps (ring filled before timing); the simulated link is re-set each round so that one step's transfers "
          f"= {args.transfer_share:g} x that round's resident compute (+{LATENCY * 1e6:.0f}"
          f" us per copy); a copy lands exactly at its modelled time, never earlier; the "
          f"planner's compute per block is equal (layout.compute_fractions) and its transfer "
          f"per block is bytes / link; torch compute threads {args.threads or 'default'}, "
          f"the copy engine's memcpy on another thread")
    for title, double, single in configs:
        print(f"== {title}")
        measure(args, double, single)


def parse():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=6)
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


def planner_depth(sizes, share):
    """What the planner picks for these blocks: equal compute per block (Flux's double
    and single blocks do equal FLOP per token), transfer = bytes / link, scaled so a
    step's transfers are `share` x its compute (units of one step's compute)."""
    m, total = len(sizes), sum(sizes)
    compute = [1.0 / m] * m
    transfer = [share * s / total for s in sizes]
    depth, stalls = choose_depth(compute, transfer, sizes)
    step, stall = ring_schedule(compute, transfer, sizes, depth)
    return depth, stalls, stall / step


def block_times(model, blocks, step, n=6):
    """Median compute seconds of each block over `n` resident steps, and of the rest of
    the step (the lead): what ring_schedule needs to predict from measured compute."""
    starts, seen = {}, []
    hooks = []
    for i, b in enumerate(blocks):
        hooks.append(b.register_forward_pre_hook(
            lambda m, a, i=i: starts.__setitem__(i, time.perf_counter())))
        hooks.append(b.register_forward_hook(
            lambda m, a, o, i=i: seen.append((i, time.perf_counter() - starts[i]))))
    rows, leads = [], []
    try:
        for _ in range(n):
            seen.clear()
            t0 = time.perf_counter()
            step()
            total = time.perf_counter() - t0
            row = [c for _, c in sorted(seen)]
            rows.append(row)
            leads.append(total - sum(row))
    finally:
        for h in hooks:
            h.remove()
    return [med([r[i] for r in rows]) for i in range(len(blocks))], med(leads)


def predicted_stall(compute, lead, sizes, share, depth):
    """ring_schedule's stall share with measured per-block compute."""
    total = sum(sizes)
    step_compute = lead + sum(compute)
    transfer = [share * step_compute * s / total for s in sizes]
    step, stall = ring_schedule(compute, transfer, sizes, depth, lead=lead)
    return stall / step


class CopyLoad:
    """The same copies at the same pace as streaming, never waited for: each block's
    pre-hook issues the next block's copy from a host copy of its bytes into its own
    device buffer (identical bytes, so compute reads what it would anyway, freshly
    written as a streamed block's are). The simulated copy engine's CPU and memory
    load without streaming's waits, hooks and scheduling."""

    def __init__(self, placed, blocks, link):
        self.transfer = SimTransfer("copy-load", link)
        bufs = {g.name: buf for _, g, buf in placed.resident_bufs}
        self.dsts = [bufs[name] for name, _ in blocks]
        self.sources = [d.clone() for d in self.dsts]
        self.handles = [b.register_forward_pre_hook(self._hook(i)) for i, (_, b) in
                        enumerate(blocks)]

    def _hook(self, i):
        nxt = (i + 1) % len(self.sources)
        src, dst = self.sources[nxt], self.dsts[nxt]

        def pre(module, args):
            self.transfer.submit(dst, src)
        return pre

    def close(self):
        for h in self.handles:
            h.remove()
        self.transfer.drain()
        self.transfer.close()


def measure(args, double, single):
    model, inp = flux(args.hidden, args.hidden // 64, double, single, args.tokens)
    blocks = [b for _, b in find_blocks(model)]
    sizes = [sum(p.numel() * p.element_size() for p in b.parameters()) for b in blocks]
    streamed = sum(sizes)
    chosen, stalls, predicted = planner_depth(sizes, args.transfer_share)
    depths = tuple(sorted(set(DEPTHS) | {chosen}))
    inv = inventory(",".join(f"cuda{i}=16GiB" for i in range(len(depths) + 2)))

    def run(m):
        with torch.no_grad():
            m(**inp)

    resident = place(model, plan("cuda0", device="cuda0"), "diffusion", inv, device_check=False, rehearse=False)
    with resident:                                  # calibrate the link on compute
        run(model)
        t0 = time.perf_counter()
        for _ in range(args.steps):
            run(model)
        compute0 = (time.perf_counter() - t0) / args.steps
        per_block, lead = block_times(model, blocks, lambda: run(model))
    link = Link(bandwidth=streamed / (compute0 * args.transfer_share), latency=LATENCY)

    def modelled(lk):
        return sum(lk.seconds(n) for n in sizes)

    variants = [("resident", model, place(model, plan("cuda0", device="cuda0"), "diffusion",
                                          inv, device_check=False, rehearse=False))]
    loaded = copy.deepcopy(model)
    variants.append(("res+copies", loaded, place(loaded, plan("cuda1", device="cuda1"),
                                                  "diffusion", inv, device_check=False, rehearse=False)))
    for i, depth in enumerate(depths, start=2):
        m = copy.deepcopy(model)
        variants.append((f"depth {depth}", m, place(m, plan("cpu", stream=(0, depth),
                                                            device=f"cuda{i}"),
                                                     "diffusion", inv, link=link, device_check=False, rehearse=False)))
    names = [name for name, _, _ in variants]
    times = {name: [] for name in names}
    ratios = {name: [] for name in names}
    same_run = {name: [] for name in names}
    serial = {name: [] for name in names}
    h2d = {}
    for _, m, placed in variants:
        placed.__enter__()
    load = CopyLoad(variants[1][2], find_blocks(loaded), link)
    try:
        for _, m, _ in variants:
            run(m)                                  # warm up, learn the block order
        load.transfer.drain()
        for _ in range(args.rounds):
            round_times = {}
            for name, m, placed in variants:
                run(m)                            # into the steady state, untimed
                before = placed.stats()["devices"]
                waited = placed.streamer.wait_seconds if placed.streamer else 0.0
                t0 = time.perf_counter()
                for _ in range(args.steps):
                    run(m)
                round_times[name] = (time.perf_counter() - t0) / args.steps
                if placed.streamer is not None:   # the next step's copies: not this one's
                    placed.streamer.drain()
                if name == "res+copies":
                    load.transfer.drain()
                if placed.streamer is not None:   # compute of this very run: not waiting
                    waited = (placed.streamer.wait_seconds - waited) / args.steps
                    same_run[name].append((round_times[name], round_times[name] - waited))
                times[name].append(round_times[name])
                after = placed.stats()["devices"]
                dev = next(iter(after))
                h2d[name] = (after[dev]["h2d_bytes"] - before[dev]["h2d_bytes"]) / args.steps
                if name == "resident":            # the machine is shared: follow its speed
                    link = Link(streamed / (round_times[name] * args.transfer_share),
                                LATENCY)
                    for _, _, p in variants[2:]:
                        p.target.transfer.link = link
                    load.transfer.link = link
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
        load.close()

    compute = med(times["resident"])
    print(f"model: Flux architecture, hidden {args.hidden}, {len(blocks)} blocks streamed "
          f"(K=0; {', '.join(f'{n / 2**20:.2f}' for n in sorted(set(sizes), reverse=True))}"
          f" MiB), {args.tokens} image tokens, {streamed / 2**20:.1f} MiB per step; "
          f"torch threads {torch.get_num_threads()}; {args.rounds} rounds x {args.steps} "
          f"steps")
    print(f"planner's depth (choose_depth, transfer = {args.transfer_share:g} x compute): "
          f"{chosen}; predicted stall share by depth "
          f"{', '.join(f'{d}: {s:.1%}' for d, s in enumerate(stalls, start=1))}; at depth "
          f"{chosen}: {predicted:.1%}")
    print(f"compute (all resident) {compute * 1e3:.1f} ms/step, with the copy load "
          f"{med(times['res+copies']) * 1e3:.1f} ms/step (medians); ratios are per round, "
          f"median shown")
    print("columns: ratio = step / max(resident step of the same round, transfer) (target "
          "<= 1.10 at the planner's depth); serial = step / (resident + transfer); same-run"
          " = step / max(this run's step minus its waits on copies, transfer)")
    spread = max(per_block) / min(per_block) - 1
    print(f"predicted stall: 'plan' = ring_schedule as the planner runs it (equal compute "
          f"per block); 'meas' = ring_schedule on the per-block compute measured here "
          f"(blocks differ by up to {spread:.0%}; lead {lead * 1e3:.1f} ms)")
    print(f"{'variant':>12} {'ms/step':>9} {'ratio':>7} "
          f"{'serial':>7} {'same-run':>9} {'plan':>6} {'meas':>6} {'h2d MiB/step':>13} "
          f"{'ring MiB':>9} {'ahead':>6}")
    for name, _, placed in variants:
        t = med(times[name])
        st = placed.streamer
        ring = f"{st.ring_bytes / 2**20:9.1f} {min(st.ahead)}-{max(st.ahead):<4}" if st else ""
        mark = " <- planner" if name == f"depth {chosen}" else ""
        pred = ""
        if st is not None and st.depth > 0:
            m = len(sizes)
            plan_share = ring_schedule([1.0 / m] * m, [args.transfer_share * s / streamed
                                                       for s in sizes], sizes, st.depth)
            pred = (f"{plan_share[1] / plan_share[0]:>6.1%} "
                    f"{predicted_stall(per_block, lead, sizes, args.transfer_share, st.depth):>6.1%}")
        else:
            pred = f"{'':>6} {'':>6}"
        print(f"{name:>12} {t * 1e3:>9.1f} "
              f"{med(ratios[name]):>7.3f} {med(serial[name]):>7.3f} "
              f"{med(same_run[name]) if same_run[name] else 0:>9.3f} {pred} "
              f"{h2d[name] / 2**20:>13.1f} {ring}{mark}")


if __name__ == "__main__":
    main()
