"""Writer host: one process running several partition writers (``[topics] partitions_per_writer``).

Runs as a child of the supervisor when ``partitions_per_writer`` is above 1 (the default, 1,
forks ``workers.partition_writer`` alone per partition and never comes here). Owns no state of
its own: each ``PartitionWriter`` it runs keeps everything it has in a process of its own: its
name, state page, generation, heartbeat slot, mailbox and doorbell, rings, log, producer state,
flusher thread and metrics; peers address it exactly as before. Each partition still has exactly
one writer. What the host adds is the sharing of one process:

* memory: a writer process's private memory is the interpreter's pages its code writes to, not
  its data (loadtests/README.md, "Many partitions"), so K partitions in one process cost about
  one process's memory instead of K;
* wake-ups: a Produce request for many partitions wakes one process per host instead of one per
  partition, and the host sleeps on all its members' doorbells in one ``poll``.

The life cycle is the worker base's (``workers.base.WorkerProcess``, the host being one with K
members): its prologue for every member (RECOVERING, ``setup`` one after the other, then READY
for all), SIGTERM stopping every member, then each member's drain and close. The host gives the
loop: a member takes a turn (``Worker.turn``) when its doorbell rang, its last turn did work, or
its own timeout (ticks, flushes, verification deadlines) is due. A turn that finds nothing arms
the member's mailbox (and looks at its rings once more, the protocol of ``Mailbox.wait``), so its
producers ring its bell from then on, as for a writer asleep in a process of its own; one
``poll`` over every member's doorbell, without waiting while any member works, tells the host
which to turn next. A turn of the loop thus costs the members that have something to do, not all
of them. Single-threaded like every writer (each member's flusher thread only fsyncs).

Shared fate, by design: the members live and die as one process. SIGTERM drains them all; a
member that stops (an exception on its write path, or ``exit`` after a log-dir failure) ends the
host, which drains the others, and the supervisor restarts every member (each generation bumps,
as after any writer restart: frontends fail their in-flight requests with the retriable
NOT_LEADER_OR_FOLLOWER). Members recover one after the other, so a host's partitions are READY
later than K processes recovering side by side would be; one member waiting on a full disk at its
restart holds the others' recovery until space comes back.
"""

from __future__ import annotations

import select
import time

from appliance.runtime import WorkerContext
from workers.base import IDLE_WAIT_S, WorkerProcess
from workers.partition_writer import PartitionWriter


def main(ctxs: list[WorkerContext]) -> int:
    return WriterHost(ctxs).main()


class WriterHost(WorkerProcess):
    def __init__(self, ctxs: list[WorkerContext]) -> None:
        self.writers = [PartitionWriter(ctx) for ctx in ctxs]
        self.members = self.writers
        self.stop = False
        self._poll = select.poll()
        self._by_fd: dict[int, int] = {}            # doorbell fd -> index in self.writers
        for i, w in enumerate(self.writers):
            fd = w.mailbox.fileno()
            self._poll.register(fd, select.POLLIN)
            self._by_fd[fd] = i

    # -- the loop (main, run, the signals and the drain are WorkerProcess's) ----------------------
    def loop(self) -> None:
        """Turn the members that have work; sleep when none has. An idle member's mailbox stays
        armed (its producers ring its bell, as for a writer asleep in a process of its own)
        until its bell rings or its timeout is due, so a turn of the loop looks only at the
        members that worked, rang or are due, never at every member's rings."""
        writers = self.writers
        n = len(writers)
        busy = [True] * n                 # worked last turn, or its bell rang: turn it again
        armed = [False] * n               # idle, its mailbox armed: its bell will ring
        due = [0.0] * n                   # when its own timeout ends (monotonic)
        while not self.stop:
            now = time.monotonic()
            worked = False
            earliest = now + IDLE_WAIT_S
            for i in range(n):
                if busy[i] or due[i] <= now:
                    w = writers[i]
                    if armed[i]:
                        w.mailbox.disarm()
                        armed[i] = False
                    timeout = w.turn()
                    if w.stop:                # exit() of a member: the whole host stops
                        self.stop = True
                    if timeout is None:
                        busy[i] = worked = True
                        continue
                    due[i] = now + timeout
                    # Idle: arm, then look once more (a record put before the flags were seen
                    # rang no bell).
                    w.mailbox.arm()
                    armed[i] = True
                    if w.mailbox.pending():
                        busy[i] = worked = True
                        continue
                    busy[i] = False
                if due[i] < earliest:
                    earliest = due[i]
            if self.stop:
                break
            timeout = 0 if worked else max(1, int((earliest - time.monotonic()) * 1000 + 0.999))
            for fd, _ in self._poll.poll(timeout):
                i = self._by_fd[fd]
                writers[i].mailbox.drain()
                busy[i] = True
