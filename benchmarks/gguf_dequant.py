"""GGUF dequantization throughput, ours (runtime/gguf) against ComfyUI-GGUF's torch
dequantization, same device, same types, same bytes, in one run; then the bytes per
sampling step over the link for a Flux-sized block stack in Q4_K and Q8_0 against bf16.

    python benchmarks/gguf_dequant.py --comfyui-gguf /tmp/comfyui/custom_nodes/ComfyUI-GGUF
    python benchmarks/gguf_dequant.py --comfyui-gguf PATH --device cuda

What it assumes:
- One tensor of --shape (default 3072x3072, a Flux attention projection) per type, its
  raw bytes random (dequantization cost does not depend on the values: no branches, and
  no fp32 subnormals can arise from fp16 scales times small integer codes), already on
  the device; the timed call is raw bytes -> a new tensor of the compute dtype (--dtype,
  default bf16, what Flux runs in).
- ComfyUI-GGUF is timed as its layers call it: `dequantize_tensor` computes with
  `dequantize(data, qtype, shape, dtype=dequant_dtype).to(dtype)`; its default
  `dequant_dtype` is None (blocks computed in fp16 from the fp16 scales) and "target"
  computes in the compute dtype. Both are timed; the ratio is against the faster of the
  two. F32/F16 are plain casts in both and are left out; BF16 is listed.
- Timing: the best of --rounds rounds (ours and theirs interleaved, each round --calls
  calls) after a warm-up: the CPU here is shared with other jobs, and the least
  disturbed round is the one that compares; CUDA timed with events after a synchronize.
  On the CPU, torch uses --threads threads (default: what torch picked).
- Bytes per step: Flux.1's 19 double and 38 single blocks (tensor shapes as in
  diffusers' FluxTransformer2DModel), every block streamed once per step (resident
  prefix 0, one forward per step: guidance-distilled, no CFG); 2-D weights in the quant
  type, 1-D tensors (biases, norm scales) in F32 as GGUF converters keep them; bf16 is
  every tensor in bf16. The link time uses --link-gbps (default 25 GB/s, PCIe 4.0 x16
  as measured in practice), the dequantization time per step the throughput measured
  above for that type on this device.
"""
import argparse
import importlib.util
import os
import sys
import time

import numpy as np
import torch

import _common  # noqa: F401  (imports the checkout as comfyui_placement if not installed)
from comfyui_placement.runtime.gguf import SUPPORTED, dequantize, quantized_nbytes
from comfyui_placement.runtime.gguf.types import ggml_type

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
DEFAULT_TYPES = ("BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K",
                 "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS")

# Flux.1 [dev/schnell] blocks (hidden 3072, 24 heads of 128, MLP ratio 4), diffusers names
H, MLP, HD = 3072, 12288, 128
FLUX_DOUBLE = ([(6 * H, H)] * 2 + [(H, H)] * 8 + [(MLP, H), (H, MLP)] * 2,      # weights
               [6 * H] * 2 + [H] * 8 + [MLP, H] * 2 + [HD] * 4)                  # 1-D
FLUX_SINGLE = ([(3 * H, H), (MLP, H), (H, H + MLP)] + [(H, H)] * 3,
               [3 * H, MLP, H] + [H] * 3 + [HD] * 2)
N_DOUBLE, N_SINGLE = 19, 38


def load_comfyui_gguf(path):
    """ComfyUI-GGUF's dequant.py, imported from its checkout (never copied here)."""
    if not path:
        return None
    file = os.path.join(path, "dequant.py")
    if not os.path.isfile(file):
        sys.exit(f"--comfyui-gguf {path}: no dequant.py there")
    spec = importlib.util.spec_from_file_location("comfyui_gguf_dequant", file)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_call(fn, device, calls):
    sync(device)
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / calls
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls


def bench_type(name, shape, dtype, device, cg, rounds, calls):
    t = ggml_type(name)
    numel = int(np.prod(shape))
    nbytes = quantized_nbytes(shape, name)
    gen = torch.Generator().manual_seed(t.id)
    raw = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=gen)
    if name == "BF16":          # keep it finite: random bf16 bits are NaN 1/256 of the time
        raw = torch.randn(numel, generator=gen).to(torch.bfloat16).view(torch.uint8)
    raw = raw.to(device)
    fns = {"ours": lambda: dequantize(raw, name, shape, dtype)}
    if cg is not None:
        import gguf
        qt = gguf.GGMLQuantizationType[name]
        if qt in cg.dequantize_functions:
            fns["cg_default"] = lambda: cg.dequantize(raw, qt, shape, dtype=None).to(dtype)
            fns["cg_target"] = lambda: cg.dequantize(raw, qt, shape, dtype=dtype).to(dtype)
    for fn in fns.values():                   # warm-up (allocator, kernels, constants)
        fn()
        fn()
    times = {k: [] for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            times[k].append(time_call(fn, device, calls))
    med = {k: min(v) for k, v in times.items()}
    return numel, nbytes, med


def flux_stack_bytes(qtype):
    """(bytes of all blocks in `qtype` or bf16, elements of the quantized weights)."""
    total, q_elems = 0, 0
    for (weights, vectors), n in ((FLUX_DOUBLE, N_DOUBLE), (FLUX_SINGLE, N_SINGLE)):
        for shape in weights:
            el = shape[0] * shape[1]
            if qtype == "bf16":
                total += n * 2 * el
            else:
                total += n * quantized_nbytes(shape, qtype)
                q_elems += n * el
        total += n * sum(vectors) * (2 if qtype == "bf16" else 4)
    return total, q_elems


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--comfyui-gguf", default=os.environ.get("COMFYUI_GGUF"),
                    help="ComfyUI-GGUF checkout (folder holding dequant.py)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", choices=list(DTYPES), default="bf16")
    ap.add_argument("--types", default=",".join(DEFAULT_TYPES))
    ap.add_argument("--shape", default="3072x3072")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=0, help="calls per round (0: 2 CPU, 20 GPU)")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--link-gbps", type=float, default=25.0)
    args = ap.parse_args()
    device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = DTYPES[args.dtype]
    shape = tuple(int(x) for x in args.shape.lower().split("x"))
    calls = args.calls or (20 if device.type == "cuda" else 2)
    types = [t.strip().upper() for t in args.types.split(",") if t.strip()]
    for t in types:
        if t not in SUPPORTED:
            sys.exit(f"--types: {t} is not one of {', '.join(SUPPORTED)}")
    cg = load_comfyui_gguf(args.comfyui_gguf)
    dev_name = (torch.cuda.get_device_name(device) if device.type == "cuda"
                else f"cpu, {torch.get_num_threads()} threads")
    print(f"device {dev_name}; torch {torch.__version__}; shape {shape}; out {args.dtype}; "
          f"best of {args.rounds} rounds x {calls} calls")
    if cg is None:
        print("(no --comfyui-gguf: ours only)")
    print(f"{'type':7s} {'ours ms':>9s} {'Gel/s':>7s} {'GB/s in':>8s} | {'CG dflt ms':>10s} "
          f"{'CG tgt ms':>10s} | {'ours/CG':>7s}")
    rate = {}
    ratios = []
    for name in types:
        numel, nbytes, med = bench_type(name, shape, dtype, device, cg, args.rounds, calls)
        ours = med["ours"]
        rate[name] = numel / ours
        line = (f"{name:7s} {ours * 1e3:9.3f} {numel / ours / 1e9:7.2f} "
                f"{nbytes / ours / 1e9:8.2f} | ")
        if "cg_default" in med:
            best = min(med["cg_default"], med["cg_target"])
            ratios.append(best / ours)
            line += (f"{med['cg_default'] * 1e3:10.3f} {med['cg_target'] * 1e3:10.3f} | "
                     f"{best / ours:6.2f}x")
        else:
            line += f"{'-':>10s} {'-':>10s} | {'-':>7s}"
        print(line, flush=True)
    if ratios:
        geo = float(np.exp(np.mean(np.log(ratios))))
        print(f"ours/ComfyUI-GGUF (time theirs / time ours, best of their two paths): "
              f"min {min(ratios):.2f}x, geometric mean {geo:.2f}x over {len(ratios)} types")

    print(f"\nFlux.1 block stack ({N_DOUBLE} double + {N_SINGLE} single), bytes over the link "
          f"per step at {args.link_gbps:g} GB/s:")
    base, _ = flux_stack_bytes("bf16")
    for q in ("bf16", "Q8_0", "Q4_K"):
        nb, elems = flux_stack_bytes(q)
        line = (f"  {q:5s} {nb / 2**30:7.2f} GiB  {nb / base:5.3f} of bf16  link "
                f"{nb / (args.link_gbps * 1e9) * 1e3:7.1f} ms/step")
        if q in rate:
            line += f"  dequant {elems / rate[q] * 1e3:7.1f} ms/step on {args.device}"
        print(line)


if __name__ == "__main__":
    main()
