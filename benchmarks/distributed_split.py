"""What does a layer split over a worker process cost, against the same split on one machine?

The same Flux-architecture model, its blocks split in two the same way three times:
  plain            no split at all: the floor both splits are measured against
  local split x2   the engine's layer split over two simulated devices (PCIe-4 modelled hops)
  dist x2 chained  the second range on a worker process over loopback gloo, one round trip
                   per step for the range (after the first, learning, forward)
  dist x2 blocks   the same, one round trip per block (chain=False): what the chain saves
Ratios use the fastest round of each variant (this machine is shared; rounds alternate and
start with the next variant each time); medians are printed beside them.

Assumes: loopback (memory-speed "network", no bandwidth limit), the worker on this
machine, so its compute and the main process's never overlap (a layer split is
sequential anyway); the same torch thread count in both processes (--threads, default 1).
A ratio below 1.0 against the local split would mean the measurement is wrong: the
distributed split does the same compute plus serialisation and a socket round trip.
The last lines turn the measured activation bytes per step into link time for real
networks (arithmetic, not measured).

    python benchmarks/distributed_split.py [--rounds 5] [--hidden 256] [--tokens 256]
"""
import argparse
import copy
import os
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import torch

from _common import flux, inventory
from comfyui_placement.placement.plan import ComponentPlan, DevicePlan, Plan
from comfyui_placement.runtime.distributed import Cluster, remote_range
from comfyui_placement.runtime.device.simdevice import Link
from comfyui_placement.runtime.split import place_split

PCIE4 = Link(bandwidth=25e9, latency=10e-6)
SECRET_ENV = "COMFYUI_PLACEMENT_BENCH_SECRET"


def start_worker(models: str, threads: int):
    env = dict(os.environ, **{SECRET_ENV: "bench", "OMP_NUM_THREADS": str(threads)})
    proc = subprocess.Popen([sys.executable, "-m", "comfyui_placement", "worker", "--listen",
                             "127.0.0.1:0", "--models", models, "--secret-env", SECRET_ENV],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env,
                            text=True)
    ready, _, _ = select.select([proc.stdout], [], [], 120)
    line = proc.stdout.readline() if ready else ""
    if not line.startswith("listening on "):
        proc.kill()
        raise SystemExit(f"worker did not start: {line!r}")
    return proc, line.split()[-1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--double", type=int, default=2)
    ap.add_argument("--single", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--threads", type=int, default=1, help="torch threads, both processes")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from safetensors.torch import save_file
    model, inp = flux(args.hidden, args.hidden // 64, args.double, args.single, args.tokens)
    tmp = tempfile.mkdtemp(prefix="dist-bench-")
    path = os.path.join(tmp, "flux.safetensors")
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, path)
    proc, address = start_worker(tmp, args.threads)

    def run(m):
        with torch.no_grad():
            m(**inp)

    inv = inventory("cuda0=64GiB,cuda1=64GiB")
    split = Plan([DevicePlan(d, "gpu", 16 << 30, 16 << 30, None) for d in ("cuda0", "cuda1")],
                 {"diffusion": ComponentPlan("diffusion", ["cuda0", "cuda1"], "cuda0")})
    try:
        with Cluster(f"w1={address}", secret=b"bench", timeout_s=120) as cluster:
            models = [copy.deepcopy(model) for _ in range(3)]
            local = place_split(models[0], split, "diffusion", inv, hop_link=PCIE4, device_check=False)
            local.__enter__()
            first, last = local.stats()["ranges"]["cuda1"]
            chained = remote_range(models[1], (first, last), cluster["w1.cpu"], path)
            blocks = remote_range(models[2], (first, last), cluster["w1.cpu"], path,
                                  chain=False)
            variants = [("plain", model, None), ("local split x2", models[0], local),
                        ("dist x2 chained", models[1], chained.__enter__()),
                        ("dist x2 blocks", models[2], blocks.__enter__())]
            try:
                for _, m, _ in variants:
                    run(m)                                 # warm up; the chain is learned
                times = {name: [] for name, _, _ in variants}
                hop_bytes, trips = {}, {}
                for r in range(args.rounds):
                    for name, m, placed in variants[r % 4:] + variants[:r % 4]:
                        before = placed.stats() if placed else {}
                        t0 = time.perf_counter()
                        run(m)
                        times[name].append(time.perf_counter() - t0)
                        after = placed.stats() if placed else {}
                        hop_bytes[name] = after.get("hop_bytes", 0) - before.get("hop_bytes", 0)
                        trips[name] = after.get("round_trips", 0) - before.get("round_trips", 0)
            finally:
                blocks.__exit__(None, None, None)
                chained.__exit__(None, None, None)
                local.__exit__(None, None, None)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)

    n_remote = last - first + 1
    print(f"Flux-architecture model: hidden {args.hidden}, {args.double}+{args.single} blocks, "
          f"{args.tokens} image tokens; blocks {first}..{last} on the second device / worker; "
          f"{args.threads} torch thread(s) per process; {args.rounds} rounds; loopback gloo")
    print(f"{'variant':18} {'best ms':>9} {'median ms':>10} {'hop MB/step':>12} "
          f"{'trips/step':>10} {'vs plain':>9} {'vs local split':>15}")
    best = {k: min(v) for k, v in times.items()}
    for name, ts in times.items():
        print(f"{name:18} {best[name] * 1e3:9.2f} {statistics.median(ts) * 1e3:10.2f} "
              f"{hop_bytes[name] / 1e6:12.3f} {trips[name]:10d} "
              f"{best[name] / best['plain']:9.3f} "
              f"{best[name] / best['local split x2']:15.3f}")
    extra = (best["dist x2 blocks"] - best["dist x2 chained"]) / max(n_remote - 1, 1)
    print(f"cost of one extra round trip (blocks - chained, per block beyond the first): "
          f"{extra * 1e3:.2f} ms")
    chained_bytes = hop_bytes["dist x2 chained"]
    for label, gbit in (("1 GbE", 1), ("10 GbE", 10), ("100 GbE", 100)):
        print(f"at {label} ({gbit} Gbit/s, latency not counted) the chained split's "
              f"{chained_bytes / 1e6:.3f} MB per step would take "
              f"{chained_bytes * 8 / (gbit * 1e9) * 1e3:.3f} ms per step on the wire")
    if best["dist x2 chained"] < 0.95 * best["local split x2"]:
        print("WARNING: the distributed split ran faster than the local split: below the "
              "floor, the measurement is disturbed (rerun with more --rounds)")


if __name__ == "__main__":
    main()
