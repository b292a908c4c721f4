"""Joining needs a shared secret: a challenge-response on the control socket, each side
proving it knows the secret (HMAC-SHA256 over the other side's fresh nonce), compared in
constant time. The secret itself never crosses the wire."""
import hashlib
import hmac
import os
import secrets
import socket

from ...placement.errors import PlacementError
from .wire import LinkLost, recv_message, send_message

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


def worker_handshake(sock: socket.socket, secret: bytes, hello: dict) -> dict:
    """Worker side. Returns the main process's first request; LinkLost when refused."""
    nonce = secrets.token_hex(16)
    send_message(sock, {"protocol": PROTOCOL, "nonce": nonce})
    reply = recv_message(sock)
    if not hmac.compare_digest(str(reply.get("mac", "")), _mac(secret, "main", nonce)):
        send_message(sock, {"error": "wrong secret"})
        raise LinkLost("wrong secret")
    send_message(sock, dict(hello, mac=_mac(secret, "worker", str(reply.get("nonce", "")))))
    return recv_message(sock)


def main_handshake(sock: socket.socket, secret: bytes, where: str) -> dict:
    """Main side. Returns the worker's hello (its devices); PlacementError when refused."""
    first = recv_message(sock)
    if first.get("protocol") != PROTOCOL:
        raise PlacementError(f"{where} is not a comfyui-placement worker (or another "
                             f"version): it said {str(first)[:80]!r}")
    nonce = secrets.token_hex(16)
    send_message(sock, {"mac": _mac(secret, "main", str(first.get("nonce", ""))),
                        "nonce": nonce})
    hello = recv_message(sock)
    if "error" in hello:
        raise PlacementError(f"{where} refused to join: {hello['error']}; set the same "
                             f"secret on both sides")
    if not hmac.compare_digest(str(hello.get("mac", "")), _mac(secret, "worker", nonce)):
        raise PlacementError(f"{where} did not prove the shared secret; refusing it")
    return hello
