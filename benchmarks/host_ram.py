"""Host RAM for cpu residency: peak RSS while a model streams from host memory, over
the weights' bytes.   ratio = (peak RSS - RSS before the model) / weight bytes  (<= 1.10)
The simulated device's memory is host memory too, so the figure without it (what the
host would hold next to a real GPU) is printed beside the raw one. Linux only: the
peak is VmHWM, reset after the model is built (/proc/self/clear_refs).

    python benchmarks/host_ram.py [--blocks 32]
"""
import argparse

import torch

from _common import flux, inventory, plan
from comfyui_placement.runtime import place


def status(key):
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{key} not in /proc/self/status")


def reset_peak():
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--double", type=int, default=8)
    ap.add_argument("--single", type=int, default=24)
    ap.add_argument("--depth", type=int, default=1)
    args = ap.parse_args()
    import diffusers.models  # noqa: F401           # libraries load before the baseline
    from diffusers import FluxTransformer2DModel  # noqa: F401
    torch.zeros(1) @ torch.zeros(1)
    base = status("VmRSS")
    model, inp = flux(args.hidden, args.hidden // 64, args.double, args.single,
                      img_tokens=64, txt_tokens=16)
    weights = sum(t.numel() * t.element_size() for t in
                  list(model.parameters()) + list(model.buffers()))
    built = status("VmRSS")
    reset_peak()
    with place(model, plan("cpu", stream=(0, args.depth)), "diffusion", inventory(), device_check=False) as placed:
        with torch.no_grad():
            for _ in range(2):
                model(**inp)
        during = status("VmRSS")
    peak = status("VmHWM")
    dev = placed.stats()["devices"]["cuda0"]
    sim = dev["peak_bytes"]
    print(f"model: Flux architecture, hidden {args.hidden}, {args.double + args.single} "
          f"blocks, weights {weights / 2**20:.1f} MiB; cpu residency, K=0, depth "
          f"{args.depth}; simulated device peak {sim / 2**20:.1f} MiB "
          f"(slots + non-block weights + activations)")
    print(f"after build: {(built - base) / weights:.3f}x weights")
    print(f"placed, peak RSS: {(peak - base) / weights:.3f}x weights raw, "
          f"{(peak - base - sim) / weights:.3f}x without the simulated device's memory "
          f"(RSS while placed {(during - base) / weights:.3f}x)")


if __name__ == "__main__":
    main()
