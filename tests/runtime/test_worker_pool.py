"""The workers a ComfyUI session joins (runtime/distributed/pool.py): joined once and
reused, an unreachable one is a line (never an exception), a lost one is joined again."""
import socket
import time

import pytest

from comfyui_placement.placement.errors import PlacementError
from comfyui_placement.runtime.distributed import pool
from test_distributed import SECRET_ENV, flux, WorkerProcess


@pytest.fixture
def worker(tmp_path, monkeypatch):
    _, _, models, _ = flux(tmp_path)
    w = WorkerProcess(models, tmp_path)
    monkeypatch.setenv(SECRET_ENV, "loopback-secret")
    yield w
    pool.close_all()
    w.stop()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]         # nothing listens there once closed


def test_joined_once_and_reused(worker):
    text = f"w1={worker.address}"
    a = pool.join_workers(text, secret_env=SECRET_ENV)
    b = pool.join_workers(text, secret_env=SECRET_ENV)
    assert a.joined["w1"] is b.joined["w1"]             # one join per session
    assert not a.unreachable
    names = [d.name for d in a.devices()]
    assert "w1.cpu" in names
    assert a["w1.cpu"].name == "w1.cpu"
    assert a.lines()[0].startswith(f"worker w1 ({worker.address}) joined: w1.cpu")
    assert worker.logs().count("joined; rank 1") == 1


def test_unreachable_worker_is_one_line_and_the_others_join(worker):
    port = closed_port()
    t0 = time.time()
    got = pool.join_workers(f"w1={worker.address},w2=127.0.0.1:{port}",
                            secret_env=SECRET_ENV, connect_timeout_s=3)
    assert time.time() - t0 < 10
    assert list(got.joined) == ["w1"]
    line = got.unreachable["w2"]
    assert line.startswith(f"worker w2 (127.0.0.1:{port}): cannot connect") and "\n" not in line
    with pytest.raises(PlacementError, match="cannot connect"):
        got["w2.cpu"]
    assert [d.name.split(".")[0] for d in got.devices()] == ["w1"]


def test_wrong_or_missing_secret_is_a_line(worker, monkeypatch):
    got = pool.join_workers(f"w1={worker.address}", secret=b"not-it")
    assert "wrong secret" in got.unreachable["w1"] and not got.joined
    monkeypatch.delenv(SECRET_ENV)
    got = pool.join_workers(f"w1={worker.address}", secret_env=SECRET_ENV)
    assert f"set the environment variable {SECRET_ENV}" in got.unreachable["w1"]


def test_bad_text_is_an_error_and_empty_is_nothing():
    with pytest.raises(PlacementError, match="ALIAS=HOST:PORT"):
        pool.join_workers("w1=nowhere")
    assert not pool.join_workers("  ")


def test_a_lost_worker_is_joined_again(worker):
    text = f"w1={worker.address}"
    first = pool.join_workers(text, secret_env=SECRET_ENV)
    cluster = first.joined["w1"]
    link = cluster.links["w1"]
    link._lost(RuntimeError("simulated loss"))            # as a failed step marks it
    pool.forget(first)
    again = pool.join_workers(text, secret_env=SECRET_ENV)
    assert again.joined["w1"] is not cluster
    deadline = time.time() + 10
    while worker.logs().count("joined; rank 1") < 2 and time.time() < deadline:
        time.sleep(0.1)
    assert worker.logs().count("joined; rank 1") == 2


def test_a_refused_worker_is_not_asked_again_at_once(monkeypatch):
    """Validation and execution of one prompt would each wait on the same dead worker:
    a refusal is remembered for RETRY_AFTER_S."""
    import threading
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    accepted = []

    def serve():                       # not a worker: accepts and hangs up
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            accepted.append(1)
            conn.close()
    threading.Thread(target=serve, daemon=True).start()
    try:
        text = f"w9=127.0.0.1:{port}"
        first = pool.join_workers(text, secret=b"s", connect_timeout_s=3)
        again = pool.join_workers(text, secret=b"s", connect_timeout_s=3)
        assert first.unreachable["w9"] == again.unreachable["w9"]
        assert len(accepted) == 1
        monkeypatch.setattr(pool, "RETRY_AFTER_S", 0.0)
        pool.join_workers(text, secret=b"s", connect_timeout_s=3)
        deadline = time.time() + 5
        while len(accepted) < 2 and time.time() < deadline:
            time.sleep(0.05)
        assert len(accepted) == 2
    finally:
        listener.close()
        pool.close_all()


def test_a_worker_whose_backlog_is_full_is_one_line_at_the_join_deadline(monkeypatch):
    """An address that neither accepts nor refuses (a listening socket with a full
    backlog: the connection's SYN is never answered) costs the join its deadline, then
    one line; never a hang."""
    monkeypatch.setenv(SECRET_ENV, "loopback-secret")
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(0)
        port = srv.getsockname()[1]
        fillers = []
        try:
            for _ in range(8):                # more than the kernel's minimum backlog
                s = socket.socket()
                s.setblocking(False)
                s.connect_ex(("127.0.0.1", port))
                fillers.append(s)
            time.sleep(0.3)
            t0 = time.monotonic()
            w = pool.join_workers(f"w9=127.0.0.1:{port}", secret_env=SECRET_ENV,
                                  connect_timeout_s=2.0)
            took = time.monotonic() - t0
        finally:
            for s in fillers:
                s.close()
            pool.close_all()
    assert 1.5 < took < 4.0, took
    line = w.unreachable["w9"]
    assert "\n" not in line and line.startswith(f"worker w9 (127.0.0.1:{port}):")
    assert "timed out" in line
