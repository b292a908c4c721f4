"""What crosses the wire: control messages as length-prefixed JSON on the authenticated
socket, tensors packed into one byte buffer sent through the torch.distributed group.

A payload (a block's args, kwargs or outputs) is split into a JSON skeleton and its
tensors; tensors travel as raw bytes (any dtype, gloo or NCCL alike), each aligned so the
receiver views them in place. Every blocking call is bounded by the caller's timeout.
"""
import datetime
import json
import socket
import struct
import time
from typing import Any, List, Tuple

import torch

from ...placement.errors import PlacementError

ACCEPTED = "tensors, tuples, lists, dicts with str/int keys, None, bool, int, float, str"
_ALIGN = 16
_MAX_MESSAGE = 64 * 1024 * 1024      # a control message past this is a broken peer
HANDSHAKE_MAX = 64 * 1024            # before the peer proved the secret: the hellos only
_CHUNK = 1 << 20                     # memory grows with the bytes that came, not the claim
TAG_TO_WORKER, TAG_TO_MAIN = 0, 1


class LinkLost(Exception):
    """The peer is gone or too slow: the connection cannot be trusted any more."""


class TimedOut(LinkLost):
    """The peer said nothing (or not all of it) within the time it was given."""


# -- control messages -------------------------------------------------------------------
def tune_socket(sock: socket.socket) -> None:
    """Small requests go out at once (no Nagle delay); a peer whose machine vanished
    without closing is noticed by keepalive probes (about a minute) even while idle."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", 30), ("TCP_KEEPINTVL", 10), ("TCP_KEEPCNT", 3)):
        if hasattr(socket, name):                       # Linux; macOS has some of them
            try:
                sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)
            except OSError:
                pass


def _left(sock: socket.socket, deadline) -> None:
    """An absolute deadline (time.monotonic()) bounds a whole exchange: a peer sending a
    byte at a time cannot stretch it, as it would a timeout per recv."""
    if deadline is not None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimedOut("the deadline passed")
        sock.settimeout(left)


def frame(message: dict) -> bytes:
    data = json.dumps(message).encode()
    return struct.pack("<I", len(data)) + data


def send_message(sock: socket.socket, message: dict, deadline=None) -> None:
    data = frame(message)
    try:
        _left(sock, deadline)
        sock.sendall(data)
    except socket.timeout:
        raise TimedOut("sending timed out") from None
    except OSError as exc:
        raise LinkLost(f"sending failed ({exc.strerror or exc})") from None


def _recv_exact(sock: socket.socket, n: int, deadline) -> bytes:
    out = bytearray()
    while len(out) < n:
        try:
            _left(sock, deadline)
            chunk = sock.recv(min(n - len(out), _CHUNK))
        except socket.timeout:
            raise TimedOut("the deadline passed" if deadline is not None else
                           f"no answer within {sock.gettimeout():g} s") from None
        except OSError as exc:
            raise LinkLost(f"connection failed ({exc.strerror or exc})") from None
        if not chunk:
            raise LinkLost("connection closed by the peer")
        out += chunk
    return bytes(out)


def recv_message(sock: socket.socket, limit: int = _MAX_MESSAGE, deadline=None) -> dict:
    """One message of at most `limit` bytes (checked before reading it), whole before
    `deadline` when one is given (else each recv is bounded by the socket's timeout)."""
    (n,) = struct.unpack("<I", _recv_exact(sock, 4, deadline))
    if n > limit:
        raise LinkLost(f"control message of {n} bytes is past the {limit} limit")
    try:
        message = json.loads(_recv_exact(sock, n, deadline))
    except (ValueError, RecursionError):      # bad UTF-8 or JSON, or nested past reason
        raise LinkLost("control message is not JSON") from None
    if not isinstance(message, dict):
        raise LinkLost("control message is not a JSON object")
    return message


# -- payloads ---------------------------------------------------------------------------
def flatten(obj: Any) -> Tuple[Any, List[torch.Tensor]]:
    """A JSON skeleton with tensors replaced by {"t": index}, and the tensors.
    (Module-level recursion: a recursive closure would be a reference cycle that keeps
    the tensors alive until the garbage collector runs.)"""
    tensors: List[torch.Tensor] = []
    return _skeleton(obj, tensors), tensors


def _skeleton(x, tensors: List[torch.Tensor]):
    if isinstance(x, torch.Tensor):
        tensors.append(x)
        return {"t": len(tensors) - 1}
    if x is None or isinstance(x, (bool, int, float, str)):
        return {"v": x}
    if isinstance(x, tuple):
        return {"tuple": [_skeleton(v, tensors) for v in x]}
    if isinstance(x, list):
        return {"list": [_skeleton(v, tensors) for v in x]}
    if isinstance(x, dict):
        if not all(isinstance(k, (str, int)) and not isinstance(k, bool) for k in x):
            raise PlacementError(f"cannot send a dict with keys {list(x)[:3]!r} to a "
                                 f"remote block range; accepted: {ACCEPTED}")
        return {"dict": [[k, _skeleton(v, tensors)] for k, v in x.items()]}
    raise PlacementError(f"cannot send a {type(x).__name__} to a remote block range; "
                         f"accepted: {ACCEPTED}")


def unflatten(s: Any, tensors: List[torch.Tensor]) -> Any:
    if "t" in s:
        return tensors[s["t"]]
    if "v" in s:
        return s["v"]
    if "tuple" in s:
        return tuple(unflatten(v, tensors) for v in s["tuple"])
    if "list" in s:
        return [unflatten(v, tensors) for v in s["list"]]
    return {k: unflatten(v, tensors) for k, v in s["dict"]}


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name.replace("torch.", ""), None)
    if not isinstance(dtype, torch.dtype):
        raise LinkLost(f"unknown dtype {name!r} in a message")
    return dtype


def pack_layout(tensors: List[torch.Tensor]) -> Tuple[List[dict], int]:
    """Each tensor's dtype, shape and offset in the packed buffer; the buffer's size."""
    metas, offset = [], 0
    for t in tensors:
        n = t.numel() * t.element_size()
        metas.append({"dtype": str(t.dtype), "shape": list(t.shape), "offset": offset})
        offset += -(-n // _ALIGN) * _ALIGN
    return metas, offset


def pack(tensors: List[torch.Tensor], metas: List[dict], nbytes: int,
         device: torch.device) -> torch.Tensor:
    buf = torch.empty(nbytes, dtype=torch.uint8, device=device)
    for t, m in zip(tensors, metas):
        n = t.numel() * t.element_size()
        if n:
            raw = t.detach().contiguous().reshape(-1).view(torch.uint8)
            buf[m["offset"]:m["offset"] + n].copy_(raw)
    return buf


def unpack(buf: torch.Tensor, metas: List[dict]) -> List[torch.Tensor]:
    out = []
    for m in metas:
        dtype = _dtype(m["dtype"])
        shape = [int(d) for d in m["shape"]]
        count = 1
        for d in shape:
            count *= d
        n = count * torch.empty((), dtype=dtype).element_size()
        out.append(buf[m["offset"]:m["offset"] + n].view(dtype).reshape(shape))
    return out


# -- the tensor channel -----------------------------------------------------------------
def _wait(start, timeout_s: float, what: str) -> None:
    """start() posts the operation (it may fail at once on a closed peer); then wait."""
    try:
        start().wait(datetime.timedelta(seconds=timeout_s))
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if "Timed out" in first:
            raise LinkLost(f"{what} timed out after {timeout_s:g} s") from None
        raise LinkLost(f"{what} failed: {first.split('] ', 1)[-1][:160]}") from None


def send_buffer(group, buf: torch.Tensor, peer: int, tag: int, timeout_s: float) -> None:
    if buf.numel():
        _wait(lambda: group.send([buf], peer, tag), timeout_s, "sending activations")


def recv_buffer(group, nbytes: int, peer: int, tag: int, timeout_s: float,
                device: torch.device) -> torch.Tensor:
    buf = torch.empty(nbytes, dtype=torch.uint8, device=device)
    if nbytes:
        _wait(lambda: group.recv([buf], peer, tag), timeout_s, "receiving activations")
    return buf
