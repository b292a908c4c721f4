"""The workers a long-lived process (a ComfyUI server) has joined, kept while it runs.

A workflow names its workers as text (`w1=HOST:PORT,w2=HOST:PORT`); `join_workers(text)`
returns them as `Workers`: each reachable worker joined once per process (its own
Cluster, so one unreachable or lost worker never takes the others with it) and reused by
every later prompt, and one line for each worker that could not be joined. A worker
whose link broke (lost mid-run, or its heartbeat stopped) is dropped from the pool, so the
next call connects again or reports it unreachable. The secret comes from the
environment only (COMFYUI_PLACEMENT_SECRET): never from a workflow or a plan.
"""
import atexit
import hashlib
import threading
import time
from typing import Dict, List, Optional, Tuple

from ...placement.errors import PlacementError
from ...placement.remote_devices import parse_workers, split_name
from .auth import DEFAULT_SECRET_ENV, secret_from_env
from .cluster import Cluster, RemoteDevice

CONNECT_TIMEOUT_S = 5.0        # an unreachable worker costs a prompt at most this
STEP_TIMEOUT_S = 120.0         # one step's exchange with a worker, compute included
LOAD_TIMEOUT_S = 600.0         # a worker reading its range from its disk

# a worker that could not be joined is not asked again for this long: queueing a prompt
# validates it, then executes it, and each would wait on the same dead address
RETRY_AFTER_S = 10.0

_lock = threading.Lock()
_joined: Dict[Tuple[str, str, int, str], Cluster] = {}
_refused: Dict[Tuple[str, str, int, str], Tuple[float, str]] = {}


class Workers:
    """The workers one workflow names: joined ones (alias -> Cluster) and the lines of
    those that could not be joined (alias -> why). Indexing by a remote device name
    (`workers["w1.cuda0"]`) is what runtime/distributed/planned.py asks of a cluster."""

    def __init__(self, text: str, joined: Dict[str, Cluster], unreachable: Dict[str, str]):
        self.text, self.joined, self.unreachable = text, joined, unreachable

    def __getitem__(self, name: str) -> RemoteDevice:
        alias, _ = split_name(name)
        if alias in self.unreachable:
            raise PlacementError(self.unreachable[alias])
        cluster = self.joined.get(alias)
        if cluster is None:
            raise PlacementError(f"no worker {alias!r}; workers: "
                                 f"{', '.join(self.joined) or 'none joined'}")
        return cluster[name]

    def devices(self) -> list:
        """Inventory entries of every joined worker's devices (w1.cpu, w1.cuda0, ...)."""
        out = []
        for cluster in self.joined.values():
            out += cluster.devices()
        return out

    def lines(self) -> List[str]:
        """One line per worker: joined with its devices, or why it is not."""
        out = []
        for alias, cluster in self.joined.items():
            link = cluster.links[alias]
            names = ", ".join(f"{alias}.{d['name']}" for d in link.devices)
            out.append(f"worker {alias} ({link.host}:{link.port}) joined: {names}")
        out += list(self.unreachable.values())
        return out

    def __bool__(self) -> bool:
        return bool(self.joined or self.unreachable)


def _secret_key(secret: bytes) -> str:
    return hashlib.sha256(secret).hexdigest()[:16]


def _alive(cluster: Cluster) -> bool:
    return all(link.broken is None for link in cluster.links.values())


def join_workers(text: str, secret: Optional[bytes] = None,
                 secret_env: str = DEFAULT_SECRET_ENV,
                 connect_timeout_s: float = CONNECT_TIMEOUT_S) -> Workers:
    """The workers `text` names, joined (or reused) for this process. Bad text is a
    PlacementError; a worker that cannot be joined is a line in `unreachable`."""
    text = str(text or "").strip()
    if not text:
        return Workers("", {}, {})
    addresses = parse_workers(text)
    try:
        secret = secret if secret is not None else secret_from_env(secret_env)
    except PlacementError as exc:
        return Workers(text, {}, {alias: f"worker {alias} ({host}:{port}) not joined: {exc}"
                                  for alias, (host, port) in addresses.items()})
    joined: Dict[str, Cluster] = {}
    unreachable: Dict[str, str] = {}
    with _lock:
        for alias, (host, port) in addresses.items():
            key = (alias, host, port, _secret_key(secret))
            cluster = _joined.get(key)
            if cluster is not None and not _alive(cluster):
                _joined.pop(key).close()          # lost earlier: connect again
                cluster = None
            if cluster is None:
                seen = _refused.get(key)
                if seen is not None and time.monotonic() - seen[0] < RETRY_AFTER_S:
                    unreachable[alias] = seen[1]
                    continue
                try:
                    cluster = Cluster({alias: f"{host}:{port}"}, secret=secret,
                                      timeout_s=STEP_TIMEOUT_S,
                                      connect_timeout_s=connect_timeout_s,
                                      load_timeout_s=LOAD_TIMEOUT_S)
                except PlacementError as exc:
                    unreachable[alias] = f"{exc}".splitlines()[0]
                    _refused[key] = (time.monotonic(), unreachable[alias])
                    continue
                _refused.pop(key, None)
                _joined[key] = cluster
            joined[alias] = cluster
    return Workers(text, joined, unreachable)


def forget(workers: Workers) -> None:
    """Close and drop the workers whose link broke (called after a failed run, so the
    worker is free for the next main process at once)."""
    with _lock:
        for key, cluster in list(_joined.items()):
            if cluster in workers.joined.values() and not _alive(cluster):
                _joined.pop(key)
                cluster.close()


@atexit.register
def close_all() -> None:
    """Leave every worker (it drops its ranges and serves the next main)."""
    with _lock:
        _refused.clear()
        while _joined:
            _joined.popitem()[1].close()
