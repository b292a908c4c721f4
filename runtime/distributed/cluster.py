"""The main process's side of a distributed run (the Cluster): it connects to each
worker, proves the shared secret, hosts the group's store as rank 0, and calls block
ranges on workers. A worker that is lost or too slow gives one PlacementError, never a hang.

While the cluster is open a heartbeat thread pings every control socket that has been
quiet for a while (the worker drops a main process it has not heard from for its
--main-timeout, so one that vanished without closing frees the worker); a lock per link
keeps a ping from ever landing inside a request's frames."""
import contextlib
import secrets
import socket
import threading
import time
import weakref
from typing import Dict, List, Optional, Tuple, Union

import torch

from ...placement.errors import PlacementError
from ...placement.remote_devices import (parse_workers, remote_device_entries, split_name,
                                         valid_id)
from . import group as groups, wire
from .auth import DEFAULT_SECRET_ENV, main_handshake, secret_from_env


class WorkerLink:
    """One worker: its control socket, its rank in the group, what it reported."""

    def __init__(self, alias: str, host: str, port: int, sock: socket.socket, hello: dict,
                 heartbeat_s: float = 5.0):
        self.alias, self.host, self.port, self.sock = alias, host, port, sock
        self.devices: List[dict] = list(hello.get("devices") or [])
        self.machine = valid_id(hello.get("machine"))   # its network link is keyed by it
        # own_figures.py: what the worker measured since the main last reset its peaks
        self.peaks: Dict[str, Tuple[int, str]] = {}
        self._no_figures = False
        self.lock = threading.Lock()     # one exchange at a time on the control socket
        try:                             # ping well within the worker's --main-timeout
            heartbeat_s = min(heartbeat_s, float(hello["main_timeout_s"]) / 4)
        except (KeyError, TypeError, ValueError):
            pass
        self.heartbeat_s = max(heartbeat_s, 0.01)
        self._quiet_since = time.monotonic()
        self.rank = 0
        self.group = None
        self.backend = "gloo"
        self.broken: Optional[str] = None
        self._next_range = 0

    @property
    def where(self) -> str:
        return f"worker {self.alias} ({self.host}:{self.port})"

    def _lost(self, exc: Exception) -> PlacementError:
        self.broken = str(exc)
        try:
            self.sock.close()           # the worker sees EOF and stops serving us
        except OSError:
            pass
        return PlacementError(f"{self.where} lost: {exc}")

    def check(self) -> None:
        if self.broken is not None:
            raise PlacementError(f"{self.where} was lost earlier ({self.broken}); "
                                 f"connect again")

    def new_range_id(self) -> int:
        self._next_range += 1
        return self._next_range

    @contextlib.contextmanager
    def exchange(self):
        """Holds the control socket for one request and its answer (heartbeats wait)."""
        with self.lock:
            self.check()
            try:
                yield
            except wire.LinkLost as exc:
                raise self._lost(exc) from None
            finally:
                self._quiet_since = time.monotonic()

    def ping(self) -> None:
        """A heartbeat when one is due; skipped while a request holds the socket (the
        worker is busy answering it, not waiting). A failed one marks the link lost."""
        if not self.lock.acquire(blocking=False):
            return
        try:
            if self.broken is None and time.monotonic() - self._quiet_since >= self.heartbeat_s:
                if _spoke_unasked(self.sock):
                    raise wire.LinkLost("the worker closed the connection")
                self.sock.settimeout(self.heartbeat_s)
                wire.send_message(self.sock, {"op": "ping"})
                self._quiet_since = time.monotonic()
        except wire.LinkLost as exc:
            self._lost(exc)
        finally:
            self.lock.release()

    def request(self, message: dict, timeout_s: float) -> dict:
        """A control request and its answer; a refusal is a PlacementError."""
        if message.get("op") == "unload":    # held bytes peak before a release
            self.figures(timeout_s)
        with self.exchange():
            self.sock.settimeout(timeout_s)
            wire.send_message(self.sock, message)
            reply = wire.recv_message(self.sock)
        if not reply.get("ok"):
            raise PlacementError(f"{self.where}: {reply.get('error', 'refused')}")
        return reply

    def figures(self, timeout_s: float, reset_peaks: bool = False) -> bool:
        """Ask the worker for its free memory now and its peaks (runtime/distributed/
        own_figures.py): kept in `devices` and `peaks`. False from a worker that does
        not answer it (an older one): its hello's figures stay."""
        if self._no_figures:
            return False
        try:
            reply = self.request({"op": "figures", "reset_peaks": reset_peaks}, timeout_s)
        except PlacementError:
            if self.broken is not None:
                raise
            self._no_figures = True          # not asked again: one refusal in its log
            return False
        apply_figures(self.devices, self.peaks, reply)
        if reset_peaks:                      # what it measured before now is not asked
            self.peaks.clear()
        return True

    def run(self, message: dict, payload, out_device: torch.device, timeout_s: float):
        """Send a payload, run it there, get (outputs, bytes sent, bytes received)."""
        self.check()
        skeleton, tensors = wire.flatten(payload)
        metas, nbytes = wire.pack_layout(tensors)
        comm = groups.comm_device(self.backend, out_device)
        buf = wire.pack(tensors, metas, nbytes, comm)
        with self.exchange():
            self.sock.settimeout(timeout_s)
            wire.send_message(self.sock, dict(message, op="run", skeleton=skeleton,
                                              metas=metas, nbytes=nbytes))
            wire.send_buffer(self.group, buf, self.rank, wire.TAG_TO_WORKER, timeout_s)
            reply = wire.recv_message(self.sock)
            if not reply.get("ok"):
                raise PlacementError(f"{self.where}: a remote block failed: "
                                     f"{reply.get('error', 'no reason given')}")
            out_buf = wire.recv_buffer(self.group, int(reply["nbytes"]), self.rank,
                                       wire.TAG_TO_MAIN, timeout_s, comm)
            outs = [t.to(out_device) for t in wire.unpack(out_buf, reply["metas"])]
        sent = sum(t.numel() * t.element_size() for t in tensors)
        received = sum(t.numel() * t.element_size() for t in outs)
        return wire.unflatten(reply["skeleton"], outs), sent, received


def apply_figures(devices: List[dict], peaks: Dict[str, Tuple[int, str]], reply: dict):
    """A worker's "figures" answer into its link's device list (free memory now: its
    free bytes plus the bytes of this main's ranges it holds, which a plan may place
    again) and peaks ({device: (bytes, how measured)})."""
    by_name = {d.get("name"): d for d in devices}
    for got in reply.get("devices") or []:
        d = by_name.get(got.get("name"))
        if d is None:
            continue
        try:
            free, held = int(got["free_bytes"]), int(got.get("held_bytes") or 0)
            peak = int(got["peak_bytes"])
        except (KeyError, TypeError, ValueError):
            continue
        d["free_bytes"] = min(int(d["total_bytes"]), free + held)
        note = str(reply.get("measured") or "by the worker")
        if held:
            note += ", counting this main's ranges held there as free"
        d["figures"] = dict(d.get("figures") or {}, free_measured=note)
        if peak > 0:
            peaks[d["name"]] = (peak, str(got.get("peak_how") or ""))


def _spoke_unasked(sock: socket.socket) -> bool:
    """The worker never speaks unasked: anything to read between requests is its
    goodbye (end of stream or a reset), noticed before the next prompt needs it."""
    sock.settimeout(0)
    try:
        sock.recv(1, socket.MSG_PEEK)
    except BlockingIOError:
        return False
    except OSError:
        pass
    return True


class _Heartbeat:
    """A daemon thread that pings each link when it is due, until stop() or until the
    cluster is garbage (a weak reference: an unclosed Cluster still lets its workers go)."""

    def __init__(self, cluster: "Cluster", default_s: float):
        self.cluster, self.default_s = weakref.ref(cluster), default_s
        self._wake = threading.Event()
        self._stopped = False
        self.thread = threading.Thread(target=self._beat, daemon=True,
                                       name="comfyui-placement heartbeat")
        self.thread.start()

    def _beat(self) -> None:        # helpers hold the links only while they run
        while True:
            self._wake.wait(self._interval())
            self._wake.clear()
            if self._stopped or not self._ping_all():
                return

    def _links(self) -> Optional[List[WorkerLink]]:
        cluster = self.cluster()
        return None if cluster is None else list(cluster.links.values())

    def _interval(self) -> float:
        return min([self.default_s] + [k.heartbeat_s for k in self._links() or []]) / 2

    def _ping_all(self) -> bool:
        links = self._links()
        for link in links or []:
            link.ping()
        return links is not None

    def poke(self) -> None:
        """A link was added (its interval may be shorter than the others')."""
        self._wake.set()

    def stop(self) -> None:
        self._stopped = True
        self._wake.set()
        if self.thread is not threading.current_thread():
            self.thread.join(timeout=self.default_s + 1)   # a ping's send is bounded so


class RemoteDevice:
    """A device on a worker, e.g. w1.cpu: what remote_range runs a range on."""

    def __init__(self, link: WorkerLink, device: str, timeout_s: float, load_timeout_s: float):
        self.link, self.device, self.timeout_s = link, device, timeout_s
        self.load_timeout_s = load_timeout_s

    @property
    def name(self) -> str:
        return f"{self.link.alias}.{self.device}"

    def __repr__(self) -> str:
        return f"RemoteDevice({self.name} at {self.link.host}:{self.link.port})"


class Cluster:
    """`with Cluster("w1=10.0.0.2:7860", secret_env=...) as c:` then `c["w1.cpu"]`."""

    def __init__(self, workers: Union[str, Dict[str, str]], secret: Optional[bytes] = None,
                 secret_env: str = DEFAULT_SECRET_ENV, backend: str = "gloo",
                 timeout_s: float = 60.0, connect_timeout_s: float = 10.0,
                 load_timeout_s: float = 300.0, heartbeat_s: float = 5.0):
        """timeout_s bounds each step's exchange (compute included); load_timeout_s a
        range's load (the worker imports its builder and reads its range from disk);
        connect_timeout_s each worker's whole handshake. heartbeat_s: the longest a
        control socket stays quiet (shorter where a worker's --main-timeout asks)."""
        self.backend = groups.check_backend(backend)
        self.timeout_s, self.load_timeout_s = float(timeout_s), float(load_timeout_s)
        self.heartbeat_s = float(heartbeat_s)
        if min(self.timeout_s, connect_timeout_s, self.load_timeout_s, self.heartbeat_s) <= 0:
            raise PlacementError("timeouts must be positive seconds")
        secret = secret if secret is not None else secret_from_env(secret_env)
        self.links: Dict[str, WorkerLink] = {}
        self.group = None
        self._heartbeat = _Heartbeat(self, self.heartbeat_s)
        try:
            for alias, (host, port) in parse_workers(workers).items():
                self.links[alias] = self._connect(alias, host, port, secret, connect_timeout_s)
                self._heartbeat.poke()      # joined workers wait for the others: keep them
            self._join(connect_timeout_s)
        except BaseException:
            self.close()
            raise

    def _connect(self, alias, host, port, secret, timeout_s) -> WorkerLink:
        where = f"worker {alias} ({host}:{port})"
        try:
            sock = socket.create_connection((host, port), timeout=timeout_s)
        except OSError as exc:
            raise PlacementError(f"{where}: cannot connect ({exc.strerror or exc}); is the "
                                 f"pack's worker (`python custom_nodes/comfyui-placement "
                                 f"worker`) running there?") from None
        try:
            wire.tune_socket(sock)
            hello = main_handshake(sock, secret, where, time.monotonic() + timeout_s)
        except wire.TimedOut:
            sock.close()
            raise PlacementError(f"{where} did not complete the handshake within "
                                 f"{timeout_s:g} s; is it a comfyui-placement worker?") from None
        except wire.LinkLost as exc:
            sock.close()
            raise PlacementError(f"{where} refused the connection ({exc}); set the same "
                                 f"secret on both sides") from None
        except BaseException:
            sock.close()
            raise
        return WorkerLink(alias, host, port, sock, hello, self.heartbeat_s)

    def _join(self, timeout_s: float) -> None:
        store = groups.host_store(timeout_s)
        prefix = secrets.token_hex(8) + "/"
        world = len(self.links) + 1
        local_host = None
        with contextlib.ExitStack() as held:     # each link from its join to the answer
            for rank, link in enumerate(self.links.values(), start=1):
                held.enter_context(link.lock)
                link.rank, link.backend = rank, self.backend
                local_host = local_host or link.sock.getsockname()[0]
                link.sock.settimeout(timeout_s)
                try:
                    wire.send_message(link.sock, {
                        "op": "join", "store": [link.sock.getsockname()[0], store.port],
                        "prefix": prefix, "rank": rank, "world": world,
                        "backend": self.backend, "timeout": self.timeout_s})
                except wire.LinkLost as exc:
                    raise link._lost(exc) from None
            try:
                self.group = groups.join_group(self.backend, "", 0, prefix, 0, world,
                                               timeout_s, local_host or "127.0.0.1",
                                               store=store)
            except RuntimeError as exc:
                raise PlacementError(f"the workers did not join the process group within "
                                     f"{timeout_s:g} s: {str(exc).splitlines()[0][:160]}"
                                     ) from None
            for link in self.links.values():
                link.group = self.group
                try:
                    reply = wire.recv_message(link.sock)
                except wire.LinkLost as exc:
                    raise link._lost(exc) from None
                if not reply.get("ok"):
                    raise PlacementError(f"{link.where} could not join: {reply.get('error')}")

    # -- what the plan names -----------------------------------------------------------
    def __getitem__(self, name: str) -> RemoteDevice:
        alias, device = split_name(name)
        link = self.links.get(alias)
        if link is None:
            raise PlacementError(f"no worker {alias!r}; workers: {', '.join(self.links)}")
        if device not in [d["name"] for d in link.devices]:
            raise PlacementError(f"{link.where} has no device {device!r}; it has: "
                                 f"{', '.join(d['name'] for d in link.devices)}")
        return RemoteDevice(link, device, self.timeout_s, self.load_timeout_s)

    def devices(self):
        """Inventory entries (placement Device) for every worker's devices: w1.cuda0 ..."""
        out = []
        for alias, link in self.links.items():
            out += remote_device_entries(alias, f"{link.host}:{link.port}", link.devices,
                                         link.machine)
        return out

    def refresh(self, reset_peaks: bool = False) -> None:
        """Each worker's free memory measured now (before a plan), its peaks read (after
        a run) and, with reset_peaks, counted from now (before one)."""
        for link in self.links.values():
            link.figures(self.timeout_s, reset_peaks)

    def peaks(self) -> Dict[str, Tuple[int, str]]:
        """{w1.cuda0: (peak bytes, how the worker measured it)} as last read (refresh)."""
        return {f"{alias}.{dev}": got for alias, link in self.links.items()
                for dev, got in link.peaks.items()}

    # -- lifetime --------------------------------------------------------------------------
    def close(self) -> None:
        self._heartbeat.stop()
        for link in self.links.values():
            if link.broken is None and link.lock.acquire(timeout=2.0):
                try:
                    link.sock.settimeout(2.0)
                    wire.send_message(link.sock, {"op": "bye"})
                except (wire.LinkLost, OSError):
                    pass
                finally:
                    link.lock.release()
            try:
                link.sock.close()
            except OSError:
                pass
        if self.group is not None:
            groups.close_group(self.group)
            self.group = None

    def __enter__(self) -> "Cluster":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
