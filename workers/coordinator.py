"""Coordinator worker: producer-id allocation, and (issues 4-5) transactions, groups and offsets.

Runs as one child of the supervisor. Owns ``<data_dir>/__coordinator/``: today the producer-id
block file (``appliance.txn.producer_ids``); the transaction-state log and the group log move in
with issues 4 and 5. Serves requests that frontends forward through their coordinator rings and
answers on the matching reply rings; publishes its generation in its state page so that frontends
fail what a dead predecessor held instead of waiting for a timeout.
"""

from __future__ import annotations

import logging
import os
import signal

from appliance import ipc
from appliance.errors import ErrorCode
from appliance.runtime import HEARTBEAT_FILE, READY, WORKER_PAGE_FIELDS, WorkerContext
from appliance.txn.producer_ids import ProducerIdManager
from shm.doorbell import BellSender
from shm.heartbeat import HeartbeatTable
from shm.statepage import StatePage
from shm.topology import Mailbox, Outbox, Topology

log = logging.getLogger("appliance.coordinator")

COORDINATOR_DIR = "__coordinator"


def main(ctx: WorkerContext) -> int:
    return Coordinator(ctx).run()


class Coordinator:
    def __init__(self, ctx: WorkerContext) -> None:
        self.ctx = ctx
        self.topo = Topology(ctx.run_dir)
        self.hb = HeartbeatTable.open(os.path.join(ctx.run_dir, HEARTBEAT_FILE))
        self.bells = BellSender()
        self.mailbox = Mailbox(self.topo, ctx.name)
        for fe in ctx.frontends:
            self.mailbox.add(fe)
        self.outboxes = {fe: Outbox(self.topo, ctx.name, fe, self.bells) for fe in ctx.frontends}
        self.dir = os.path.join(ctx.data_dir, COORDINATOR_DIR)
        os.makedirs(self.dir, exist_ok=True)
        self.producer_ids = ProducerIdManager(self.dir)
        self.stop = False

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_term)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        page = StatePage.open(self.topo.page_path(self.ctx.name), WORKER_PAGE_FIELDS)
        page.reset_seq()
        page.publish(generation=self.ctx.generation, status=READY, pid=os.getpid())
        while not self.stop:
            self.hb.beat(self.ctx.heartbeat_slot)
            for src, ring in self.mailbox.inputs.items():
                while (raw := ring.get()) is not None:
                    self._dispatch(src, raw)
            timeout = 0.5
            for box in self.outboxes.values():
                if box.queued and box.flush():
                    timeout = 0.01
            self.mailbox.wait(timeout)
        return 0

    def _on_term(self, signum, frame) -> None:
        self.stop = True

    def _dispatch(self, src: str, raw: bytes) -> None:
        try:
            msg = ipc.decode(raw)
        except Exception:
            log.exception("undecodable request from %s", src)
            return
        try:
            if isinstance(msg, ipc.InitProducerIdReq):
                reply = self._init_producer_id(msg)
            else:
                log.error("unexpected %s from %s", type(msg).__name__, src)
                return
        except Exception:
            # A bug costs this request, never the coordinator.
            log.exception("request %d from %s failed", msg.req_id, src)
            reply = ipc.InitProducerIdResp(msg.req_id, int(ErrorCode.unknown_server_error))
        box = self.outboxes[src]
        box.post(ipc.encode(reply))
        box.flush()

    def _init_producer_id(self, req: ipc.InitProducerIdReq) -> ipc.InitProducerIdResp:
        if req.transactional_id is None:
            # Idempotent producer: Kafka blindly hands out a fresh producer id with epoch 0, also
            # when the client asks to bump an existing one (TransactionCoordinator).
            return ipc.InitProducerIdResp(req.req_id, 0, self.producer_ids.next_id(), 0)
        # Transactional ids arrive with the transaction coordinator (issue 4).
        return ipc.InitProducerIdResp(req.req_id, int(ErrorCode.coordinator_not_available))
