"""Weight-file reads with several preads in flight (runtime/readpool via
WeightFile.read_runs): byte-identical to one plain read for any run layout and chunk
size, one error for a short file, nothing left (thread or descriptor) after close, and
GGUF quantized entries read by their byte ranges only."""
import os
import threading
import time

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file

from comfyui_placement.placement.errors import PlacementError
from comfyui_placement.runtime import place
from comfyui_placement.runtime.weights import readpool
from comfyui_placement.runtime.weights.diskfill import read_staged, staged
from comfyui_placement.runtime.weights.weightfile import open_weight_file

FILE_BYTES = 96 * 1024


def reader_threads():
    return [t for t in threading.enumerate() if t.name.startswith("copy-disk-") and t.is_alive()]


def open_fds():
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    """A safetensors file whose data section is random bytes; returns (path, bytes)."""
    path = str(tmp_path_factory.mktemp("disk") / "w.safetensors")
    g = torch.Generator().manual_seed(0)
    save_file({"w": torch.randint(0, 256, (FILE_BYTES,), dtype=torch.uint8, generator=g)},
              path)
    with open(path, "rb") as fh:
        data = fh.read()
    return path, data


def expected(data, runs, size):
    """The reference: each run copied from the file's bytes by one plain slice."""
    out = bytearray(size)
    for f, b, n in runs:
        out[b:b + n] = data[f:f + n]
    return bytes(out)


@st.composite
def layouts(draw):
    """Runs with random file offsets and lengths, placed at disjoint buffer offsets in
    a random order with random gaps (as a group's tensors land in a slot)."""
    n = draw(st.integers(1, 12))
    lengths = draw(st.lists(st.integers(0, 20_000), min_size=n, max_size=n))
    gaps = draw(st.lists(st.integers(0, 300), min_size=n, max_size=n))
    order = draw(st.permutations(range(n)))
    runs, at = [], 0
    for i in order:
        f = draw(st.integers(0, FILE_BYTES - lengths[i]))
        runs.append((f, at + gaps[i], lengths[i]))
        at += gaps[i] + lengths[i]
    return runs, at + draw(st.integers(0, 100))


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(layout=layouts(), chunk=st.sampled_from([1, 7, 512, 4096, 65536]),
       readers=st.integers(0, 4))
def test_concurrent_reads_equal_one_plain_read(weights, layout, chunk, readers):
    path, data = weights
    runs, size = layout
    wf = open_weight_file(path, readers=readers, chunk=chunk)
    try:
        buf = torch.full((size,), 0xAB, dtype=torch.uint8)
        wf.read_runs(runs, buf)
        ref = bytearray(expected(data, runs, size))
        covered = np.zeros(size, dtype=bool)
        for _, b, n in runs:
            covered[b:b + n] = True
        got = buf.numpy()
        assert bytes(got[covered]) == bytes(np.frombuffer(ref, np.uint8)[covered])
        assert (got[~covered] == 0xAB).all()            # nothing written outside the runs
    finally:
        wf.close()


@pytest.mark.parametrize("n", [1, 4095, 4096, 4097, 8192, 3 * 4096 + 1])
def test_chunk_boundaries(weights, n):
    path, data = weights
    wf = open_weight_file(path, readers=3, chunk=4096)
    try:
        runs = [(1000, 5, n), (0, 5 + n, 4096 - 1)]
        size = 5 + n + 4095
        buf = torch.zeros(size, dtype=torch.uint8)
        wf.read_runs(runs, buf)
        assert bytes(buf.numpy()) == expected(data, runs, size)
    finally:
        wf.close()


def test_several_reads_are_in_flight(weights, monkeypatch):
    """The first four pieces of one call are read at the same time: each waits at a
    barrier that only four readers in flight at once can pass (a serial reader would
    break it after the timeout and the read would fail)."""
    path, data = weights
    barrier = threading.Barrier(4, timeout=10)
    calls, lock = [0], threading.Lock()
    real = readpool.pread_full

    def meet(fd, mv, off, p):
        with lock:
            calls[0] += 1
            first = calls[0] <= 4
        if first:
            barrier.wait()
        real(fd, mv, off, p)

    monkeypatch.setattr(readpool, "pread_full", meet)
    wf = open_weight_file(path, readers=3, chunk=4096)
    try:
        buf = torch.zeros(20 * 4096, dtype=torch.uint8)
        wf.read_runs([(0, 0, 20 * 4096)], buf)
    finally:
        wf.close()
    assert bytes(buf.numpy()) == data[:20 * 4096]


def test_a_short_file_raises_one_error_and_the_file_stays_usable(weights, tmp_path):
    path, data = weights
    short = str(tmp_path / "short.safetensors")
    with open(short, "wb") as fh:
        fh.write(data)
    wf = open_weight_file(short, readers=3, chunk=1024)
    try:
        end = len(data)
        # many pieces past the end: several readers fail, one error comes out
        with pytest.raises(PlacementError, match="file ends early.*truncated") as info:
            wf.read_runs([(end - 3000, 0, 40_000)], torch.zeros(40_000, dtype=torch.uint8))
        assert info.value.__cause__ is None and info.value.__context__ is None
        buf = torch.zeros(2048, dtype=torch.uint8)      # the pool still serves reads
        wf.read_runs([(0, 0, 2048)], buf)
        assert bytes(buf.numpy()) == data[:2048]
        os.truncate(short, end - 10)                    # shrunk after opening: refused
        with pytest.raises(PlacementError, match="truncated while streaming"):
            wf.read_runs([(0, 0, 2048)], buf)
    finally:
        wf.close()


def test_close_joins_the_readers_and_closes_the_descriptor(weights):
    path, data = weights
    threads, fds = len(reader_threads()), open_fds()
    wf = open_weight_file(path, readers=3, chunk=1024)
    buf = torch.zeros(20_000, dtype=torch.uint8)
    wf.read_runs([(0, 0, 20_000)], buf)
    assert bytes(buf.numpy()) == data[:20_000]
    assert len(reader_threads()) == threads + 3 and open_fds() == fds + 1
    wf.close()
    assert len(reader_threads()) == threads             # joined, not left to die later
    assert open_fds() == fds
    with pytest.raises(PlacementError, match="after the file was closed"):
        wf.read_runs([(0, 0, 10)], buf)
    wf.close()                                          # twice is harmless


def test_many_opens_and_closes_leave_nothing(weights):
    path, _ = weights
    threads, fds = len(reader_threads()), open_fds()
    for _ in range(20):
        wf = open_weight_file(path, readers=2, chunk=512)
        wf.read_runs([(0, 0, 4096)], torch.zeros(4096, dtype=torch.uint8))
        wf.close()
    assert len(reader_threads()) == threads and open_fds() == fds


def test_close_waits_for_a_read_in_progress(weights, monkeypatch):
    """The descriptor is never closed under a read (a reused fd number would read another
    file): close() returns only after the read in progress has finished."""
    path, data = weights
    started, release = threading.Event(), threading.Event()
    real = readpool.pread_full

    def held(fd, mv, off, p):
        started.set()
        release.wait(5)
        real(fd, mv, off, p)

    wf = open_weight_file(path, readers=2, chunk=1024)
    monkeypatch.setattr(readpool, "pread_full", held)
    buf = torch.zeros(8192, dtype=torch.uint8)
    errors = []
    reading = threading.Thread(target=lambda: _catch(errors, wf.read_runs,
                                                     [(0, 0, 8192)], buf))
    reading.start()
    assert started.wait(5)
    closing = threading.Thread(target=wf.close)
    closing.start()
    time.sleep(0.1)
    assert closing.is_alive()                           # held by the read
    release.set()
    reading.join(5)
    closing.join(5)
    assert not closing.is_alive() and not errors
    assert bytes(buf.numpy()) == data[:8192]


def _catch(errors, fn, *args):
    try:
        fn(*args)
    except BaseException as e:      # noqa: BLE001
        errors.append(e)


def test_two_callers_at_once_each_get_their_bytes(weights):
    path, data = weights
    wf = open_weight_file(path, readers=2, chunk=700)
    errors, bufs = [], [torch.zeros(30_000, dtype=torch.uint8) for _ in range(4)]

    def work(i):
        for _ in range(10):
            wf.read_runs([(i * 7000, 0, 30_000)], bufs[i])

    try:
        ts = [threading.Thread(target=_catch, args=(errors, work, i)) for i in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    finally:
        wf.close()
    assert not errors
    for i, b in enumerate(bufs):
        assert bytes(b.numpy()) == data[i * 7000:i * 7000 + 30_000]


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(layout=layouts(), cap=st.integers(1, 30_000))
def test_staged_reads_fit_the_staging_buffer_and_match_direct_reads(weights, layout, cap):
    """The resident fill onto a GPU goes through a staging buffer; the same function on a
    CPU destination must give the bytes a direct read gives."""
    path, data = weights
    runs, size = layout
    batches = list(staged(runs, cap))
    for batch in batches:
        assert sum(n for *_, n in batch) <= cap
        assert all(s + n <= cap for _, _, s, n in batch)
    assert sum(n for batch in batches for *_, n in batch) == sum(n for *_, n in runs)
    wf = open_weight_file(path, readers=2, chunk=1000)
    try:
        direct = torch.zeros(size, dtype=torch.uint8)
        wf.read_runs(runs, direct)
        through = torch.zeros(size, dtype=torch.uint8)
        read_staged(wf, runs, through, torch.empty(cap, dtype=torch.uint8))
        assert torch.equal(direct, through)
    finally:
        wf.close()


def test_bad_buffers_and_runs_are_refused(weights):
    path, _ = weights
    wf = open_weight_file(path)
    try:
        with pytest.raises(PlacementError, match="contiguous CPU uint8"):
            wf.read_runs([(0, 0, 4)], torch.zeros(4, dtype=torch.float32))
        with pytest.raises(PlacementError, match="does not fit a 8-byte buffer"):
            wf.read_runs([(0, 4, 5)], torch.zeros(8, dtype=torch.uint8))
    finally:
        wf.close()
    with pytest.raises(PlacementError, match="readers >= 0"):
        open_weight_file(path, readers=-1)


# -- GGUF: quantized entries by their byte ranges ------------------------------------

def test_gguf_quantized_entries_are_read_by_byte_range_only(plan_for, sim_inventory,
                                                            tmp_path, monkeypatch):
    """Streaming a module that keeps Q8_0 bytes raw reads exactly those bytes of the file
    (counted at the pread), never the large tensor it does not use, into uint8 slots."""
    gguf = pytest.importorskip("gguf")

    class QLinear(torch.nn.Module):         # keeps Q8_0 bytes raw, as ComfyUI-GGUF does
        def __init__(self, raw_bytes):
            super().__init__()
            self.register_buffer("qweight", torch.zeros(raw_bytes, dtype=torch.uint8))

        def forward(self, x):
            raw = self.qweight.numpy().reshape(32, -1)
            w = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q8_0)
            return torch.tanh(x @ torch.from_numpy(w).float().T)

    class QStack(torch.nn.Module):
        def __init__(self, raw_bytes):
            super().__init__()
            self.blocks = torch.nn.ModuleList(QLinear(raw_bytes) for _ in range(3))

        def forward(self, x):
            for b in self.blocks:
                x = b(x)
            return x

    g = torch.Generator().manual_seed(1)
    quantized = {f"blocks.{i}.qweight": gguf.quants.quantize(
        torch.randn(32, 32, generator=g).numpy(), gguf.GGMLQuantizationType.Q8_0)
        for i in range(3)}
    path = str(tmp_path / "q.gguf")
    w = gguf.GGUFWriter(path, "test")
    w.add_tensor("unused.big", np.random.default_rng(0).standard_normal(
        (512, 512)).astype(np.float32))                          # 1 MiB nobody reads
    for name, q in quantized.items():
        w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    raw_bytes = quantized["blocks.0.qweight"].nbytes
    reference = QStack(raw_bytes)
    for name, q in quantized.items():
        reference.get_buffer(name).copy_(torch.from_numpy(q.reshape(-1).copy()))
    x = torch.randn(4, 32, generator=g)
    ref = reference(x)

    wf = open_weight_file(path)
    ranges = {name: (e[2], e[3]) for name, e in wf.entries.items()}
    assert set(wf.quantized) == set(quantized) and wf.entries["blocks.0.qweight"][0] == \
        torch.uint8
    wf.close()

    reads = []
    real = readpool.pread_full

    def counted(fd, mv, off, p):
        reads.append((off, len(mv)))
        real(fd, mv, off, p)

    monkeypatch.setattr(readpool, "pread_full", counted)
    model = QStack(raw_bytes)
    steps = 2
    with place(model, plan_for("disk", stream=(0, 1)), "diffusion", sim_inventory,
               weights_file=path):
        for _ in range(steps):
            assert torch.equal(model(x), ref)
    wanted = sorted(ranges[n] for n in quantized)
    per_entry = {r: 0 for r in wanted}
    for off, n in reads:                        # every byte read lies inside a Q8_0 entry
        inside = [(o, m) for o, m in wanted if o <= off and off + n <= o + m]
        assert inside, (off, n)
        per_entry[inside[0]] += n
    for (o, m), got in per_entry.items():       # each entry read whole, once per step
        assert got % m == 0 and steps <= got // m <= steps + 1, (o, m, got)   # (+1: the
    assert sum(per_entry.values()) < os.path.getsize(path) // 50      # next step prefetched)


def test_an_interrupted_read_returns_only_after_the_started_reads_end(weights, monkeypatch):
    """A read that raises (here an interrupt in the caller's own piece) must not return
    while reader threads still write into the buffer the caller will reuse."""
    path, _ = weights
    inflight, lock = [0], threading.Lock()
    real = readpool.pread_full
    caller = threading.get_ident()

    def piece(fd, mv, off, p):
        if threading.get_ident() == caller and off > 0:
            time.sleep(0.01)                         # the readers have started theirs
            raise KeyboardInterrupt
        with lock:
            inflight[0] += 1
        time.sleep(0.05)
        real(fd, mv, off, p)
        with lock:
            inflight[0] -= 1

    monkeypatch.setattr(readpool, "pread_full", piece)
    wf = open_weight_file(path, readers=3, chunk=2048)
    try:
        with pytest.raises(KeyboardInterrupt):
            wf.read_runs([(0, 0, 40 * 2048)], torch.zeros(40 * 2048, dtype=torch.uint8))
        assert inflight[0] == 0
    finally:
        wf.close()


def test_a_file_truncated_while_streaming_in_pieces_leaves_no_reader(tiny, plan_for,
                                                                     sim_inventory, tmp_path,
                                                                     monkeypatch):
    """Streaming through the engine with blocks cut into many pieces (the tiny model's
    blocks are smaller than the default piece): a truncation mid-run gives one error
    naming it, and the placement's reader threads and descriptor are gone after."""
    from comfyui_placement.runtime.weights.weightfile import WeightFile
    monkeypatch.setattr(readpool, "CHUNK", 1024)
    model, inp = tiny("flux")
    with torch.no_grad():
        ref = model(**inp)[0]
    path = str(tmp_path / "flux.safetensors")
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    save_file(state, path)
    plan = plan_for("disk", stream=(0, 1))
    threads, fds = len(reader_threads()), open_fds()
    with place(model, plan, "diffusion", sim_inventory, weights_file=path):
        with torch.no_grad():
            assert torch.equal(model(**inp)[0], ref)
        assert len(reader_threads()) > threads       # the pieces were read in parallel
    assert len(reader_threads()) == threads and open_fds() == fds
    original, calls = WeightFile.read_runs, [0]

    def cut_at_third(self, runs, buf):
        calls[0] += 1
        if calls[0] == 3:
            end = max(f + n for f, _, n in runs)
            with open(path, "r+b") as fh:         # cut inside this block, keep the mtime
                st = os.fstat(fh.fileno())
                fh.truncate(end - 10)
            os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
            self._identity = (end - 10, st.st_mtime_ns)   # pass the size check: the
        return original(self, runs, buf)                  # short read must catch it

    monkeypatch.setattr(WeightFile, "read_runs", cut_at_third)
    with pytest.raises((RuntimeError, PlacementError)) as info:
        with place(model, plan, "diffusion", sim_inventory, weights_file=path):
            for _ in range(2):
                with torch.no_grad():
                    model(**inp)
    cause = info.value if isinstance(info.value, PlacementError) else info.value.__cause__
    assert isinstance(cause, PlacementError) and "file ends early" in str(cause)
    assert not any("teardown" in n for n in getattr(info.value, "__notes__", []))
    assert len(reader_threads()) == threads and open_fds() == fds


def test_a_file_dropped_without_close_leaves_nothing(weights):
    import gc
    path, _ = weights
    threads, fds = len(reader_threads()), open_fds()
    wf = open_weight_file(path, readers=3, chunk=1024)
    wf.read_runs([(0, 0, 20_000)], torch.zeros(20_000, dtype=torch.uint8))
    assert len(reader_threads()) == threads + 3
    del wf
    gc.collect()
    deadline = time.monotonic() + 5           # the finalizer asks; the threads then end
    while len(reader_threads()) > threads and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(reader_threads()) == threads and open_fds() == fds


def test_an_interrupt_between_pieces_neither_hangs_nor_leaves_reads_running(weights,
                                                                           monkeypatch):
    """An interrupt can land after the caller claimed a piece and before it counted it
    done: the read must still return (not wait for that piece forever), and only once
    the reader threads' pieces have ended."""
    path, _ = weights
    inflight, lock = [0], threading.Lock()
    real_read, real_work = readpool.pread_full, readpool._Job.work
    caller = []

    def slow(fd, mv, off, p):
        with lock:
            inflight[0] += 1
        time.sleep(0.03)
        real_read(fd, mv, off, p)
        with lock:
            inflight[0] -= 1

    def work(self, fd, p):
        if threading.get_ident() != caller[0]:
            return real_work(self, fd, p)
        time.sleep(0.01)                           # the readers have started theirs
        with self.lock:
            self.next += 1                         # claimed, never finished
        raise KeyboardInterrupt

    monkeypatch.setattr(readpool, "pread_full", slow)
    monkeypatch.setattr(readpool._Job, "work", work)
    wf = open_weight_file(path, readers=3, chunk=2048)
    outcome = []

    def read():
        caller.append(threading.get_ident())
        try:
            wf.read_runs([(0, 0, 30 * 2048)], torch.zeros(30 * 2048, dtype=torch.uint8))
        except KeyboardInterrupt:
            outcome.append(inflight[0])

    t = threading.Thread(target=read, daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive(), "the interrupted read hangs"   # (close() would wait on it)
    monkeypatch.setattr(readpool._Job, "work", real_work)
    wf.close()
    assert outcome == [0]
