"""The worker: listens on HOST:PORT, admits a main process that proves the shared secret,
joins its torch.distributed group, loads block ranges from its own model files (checked
against the main process's hashes) and runs them on the activations it is sent.

One session at a time; when the main process leaves or is lost, the worker drops what
it loaded and listens again.
"""
import os
import socket
import sys
import time
from typing import Dict, Sequence

import torch

from ...placement.errors import PlacementError
from . import group as groups, wire
from .auth import worker_handshake
from .chain import run_chain
from .builder import DEFAULT_ALLOWED
from .loaded import LoadedRange


def _log(text: str) -> None:
    stamp = time.strftime("%H:%M:%S") + f".{int(time.time() * 1000) % 1000:03d}"
    print(f"{stamp} worker: {text}", file=sys.stderr, flush=True)


def _devices() -> list:
    from ...placement.detect import torch_devices
    return [{"name": d.name, "kind": d.kind, "total_bytes": d.total_bytes,
             "free_bytes": d.free_bytes, "description": d.description}
            for d in torch_devices()]


class Worker:
    def __init__(self, host: str, port: int, models_dir: str, secret: bytes,
                 allowed: Sequence[str] = DEFAULT_ALLOWED, idle_timeout_s=None):
        self.models_dir, self.secret, self.allowed = models_dir, secret, tuple(allowed)
        self.idle_timeout_s = idle_timeout_s
        self.listener = socket.create_server((host, port))
        self.address = self.listener.getsockname()[:2]

    def serve_forever(self) -> None:
        print(f"listening on {self.address[0]}:{self.address[1]}", flush=True)
        while True:
            sock, addr = self.listener.accept()
            try:
                self._session(sock, f"{addr[0]}:{addr[1]}")
            except Exception as exc:      # a broken session never stops the worker
                _log(f"session from {addr[0]}:{addr[1]} ended: {exc}")
            finally:
                sock.close()

    def _session(self, sock: socket.socket, peer: str) -> None:
        wire.tune_socket(sock)
        sock.settimeout(30.0)                    # the handshake is quick or refused
        try:
            join = worker_handshake(sock, self.secret, {"devices": _devices()})
        except wire.LinkLost as exc:
            _log(f"refused {peer}: {exc}")
            return
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
        ranges: Dict[int, LoadedRange] = {}
        sock.settimeout(self.idle_timeout_s)     # idle between steps: wait for the main
        try:
            while True:
                request = wire.recv_message(sock)
                op = request.get("op")
                if op == "bye":
                    return
                if op == "run":
                    self._run(sock, group, request, ranges, timeout_s, backend)
                    continue
                try:
                    if op == "load":
                        ranges[int(request["range"])] = r = LoadedRange(
                            request, self.models_dir, self.allowed)
                        _log(f"loaded {request['file']} blocks {request['blocks'][0]}.."
                             f"{request['blocks'][-1]} ({r.nbytes} bytes) on {r.device}")
                    elif op == "unload":
                        ranges.pop(int(request["range"]), None)
                    else:
                        raise PlacementError(f"unknown request {op!r}")
                    wire.send_message(sock, {"ok": True})
                except PlacementError as exc:
                    _log(f"refused {op}: {exc}")
                    wire.send_message(sock, {"ok": False, "error": str(exc)})
        except wire.LinkLost as exc:
            _log(f"{peer} lost: {exc}")
        finally:
            ranges.clear()
            groups.close_group(group)

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
            wire.send_message(sock, {"ok": False, "error": f"{type(exc).__name__}: "
                                     f"{str(exc).splitlines()[0] if str(exc) else ''}"})
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


def serve(listen: str, models_dir: str, secret: bytes, allowed: Sequence[str]) -> None:
    host, sep, port = listen.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise PlacementError(f"invalid --listen {listen!r}; expected HOST:PORT, e.g. "
                             f"0.0.0.0:7860 (port 0 picks a free one)")
    if not os.path.isdir(models_dir):
        raise PlacementError(f"--models {models_dir!r} is not a folder")
    Worker(host.strip("[]"), int(port), models_dir, secret, allowed).serve_forever()
