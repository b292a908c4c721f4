"""`calibrate` and the what-if speed flags of `plan` (docs/calibration.md).

`python -m comfyui_placement calibrate [--json] [--quick] [--folder DIR]` measures this
machine (runtime/machine/calibrate.py, torch imported only then) and saves the figures in the
user's cache folder; `plan --auto-fit` on the detected inventory then uses them.
"""
import json
import sys

from .placement.errors import PlacementError
from .placement.units import parse_bandwidth, parse_figure_list, parse_throughput


def add_calibrate_parser(sub) -> None:
    c = sub.add_parser("calibrate", help="measure this machine's matmul throughput, host/"
                       "device/disk bandwidths and save them for auto-fit's cost model")
    c.add_argument("--json", action="store_true", help="print the figures as JSON")
    c.add_argument("--quick", action="store_true", help="smaller probes: seconds, noisier")
    c.add_argument("--folder", action="append", metavar="DIR",
                   help="a model folder whose disk read bandwidth to measure (repeat); "
                        "default: ComfyUI's models folder")
    c.add_argument("--no-save", action="store_true", help="measure and print only")
    c.add_argument("--workers", metavar="ALIAS=HOST:PORT", help="also measure the network "
                   "link to these workers (python -m comfyui_placement worker), e.g. "
                   "w1=10.0.0.2:7860,w2=10.0.0.3:7860; joins with the shared secret")
    c.add_argument("--secret-env", metavar="NAME", help="the variable holding the workers' "
                   "secret (default COMFYUI_PLACEMENT_SECRET)")


def add_speed_flags(p) -> None:
    p.add_argument("--throughput", metavar="DEV=FLOPS", help="what-if compute speed per "
                   "device or kind, e.g. cuda0=165T,cpu=1T (replaces measured figures)")
    p.add_argument("--bandwidth", metavar="DEV=B/s", help="what-if host-to-device bandwidth, "
                   "e.g. cuda0=25GB/s")
    p.add_argument("--disk-bandwidth", metavar="B/s", help="what-if disk read, e.g. 3GB/s")
    p.add_argument("--peer-bandwidth", metavar="B/s", help="what-if GPU-to-GPU, e.g. 50GB/s")
    p.add_argument("--network-bandwidth", metavar="B/s", help="the link to remote workers "
                   "(devices ALIAS.DEVICE): one figure, or ALIAS=B/s entries, e.g. "
                   "1.25GB/s (10 GbE) or w1=12.5GB/s,w2=1.25GB/s")


def speed_options(args) -> dict:
    """FitOptions fields for the speed flags that were given (only auto-fit predicts time)."""
    out = {}
    if args.throughput:
        out["throughput"] = parse_figure_list(args.throughput, parse_throughput, "--throughput")
    if args.bandwidth:
        out["bandwidth"] = parse_figure_list(args.bandwidth, parse_bandwidth, "--bandwidth")
    if args.disk_bandwidth:
        out["disk_bandwidth"] = parse_bandwidth(args.disk_bandwidth, "--disk-bandwidth")
    if args.peer_bandwidth:
        out["peer_bandwidth"] = parse_bandwidth(args.peer_bandwidth, "--peer-bandwidth")
    if getattr(args, "network_bandwidth", None):
        out["network_bandwidth"] = parse_network(args.network_bandwidth)
    if out and not args.auto_fit:
        flags = ", ".join("--" + k.replace("_", "-") for k in out)
        raise PlacementError(f"{flags} need{'s' if len(out) == 1 else ''} --auto-fit (only "
                             f"auto-fit predicts times)")
    return out


def parse_network(text: str):
    """'1.25GB/s' (every worker) or 'w1=12.5GB/s,w2=1.25GB/s' (per worker alias)."""
    if "=" not in str(text):
        return parse_bandwidth(text, "--network-bandwidth")
    out = {}
    for item in str(text).split(","):
        alias, eq, value = item.strip().partition("=")
        alias = alias.strip().lower()
        if not eq or not alias or "." in alias:
            raise PlacementError(f"invalid --network-bandwidth entry {item.strip()!r}; "
                                 f"expected B/s, or ALIAS=B/s entries separated by commas "
                                 f"(e.g. w1=12.5GB/s)")
        out[alias] = parse_bandwidth(value, "--network-bandwidth value")
    return out


def run_calibrate_command(args, inventory) -> int:
    from .runtime.machine.calibrate import format_record, run_calibrate
    progress = (lambda text: print(text, file=sys.stderr, flush=True))
    result = run_calibrate(inventory, args.folder, quick=args.quick, progress=progress,
                           save=not args.no_save, workers=args.workers,
                           secret_env=args.secret_env)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(format_record(result["record"]))
        print(f"saved to {result['path']}" if result["path"] else "not saved (--no-save)")
    return 0
