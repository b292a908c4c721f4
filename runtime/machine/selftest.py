"""`python -m comfyui_placement selftest`: proves the runtime on the machine it runs on.

On a CUDA machine: the CUDA tests; host-to-device bandwidth (pinned and pageable)
against the link's nominal peak; one sampling step of a Flux-sized block stack (random
weights, hidden 3072, double and single blocks at Flux.1's real sizes, bf16, 1024x1024
tokens) all-resident, streamed by the pack's engine, cast per layer on use (ComfyUI
core's low-VRAM style) and under diffusers' block-level group offloading with
use_stream=True, side by side; a layer split over all GPUs present; one step's working
memory rehearsed on the meta device (rehearse.py) beside the CUDA allocator's peak.
Without CUDA: the same comparisons at a scale this CPU runs in seconds, on a simulated
device whose modelled link moves a block in about the time one computes.

Every streamed figure is divided by the step's floor, max(resident compute, streamed
bytes / measured pinned bandwidth): both measured here, in the same process, warm,
with the same threads. A ratio of 1.0 is perfect overlap; below 1.0 would mean the
measurement is wrong. Prints a table; `--json PATH` writes the figures.
"""
import gc
import json
import platform
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional

import torch
import torch.nn.functional as F
from torch import nn

from ...placement.devices import Inventory
from ...placement.layout import choose_depth
from ...placement.plan import ComponentPlan, DevicePlan, Plan, StreamPlan
from ...placement.units import format_bytes
from ..device.simdevice import Link
from ..measure.rehearse import rehearse
from ..place import place

PACK = Path(__file__).resolve().parents[1]


# -- a Flux-shaped block stack ------------------------------------------------------------
@dataclass(frozen=True)
class Shape:
    hidden: int
    heads: int
    mlp: int
    img_tokens: int
    txt_tokens: int
    double: int
    single: int

    @property
    def tokens(self) -> int:
        return self.img_tokens + self.txt_tokens


FLUX = Shape(hidden=3072, heads=24, mlp=12288, img_tokens=4096, txt_tokens=512,
             double=6, single=12)          # Flux.1 has 19 + 38 blocks of these sizes
CPU = Shape(hidden=256, heads=4, mlp=1024, img_tokens=192, txt_tokens=64, double=2, single=4)


def _attend(q, k, v, heads):
    b, t, c = q.shape
    split = lambda x: x.view(b, t, heads, c // heads).transpose(1, 2)    # noqa: E731
    out = F.scaled_dot_product_attention(split(q), split(k), split(v))
    return out.transpose(1, 2).reshape(b, t, c)


class DoubleBlock(nn.Module):
    """Flux's double-stream block: image and text streams, joint attention."""

    def __init__(self, s: Shape):
        super().__init__()
        h = s.hidden
        self.heads, self.txt = s.heads, s.txt_tokens
        for side in ("img", "txt"):
            setattr(self, f"{side}_mod", nn.Linear(h, 6 * h))
            setattr(self, f"{side}_qkv", nn.Linear(h, 3 * h))
            setattr(self, f"{side}_proj", nn.Linear(h, h))
            setattr(self, f"{side}_mlp_in", nn.Linear(h, s.mlp))
            setattr(self, f"{side}_mlp_out", nn.Linear(s.mlp, h))

    def forward(self, x, vec):
        txt, img = x[:, :self.txt], x[:, self.txt:]
        mods = {side: getattr(self, f"{side}_mod")(F.silu(vec))[:, None].chunk(6, -1)
                for side in ("img", "txt")}
        qkv = torch.cat([getattr(self, f"{side}_qkv")(
            F.layer_norm(part, part.shape[-1:]) * (1 + mods[side][1]) + mods[side][0])
            for side, part in (("txt", txt), ("img", img))], 1)
        attn = _attend(*qkv.chunk(3, -1), self.heads)
        out = []
        for side, part, a in (("txt", txt, attn[:, :self.txt]), ("img", img, attn[:, self.txt:])):
            m = mods[side]
            part = part + m[2] * getattr(self, f"{side}_proj")(a)
            mlp = getattr(self, f"{side}_mlp_out")(F.gelu(getattr(self, f"{side}_mlp_in")(
                F.layer_norm(part, part.shape[-1:]) * (1 + m[4]) + m[3]), approximate="tanh"))
            out.append(part + m[5] * mlp)
        return torch.cat(out, 1)


class SingleBlock(nn.Module):
    """Flux's single-stream block: one fused linear in, attention + MLP, one out."""

    def __init__(self, s: Shape):
        super().__init__()
        h = s.hidden
        self.heads, self.hidden = s.heads, h
        self.mod = nn.Linear(h, 3 * h)
        self.linear1 = nn.Linear(h, 3 * h + s.mlp)
        self.linear2 = nn.Linear(h + s.mlp, h)

    def forward(self, x, vec):
        shift, scale, gate = self.mod(F.silu(vec))[:, None].chunk(3, -1)
        y = self.linear1(F.layer_norm(x, x.shape[-1:]) * (1 + scale) + shift)
        qkv, mlp = y.split([3 * self.hidden, y.shape[-1] - 3 * self.hidden], -1)
        attn = _attend(*qkv.chunk(3, -1), self.heads)
        return x + gate * self.linear2(torch.cat([attn, F.gelu(mlp, approximate="tanh")], -1))


class FluxStack(nn.Module):
    def __init__(self, s: Shape):
        super().__init__()
        self.double_blocks = nn.ModuleList(DoubleBlock(s) for _ in range(s.double))
        self.single_blocks = nn.ModuleList(SingleBlock(s) for _ in range(s.single))

    def forward(self, x, vec):
        for b in self.double_blocks:
            x = b(x, vec)
        for b in self.single_blocks:
            x = b(x, vec)
        return x

    def block_names(self) -> List[str]:
        return [f"double_blocks.{i}" for i in range(len(self.double_blocks))] + \
               [f"single_blocks.{i}" for i in range(len(self.single_blocks))]


def build_stack(s: Shape, dtype, device) -> FluxStack:
    torch.manual_seed(0)
    with torch.device(device):
        model = FluxStack(s).to(dtype)
    with torch.no_grad():                 # small weights: keep bf16 activations finite
        for p in model.parameters():
            p.normal_(0, 0.02)
    return model.eval().requires_grad_(False)


def stack_inputs(s: Shape, dtype, device):
    g = torch.Generator(device="cpu").manual_seed(1)
    x = torch.randn(1, s.tokens, s.hidden, generator=g).to(device, dtype)
    vec = torch.randn(1, s.hidden, generator=g).to(device, dtype)
    return x, vec


def rel_diff(out: torch.Tensor, ref: torch.Tensor) -> float:
    """max |out - ref| / max |ref|: 0 is bit-identical, ~1e-2 is bf16 rounding."""
    ref = ref.float()
    return float((out.float().to(ref.device) - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


def module_bytes(m: nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in list(m.parameters()) + list(m.buffers()))


# -- timing -------------------------------------------------------------------------------
def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_steps(fn: Callable[[], torch.Tensor], device, warmup: int, reps: int):
    """Median seconds of `reps` calls after `warmup` calls, each synchronized; and the
    last output."""
    out = None
    with torch.no_grad():
        for _ in range(warmup):
            out = fn()
        _sync(device)
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            out = fn()
            _sync(device)
            times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2], out


# -- host-to-device bandwidth -------------------------------------------------------------
PCIE_GT = {1: 2.5, 2: 5.0, 3: 8.0, 4: 16.0, 5: 32.0, 6: 64.0}


def nominal_link(index: int) -> Optional[dict]:
    """The PCIe link's nominal peak from nvidia-smi (gen and width), when it answers."""
    if not shutil.which("nvidia-smi"):
        return None
    try:
        text = subprocess.run(
            ["nvidia-smi", "-i", str(index), "--query-gpu=pcie.link.gen.current,"
             "pcie.link.width.current", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=20).stdout.strip()
        gen, width = (int(v) for v in text.split(","))
    except (ValueError, OSError, subprocess.SubprocessError):
        return None
    encoding = 128 / 130 if gen >= 3 else 0.8
    return {"gen": gen, "width": width,
            "bytes_per_s": PCIE_GT.get(gen, 0) * 1e9 * width / 8 * encoding}


def measure_h2d(device, nbytes: int, reps: int = 10) -> Dict[str, float]:
    """Bytes per second of host-to-device copies from pinned and from pageable memory:
    the best of `reps` copies of `nbytes` and of `nbytes // 4`, each into a preallocated
    device buffer after a warm-up copy. The best, because the streamed-step floor divides
    by it: a slow probe would let a step look faster than the link (seen: single probes
    of 1 GiB varied 52.8-55.0 GB/s on one H100)."""
    dst = torch.empty(nbytes, dtype=torch.uint8, device=device)
    out = {}
    for kind in ("pinned", "pageable"):
        src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=(kind == "pinned"))
        src.fill_(1)
        best = 0.0
        for n in (nbytes, nbytes // 4):
            dst[:n].copy_(src[:n], non_blocking=True)
            _sync(device)
            for _ in range(reps):
                t0 = time.perf_counter()
                dst[:n].copy_(src[:n], non_blocking=True)
                _sync(device)
                best = max(best, n / (time.perf_counter() - t0))
        out[kind] = best
        del src
    return out


# -- the ways to run a step ---------------------------------------------------------------
def one_device_plan(name: str, kind: str, capacity: int, depth: int) -> Plan:
    devices = [DevicePlan(name, kind, capacity, capacity, None)]
    comp = ComponentPlan("diffusion", [name], "cpu", stream=StreamPlan(0, depth))
    return Plan(devices, {"diffusion": comp})


def split_plan(names: List[str], capacity: int) -> Plan:
    """A layer split over `names`, ranges left to the split engine (equal budgets:
    equal shares of the bytes)."""
    devices = [DevicePlan(n, "gpu", capacity, capacity, capacity) for n in names]
    comp = ComponentPlan("diffusion", list(names), names[0])
    return Plan(devices, {"diffusion": comp})


class PerLayerCast:
    """ComfyUI core's low-VRAM style: each Linear's weight and bias are copied to the
    device when the layer runs (from pinned host memory, on a side stream the compute
    stream waits for), with no prefetch of the next block."""

    def __init__(self, model: nn.Module, device):
        self.device, self.handles = device, []
        self.side = torch.cuda.Stream(device) if device.type == "cuda" else None
        for m in model.modules():
            if isinstance(m, nn.Linear):
                for p in m.parameters():
                    p.data = p.data.pin_memory() if self.side is not None else p.data
                m.host = (m.weight.data, m.bias.data)
                self.handles.append(m.register_forward_pre_hook(self._pre))
                self.handles.append(m.register_forward_hook(self._post))

    def _pre(self, m, args):
        w, b = m.host
        if self.side is None:
            m.weight.data, m.bias.data = w.clone(), b.clone()
            return
        compute = torch.cuda.current_stream(self.device)
        with torch.cuda.stream(self.side):
            m.weight.data = w.to(self.device, non_blocking=True)
            m.bias.data = b.to(self.device, non_blocking=True)
        compute.wait_stream(self.side)
        # made on the side stream, read on the compute stream: without this the allocator
        # may hand the memory to the next copy while this layer still reads it
        m.weight.data.record_stream(compute)
        m.bias.data.record_stream(compute)

    @staticmethod
    def _post(m, args, out):
        m.weight.data, m.bias.data = m.host


def _diffusers_group_offload(model, device, record_stream: bool):
    try:
        from diffusers.hooks import apply_group_offloading
    except ImportError as exc:
        return f"diffusers not installed ({exc.name})"
    apply_group_offloading(model, onload_device=device, offload_device=torch.device("cpu"),
                           offload_type="block_level", num_blocks_per_group=1,
                           use_stream=True, record_stream=record_stream)
    return None


# -- the sections -------------------------------------------------------------------------
def cuda_tests() -> dict:
    tests = PACK / "tests" / "runtime" / "test_cuda.py"
    if not tests.exists():
        return {"status": "skipped", "why": "the pack's tests are not in this install"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           str(tests)], capture_output=True, text=True, cwd=PACK, timeout=600)
    last = (proc.stdout.strip().splitlines() or ["(no output)"])[-1]
    return {"status": "passed" if proc.returncode == 0 else "failed", "summary": last,
            "output": proc.stdout[-3000:] if proc.returncode else ""}


def window(fn, device, steps: int, settle: Optional[Callable[[], None]] = None):
    """Seconds per step of `steps` calls back to back (then `settle`, inside the time),
    and the last output."""
    out = None
    _sync(device)
    t0 = time.perf_counter()
    with torch.no_grad():
        for _ in range(steps):
            out = fn()
        if settle is not None:
            settle()
    _sync(device)
    return (time.perf_counter() - t0) / steps, out


def paired(fn, ref_fn, device, reps: int, settle: Optional[Callable[[], None]] = None,
           steps: int = 4):
    """Median seconds per step of `fn` and of `ref_fn`, measured alternately (after one
    warm-up each) so both see the same load, threads and caches; and fn's output.
    Without `settle`, `fn` runs twice in a row and the second call is timed. A streamed
    way gives `settle` (wait for the copies in flight): a timed window starts after one
    and ends with one, and runs `steps` steps back to back between. The copies issued
    ahead before the window (done by the first settle) are as many as those it issues
    ahead at its end (waited for by the second), so the window holds exactly `steps`
    steps' bytes over the link and its mean step can never fall below max(compute,
    transfer). The resident reference beside it is timed over a window of as many steps.
    (One step timed after a warm step gets the copies that step issued ahead for free: a
    ring holding every block measured 0.8 of the floor that way.)"""
    t_fn, t_ref, out = [], [], None
    for i in range(reps + 1):
        if settle is None:
            ta, _ = time_steps(ref_fn, device, 0, 1)
        else:                       # the reference over a window of as many steps
            ta, _ = window(ref_fn, device, steps)
        if settle is None:
            time_steps(fn, device, 0, 1)
            t, out = time_steps(fn, device, 0, 1)
        else:
            settle()
            t, out = window(fn, device, steps, settle)
        if i:
            t_ref.append(ta)
            t_fn.append(t)
    med = lambda v: sorted(v)[len(v) // 2]       # noqa: E731
    return med(t_fn), med(t_ref), out


def stream_comparison(shape: Shape, dtype, device, inventory, device_name: str,
                      link: Optional[Link], bandwidth: float, reps: int) -> dict:
    """One step of the stack, each way timed alternately with the all-resident step;
    each way's ratio is its step over max(the resident step measured beside it, the
    streamed bytes over the measured or modelled link)."""
    resident = build_stack(shape, dtype, device if device.type == "cuda" else "cpu")
    x, vec = stack_inputs(shape, dtype, device)
    step = lambda m: (lambda: m(x, vec))          # noqa: E731
    t_res, ref = time_steps(step(resident), device, 2, reps)
    nbytes = module_bytes(resident)
    transfer_s = nbytes / bandwidth
    rows = {"all resident": {"step_s": t_res}}

    def record(name, model, settle=None, **extra):
        t, t_ref, out = paired(step(model), step(resident), device, reps, settle)
        check = ({"equal_to_resident": bool(torch.equal(out, ref))} if extra.pop("exact", False)
                 else {"max_rel_diff": rel_diff(out, ref)})
        rows[name] = {"step_s": t, "resident_beside_s": t_ref,
                      "per_floor": t / max(t_ref, transfer_s), **check, **extra}

    # the depth auto-fit would plan (layout.choose_depth: double and single blocks do
    # equal compute per token, each block's copy takes its bytes over the link) beside
    # depths 1 and 2
    sizes = [module_bytes(resident.get_submodule(n)) for n in resident.block_names()]
    planner_depth, _ = choose_depth([t_res / len(sizes)] * len(sizes),
                                    [b / bandwidth for b in sizes], sizes)
    for depth in sorted({1, 2, planner_depth}):
        host = copy_to_cpu(resident)
        plan = one_device_plan(device_name, "gpu", 1 << 62, depth)
        options = {"link": link} if link is not None else {}
        with place(host, plan, "diffusion", inventory, blocks=host.block_names(),
                   **options) as placed:
            time_steps(step(host), device, 2, 1)
            record(f"pack engine, streamed, depth {depth}", host, exact=True,
                   settle=placed.streamer.drain)
            stats = placed.stats()
        rows[f"pack engine, streamed, depth {depth}"].update(
            h2d_bytes=stats["devices"][device_name].get("h2d_bytes", 0),
            pinned_bytes=stats.get("pinned_bytes", 0), planner_depth=depth == planner_depth)
        # the host copy sits in reference cycles (its hooks): collect it now, or the next
        # depth pins beside its pinned buffers (pinned_bytes is process-wide; an H100 run
        # read 2x the weights at depth 2 without this)
        del host
        gc.collect()

    if device.type == "cuda":
        host = copy_to_cpu(resident)
        cast = PerLayerCast(host, device)
        try:
            record("per-layer cast (ComfyUI core style)", host)
        finally:
            for h in cast.handles:
                h.remove()
        del host, cast
        gc.collect()
        # diffusers' default (record_stream=False) and with record_stream=True: its
        # prefetched weights are made on a side stream and read on the compute stream
        for record_stream in (False, True):
            name = f"diffusers group offload, use_stream{', record_stream' * record_stream}"
            host = copy_to_cpu(resident)
            why = _diffusers_group_offload(host, device, record_stream)
            if why is None:
                record(name, host)
            else:
                rows[name] = {"skipped": why}
            del host
            gc.collect()
    return {"shape": {**shape.__dict__, "tokens": shape.tokens}, "planner_depth": planner_depth,
            "dtype": str(dtype).replace("torch.", ""), "weights_bytes": nbytes,
            "resident_step_s": t_res, "transfer_s": transfer_s,
            "floor_s": max(t_res, transfer_s), "rows": rows}


def working_memory(shape: Shape, dtype, device) -> dict:
    """One resident step's working memory: rehearsed on the meta device (rehearse.py,
    what the simulated device meters) beside, on CUDA, the caching allocator's peak above
    what was allocated before the step (weights and inputs): the gap is what the
    planner's workspace reserve must cover."""
    model = build_stack(shape, dtype, device)
    x, vec = stack_inputs(shape, dtype, device)
    out = {"rehearsed_bytes": rehearse(model, (x, vec))}
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        model(x, vec)                      # its output counts in the peak, then goes
        torch.cuda.synchronize(device)
        out["allocator_peak_bytes"] = torch.cuda.max_memory_allocated(device) - before
        out["reserved_peak_bytes"] = torch.cuda.max_memory_reserved(device)
    del model
    gc.collect()
    return out


def copy_to_cpu(model: nn.Module) -> nn.Module:
    """An independent copy of `model` whose weights rest in host memory (on CUDA, a
    second device copy exists for a moment)."""
    import copy
    return copy.deepcopy(model).to("cpu").eval()


def layer_split(inventory, names: List[str], device, shape: Shape, dtype, reps: int) -> dict:
    if len(names) < 2:
        return {"skipped": f"a layer split needs two GPUs; {len(names)} present"}
    model = build_stack(shape, dtype, "cpu")
    x, vec = stack_inputs(shape, dtype, device)
    first = inventory.get(names[0]).torch_device
    ref_model = build_stack(shape, dtype, first or "cpu")
    _, ref = time_steps(lambda m=ref_model: m(x, vec), device, 1, 1)
    del ref_model
    plan = split_plan(names, 1 << 40)
    with place(model, plan, "diffusion", inventory, blocks=model.block_names()) as placed:
        t, out = time_steps(lambda: model(x, vec), device, 2, reps)
        stats = placed.stats()
    return {"devices": names, "step_s": t, "hops": stats.get("hops", 0),
            "hop_bytes": stats.get("hop_bytes", 0),
            "max_rel_diff": rel_diff(out, ref)}


def run_selftest(json_path: Optional[str] = None, reps: int = 5,
                 run_tests: bool = True, cpu: bool = False) -> dict:
    """cpu: the CPU part even where CUDA is present."""
    use_cuda = torch.cuda.is_available() and not cpu
    report = {"python": platform.python_version(), "torch": torch.__version__,
              "cuda": use_cuda}
    torch.set_grad_enabled(False)
    if use_cuda:
        inventory = Inventory.detect()
        gpus = [d.name for d in inventory.devices if d.kind == "gpu"
                and (d.torch_device or "").startswith("cuda")]
        device = torch.device(inventory.get(gpus[0]).torch_device)
        report["devices"] = [{"name": n, "description": inventory.get(n).description}
                             for n in gpus]
        report["cuda_tests"] = cuda_tests() if run_tests else {"status": "not run"}
        bw = measure_h2d(device, 1 << 30)
        report["h2d"] = {**bw, "nominal": nominal_link(device.index or 0)}
        report["stream"] = stream_comparison(FLUX, torch.bfloat16, device, inventory, gpus[0],
                                             None, bw["pinned"], reps)
        report["layer_split"] = layer_split(inventory, gpus, device, FLUX, torch.bfloat16,
                                            reps)
        report["working_memory"] = working_memory(FLUX, torch.bfloat16, device)
    else:
        # the CPU part: a simulated device whose link moves a block in about the time
        # one computes (transfer at compute: the hardest case for overlap)
        shape, device = CPU, torch.device("cpu")
        probe = build_stack(shape, torch.float32, "cpu")
        x, vec = stack_inputs(shape, torch.float32, device)
        t_res, _ = time_steps(lambda: probe(x, vec), device, 2, reps)
        link = Link(bandwidth=module_bytes(probe) / t_res, latency=0.0)
        del probe
        inventory = Inventory.simulated("cuda0=8GiB,cuda1=8GiB")
        report["cuda_tests"] = {"status": "skipped", "why": "no CUDA device" if not cpu
                                else "--cpu asked for the CPU part"}
        report["h2d"] = {"simulated_link_bytes_per_s": link.bandwidth}
        report["stream"] = stream_comparison(shape, torch.float32, device, inventory, "cuda0",
                                             link, link.bandwidth, reps)
        report["layer_split"] = layer_split(inventory, ["cuda0", "cuda1"], device, shape,
                                            torch.float32, reps)
        report["working_memory"] = working_memory(shape, torch.float32, device)
    print(format_report(report))
    if json_path:
        Path(json_path).write_text(json.dumps(report, indent=2))
    return report


def format_report(r: dict) -> str:
    gbs = lambda v: f"{v / 1e9:.1f} GB/s"     # noqa: E731
    lines = [f"placement selftest: python {r['python']}, torch {r['torch']}, "
             f"{'CUDA' if r['cuda'] else 'no CUDA (CPU part, simulated device)'}"]
    for d in r.get("devices", []):
        lines.append(f"  {d['name']}: {d['description']}")
    t = r["cuda_tests"]
    lines.append(f"CUDA tests: {t['status']} {t.get('summary', t.get('why', ''))}".rstrip())
    h = r["h2d"]
    if "pinned" in h:
        nom = h.get("nominal")
        peak = (f" of nominal {gbs(nom['bytes_per_s'])} (PCIe gen{nom['gen']} x{nom['width']})"
                if nom else "")
        lines.append(f"host->device: pinned {gbs(h['pinned'])}, pageable {gbs(h['pageable'])}"
                     f"{peak}")
    else:
        lines.append(f"host->device: simulated link {gbs(h['simulated_link_bytes_per_s'])} "
                     f"(set so one block's copy takes about its compute)")
    s = r["stream"]
    sh = s["shape"]
    lines.append(f"one step, {sh['double']} double + {sh['single']} single blocks, hidden "
                 f"{sh['hidden']}, {sh['tokens']} tokens, {s['dtype']}, "
                 f"{format_bytes(s['weights_bytes'])} of weights")
    lines.append(f"  all weights over the link: {s['transfer_s'] * 1e3:.1f} ms; each way is timed "
                 f"alternately with the all-resident step")
    lines.append(f"  {'way':<46} {'step ms':>8} {'resident':>9} {'/ floor':>8}  check")
    for name, row in s["rows"].items():
        if "skipped" in row:
            lines.append(f"  {name:<46} {'-':>8} {'-':>9} {'-':>8}  skipped: {row['skipped']}")
            continue
        check = ("bit-identical" if row.get("equal_to_resident") else
                 "DIFFERS" if "equal_to_resident" in row else
                 f"max |diff| / max |ref| {row['max_rel_diff']:.2g}"
                 if "max_rel_diff" in row else "")
        beside = row.get("resident_beside_s", row["step_s"])
        ratio = f"{row['per_floor']:>8.2f}" if "per_floor" in row else f"{'-':>8}"
        mark = "  <- the planner's depth" if row.get("planner_depth") else ""
        lines.append(f"  {name:<46} {row['step_s'] * 1e3:>8.1f} {beside * 1e3:>9.1f} {ratio}  "
                     f"{check}{mark}".rstrip())
    lines.append("  / floor = step / max(resident step beside it, weights over the link)")
    ls = r["layer_split"]
    if "skipped" in ls:
        lines.append(f"layer split: skipped ({ls['skipped']})")
    else:
        lines.append(f"layer split over {'&'.join(ls['devices'])}: {ls['step_s'] * 1e3:.1f} ms "
                     f"per step, {ls['hops']} hops, {format_bytes(ls['hop_bytes'])} hopped, "
                     f"max |diff| / max |ref| vs one device {ls['max_rel_diff']:.2g}")
    wm = r.get("working_memory")
    if wm:
        line = f"working memory of one step: rehearsed on meta {format_bytes(wm['rehearsed_bytes'])}"
        if "allocator_peak_bytes" in wm:
            line += (f", CUDA allocator peak above the weights "
                     f"{format_bytes(wm['allocator_peak_bytes'])} "
                     f"({wm['allocator_peak_bytes'] / max(1, wm['rehearsed_bytes']):.2f}x)")
        lines.append(line)
    return "\n".join(lines)
