"""Joining needs a shared secret: a challenge-response on the control socket, each side
proving it knows the secret (HMAC-SHA256 over the other side's fresh nonce), compared in
constant time. The secret itself never crosses the wire. Every handshake has one deadline
for the whole exchange, and its messages are small until the peer proved the secret."""
import hashlib
import hmac
import os
import secrets
import socket

from ...placement.errors import PlacementError
from .wire import HANDSHAKE_MAX, LinkLost, frame, recv_message, send_message

PROTOCOL = "comfyui-placement worker 1"
DEFAULT_SECRET_ENV = "COMFYUI_PLACEMENT_SECRET"


def secret_from_env(name: str) -> bytes:
    value = os.environ.get(name, "")
    if not value:
        raise PlacementError(f"no shared secret: set the environment variable {name} to the "
                             f"same value on the main process and every worker")
    return value.encode()


def _mac(secret: bytes, role: str, nonce: str) -> str:
    return hmac.new(secret, f"{role}:{nonce}".encode(), hashlib.sha256).hexdigest()


def _one_line(text) -> str:
    return " ".join(str(text).split())[:200]


def worker_handshake(sock: socket.socket, secret: bytes, deadline: float) -> str:
    """Worker side, up to the main process's proof, all before `deadline` (monotonic):
    returns the main's nonce for worker_hello; LinkLost (TimedOut) when it fails. Only
    the small hello messages are accepted until the peer proved the secret."""
    nonce = secrets.token_hex(16)
    send_message(sock, {"protocol": PROTOCOL, "nonce": nonce}, deadline)
    reply = recv_message(sock, HANDSHAKE_MAX, deadline)
    if not hmac.compare_digest(str(reply.get("mac", "")), _mac(secret, "main", nonce)):
        try:
            send_message(sock, {"error": "wrong secret"}, deadline)
        except LinkLost:
            pass
        raise LinkLost("wrong secret")
    return str(reply.get("nonce", ""))


def worker_hello(sock: socket.socket, secret: bytes, main_nonce: str, hello: dict,
                 deadline: float) -> None:
    """The worker's proof, with what it tells an admitted main process (its devices)."""
    send_message(sock, dict(hello, mac=_mac(secret, "worker", main_nonce)), deadline)


def refuse(sock: socket.socket, reason: str, kind: str) -> None:
    """One line for the peer instead of a hello (`kind` lets the main side word it). It
    never blocks: a fresh socket's send buffer takes it whole; a peer that is gone or does
    not read simply misses it."""
    try:
        sock.setblocking(False)
        sock.send(frame({"error": reason, "refusal": kind}))
    except OSError:
        pass


def main_handshake(sock: socket.socket, secret: bytes, where: str, deadline: float) -> dict:
    """Main side. Returns the worker's hello (its devices); PlacementError when refused."""
    first = recv_message(sock, HANDSHAKE_MAX, deadline)
    if "error" in first:                       # e.g. too many handshakes pending there
        raise PlacementError(f"{where} refused the connection: {_one_line(first['error'])}")
    if first.get("protocol") != PROTOCOL:
        raise PlacementError(f"{where} is not a comfyui-placement worker (or another "
                             f"version): it said {str(first)[:80]!r}")
    nonce = secrets.token_hex(16)
    send_message(sock, {"mac": _mac(secret, "main", str(first.get("nonce", ""))),
                        "nonce": nonce}, deadline)
    hello = recv_message(sock, HANDSHAKE_MAX, deadline)
    if "error" in hello:                       # busy: serving another main process
        hint = "" if hello.get("refusal") == "busy" else "; set the same secret on both sides"
        raise PlacementError(f"{where} refused to join: {_one_line(hello['error'])}{hint}")
    if not hmac.compare_digest(str(hello.get("mac", "")), _mac(secret, "worker", nonce)):
        raise PlacementError(f"{where} did not prove the shared secret; refusing it")
    return hello
