"""Do two devices run a batch faster than one? Batch parallel (runtime/parallel) against
one device, resident and streamed, on simulated devices with modelled links, in one run.

Assumptions, printed with the figures:
- This machine has no GPU and 2 CPU cores shared with other work, so the headline
  table models compute as time: every block does a small real matmul (the values) and
  then holds its thread for `--item-ms` per batch item (the kernel time a GPU would
  spend; a CUDA host thread likewise waits while its device computes, and two devices
  compute at the same time). Copies land after the modelled link time (bytes /
  bandwidth + latency, runtime/device/simdevice.py), one link per device: each GPU has its
  own PCIe link, the host memory behind them is assumed not to be the bottleneck.
- Streamed: every device streams all blocks (K=0, prefetch depth 1) from the one
  packed host copy; per forward a device takes about max(its compute, its transfers),
  so the expected speedup is max(C, T) / max(C / 2, T) for a batch split in 2 (C: one
  device's compute for the whole batch, T: one forward's transfers). The link is set
  from C by --transfer-shares (T = share x C).
- The second table runs real compute (a tiny Flux-architecture model from diffusers)
  with torch threads = 1 per device, so one device uses one core and two devices two
  cores; on a shared 2-core machine it is noisy and bounded by the cores actually free.
- Physical floor: two devices cannot do better than half the single-device time
  (speedup <= 2); a figure past it is flagged as a measurement error.
Variants are timed in alternating rounds so machine noise hits all; times are medians,
speedups the median of the per-round ratios.

- The pipelined table: a layer split over 2 devices holding half the blocks each, the
  plain split (one stage at a time) against the pipelined one (parallel pipeline: the
  batch's items flow through the stages one behind the other), and one device streaming
  the whole model; same modelled compute, its assumptions printed with it.

    python benchmarks/multi_gpu.py [--rounds 5] [--batch 2] [--item-ms 2]
    python benchmarks/multi_gpu.py --only-pipeline [--pipeline-batches 2 4]
"""
import argparse
import copy
import threading
import time

import torch
from torch import nn

from _common import flux, inventory, med
from comfyui_placement.placement.plan import ComponentPlan, DevicePlan, Plan, StreamPlan
from comfyui_placement.runtime import place
from comfyui_placement.runtime.device.simdevice import Link


class KernelBlock(nn.Module):
    """A block whose compute time is modelled: the real matmul gives the values, the
    wait stands for the kernel time of `item_s` per batch item."""

    def __init__(self, width: int, item_s: float):
        super().__init__()
        self.proj = nn.Linear(width, width)
        self.item_s = item_s

    def forward(self, x):
        y = x + 0.01 * torch.tanh(self.proj(x))
        time.sleep(self.item_s * x.shape[0])
        return y


class KernelModel(nn.Module):
    def __init__(self, width: int, depth: int, item_s: float):
        super().__init__()
        self.blocks = nn.ModuleList(KernelBlock(width, item_s) for _ in range(depth))

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x


def plan_for(devices, params, stream=None):
    devs = [DevicePlan(d, "gpu", 64 << 30, 64 << 30, None) for d in devices]
    cp = ComponentPlan("diffusion", list(devices), params,
                       parallel="batch" if len(devices) > 1 else "none",
                       stream=StreamPlan(*stream) if stream else None)
    return Plan(devs, {"diffusion": cp})


def streamers(placed):
    """Every ring of a placement (one device, a split's stages, batch parallel's devices)."""
    if placed is None:
        return []
    return list(getattr(placed, "streamers", [])) + \
        [s for p in getattr(placed, "placed", []) for s in streamers(p)]


def time_rounds(variants, rounds, call, timed=None):
    """{name: [seconds per forward, one per round]}, variants interleaved per round.
    `timed(name, model)` runs one variant (default: call(model)). A streamed variant's
    forward is timed from rings with nothing in flight to rings with nothing in flight
    (its copies issued ahead for the next forward waited for inside the window): while
    the other variants run, its link would otherwise fetch the next forward's first
    blocks for free, and a forward could beat its own link time."""
    timed = timed or (lambda name, m: call(m))
    times = {name: [] for name, *_ in variants}
    for name, m, _ in variants:
        timed(name, m)                              # warm up: block order, first loads
    for _ in range(rounds):
        for name, m, placed in variants:
            rings = streamers(placed)
            for s in rings:
                s.drain()
            t0 = time.perf_counter()
            timed(name, m)
            for s in rings:
                s.drain()
            times[name].append(time.perf_counter() - t0)
    return times


def run_variants(variants, rounds, call):
    for _, _, placed in variants:
        placed.__enter__()
    try:
        times = time_rounds(variants, rounds, call)
    finally:
        for _, _, placed in reversed(variants):
            placed.__exit__(None, None, None)
    return times


def per_round(times, one: str, two: str) -> float:
    """Median over rounds of the ratio within a round (both timed back to back)."""
    return med([a / b for a, b in zip(times[one], times[two])])


def check(speedup: float, two_s: float = 0.0, floor_s: float = 0.0) -> str:
    """Two devices cannot beat half of one (speedup <= 2), nor a forward its own
    floor (max(C/2, T) for two devices: their compute, each device's transfers);
    2% allows the timer."""
    if speedup > 2.05 or two_s < 0.98 * floor_s:
        return "PAST THE FLOOR: measurement wrong"
    return "ok"


def modelled_table(args):
    item_s = args.item_ms / 1e3
    model = KernelModel(args.width, args.depth, item_s).eval()
    x = torch.randn(args.batch, args.tokens, args.width)
    block_bytes = sum(p.numel() * p.element_size() for p in model.blocks[0].parameters())
    streamed = block_bytes * args.depth
    compute = item_s * args.batch * args.depth      # one device, the whole batch
    names = [f"cuda{i}" for i in range(16)]
    inv = inventory(",".join(f"{n}=64GiB" for n in names))
    dev = iter(names)

    def call(m):
        with torch.no_grad():
            m(x)

    rows = []
    one, two = next(dev), (next(dev), next(dev))
    m1, m2 = copy.deepcopy(model), copy.deepcopy(model)
    variants = [("resident 1", m1, place(m1, plan_for([one], one), "diffusion", inv, device_check=False)),
                ("resident 2", m2, place(m2, plan_for(two, two[0]), "diffusion", inv, device_check=False))]
    expected = {"resident": 2.0}
    exp_t = {}
    for share in args.transfer_shares:
        link = Link(bandwidth=streamed / (share * compute), latency=20e-6)
        for n in (1, 2):
            devs = [next(dev) for _ in range(n)]
            m = copy.deepcopy(model)
            variants.append((f"streamed T={share:g}C {n}", m,
                             place(m, plan_for(devs, "cpu", (0, 1)), "diffusion", inv,
                                   link=link, device_check=False)))
        t = share * compute
        expected[f"streamed T={share:g}C"] = max(compute, t) / max(compute / 2, t)
        exp_t[f"streamed T={share:g}C"] = t
    times = run_variants(variants, args.rounds, call)
    r1, r2 = med(times["resident 1"]), med(times["resident 2"])
    for key, exp in expected.items():
        t1, t2 = med(times[f"{key} 1"]), med(times[f"{key} 2"])
        # from the measured resident times (compute with its overheads) and the link
        measured_exp = r1 / r2 if key == "resident" else \
            max(r1, exp_t[key]) / max(r2, exp_t[key])
        floor = compute / 2 if key == "resident" else max(compute / 2, exp_t[key])
        rows.append((key, t1, t2, per_round(times, f"{key} 1", f"{key} 2"), exp,
                     measured_exp, floor))
    print(f"== modelled compute: {args.depth} blocks x {block_bytes / 2**20:.2f} MiB, "
          f"{args.item_ms:g} ms per item per block, batch {args.batch} "
          f"(C = {compute * 1e3:.0f} ms per forward on one device); links: one per device, "
          f"T = one forward's transfers; {args.rounds} rounds, median")
    print("ideal: max(C, T) / max(C/2, T) with the modelled C; from resident: the same "
          "with the measured resident times (compute plus hooks, threads, the real matmul "
          "and sleep overshoot) in place of C and C/2")
    print("speedup: median of the per-round ratios (1 device / 2 devices, timed back to back)")
    print(f"{'variant':>18} {'1 device ms':>12} {'2 devices ms':>13} {'speedup':>8} "
          f"{'ideal':>6} {'from resident':>14}  floor check")
    for key, t1, t2, s, exp, mexp, floor in rows:
        print(f"{key:>18} {t1 * 1e3:>12.1f} {t2 * 1e3:>13.1f} {s:>8.2f} {exp:>6.2f} "
              f"{mexp:>14.2f}  {check(s, t2, floor)}")


def real_table(args):
    torch.set_num_threads(1)           # one core per device (the per-device threads too)
    model, inp = flux(args.flux_hidden, max(1, args.flux_hidden // 64), 2, 4,
                      args.flux_tokens)
    g = torch.Generator().manual_seed(0)
    batched = dict(inp)
    for k in ("hidden_states", "encoder_hidden_states", "pooled_projections"):
        v = inp[k]
        batched[k] = torch.randn((args.batch,) + tuple(v.shape[1:]), generator=g)
    batched["timestep"] = torch.full((args.batch,), 0.5)
    inv = inventory("cuda0=64GiB,cuda1=64GiB,cuda2=64GiB")

    def call(m):
        with torch.no_grad():
            m(**batched)

    a, b = copy.deepcopy(model), copy.deepcopy(model)
    variants = [("1 device", a, place(a, plan_for(["cuda0"], "cuda0"), "diffusion", inv, device_check=False)),
                ("2 devices", b, place(b, plan_for(["cuda1", "cuda2"], "cuda1"), "diffusion",
                                       inv, device_check=False))]
    variants.append(("matmul x2 serial", None, None))
    variants.append(("matmul x2 threads", None, None))
    a_ = torch.randn(512, 512)

    def matmuls():
        for _ in range(24):
            a_ @ a_

    def timed(name, m):
        if name == "matmul x2 serial":
            matmuls(), matmuls()
        elif name == "matmul x2 threads":        # what two free cores give right now
            th = threading.Thread(target=matmuls)
            th.start()
            matmuls()
            th.join()
        else:
            call(m)
    for _, _, placed in variants[:2]:
        placed.__enter__()
    try:
        times = time_rounds(variants, args.rounds, None, timed)
    finally:
        for _, _, placed in reversed(variants[:2]):
            placed.__exit__(None, None, None)
    t1, t2 = med(times["1 device"]), med(times["2 devices"])
    speedup = per_round(times, "1 device", "2 devices")
    ceiling = per_round(times, "matmul x2 serial", "matmul x2 threads")
    print(f"== real compute on CPU cores: tiny Flux (hidden {args.flux_hidden}, "
          f"{args.flux_tokens} image tokens), batch {args.batch}, resident, torch threads 1 "
          f"per device, {args.rounds} rounds, median (2 shared cores: noisy)")
    print(f"{'1 device ms':>12} {'2 devices ms':>13} {'speedup':>8} {'2-thread ceiling':>17}"
          f"  floor check")
    print(f"{t1 * 1e3:>12.1f} {t2 * 1e3:>13.1f} {speedup:>8.2f} {ceiling:>17.2f}  "
          f"{check(speedup)}")
    print("2-thread ceiling: plain 512x512 matmuls on two threads vs one after the other, "
          "interleaved with the rounds: the parallelism the shared cores gave at the time")


def split_plan(devices, parallel, depth):
    """Two devices, each holding half the blocks resident (a layer split)."""
    half = depth // 2
    devs = [DevicePlan(d, "gpu", 64 << 30, 64 << 30, None) for d in devices]
    cp = ComponentPlan("diffusion", list(devices), devices[0], split_mode="layer",
                       parallel=parallel,
                       blocks={devices[0]: [0, half - 1], devices[1]: [half, depth - 1]})
    return Plan(devs, {"diffusion": cp})


def pipelined_table(args):
    """Pipelined layer split vs the plain layer split vs one device streaming the whole
    model, with the modelled compute of the first table."""
    item_s = args.item_ms / 1e3
    model = KernelModel(args.width, args.depth, item_s).eval()
    block_bytes = sum(p.numel() * p.element_size() for p in model.blocks[0].parameters())
    names = [f"cuda{i}" for i in range(8)]
    inv = inventory(",".join(f"{n}=64GiB" for n in names))
    print(f"== pipelined layer split: {args.depth} blocks, half on each of 2 devices "
          f"(resident), {args.item_ms:g} ms per item per block (modelled kernel time); "
          f"one device streams all blocks (K=0, depth 1) over a link with T = C/4 (its "
          f"copies hide under compute); shares = batch (one item each); {args.rounds} "
          f"rounds interleaved, median; speedup: median of per-round ratios")
    print("ideal pipelined vs plain: 2b / (b + 1) for b shares over 2 stages (the first "
          "and last share leave one stage idle); plain split = one device's compute")
    print(f"{'batch':>5} {'1 dev stream ms':>16} {'plain split ms':>15} {'pipelined ms':>13}"
          f" {'pipe/plain':>11} {'pipe/1 dev':>11} {'ideal':>6}")
    for batch in args.pipeline_batches:
        x = torch.randn(batch, args.tokens, args.width)
        compute = item_s * batch * args.depth
        link = Link(bandwidth=block_bytes * args.depth / (0.25 * compute), latency=20e-6)
        dev = iter(names)
        m0, m1, m2 = (copy.deepcopy(model) for _ in range(3))
        one = next(dev)
        variants = [
            ("one", m0, place(m0, plan_for([one], "cpu", (0, 1)), "diffusion", inv,
                              link=link, device_check=False)),
            ("plain", m1, place(m1, split_plan([next(dev), next(dev)], "none", args.depth),
                                "diffusion", inv, device_check=False)),
            ("pipe", m2, place(m2, split_plan([next(dev), next(dev)], "pipeline",
                                              args.depth), "diffusion", inv, device_check=False))]

        def call(m):
            with torch.no_grad():
                m(x)
        times = run_variants(variants, args.rounds, call)
        print(f"{batch:>5} {med(times['one']) * 1e3:>16.1f} {med(times['plain']) * 1e3:>15.1f}"
              f" {med(times['pipe']) * 1e3:>13.1f} {per_round(times, 'plain', 'pipe'):>11.2f}"
              f" {per_round(times, 'one', 'pipe'):>11.2f} {2 * batch / (batch + 1):>6.2f}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batch", type=int, default=2, help="CFG: cond + uncond = 2")
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--depth", type=int, default=12)
    ap.add_argument("--tokens", type=int, default=4)
    ap.add_argument("--item-ms", type=float, default=2.0)
    ap.add_argument("--transfer-shares", type=float, nargs="+", default=[0.25, 1.0])
    ap.add_argument("--flux-hidden", type=int, default=256)
    ap.add_argument("--flux-tokens", type=int, default=256)
    ap.add_argument("--skip-real", action="store_true")
    ap.add_argument("--pipeline-batches", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--only-pipeline", action="store_true")
    args = ap.parse_args()
    if args.only_pipeline:
        pipelined_table(args)
        return
    modelled_table(args)
    pipelined_table(args)
    if not args.skip_real:
        real_table(args)


if __name__ == "__main__":
    main()
