"""The plan's account of every figure it priced a worker with: per worker device its
throughput, host link and free memory, per worker its network link, each with where it
came from in words (calibrated on the worker, a simulated what-if, given to the planner,
measured from this machine, or the default for its kind). An auto-fit plan with worker
devices carries it as `worker_figures` (JSON) and prints it under "worker figures:"."""
from typing import List

from .fit.costs import DEFAULT_NETWORK_BANDWIDTH
from .remote_devices import CALIBRATED, DEFAULT, SIMULATED, is_remote
from .units import format_bytes


def worker_figures(inventory, cost_model: dict, options: dict, measured) -> dict:
    """{"devices": {w1.cuda0: figures and sources}, "links": {w1: bytes/s and source}}
    for the remote devices of `inventory`; {} without any. `cost_model`: the plan's
    fit.cost_model (what was priced); `options`: the fit options given (--throughput,
    --bandwidth, --network-bandwidth); `measured`: the Figures the fit read."""
    remote = [d for d in inventory.devices if is_remote(d.name)]
    if not remote:
        return {}
    flops = cost_model.get("throughput_flops") or {}
    links = cost_model.get("bandwidth_bytes_per_s") or {}
    sources = cost_model.get("sources") or {}
    devices, aliases = {}, {}
    for d in remote:
        aliases.setdefault(d.name.partition(".")[0], d)
        devices[d.name] = {
            "throughput_flops": flops.get(d.name),
            "throughput_source": _source(d, "throughput", sources, options),
            "bandwidth_bytes_per_s": links.get(d.name),
            "bandwidth_source": _source(d, "bandwidth", sources, options),
            "free_bytes": d.free_bytes,
            "free_source": d.free_measured and f"measured {d.free_measured}"
            or "as the worker reported when the main joined (it answers no refresh)",
            "machine": d.machine}
    return {"devices": devices,
            "links": {a: _link(a, cost_model, options, measured) for a in aliases}}


def _source(d, what: str, sources: dict, options: dict) -> str:
    """Where the fit's figure came from (fit/costs._pick's order), in words."""
    given = options.get(what) or {}
    src = (sources.get(what) or {}).get(d.name)
    own = getattr(d, what)
    if src == "given":
        if d.name in given:
            return f"given to the planner (--{what} {d.name}=...)"
        if own is not None:
            return SIMULATED
        return f"given to the planner for its kind (--{what} {d.kind}=...)"
    if src == "measured":
        when = f", saved {d.measured_at}" if d.measured_at else ""
        return f"{CALIBRATED}{when}"
    if src == "default":
        why = "the worker's --simulate gives none" if d.simulated else \
            "not calibrated on the worker"
        return f"{DEFAULT}, {why}"
    return "not priced"


def _link(alias: str, cost_model: dict, options: dict, measured) -> dict:
    given = options.get("network_bandwidth")
    priced = cost_model.get("network_bandwidth_bytes_per_s") or {}
    value = priced.get(alias) or priced.get("*") or DEFAULT_NETWORK_BANDWIDTH
    if (alias in given) if isinstance(given, dict) else given is not None:
        source = "given to the planner (--network-bandwidth)"
    else:
        source = (getattr(measured, "network_sources", None) or {}).get(alias) or (
            f"default, 10 GbE as seen: not measured to this worker; calibrate --workers "
            f"{alias}=HOST:PORT measures it")
    return {"bytes_per_s": value, "source": source}


def lines(plan) -> List[str]:
    """The report's "worker figures:" lines (placement/report.py wraps them)."""
    got = plan.extra.get("worker_figures") or {}
    out = []
    for name, f in (got.get("devices") or {}).items():
        flops, link = f.get("throughput_flops"), f.get("bandwidth_bytes_per_s")
        text = f"{name}: " + (f"{flops / 1e12:.3g} TFLOP/s" if flops else "throughput -")
        text += f" ({f.get('throughput_source')})"
        text += (f", {link / 1e9:.3g} GB/s from host ({f.get('bandwidth_source')})"
                 if link else "")
        text += f", {format_bytes(f['free_bytes'])} free ({f.get('free_source')})"
        out.append(text)
    for alias, f in (got.get("links") or {}).items():
        out.append(f"link to {alias}: {f['bytes_per_s'] / 1e9:.3g} GB/s ({f['source']})")
    return out
