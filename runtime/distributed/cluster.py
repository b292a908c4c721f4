"""The main process's side of a distributed run (the Cluster): it connects to each
worker, proves the shared secret, hosts the group's store as rank 0, and calls block
ranges on workers. A worker that is lost or too slow gives one PlacementError, never a hang."""
import secrets
import socket
from typing import Dict, List, Optional, Union

import torch

from ...placement.errors import PlacementError
from ...placement.remote_devices import parse_workers, remote_device_entries, split_name
from . import group as groups, wire
from .auth import DEFAULT_SECRET_ENV, main_handshake, secret_from_env


class WorkerLink:
    """One worker: its control socket, its rank in the group, what it reported."""

    def __init__(self, alias: str, host: str, port: int, sock: socket.socket, hello: dict):
        self.alias, self.host, self.port, self.sock = alias, host, port, sock
        self.devices: List[dict] = list(hello.get("devices") or [])
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
            self.sock.close()           # the worker sees EOF and drops the session
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

    def request(self, message: dict, timeout_s: float) -> dict:
        """A control request and its answer; a refusal is a PlacementError."""
        self.check()
        try:
            self.sock.settimeout(timeout_s)
            wire.send_message(self.sock, message)
            reply = wire.recv_message(self.sock)
        except wire.LinkLost as exc:
            raise self._lost(exc) from None
        if not reply.get("ok"):
            raise PlacementError(f"{self.where}: {reply.get('error', 'refused')}")
        return reply

    def run(self, message: dict, payload, out_device: torch.device, timeout_s: float):
        """Send a payload, run it there, get (outputs, bytes sent, bytes received)."""
        self.check()
        skeleton, tensors = wire.flatten(payload)
        metas, nbytes = wire.pack_layout(tensors)
        comm = groups.comm_device(self.backend, out_device)
        buf = wire.pack(tensors, metas, nbytes, comm)
        try:
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
        except wire.LinkLost as exc:
            raise self._lost(exc) from None
        sent = sum(t.numel() * t.element_size() for t in tensors)
        received = sum(t.numel() * t.element_size() for t in outs)
        return wire.unflatten(reply["skeleton"], outs), sent, received


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
                 load_timeout_s: float = 300.0):
        """timeout_s bounds each step's exchange (compute included); load_timeout_s a
        range's load (the worker imports its builder and reads its range from disk)."""
        self.backend = groups.check_backend(backend)
        self.timeout_s, self.load_timeout_s = float(timeout_s), float(load_timeout_s)
        if min(self.timeout_s, connect_timeout_s, self.load_timeout_s) <= 0:
            raise PlacementError("timeouts must be positive seconds")
        secret = secret if secret is not None else secret_from_env(secret_env)
        self.links: Dict[str, WorkerLink] = {}
        self.group = None
        try:
            for alias, (host, port) in parse_workers(workers).items():
                self.links[alias] = self._connect(alias, host, port, secret, connect_timeout_s)
            self._join(connect_timeout_s)
        except BaseException:
            self.close()
            raise

    def _connect(self, alias, host, port, secret, timeout_s) -> WorkerLink:
        where = f"worker {alias} ({host}:{port})"
        try:
            sock = socket.create_connection((host, port), timeout=timeout_s)
        except OSError as exc:
            raise PlacementError(f"{where}: cannot connect ({exc.strerror or exc}); is "
                                 f"`python -m comfyui_placement worker` running there?") from None
        try:
            wire.tune_socket(sock)
            hello = main_handshake(sock, secret, where)
        except wire.LinkLost as exc:
            sock.close()
            raise PlacementError(f"{where} refused the connection ({exc}); set the same "
                                 f"secret on both sides") from None
        except BaseException:
            sock.close()
            raise
        return WorkerLink(alias, host, port, sock, hello)

    def _join(self, timeout_s: float) -> None:
        store = groups.host_store(timeout_s)
        prefix = secrets.token_hex(8) + "/"
        world = len(self.links) + 1
        local_host = None
        for rank, link in enumerate(self.links.values(), start=1):
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
            self.group = groups.join_group(self.backend, "", 0, prefix, 0, world, timeout_s,
                                           local_host or "127.0.0.1", store=store)
        except RuntimeError as exc:
            raise PlacementError(f"the workers did not join the process group within "
                                 f"{timeout_s:g} s: {str(exc).splitlines()[0][:160]}") from None
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
            out += remote_device_entries(alias, f"{link.host}:{link.port}", link.devices)
        return out

    # -- lifetime --------------------------------------------------------------------------
    def close(self) -> None:
        for link in self.links.values():
            if link.broken is None:
                try:
                    link.sock.settimeout(2.0)
                    wire.send_message(link.sock, {"op": "bye"})
                except (wire.LinkLost, OSError):
                    pass
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
