"""Flushers: fdatasync of the active segments off the writer process's loop (group commit).

Runs as one helper thread inside a writer process (``FlushThread``), for every partition the
process carries; each partition has its ``Flusher``, the state its writer reads. The thread owns
no state of a partition: it gets (the partition's ``Flusher``, a dup'd descriptor of the segment
file, the log end offset at that moment), calls ``os.fdatasync`` (which releases the GIL), closes
the descriptor, publishes on that ``Flusher`` the offset below which everything is now durable,
and wakes the writer process. Meanwhile the writer keeps appending, so the next group of batches
accumulates while this one reaches the disk; acks=-1 answers are released when ``durable``
passes their batch (the writer's loop does that, single-threaded as ever). One thread for all the
process's partitions: their flushes run one after the other, as they would on one disk queue.

The segment's bytes reach the page cache by pwrite (and readers' shared maps are views of the
same pages), so fdatasync of the file covers them (msync is not needed). An I/O error is fatal: the writer
exits and recovery decides what is in the log; nothing is acknowledged meanwhile.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from typing import Callable


class FlushThread:
    """The writer process's one flushing thread (see the module docstring)."""

    def __init__(self, wake: Callable[[], None]) -> None:
        self._wake = wake
        self._requests: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="flusher", daemon=True)
        self._thread.start()

    def submit(self, flusher: "Flusher", fd: int, offset: int) -> None:
        self._requests.put((flusher, fd, offset))

    def stop(self) -> None:
        self._requests.put(None)
        self._thread.join(30)

    def _run(self) -> None:
        while True:
            item = self._requests.get()
            if item is None:
                return
            f, fd, offset = item
            t0 = time.monotonic_ns()
            try:
                os.fdatasync(fd)
            except OSError as e:
                f.error = e
            else:
                f.last_us = (time.monotonic_ns() - t0) // 1000
                f.completed += 1
                if offset > f.durable:
                    f.durable = offset
            finally:
                os.close(fd)
                f.busy = False
                self._wake()


class Flusher:
    """One partition's flushes: what its writer reads (``durable``, ``busy``, ``error``, the last
    fdatasync's time) and starts (``start``). Without a ``thread`` it has one of its own."""

    def __init__(self, wake: Callable[[], None] | None, durable: int,
                 thread: FlushThread | None = None) -> None:
        self._own = thread is None
        self._thread = thread if thread is not None else FlushThread(wake or (lambda: None))
        self.durable = durable          # every batch below this offset is on disk
        self.busy = False
        self.error: OSError | None = None
        # The last flush's fdatasync time and how many flushes finished: the writer's loop turns
        # them into its flush-latency histogram (it owns the metrics, the thread only reports).
        self.last_us = 0
        self.completed = 0

    def start(self, fd: int, offset: int) -> None:
        """Begin a flush that makes everything below ``offset`` durable (takes ``fd``)."""
        self.busy = True
        self._thread.submit(self, fd, offset)

    def stop(self) -> None:
        """Stop the thread when it is this flusher's own (the process stops a shared one)."""
        if self._own:
            self._thread.stop()
