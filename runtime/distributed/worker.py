"""The worker: listens on HOST:PORT, admits a main process that proves the shared secret,
joins its torch.distributed group, loads block ranges from its own model files (checked
against the main process's hashes) and runs them on the activations it is sent.

Strangers cannot stall it: every connection's handshake runs in a thread of its own
under one absolute deadline (--handshake-timeout), at most --max-pending of them at a
time and at most --max-pending-per-address of them from one address (more are turned
away at once: one line when a flood starts, one when it ends, never one per connection),
reading only small messages until the peer proved the secret. One main process at a
time (the worker joins one group): a second one that proves the secret meanwhile is
told, in one line, whom the worker serves. A main process heard from neither by request
nor by heartbeat for --main-timeout is dropped, and the next one may join. A broken
connection never stops the worker.
"""
import os
import socket
import sys
import threading
import time
from typing import Dict, Optional, Sequence

import torch

from ...placement.errors import PlacementError
from . import group as groups, wire
from .auth import refuse, worker_handshake, worker_hello
from .builder import DEFAULT_ALLOWED
from .chain import run_chain
from .digests import SETTLE_S, signature
from .held import HeldTensors
from .loaded import LoadedRange
from .offered import OfferedDevices
from .own_figures import OwnFigures

HANDSHAKE_TIMEOUT_S = 5.0     # a main process on any sane network proves itself in far less
MAIN_TIMEOUT_S = 30.0         # a Cluster sends a heartbeat at least every quarter of this
MAX_PENDING = 128             # handshakes in flight (a thread each)
MAX_PENDING_PER_ADDRESS = 4   # of them from one address: one stranger cannot take them all
_HANDOVER_S = 2.0             # a main that just left is still releasing its ranges


_LOG_LOCK = threading.Lock()   # handshake threads log at once: one whole line each


def _log(text: str) -> None:
    stamp = time.strftime("%H:%M:%S") + f".{int(time.time() * 1000) % 1000:03d}"
    with _LOG_LOCK:
        sys.stderr.write(f"{stamp} worker: {text}\n")
        sys.stderr.flush()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"


class _Silent(Exception):
    """The main process sent nothing, not even a heartbeat, for main_timeout_s."""


class Worker:
    def __init__(self, host: str, port: int, models_dir: str, secret: bytes,
                 allowed: Sequence[str] = DEFAULT_ALLOWED,
                 handshake_timeout_s: float = HANDSHAKE_TIMEOUT_S,
                 main_timeout_s: float = MAIN_TIMEOUT_S, max_pending: int = MAX_PENDING,
                 simulate: Optional[str] = None,
                 max_per_address: int = MAX_PENDING_PER_ADDRESS):
        self.models_dir, self.secret, self.allowed = models_dir, secret, tuple(allowed)
        self.offered = OfferedDevices(simulate)
        self.handshake_timeout_s, self.main_timeout_s = handshake_timeout_s, main_timeout_s
        self.max_pending, self.max_per_address = max_pending, max_per_address
        self._state = threading.Condition()
        self._pending = 0                        # handshakes in flight
        self._pending_from: Dict[str, int] = {}  # of them per peer address
        # refusals not logged: one line when a flood starts, one when it ends (key: the
        # address, or None for "every slot taken"), never a line per connection
        self._unlogged: Dict[Optional[str], int] = {}
        self._serving: Optional[str] = None      # "HOST:PORT since TIME" of the main served
        self.listener = socket.create_server((host, port))
        self.address = self.listener.getsockname()[:2]

    # -- connections: accepted at once, each handshake on its own thread --------------
    def serve_forever(self) -> None:
        print(f"listening on {self.address[0]}:{self.address[1]}", flush=True)
        while True:
            try:
                sock, addr = self.listener.accept()
            except OSError as exc:               # e.g. out of file descriptors: wait a bit
                _log(f"accept failed: {exc.strerror or exc}")
                time.sleep(0.1)
                continue
            self._admit(sock, f"{addr[0]}:{addr[1]}", addr[0])

    def _admit(self, sock: socket.socket, peer: str, host: str) -> None:
        with self._state:
            if self._pending >= self.max_pending:
                key, reason = None, f"{self.max_pending} handshakes are pending already"
            elif self._pending_from.get(host, 0) >= self.max_per_address:
                key, reason = host, (f"{self.max_per_address} handshakes from {host} are "
                                     f"pending already")
            else:
                key = reason = None
                self._pending += 1
                self._pending_from[host] = self._pending_from.get(host, 0) + 1
            first = reason is not None and key not in self._unlogged
            if reason is not None:
                self._unlogged[key] = 0 if first else self._unlogged[key] + 1
        if reason is not None:
            refuse(sock, reason, "full")
            sock.close()
            if first:
                _log(f"refused {peer}: {reason} (the next ones are counted, not logged)")
            return
        try:
            threading.Thread(target=self._connection, args=(sock, peer, host), daemon=True,
                             name=f"worker {peer}").start()
        except RuntimeError as exc:              # no thread to spare
            self._handshake_done(host)
            sock.close()
            _log(f"refused {peer}: {exc}")

    def _handshake_done(self, host: str) -> None:
        ended = []
        with self._state:
            self._pending -= 1
            left = self._pending_from[host] = self._pending_from[host] - 1
            if not left:
                del self._pending_from[host]
                if host in self._unlogged:
                    ended.append((host, self._unlogged.pop(host)))
            if None in self._unlogged and self._pending < self.max_pending:
                ended.append((None, self._unlogged.pop(None)))
        for key, count in ended:
            if not count:
                continue
            what = f"{count} more connection{'s' if count > 1 else ''}"
            _log(f"refused {what} from {key} while its handshakes were pending" if key else
                 f"refused {what} while every handshake slot was taken")

    def _connection(self, sock: socket.socket, peer: str, host: str) -> None:
        try:
            nonce = self._handshake(sock, peer, host)
            if nonce is not None:
                self._serve(sock, peer, nonce)
        except Exception as exc:                 # never stops the worker
            _log(f"{peer} ended: {_first_line(exc)}")
        finally:
            sock.close()

    def _handshake(self, sock: socket.socket, peer: str, host: str) -> Optional[str]:
        """The main process's nonce once it proved the secret; None (logged) if not."""
        try:
            wire.tune_socket(sock)
            return worker_handshake(sock, self.secret,
                                    time.monotonic() + self.handshake_timeout_s)
        except wire.TimedOut:
            _log(f"refused {peer}: handshake not finished within "
                 f"{self.handshake_timeout_s:g} s")
        except (wire.LinkLost, OSError) as exc:
            _log(f"refused {peer}: {exc}")
        finally:
            self._handshake_done(host)
        return None

    # -- the one main process served ---------------------------------------------------
    def _claim(self, peer: str) -> Optional[str]:
        """Serve peer from now on; else the one-line refusal naming whom it serves."""
        with self._state:
            if not self._state.wait_for(lambda: self._serving is None, _HANDOVER_S):
                return f"busy: serving a main process from {self._serving}"
            self._serving = f"{peer} since {time.strftime('%Y-%m-%d %H:%M:%S')}"
            return None

    def _serve(self, sock: socket.socket, peer: str, nonce: str) -> None:
        busy = self._claim(peer)
        if busy is not None:
            refuse(sock, busy, "busy")
            _log(f"refused {peer}: {busy}")
            return
        try:
            # this session's own figures: calibrated speeds, machine id, free memory
            self.own = OwnFigures(self.offered)
            if self.own.problem:
                _log(f"calibration not sent: {self.own.problem}")
            worker_hello(sock, self.secret, nonce,
                         {"devices": self.own.devices(self.offered.hello()),
                          "machine": self.own.machine,
                          "main_timeout_s": self.main_timeout_s},
                         time.monotonic() + self.main_timeout_s)
            self._requests(sock, peer)
        finally:
            with self._state:
                self._serving = None
                self._state.notify_all()

    def _next_request(self, sock: socket.socket, reply_timeout_s: float) -> dict:
        """The main process's next request; its heartbeats (pings) only say it is there."""
        while True:
            try:
                request = wire.recv_message(sock,
                                            deadline=time.monotonic() + self.main_timeout_s)
            except wire.TimedOut:
                raise _Silent() from None
            if request.get("op") != "ping":
                sock.settimeout(reply_timeout_s)  # not what was left of the wait
                return request

    def _requests(self, sock: socket.socket, peer: str) -> None:
        ranges: Dict[int, LoadedRange] = {}
        held = HeldTensors()          # the ranges' tensors, kept until the ranges go
        group = None
        try:
            join = self._next_request(sock, self.main_timeout_s)
            if join.get("op") != "join":
                raise PlacementError(f"expected a join request, got {join.get('op')!r}")
            timeout_s = float(join["timeout"])
            backend = groups.check_backend(join["backend"])
            local_host = sock.getsockname()[0]
            group = groups.join_group(backend, join["store"][0], int(join["store"][1]),
                                      join["prefix"], int(join["rank"]), int(join["world"]),
                                      timeout_s, local_host)
            _log(f"{peer} joined; rank {join['rank']} of {join['world']} ({backend})")
            wire.send_message(sock, {"ok": True})
            while True:
                request = self._next_request(sock, timeout_s)
                op = request.get("op")
                if op == "bye":
                    _log(f"{peer} left")
                    return
                if op == "run":
                    self._run(sock, group, request, ranges, timeout_s, backend)
                    continue
                try:
                    if op == "load":
                        reply = self._load(request, ranges, held)
                    elif op == "check":
                        reply = self._check(request, ranges)
                    elif op == "unload":
                        gone = ranges.pop(int(request["range"]), None)
                        held.drop_range(int(request["range"]))
                        if gone is not None:
                            _log(f"freed {gone.path} blocks {gone.span} on {gone.device}")
                        reply = {}
                    elif op == "figures":    # free memory now, peaks (own_figures.py)
                        reply = self.own.answer(request, ranges, held)
                    else:
                        raise PlacementError(f"unknown request {op!r}")
                    wire.send_message(sock, dict(reply, ok=True))
                except wire.LinkLost:
                    raise
                except Exception as exc:         # e.g. out of memory: say so, stay joined
                    why = str(exc) if isinstance(exc, PlacementError) else _first_line(exc)
                    _log(f"refused {op}: {why}")
                    wire.send_message(sock, {"ok": False, "error": why})
        except _Silent:
            _log(f"{peer} silent for {self.main_timeout_s:g} s (no request, no heartbeat); "
                 f"dropped its session")
        except wire.LinkLost as exc:
            _log(f"{peer} lost: {exc}")
        finally:
            ranges.clear()
            held.clear()
            if group is not None:
                groups.close_group(group)

    def _load(self, request: dict, ranges: Dict[int, LoadedRange],
              held: HeldTensors) -> dict:
        """Load a range, taking what ranges held already hold; the ranges it replaces
        (`replaces`: the main's ranges it no longer needs) go once it is loaded."""
        range_id, name = int(request["range"]), str(request.get("device", "cpu"))
        replaces = {int(r) for r in request.get("replaces", ())} - {range_id}
        before = held.bytes_on(name, without=replaces)
        r = LoadedRange(self.offered.load_request(request), self.models_dir, self.allowed,
                        held, range_id, held_as=name)
        after = held.bytes_on(name, without=replaces)
        try:
            self.offered.admit(name, after, after - before)
        except PlacementError:
            held.drop_range(range_id)
            raise
        for old in replaces:
            ranges.pop(old, None)
            held.drop_range(old)
        ranges[range_id] = r
        as_ = f" for simulated {name}" if self.offered.simulated is not None else ""
        kept = r.nbytes - r.moved
        _log(f"loaded {r.path} blocks {r.span} "
             f"({r.nbytes} bytes) on {r.device}{as_}: {r.read} bytes read, {r.hashed} "
             f"hashed, {r.moved} moved" + (f", {kept} kept from ranges held" if kept
                                           else ""))
        return {"read_bytes": r.read, "hashed_bytes": r.hashed, "moved_bytes": r.moved,
                "nbytes": r.nbytes}

    @staticmethod
    def _check(request: dict, ranges: Dict[int, LoadedRange]) -> dict:
        """Is the range still held, from its file as it is now? Nothing read or hashed:
        the file's signature (digests.py) says whether it changed."""
        r = ranges.get(int(request["range"]))
        if r is None:
            return {"kept": False, "why": "not held"}
        name = os.path.basename(r.path)
        if r.racy:                    # see digests.settled
            return {"kept": False,
                    "why": f"{name} was read within {SETTLE_S:g} s of being written"}
        try:
            changed = signature(r.path) != r.sig
        except OSError:
            changed = True
        if changed:
            return {"kept": False, "why": f"{name} changed on the worker"}
        _log(f"kept {r.path} blocks {r.span} ({r.nbytes} bytes) on "
             f"{r.device} for the next run: no weight moved, nothing hashed")
        return {"kept": True, "nbytes": r.nbytes}

    def _run(self, sock, group, request, ranges, timeout_s, backend) -> None:
        loaded = ranges.get(int(request.get("range", -1)))
        where = loaded.device if loaded is not None else torch.device("cpu")
        buf = wire.recv_buffer(group, int(request["nbytes"]), 0, wire.TAG_TO_WORKER, timeout_s,
                               groups.comm_device(backend, where))
        try:
            if request.get("mode") == "echo":     # calibrate: the link alone (probe.py)
                skeleton, outs = request["skeleton"], wire.unpack(buf, request["metas"])
            else:
                if loaded is None:
                    raise PlacementError(f"range {request.get('range')} is not loaded here")
                tensors = [t.to(where) for t in wire.unpack(buf, request["metas"])]
                args, kwargs = wire.unflatten(request["skeleton"], tensors)
                with torch.no_grad():
                    if request.get("mode") == "chain":
                        out = run_chain(loaded.blocks, request["chain"], args, kwargs)
                    else:
                        out = loaded.blocks[int(request["index"])](*args, **kwargs)
                skeleton, outs = wire.flatten(out)
        except Exception as exc:                  # the block failed: say so, stay joined
            wire.send_message(sock, {"ok": False, "error": _first_line(exc)})
            return
        self._reply(sock, group, skeleton, outs, timeout_s, backend, where)

    @staticmethod
    def _reply(sock, group, skeleton, outs, timeout_s, backend, where) -> None:
        metas, nbytes = wire.pack_layout(outs)
        wire.send_message(sock, {"ok": True, "skeleton": skeleton, "metas": metas,
                                 "nbytes": nbytes})
        wire.send_buffer(group, wire.pack(outs, metas, nbytes,
                                          groups.comm_device(backend, where)),
                         0, wire.TAG_TO_MAIN, timeout_s)


def serve(listen: str, models_dir: str, secret: bytes, allowed: Sequence[str],
          handshake_timeout_s: float = HANDSHAKE_TIMEOUT_S,
          main_timeout_s: float = MAIN_TIMEOUT_S, max_pending: int = MAX_PENDING,
          simulate: Optional[str] = None,
          max_per_address: int = MAX_PENDING_PER_ADDRESS) -> None:
    host, sep, port = listen.rpartition(":")
    accepted = "expected HOST:PORT, e.g. 0.0.0.0:7860 (port 0 picks a free one)"
    if not sep or not host or not port.isdigit():
        raise PlacementError(f"invalid --listen {listen!r}; {accepted}")
    if int(port) > 65535:
        raise PlacementError(f"invalid --listen {listen!r}: port {port} is past 65535; "
                             f"{accepted}")
    if not os.path.isdir(models_dir):
        raise PlacementError(f"--models {models_dir!r} is not a folder")
    if not os.access(models_dir, os.R_OK | os.X_OK):
        raise PlacementError(f"--models {models_dir!r} cannot be read by this user")
    if not (handshake_timeout_s > 0 and main_timeout_s > 0 and max_pending >= 1
            and max_per_address >= 1):
        raise PlacementError("--handshake-timeout and --main-timeout must be positive "
                             "seconds, --max-pending and --max-pending-per-address at "
                             "least 1")
    try:
        worker = Worker(host.strip("[]"), int(port), models_dir, secret, allowed,
                        handshake_timeout_s, main_timeout_s, max_pending, simulate,
                        max_per_address)
    except (OSError, OverflowError) as exc:        # in use, no such address, not allowed
        why = getattr(exc, "strerror", None) or str(exc)
        raise PlacementError(f"cannot listen on {listen}: {why}; give a free port of an "
                             f"address of this machine (port 0 picks a free one)") from None
    worker.serve_forever()
