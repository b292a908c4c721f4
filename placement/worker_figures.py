"""Figures of worker machines for the planner: the speeds each worker calibrated on its
own machine (sent in its hello: remote_devices.py) and the network link this machine
measured to it (`calibrate --workers`).

A network figure is saved per worker machine, under the machine id the worker sends
(placement/machine_identity.py): the same machine joined under another alias keeps its
link, another machine under an old alias never borrows it. Records saved before workers
sent an id are per alias, and are still read for that alias."""
from dataclasses import replace
from typing import Dict, Optional, Tuple

from .remote_devices import is_remote, valid_id

MACHINE_KEY = "machine:"


def merged_network(old: dict, measured: dict) -> dict:
    """A record's "network" after a calibrate run: `measured` ({alias: figures, with
    "machine" when the worker sent its id}) saved per machine ("machine:ID", the alias
    kept inside), else per alias; entries not measured now are kept, except an older
    per-alias entry for an alias measured now."""
    out = dict(old)
    for alias, got in measured.items():
        machine = valid_id(got.get("machine"))
        if machine:
            out.pop(alias, None)
            out[MACHINE_KEY + machine] = dict(got, alias=alias)
        else:
            out[alias] = dict(got)
    return out


def network_for(alias: str, machine: Optional[str],
                records: Dict[str, dict]) -> Optional[Tuple[float, str]]:
    """(bytes/s, where it came from) of the saved link to worker `alias`, whose machine
    id is `machine` (None: it sent none, or it is not joined); None: nothing saved."""
    got = records.get(MACHINE_KEY + machine) if machine else None
    if got is not None:
        return float(got["bytes_per_s"]), (
            f"measured by calibrate --workers to this worker's machine"
            f"{_as(got, alias)}{_when(got)}")
    got = records.get(alias)
    if got is not None and not valid_id(got.get("machine")):
        return float(got["bytes_per_s"]), (
            f"measured by calibrate --workers for alias {alias}{_when(got)} (an older "
            f"record, kept per alias: calibrate again to key it by the worker's machine)")
    if machine is None:          # a worker too old to send its id, or a simulated w1.cuda0
        for key, got in records.items():
            if key.startswith(MACHINE_KEY) and got.get("alias") == alias:
                return float(got["bytes_per_s"]), (
                    f"measured by calibrate --workers for alias {alias}{_when(got)} (the "
                    f"worker named no machine here)")
    return None


def _as(got: dict, alias: str) -> str:
    was = got.get("alias")
    return f", as {was}" if was and was != alias else ""


def _when(got: dict) -> str:
    return f", {got['measured_at']}" if got.get("measured_at") else ""


def with_workers(local, inventory, path=None):
    """`local` (this machine's Figures) with the workers' figures: each worker device's
    own calibrated speeds by its name (w1.cuda0), and the saved network link per worker
    alias, keyed as network_for finds it (its source in words in network_sources)."""
    remote = [d for d in getattr(inventory, "devices", []) if is_remote(d.name)]
    records = getattr(local, "network_records", {}) or {}
    out = replace(local, throughput=dict(local.throughput), bandwidth=dict(local.bandwidth),
                  network_bandwidth={}, network_sources={})
    machines: Dict[str, Optional[str]] = {}
    for d in remote:
        if d.measured_throughput:
            out.throughput[d.name] = float(d.measured_throughput)
        if d.measured_bandwidth:
            out.bandwidth[d.name] = float(d.measured_bandwidth)
        machines.setdefault(d.name.partition(".")[0], d.machine)
    # aliases of saved links no joined worker has: a plan may name them (--simulate
    # w1.cuda0=24GiB): the link measured under that alias, unless its machine is joined
    # under another alias
    joined = {m for m in machines.values() if m}
    for key, got in records.items():
        alias = got.get("alias") if key.startswith(MACHINE_KEY) else key
        if key[len(MACHINE_KEY):] in joined and key.startswith(MACHINE_KEY):
            continue
        if alias and alias not in machines:
            machines[str(alias)] = None
    for alias, machine in machines.items():
        got = network_for(alias, machine, records)
        if got is not None:
            out.network_bandwidth[alias], out.network_sources[alias] = got
    return out
