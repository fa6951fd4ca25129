"""Coordinator worker: will own the transaction-state log, the group log and pending offsets.

Runs as one child of the supervisor. Issue 2 only establishes the process: it heartbeats, owns its
mailbox (requests from frontends), and drains cleanly on SIGTERM. The transaction coordinator
(issue 4) and the group coordinator (issue 5) move in here.
"""

from __future__ import annotations

import logging
import os
import signal

from appliance.runtime import HEARTBEAT_FILE, WorkerContext
from shm.heartbeat import HeartbeatTable
from shm.topology import Mailbox, Topology

log = logging.getLogger("appliance.coordinator")


def main(ctx: WorkerContext) -> int:
    stop = False

    def on_term(signum, frame):
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    topo = Topology(ctx.run_dir)
    hb = HeartbeatTable.open(os.path.join(ctx.run_dir, HEARTBEAT_FILE))
    mailbox = Mailbox(topo, ctx.name)
    for fe in ctx.frontends:
        mailbox.add(fe)
    while not stop:
        hb.beat(ctx.heartbeat_slot)
        for src, ring in mailbox.inputs.items():
            while ring.get() is not None:
                log.warning("coordinator request from %s dropped: no coordinator API yet", src)
        mailbox.wait(0.5)
    return 0
