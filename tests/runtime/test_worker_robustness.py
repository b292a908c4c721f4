"""A worker strangers cannot stall: real worker subprocesses on loopback (ports chosen
free by the OS), strangers as raw sockets, a vanished main as a stopped subprocess.
Every wait is bounded."""
import json
import os
import random
import re
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

import pytest
import torch

from comfyui_placement.placement.errors import PlacementError

SECRET_ENV = "CP_TEST_ROBUST_SECRET"
SECRET = "robust-secret"
HANDSHAKE_S = 5.0            # the worker's default --handshake-timeout


class Worker:
    def __init__(self, tmp_path, *options, name="w"):
        models = tmp_path / "models"
        models.mkdir(exist_ok=True)
        # the worker's stderr; read through a file of our own (logs()): a read through
        # this one would move the offset its writes share
        self.log = open(tmp_path / f"{name}.log", "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "comfyui_placement", "worker", "--listen", "127.0.0.1:0",
             "--models", str(models), "--secret-env", SECRET_ENV, *options],
            stdout=subprocess.PIPE, stderr=self.log, text=True,
            env=dict(os.environ, **{SECRET_ENV: SECRET}))
        ready, _, _ = select.select([self.proc.stdout], [], [], 60)
        line = self.proc.stdout.readline() if ready else ""
        if not line.startswith("listening on "):
            self.stop()
            raise RuntimeError(f"worker did not start: {line!r}")
        self.address = line.split()[-1]
        host, port = self.address.rsplit(":", 1)
        self.host, self.port = host, int(port)

    def logs(self) -> str:
        with open(self.log.name) as own:
            return own.read()

    def wait_log(self, pattern: str, timeout_s: float, count: int = 1) -> float:
        """Seconds until `pattern` (a regex) is in the log `count` times."""
        t0 = time.monotonic()
        while len(re.findall(pattern, self.logs())) < count:
            if time.monotonic() - t0 > timeout_s:
                raise AssertionError(f"{pattern!r} x{count} not logged within {timeout_s} s")
            time.sleep(0.05)
        return time.monotonic() - t0

    def connect(self, source: str = "127.0.0.1") -> socket.socket:
        """A connection from the loopback address `source` (127.0.0.0/8: each one a
        different peer address to the worker)."""
        return socket.create_connection((self.host, self.port), timeout=10,
                                        source_address=(source, 0))

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
        self.proc.wait(timeout=30)
        self.log.close()


@pytest.fixture
def worker(tmp_path):
    started = []

    def start(*options):
        w = Worker(tmp_path, *options, name=f"w{len(started) + 1}")
        started.append(w)
        return w
    yield start
    for w in started:
        print(f"--- worker log ---\n{w.logs()}")        # pytest shows it on failure
        w.stop()


def cluster(w, secret=SECRET, **kw):
    from comfyui_placement.runtime.distributed import Cluster
    kw.setdefault("timeout_s", 10)
    kw.setdefault("connect_timeout_s", 10)
    return Cluster(f"w1={w.address}", secret=secret.encode(), **kw)


def echo(c):
    """A round trip through the worker's group: it serves, not just shook hands."""
    from comfyui_placement.runtime.distributed.probe import echo as probe_echo
    payload = torch.arange(1000, dtype=torch.int32)
    assert probe_echo(c.links["w1"], payload, 10) < 10


def read_message(sock) -> dict:
    (n,) = struct.unpack("<I", _exact(sock, 4))
    return json.loads(_exact(sock, n))


def _exact(sock, n):
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise ConnectionError("closed")
        out += chunk
    return out


def closed_within(sock, timeout_s: float) -> bool:
    """Whether the worker closes `sock` within timeout_s (what it sent before is read)."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        ready, _, _ = select.select([sock], [], [], max(0.0, end - time.monotonic()))
        if ready:
            try:
                if not sock.recv(65536):
                    return True
            except ConnectionError:
                return True
    return False


def heartbeat_threads() -> int:
    return sum(t.name == "comfyui-placement heartbeat" and t.is_alive()
               for t in threading.enumerate())


# -- the framing itself ---------------------------------------------------------------
def test_a_message_is_bounded_before_it_is_read_and_a_deadline_is_absolute():
    from comfyui_placement.runtime.distributed import wire
    a, b = socket.socketpair()
    with a, b:
        a.sendall(struct.pack("<I", 0xFFFFFFFF))       # claims 4 GiB, sends nothing more
        b.settimeout(5)
        t0 = time.monotonic()
        with pytest.raises(wire.LinkLost, match="4294967295 bytes is past the 65536 limit"):
            wire.recv_message(b, wire.HANDSHAKE_MAX)
        assert time.monotonic() - t0 < 1               # refused on the prefix alone
        a.sendall(struct.pack("<I", 100) + b"[" * 100)
        with pytest.raises(wire.LinkLost, match="not JSON"):
            wire.recv_message(b)

    a, b = socket.socketpair()
    stop = threading.Event()

    def dribble():                      # one byte every 0.1 s: each recv gets an answer
        a.sendall(struct.pack("<I", 1000))
        while not stop.wait(0.1):
            try:
                a.send(b" ")
            except OSError:
                return
    with a, b:
        threading.Thread(target=dribble, daemon=True).start()
        t0 = time.monotonic()
        with pytest.raises(wire.TimedOut):
            wire.recv_message(b, deadline=time.monotonic() + 0.8)
        elapsed = time.monotonic() - t0
        stop.set()
    assert 0.7 < elapsed < 1.5


# -- strangers ------------------------------------------------------------------------
def test_idle_and_garbage_connections_do_not_delay_a_main(worker):
    """50 idle connections of one stranger and peers sending garbage are all in their
    handshakes when a main process with the secret joins: it joins at once and runs a
    round trip; a garbage peer is refused in one log line at once, the stranger's four
    admitted connections at the deadline, its other 46 at once in one line, and one line
    counts them when its handshakes end."""
    w = worker()
    idle = [w.connect("127.0.0.2") for _ in range(50)]
    rnd = random.Random(0)
    garbage = {"random": bytes(rnd.randrange(256) for _ in range(3000)),
               "enormous": struct.pack("<I", 0xFFFFFFFF) + b"{",
               "half": struct.pack("<I", 200) + b'{"mac": "' + b"a" * 60,
               "not json": struct.pack("<I", 8) + b"\xff\xfe\x00garbl"}
    peers = {}
    for i, (what, data) in enumerate(garbage.items()):
        s = w.connect(f"127.0.0.{3 + i}")
        s.sendall(data)
        peers[what] = s
    try:
        t0 = time.monotonic()
        with cluster(w) as c:
            joined = time.monotonic() - t0
            assert [d["name"] for d in c.links["w1"].devices][:1] == ["cpu"]
            echo(c)
            assert joined < 3.0, f"joining took {joined:.1f} s"
            ports = {what: s.getsockname()[1] for what, s in peers.items()}
            w.wait_log(rf"refused 127\.0\.0\.4:{ports['enormous']}: control message of "
                       rf"4294967295 bytes is past the 65536 limit", 5)
            w.wait_log(rf"refused 127\.0\.0\.6:{ports['not json']}: control message is "
                       rf"not JSON", 5)
            w.wait_log(rf"refused 127\.0\.0\.3:{ports['random']}: ", 5)
            assert closed_within(peers["enormous"], 2)
            # silence is cut at the handshake deadline, not later
            assert closed_within(peers["half"], HANDSHAKE_S + 3)
            assert all(closed_within(s, 3) for s in idle)
            w.wait_log(r"refused 127\.0\.0\.2:\d+: handshake not finished within 5 s", 5,
                       count=4)
            w.wait_log(r"refused 127\.0\.0\.5:\d+: handshake not finished within 5 s", 5)
            w.wait_log(r"refused 45 more connections from 127\.0\.0\.2 while its "
                       r"handshakes were pending", 5)
            assert len(re.findall(r"4 handshakes from 127\.0\.0\.2 are pending already",
                                  w.logs())) == 1
            echo(c)                                # the session outlived them all
    finally:
        for s in idle + list(peers.values()):
            s.close()
    assert w.proc.poll() is None


def seconds_to_join(w) -> float:
    """A main with the secret joins `w` and runs a round trip: how long the join took."""
    t0 = time.monotonic()
    with cluster(w) as c:
        joined = time.monotonic() - t0
        echo(c)
    return joined


def test_one_stranger_with_300_idle_connections_cannot_lock_the_main_out(worker):
    """One address holds at most four handshakes (--max-pending-per-address): its other
    296 connections are closed at once, the main joins in well under 5 s, and the worker
    logs the flood in two lines, never one per connection (issue 33)."""
    w = worker()
    hog = [w.connect("127.0.0.2") for _ in range(300)]
    try:
        joined = seconds_to_join(w)
        assert joined < 5.0, f"joining took {joined:.1f} s"
        assert sum(closed_within(s, 0.5) for s in hog[4:]) == 296
    finally:
        for s in hog:
            s.close()
    w.wait_log(r"refused 295 more connections from 127\.0\.0\.2 while its handshakes "
               r"were pending", HANDSHAKE_S + 5)
    logs = w.logs()
    assert len(re.findall(r"4 handshakes from 127\.0\.0\.2 are pending already", logs)) == 1
    lines = [line for line in logs.splitlines() if "127.0.0.2" in line]
    assert len(lines) <= 1 + 4 + 1, logs          # the first, the 4 admitted, the end


def test_twenty_strangers_of_twenty_connections_cannot_lock_the_main_out(worker):
    """20 addresses of 20 idle connections each: 80 handshakes pending at most (four an
    address), the main joins in under 5 s; one line per address for its refusals."""
    w = worker()
    strangers = [f"127.0.0.{10 + i}" for i in range(20)]
    socks = [w.connect(host) for host in strangers for _ in range(20)]
    try:
        joined = seconds_to_join(w)
        assert joined < 5.0, f"joining took {joined:.1f} s"
    finally:
        for s in socks:
            s.close()
    logs = w.logs()
    for host in strangers:
        pattern = rf"4 handshakes from {re.escape(host)} are pending already"
        assert len(re.findall(pattern, logs)) == 1, host


def test_a_dribbling_peer_is_cut_at_the_deadline(worker):
    """A byte a second would renew a timeout per recv forever; the handshake has one
    deadline for the whole of it."""
    w = worker()
    with w.connect() as s:
        t0 = time.monotonic()
        assert "nonce" in read_message(s)
        s.sendall(struct.pack("<I", 1000))
        cut = None
        while time.monotonic() - t0 < HANDSHAKE_S + 4:
            try:
                s.send(b"a")
            except OSError:
                cut = time.monotonic() - t0
                break
            ready, _, _ = select.select([s], [], [], 0.3)
            if ready:
                try:
                    closed = not s.recv(100)
                except ConnectionError:
                    closed = True
                if closed:
                    cut = time.monotonic() - t0
                    break
        port = s.getsockname()[1]
    assert cut is not None, "the dribbling peer was never cut"
    assert HANDSHAKE_S - 0.5 < cut < HANDSHAKE_S + 1.5
    w.wait_log(rf"refused 127\.0\.0\.1:{port}: handshake not finished within 5 s", 2)


def test_beyond_max_pending_new_connections_are_closed_at_once(worker):
    w = worker("--max-pending", "4", "--handshake-timeout", "60")
    idle = [w.connect() for _ in range(4)]
    try:
        for s in idle:                 # each one's handshake has begun (pending = 4)
            assert "nonce" in read_message(s)
        with w.connect() as extra:
            t0 = time.monotonic()
            said = read_message(extra)
            assert closed_within(extra, 1) and time.monotonic() - t0 < 1.5
        assert said == {"error": "4 handshakes are pending already", "refusal": "full"}
        with pytest.raises(PlacementError, match=r"^worker w1 \(127\.0\.0\.1:\d+\) refused "
                           r"the connection: 4 handshakes are pending already$"):
            cluster(w)
    finally:
        for s in idle:
            s.close()
    w.wait_log(r"refused 127\.0\.0\.1:\d+: connection closed by the peer", 5, count=4)
    with cluster(w) as c:              # their slots are free again
        echo(c)


# -- one session at a time ------------------------------------------------------------
def test_a_second_main_is_told_who_is_served_and_joins_after(worker):
    w = worker()
    before = heartbeat_threads()
    first = cluster(w)
    try:
        assert heartbeat_threads() == before + 1
        t0 = time.monotonic()
        with pytest.raises(PlacementError) as err:
            cluster(w)
        assert time.monotonic() - t0 < 5
        assert re.fullmatch(r"worker w1 \(127\.0\.0\.1:\d+\) refused to join: busy: serving "
                            r"a main process from 127\.0\.0\.1:\d+ since \d{4}-\d\d-\d\d "
                            r"\d\d:\d\d:\d\d", str(err.value)), str(err.value)
        main_port = first.links["w1"].sock.getsockname()[1]
        assert f"from 127.0.0.1:{main_port} since" in str(err.value)
        assert heartbeat_threads() == before + 1       # the refused one left none behind
        with pytest.raises(PlacementError, match=r"refused to join: wrong secret; set the "
                           r"same secret") as wrong:     # no secret: not told who is served
            cluster(w, secret="not-the-secret")
        assert "busy" not in str(wrong.value)
        echo(first)                                      # undisturbed
    finally:
        first.close()
    assert heartbeat_threads() == before                 # closing stops its heartbeat
    with cluster(w) as second:                           # at once: no busy window
        echo(second)
    assert re.search(r"worker: refused 127\.0\.0\.1:\d+: busy: serving a main process",
                     w.logs())
    w.wait_log(r"worker: 127\.0\.0\.1:\d+ left", 5, count=2)


MAIN = """
import sys, time
from comfyui_placement.runtime.distributed import Cluster
cluster = Cluster("w1=" + sys.argv[1], secret=sys.argv[2].encode(), timeout_s=10)
print("joined", cluster.links["w1"].sock.getsockname()[1], flush=True)
time.sleep(600)
"""


def test_a_silent_main_is_dropped_and_the_next_one_joins(worker, tmp_path):
    """A main process that stops without closing (its machine gone) holds the worker only
    for --main-timeout; one merely idle keeps it (its heartbeat), and a main notices a
    worker that went away between prompts."""
    main_timeout = 2.0
    w = worker("--main-timeout", f"{main_timeout:g}")
    script = tmp_path / "main.py"
    script.write_text(MAIN)
    main = subprocess.Popen([sys.executable, str(script), w.address, SECRET],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        ready, _, _ = select.select([main.stdout], [], [], 60)
        line = main.stdout.readline() if ready else ""
        assert line.startswith("joined "), line
        port = int(line.split()[1])
        time.sleep(main_timeout * 1.5)                 # idle, not silent: still served
        with pytest.raises(PlacementError, match="busy: serving a main process from "
                           rf"127\.0\.0\.1:{port} since"):
            cluster(w)
        assert "silent" not in w.logs()
        main.send_signal(signal.SIGSTOP)               # vanished without closing
        waited = w.wait_log(rf"worker: 127\.0\.0\.1:{port} silent for 2 s \(no request, "
                            rf"no heartbeat\); dropped its session", main_timeout + 4)
        assert waited > main_timeout - 1.0
        with cluster(w) as c:
            time.sleep(main_timeout * 1.5)             # this one idles under its heartbeat
            echo(c)
            link = c.links["w1"]
            w.proc.kill()                              # the worker goes away between prompts
            t0 = time.monotonic()
            while link.broken is None and time.monotonic() - t0 < 5:
                time.sleep(0.05)
            assert link.broken is not None
            with pytest.raises(PlacementError, match="was lost earlier"):
                echo(c)
    finally:
        main.kill()
        main.wait(timeout=30)
