"""Several positional reads of one file in flight at once, straight into the caller's
buffer. A disk (NVMe above all) reaches its speed only with a queue of requests; one
`preadv` at a time leaves it idle between calls. `os.preadv` releases the GIL, so a few
threads are enough: the caller cuts its byte ranges into pieces of about 1 MiB, reads
pieces itself and lets up to `readers` kept threads read the others. The first error
is raised once, after every piece already started has finished (a buffer must not be
written once its read has returned)."""
import os
import queue
import threading
from typing import List, Optional, Sequence, Tuple

from ...placement.errors import PlacementError

# Measured cold, each read paired with a plain read of the same block (benchmarks/
# disk_read.py --pieces; 2-core VM, virtio disk): 1 MiB pieces x 4 in flight 1.03x one plain read,
# 4 MiB pieces 0.74x (probably: the in-flight span strays from the order the host's
# readahead follows), 512 KiB 1.15x but ~7 us of Python (GIL) per piece.
CHUNK = 1024 ** 2
READERS = 3                # threads besides the caller: 4 pieces in flight

Piece = Tuple[int, memoryview]          # file offset, destination


def pread_full(fd: int, mv: memoryview, offset: int, path: str) -> None:
    """Read len(mv) bytes at `offset` into `mv`; a file that ends before is truncated."""
    n = len(mv)
    done = os.preadv(fd, [mv], offset)      # almost always all of it
    while done < n:
        got = os.preadv(fd, [mv[done:]], offset + done)
        if got <= 0:
            raise PlacementError(f"{path}: file ends early at byte {offset + done}; the "
                                 f"file is truncated")
        done += got


def cut(runs: Sequence[Tuple[int, int, int]], mv: memoryview, chunk: int) -> List[Piece]:
    """(file offset, buffer offset, nbytes) runs -> pieces of at most `chunk` bytes."""
    pieces = []
    for file_off, buf_off, n in runs:
        for at in range(0, n, chunk):
            m = min(chunk, n - at)
            pieces.append((file_off + at, mv[buf_off + at:buf_off + at + m]))
    return pieces


class _Job:
    """One read_runs call: pieces claimed one by one by whoever is free."""

    def __init__(self, pieces: List[Piece]):
        self.pieces = pieces
        self.next = 0
        self.left = len(pieces)             # pieces not yet finished (read or skipped)
        self.error: Optional[BaseException] = None
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.helping = 0                    # reader threads inside work()
        self.idle = threading.Condition(self.lock)

    def help(self, fd: int, path: str) -> None:
        """work() on a reader thread, counted so an interrupted caller can wait for it."""
        with self.lock:
            self.helping += 1
        try:
            self.work(fd, path)
        finally:
            with self.lock:
                self.helping -= 1
                self.idle.notify_all()

    def work(self, fd: int, path: str) -> None:
        finished = False                    # one lock round per piece: count the last
        while True:                         # one done and claim the next together
            with self.lock:
                if finished:
                    self.left -= 1
                    if self.left == 0:
                        self.done.set()
                i = self.next
                if i >= len(self.pieces):
                    return
                self.next += 1
                skip = self.error is not None
            if not skip:
                try:
                    off, mv = self.pieces[i]
                    pread_full(fd, mv, off, path)
                except BaseException as e:          # noqa: BLE001 (handed to the caller)
                    with self.lock:
                        if self.error is None:
                            self.error = e
            finished = True

    def cancel(self, why: BaseException) -> None:
        """Skip the pieces not started and wait for the reader threads' reads to end (a
        piece the interrupted caller had claimed is its own: nobody else writes it)."""
        with self.lock:
            if self.error is None:
                self.error = why
            while self.helping:
                self.idle.wait()


class ReadPool:
    """Reader threads kept for one open file's life (started on the first large read,
    joined by close()). Thread names start with "copy-disk-" so leak checks see them."""

    def __init__(self, fd: int, path: str, readers: int = READERS, chunk: int = CHUNK):
        if readers < 0 or chunk < 1:
            raise PlacementError(f"ReadPool needs readers >= 0 and chunk >= 1, got "
                                 f"readers={readers}, chunk={chunk}")
        self.fd, self.path = fd, path
        self.readers, self.chunk = readers, chunk
        self._queue: "queue.SimpleQueue[Optional[_Job]]" = queue.SimpleQueue()
        self._threads: List[threading.Thread] = []
        self._active = 0                    # read() calls in progress
        self._closed = False
        self._state = threading.Condition()

    def read(self, runs: Sequence[Tuple[int, int, int]], mv: memoryview) -> None:
        pieces = cut(runs, mv, self.chunk)
        with self._state:
            if self._closed:
                raise PlacementError(f"{self.path}: read after the file was closed")
            self._active += 1
        try:
            helpers = min(self.readers, len(pieces) - 1)
            if helpers <= 0:                # one piece: no handoff, read it here
                for off, view in pieces:
                    pread_full(self.fd, view, off, self.path)
                return
            self._start(helpers)
            job = _Job(pieces)
            for _ in range(helpers):
                self._queue.put(job)
            try:
                job.work(self.fd, self.path)
                job.done.wait()
            except BaseException as e:      # interrupted: stop, but let started reads end
                job.cancel(e)
                raise
            if job.error is not None:
                raise job.error
        finally:
            with self._state:
                self._active -= 1
                self._state.notify_all()

    def _start(self, n: int) -> None:
        with self._state:
            while len(self._threads) < n:
                t = threading.Thread(target=self._serve, daemon=True,
                                     name=f"copy-disk-{len(self._threads)}")
                t.start()
                self._threads.append(t)

    def _serve(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            job.help(self.fd, self.path)

    def close(self, join: bool = True) -> None:
        """Wait for reads in progress, then stop (and join) the threads; the fd is the
        caller's. join=False only asks them to stop (from a finalizer, where joining
        could wait on a thread the interpreter has already frozen)."""
        with self._state:
            if self._closed:
                return
            self._closed = True
            while self._active:
                self._state.wait()
            threads, self._threads = self._threads, []
        for _ in threads:
            self._queue.put(None)
        if join:
            for t in threads:
                t.join()
