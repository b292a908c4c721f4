"""`python -m comfyui_placement calibrate`: measure the speeds the auto-fit cost model uses.

On every device of the detected inventory: dense matmul throughput per dtype (bf16, fp16,
fp32, fp8 through torch._scaled_mm where the device runs it), host-to-device bandwidth
from pinned and pageable memory (runtime/selftest.measure_h2d), device-to-device between
every pair of GPUs (peer when torch says the pair can access each other, else through
host memory), and the read bandwidth of the model folders. The figures are saved per
machine by placement/machine_figures; docs/calibration.md says what each one measures.
"""
import os
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional

import torch

from ...placement.machine_figures import figures_path, save_measurements
from ...placement.units import MiB, format_bytes
from .selftest import _sync, measure_h2d, time_steps

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
# Square matmul sizes: large enough to reach a GPU's steady throughput; on the CPU small
# enough that one product takes well under a second even in a slow dtype.
SIZES = {"cuda": 8192, "cpu": 1024}
QUICK_SIZES = {"cuda": 4096, "cpu": 512}
TIME_BUDGET_S = {"cuda": 0.5, "cpu": 1.0}       # per dtype, after the first product
DISK_BYTES, QUICK_DISK_BYTES = 512 * MiB, 64 * MiB
H2D_BYTES, QUICK_H2D_BYTES = 256 * MiB, 64 * MiB
READ_CHUNK = 4 * MiB


def format_flops(value: float) -> str:
    return f"{value / 1e12:.2f} TFLOP/s" if value >= 1e12 else f"{value / 1e9:.1f} GFLOP/s"


def _say(progress: Optional[Callable[[str], None]], text: str) -> None:
    if progress:
        progress(text)


# -- matmul throughput --------------------------------------------------------------------
def _operands(device, dtype_name: str, n: int):
    """A function computing one n x n x n product in `dtype_name` on `device`. fp8 runs
    torch._scaled_mm with unit scales into bf16, as an fp8 checkpoint's linear layers do."""
    gen = torch.Generator(device=device).manual_seed(0)
    if dtype_name == "fp8":
        a = torch.randn(n, n, device=device, generator=gen).to(torch.float8_e4m3fn)
        b = torch.randn(n, n, device=device, generator=gen).to(torch.float8_e4m3fn).t()
        one = torch.ones((), device=device)
        return lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one,
                                        out_dtype=torch.bfloat16)
    dtype = DTYPES[dtype_name]
    a = torch.randn(n, n, device=device, generator=gen, dtype=dtype)
    b = torch.randn(n, n, device=device, generator=gen, dtype=dtype)
    return lambda: a @ b


def _once(product, device) -> float:
    start = time.perf_counter()
    with torch.no_grad():
        product()
        _sync(device)
    return max(time.perf_counter() - start, 1e-9)


def matmul_throughput(device: torch.device, dtype_name: str, n: int, budget_s: float):
    """(FLOP/s, n): n x n x n products (2 n^3 FLOP), the median of as many as fit in
    `budget_s` (at least 3) after one warm-up. A dtype the device runs slowly (fp16 on
    many CPUs) is measured at a smaller n, found by a 128^3 probe (best of 3), so that one product
    takes at most a quarter of the budget: the run stays within seconds."""
    probe_n = min(n, 128)
    probe = _operands(device, dtype_name, probe_n)
    rate = 2.0 * probe_n ** 3 / min(_once(probe, device) for _ in range(3))
    while n > probe_n and 2.0 * n ** 3 / rate > budget_s / 4:
        n //= 2
    product = _operands(device, dtype_name, n)
    first = _once(product, device)
    reps = max(3, min(50, int(budget_s / first)))
    seconds, _ = time_steps(product, device, warmup=0, reps=reps)
    return 2.0 * n ** 3 / seconds, n


def throughput_table(device: torch.device, quick: bool, progress=None, sizes=None):
    """{dtype: FLOP/s, or a string saying why it was not measured}; `sizes` gets the n
    each dtype was measured at."""
    kind = "cuda" if device.type == "cuda" else "cpu"
    n = (QUICK_SIZES if quick else SIZES)[kind]
    out: Dict[str, object] = {}
    for name in ("bf16", "fp16", "fp32", "fp8"):
        if name == "fp8" and device.type == "cuda" and \
                torch.cuda.get_device_capability(device) < (8, 9):
            out[name] = "not supported (fp8 matmul needs compute capability 8.9+)"
            continue
        try:
            flops, used = matmul_throughput(device, name, n, TIME_BUDGET_S[kind])
        except (RuntimeError, NotImplementedError, TypeError, AttributeError) as exc:
            out[name] = f"not supported: {str(exc).splitlines()[0][:120]}"
            _say(progress, f"  {name}: {out[name]}")
            continue
        out[name] = flops
        if sizes is not None:
            sizes[name] = used
        _say(progress, f"  {name}: {format_flops(flops)} ({used}x{used} matmul)")
    return out


# -- device to device ---------------------------------------------------------------------
def device_to_device(a: int, b: int, nbytes: int, reps: int = 5) -> dict:
    """Bytes/s of copies from cuda:a to cuda:b: best of `reps` after a warm-up."""
    peer = torch.cuda.can_device_access_peer(a, b)
    src = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{a}").fill_(1)
    dst = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{b}")
    dst.copy_(src)
    best = 0.0
    for _ in range(reps):
        torch.cuda.synchronize(a)
        torch.cuda.synchronize(b)
        t0 = time.perf_counter()
        dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize(a)
        torch.cuda.synchronize(b)
        best = max(best, nbytes / (time.perf_counter() - t0))
    return {"bytes_per_s": best, "how": "peer" if peer else "through host"}


# -- disk ---------------------------------------------------------------------------------
def default_model_folders() -> List[Path]:
    """ComfyUI's models folder when the pack sits in ComfyUI/custom_nodes, the one of
    the folder the command runs from (ComfyUI's own, as its README has users do), plus
    $COMFYUI_PATH/models; else the temporary folder (said in the result)."""
    pack = Path(__file__).resolve().parents[1]
    found = []
    for root in (pack.parents[1], Path.cwd(),
                 Path(os.environ.get("COMFYUI_PATH", "") or "/nonexistent")):
        folder = root / "models"
        if folder.is_dir() and folder.resolve() not in found:
            found.append(folder.resolve())
    return found


def disk_read(folder: Path, nbytes: int) -> dict:
    """Sequential read bandwidth of a temporary file in `folder`: written, fsynced, its
    pages dropped from the page cache with posix_fadvise(DONTNEED) where the platform has
    it (a cold read, as a model's first load), then read in 4 MiB pieces. Without
    fadvise the read is warm and only an upper bound: `cold` says which."""
    import tempfile
    fd, path = tempfile.mkstemp(prefix=".placement-calibrate-", dir=str(folder))
    try:
        block = os.urandom(READ_CHUNK)
        with os.fdopen(fd, "wb") as fh:
            for _ in range(max(1, nbytes // READ_CHUNK)):
                fh.write(block)
            fh.flush()
            os.fsync(fh.fileno())
        size = os.path.getsize(path)
        cold = hasattr(os, "posix_fadvise")
        rfd = os.open(path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
        try:
            if cold:
                os.posix_fadvise(rfd, 0, 0, os.POSIX_FADV_DONTNEED)
            buf = bytearray(READ_CHUNK)
            view = memoryview(buf)
            t0 = time.perf_counter()
            with os.fdopen(rfd, "rb", buffering=0, closefd=False) as fh:
                while fh.readinto(view):
                    pass
            seconds = time.perf_counter() - t0
        finally:
            os.close(rfd)
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass
    return {"bytes_per_s": size / max(seconds, 1e-9), "bytes": size, "cold": cold,
            "how": ("cold read (page cache dropped with posix_fadvise DONTNEED after fsync)"
                    if cold else "warm read (this platform cannot drop the page cache): an "
                                 "upper bound")}


# -- the whole run ------------------------------------------------------------------------
def calibrate(inventory, folders: Optional[List[str]] = None, quick: bool = False,
              progress: Optional[Callable[[str], None]] = None) -> dict:
    """Measure every figure; returns the record machine_figures saves."""
    record: dict = {"quick": quick, "devices": {}, "peer": {}, "disk": {}, "notes": []}
    for dev in inventory.devices:
        if dev.torch_device is None:
            continue
        device = torch.device(dev.torch_device)
        if device.type not in ("cuda", "cpu"):
            record["notes"].append(f"{dev.name}: {device.type} devices are not measured yet")
            continue
        _say(progress, f"{dev.name} ({dev.description}): matmul throughput")
        sizes: Dict[str, int] = {}
        entry = {"description": dev.description, "total_bytes": dev.total_bytes,
                 "throughput_flops": throughput_table(device, quick, progress, sizes),
                 "matmul_n": sizes}
        if device.type == "cuda":
            _say(progress, f"{dev.name}: host-to-device bandwidth")
            h2d = measure_h2d(device, QUICK_H2D_BYTES if quick else H2D_BYTES)
            entry["h2d_bytes_per_s"] = h2d
            _say(progress, f"  pinned {h2d['pinned'] / 1e9:.1f} GB/s, pageable "
                           f"{h2d['pageable'] / 1e9:.1f} GB/s")
            torch.cuda.empty_cache()
        record["devices"][dev.name] = entry
    cuda = [d for d in inventory.devices if (d.torch_device or "").startswith("cuda:")]
    if len(cuda) < 2:
        record["notes"].append(f"{len(cuda)} CUDA GPU(s): device-to-device not measured "
                               f"(needs 2)")
    for a in cuda:
        for b in cuda:
            if a is b:
                continue
            _say(progress, f"{a.name} -> {b.name}: device-to-device")
            ia, ib = int(a.torch_device.split(":")[1]), int(b.torch_device.split(":")[1])
            got = device_to_device(ia, ib, QUICK_H2D_BYTES if quick else H2D_BYTES)
            record["peer"][f"{a.name}->{b.name}"] = got
            _say(progress, f"  {got['bytes_per_s'] / 1e9:.1f} GB/s ({got['how']})")
    paths = [Path(f) for f in folders] if folders else default_model_folders()
    if not paths:
        import tempfile
        paths = [Path(tempfile.gettempdir())]
        record["notes"].append(f"no model folder found (give --folder DIR): measured the "
                               f"temporary folder {paths[0]} instead")
    for folder in paths:
        if not folder.is_dir():
            record["notes"].append(f"{folder}: not a folder, not measured")
            continue
        nbytes = QUICK_DISK_BYTES if quick else DISK_BYTES
        _say(progress, f"{folder}: disk read of a {format_bytes(nbytes)} temporary file")
        try:
            got = disk_read(folder, nbytes)
        except OSError as exc:
            record["notes"].append(f"{folder}: not measured ({exc.strerror or exc})")
            continue
        record["disk"][str(folder)] = got
        _say(progress, f"  {got['bytes_per_s'] / 1e9:.2f} GB/s ({got['how']})")
    return record


def network(cluster, quick: bool = False, progress=None) -> dict:
    """{alias: link figures} for each worker of a joined Cluster
    (runtime/distributed/probe.py), with the worker's machine id when it sent one."""
    from ..distributed.probe import measure_link
    out = {}
    for alias, link in cluster.links.items():
        _say(progress, f"{link.where}: network round trips")
        got = measure_link(link, cluster.timeout_s, quick)
        # saved per worker machine (placement/worker_figures.py): another alias for it
        # keeps the link
        got.update(address=f"{link.host}:{link.port}",
                   measured_at=time.strftime("%Y-%m-%d %H:%M", time.localtime()),
                   **({"machine": link.machine} if link.machine else {}))
        out[alias] = got
        _say(progress, f"  {got['bytes_per_s'] / 1e9:.2f} GB/s each way, "
                       f"{got['latency_s'] * 1e3:.2f} ms per crossing")
    return out


def run_calibrate(inventory, folders=None, quick=False, progress=None, save=True,
                  workers: Optional[str] = None, secret_env: Optional[str] = None) -> dict:
    """Measure, save for this machine, and return {'record', 'path'}. `workers`
    ("w1=HOST:PORT,..."): also the network link to each, joined first (with the shared
    secret from the environment) so a worker that cannot be reached fails at once;
    saved per worker machine, and links not measured now keep their figures."""
    from contextlib import nullcontext
    cluster = nullcontext()
    if workers:
        from ..distributed.auth import DEFAULT_SECRET_ENV
        from ..distributed.cluster import Cluster
        cluster = Cluster(workers, secret_env=secret_env or DEFAULT_SECRET_ENV)
    with cluster as joined:
        record = calibrate(inventory, folders, quick, progress)
        if joined is not None:
            record["network"] = network(joined, quick, progress)
    path = save_measurements(inventory, record) if save else None
    return {"record": record, "path": str(path) if path else None}


def format_record(record: dict) -> str:
    lines = ["device    figure                         value"]
    for name, dev in record["devices"].items():
        for dtype, value in dev["throughput_flops"].items():
            shown = format_flops(value) if isinstance(value, float) else value
            lines.append(f"{name:9s} matmul {dtype:<23s} {shown}")
        for how, value in (dev.get("h2d_bytes_per_s") or {}).items():
            lines.append(f"{name:9s} host->device {how:<17s} {value / 1e9:.2f} GB/s")
    for pair, got in record["peer"].items():
        lines.append(f"{pair:<20s} device->device {got['bytes_per_s'] / 1e9:.2f} GB/s "
                     f"({got['how']})")
    for folder, got in record["disk"].items():
        lines.append(f"disk read {got['bytes_per_s'] / 1e9:.2f} GB/s  {folder}  ({got['how']})")
    for alias, got in (record.get("network") or {}).items():
        lines.append(f"{alias:9s} network {got['bytes_per_s'] / 1e9:.2f} GB/s each way, "
                     f"{got['latency_s'] * 1e3:.2f} ms per crossing ({got['how']})")
    lines += [f"note: {n}" for n in record["notes"]]
    return "\n".join(lines)


__all__ = ["calibrate", "run_calibrate", "matmul_throughput", "disk_read", "format_record",
           "figures_path"]
