"""Flusher: fdatasync of the active segment off the partition writer's loop (group commit).

Runs as a helper thread inside a partition writer process. It owns no state of the partition:
it gets (a dup'd descriptor of the segment file, the log end offset at that moment), calls
``os.fdatasync`` (which releases the GIL), closes the descriptor, publishes the offset below which
everything is now durable, and wakes the writer. Meanwhile the writer keeps appending, so the next
group of batches accumulates while this one reaches the disk; acks=-1 answers are released when
``durable`` passes their batch (the writer's loop does that, single-threaded as ever).

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


class Flusher:
    def __init__(self, wake: Callable[[], None], durable: int) -> None:
        self._wake = wake
        self._requests: queue.SimpleQueue = queue.SimpleQueue()
        self.durable = durable          # every batch below this offset is on disk
        self.busy = False
        self.error: OSError | None = None
        # The last flush's fdatasync time and how many flushes finished: the writer's loop turns
        # them into its flush-latency histogram (it owns the metrics, the thread only reports).
        self.last_us = 0
        self.completed = 0
        self._thread = threading.Thread(target=self._run, name="flusher", daemon=True)
        self._thread.start()

    def start(self, fd: int, offset: int) -> None:
        """Begin a flush that makes everything below ``offset`` durable (takes ``fd``)."""
        self.busy = True
        self._requests.put((fd, offset))

    def stop(self) -> None:
        self._requests.put(None)
        self._thread.join(30)

    def _run(self) -> None:
        while True:
            item = self._requests.get()
            if item is None:
                return
            fd, offset = item
            t0 = time.monotonic_ns()
            try:
                os.fdatasync(fd)
            except OSError as e:
                self.error = e
            else:
                self.last_us = (time.monotonic_ns() - t0) // 1000
                self.completed += 1
                if offset > self.durable:
                    self.durable = offset
            finally:
                os.close(fd)
                self.busy = False
                self._wake()
