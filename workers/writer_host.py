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

The loop: the prologue of ``workers.base.Worker.main`` for every member (RECOVERING, ``setup``
one after the other, then READY for all), then turns: a member takes a turn (``Worker.turn``)
when its doorbell rang, its last turn did work, or its own timeout (ticks, flushes, verification
deadlines) is due. A turn that finds nothing arms the member's mailbox (and looks at its rings
once more, the protocol of ``Mailbox.wait``), so its producers ring its bell from then on, as for
a writer asleep in a process of its own; one ``poll`` over every member's doorbell, without
waiting while any member works, tells the host which to turn next. A turn of the loop thus costs
the members that have something to do, not all of them. Single-threaded like every writer
(each member's flusher thread only fsyncs).

Shared fate, by design: the members live and die as one process. SIGTERM drains them all; a
member that stops (an exception on its write path, or ``exit`` after a log-dir failure) ends the
host, which drains the others, and the supervisor restarts every member (each generation bumps,
as after any writer restart: frontends fail their in-flight requests with the retriable
NOT_LEADER_OR_FOLLOWER). Members recover one after the other, so a host's partitions are READY
later than K processes recovering side by side would be; one member waiting on a full disk at its
restart holds the others' recovery until space comes back.
"""

from __future__ import annotations

import logging
import select
import signal
import time

from appliance.runtime import READY, STOPPED, WorkerContext
from workers.base import IDLE_WAIT_S
from workers.partition_writer import PartitionWriter

log = logging.getLogger("appliance.writer")


def main(ctxs: list[WorkerContext]) -> int:
    return WriterHost(ctxs).main()


class WriterHost:
    def __init__(self, ctxs: list[WorkerContext]) -> None:
        self.writers = [PartitionWriter(ctx) for ctx in ctxs]
        self.stop = False
        self._poll = select.poll()
        self._by_fd: dict[int, int] = {}            # doorbell fd -> index in self.writers
        for i, w in enumerate(self.writers):
            fd = w.mailbox.fileno()
            self._poll.register(fd, select.POLLIN)
            self._by_fd[fd] = i

    # -- life cycle (Worker.main for every member) ------------------------------------------------
    def main(self) -> int:
        for w in self.writers:
            w.close_listener()
        signal.signal(signal.SIGTERM, self.handle_term)
        signal.signal(signal.SIGINT, signal.SIG_IGN)     # the supervisor orders the drain
        for w in self.writers:
            w.publish_start()
        for w in self.writers:
            code = w.setup()
            if code:
                return code
        # READY only once every member has recovered: the supervisor holds a READY writer to its
        # heartbeat, and a member that is READY does not beat while a mate's recovery runs
        # (regression: a host whose last member took longer than heartbeat_timeout_ms to recover
        # was SIGKILLed for its first member's silence, and again after every restart).
        for w in self.writers:
            w.page.publish(status=READY)
        return self.run()

    def handle_term(self, signum=None, frame=None) -> None:
        self.stop = True
        for w in self.writers:
            w.stop = True
        # End a sleep in poll now (PEP 475 would resume it for the rest of its timeout).
        first = self.writers[0]
        first.bells.ring(first.mailbox.doorbell.path)

    def run(self) -> int:
        writers = self.writers
        try:
            self.loop()
            for w in writers:
                w.stop_serving()
        finally:
            failed: BaseException | None = None
            for w in writers:
                try:
                    w.close()
                except BaseException as e:            # close the others' logs all the same
                    log.exception("%s: closing failed", w.name)
                    failed = failed or e
                finally:
                    w.page.publish(status=STOPPED)
            if failed is not None:
                raise failed
        return max(w.exit_code for w in writers)

    # -- the loop -----------------------------------------------------------------------------------
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
