"""The frontend's view of the rest of the appliance: channels to writers, fetchers, supervisor.

Runs inside each frontend process (asyncio, single thread). Owns this frontend's end of its rings:
the produce rings to every writer process (one each, whatever the partitions it carries: a
produce record names its partition; docs/architecture.md, "Writer processes and their rings"),
the request rings to fetchers, the supervisor and the coordinator, and what arrives in the mailbox (the worker base's, ``workers.base``): acks and
replies, matched to the futures of the requests they answer. Handlers (``appliance.api``) call the
``async`` methods here with a typed request (an ``appliance.ipc.Request``) and get its typed
result back: ``call_coordinator(JoinGroupRequest(...))`` answers a ``JoinGroupResult``, or the
request's own ``error_reply(COORDINATOR_NOT_AVAILABLE)`` when the coordinator does not answer in
time or restarts under it. Nothing in this module parses Kafka requests.

Request ids are unique per frontend incarnation (the generation sits in the high bits), so acks
addressed to a dead predecessor of this frontend, still sitting in a ring, are recognised and
dropped.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time

from appliance import ipc
from appliance.acl.authorizer import Authorizer
from appliance.acl.store import PUBLISHED_FILE as ACL_PUBLISHED_FILE, AclView
from appliance.catalog.model import Catalog, TopicInfo
from appliance.errors import ErrorCode
from appliance.fetch_session import FetchSessionCache
from appliance.ipc import ProduceResult
from appliance.log.reader import SegmentViews
from appliance.metrics.client_telemetry import SNAPSHOT_PREFIX, ClientTelemetry
from appliance.security import credentials
from appliance.security.credentials import CredentialsView
from appliance.catalog.assignment import ASSIGNMENT_FILE, AssignmentView
from appliance.runtime import (COORDINATOR, COORDINATOR_PAGE_FIELDS, PARTITION_PAGE_FIELDS,
                               SUPERVISOR, WORKER_PAGE_FIELDS, WRITER_PROCESS_PAGE_FIELDS,
                               writer_name)
from workers.frontend.client_quotas import QuotaShell
from shm.doorbell import BellSender
from shm.statepage import StatePage
from shm.topology import Outbox, Topology

log = logging.getLogger("appliance.broker")

# Directories of cached segment maps a frontend tick (20 ms) looks at for deleted segments: a
# round over 1,024 partitions' maps takes 64 ticks, about 1.3 s, instead of one long tick.
SWEEP_DIRS_PER_TICK = 16


class Channel(Outbox):
    """A request ring from this frontend. ``send`` queues behind earlier messages when the ring
    is full (Outbox.post), so produce requests from one connection reach a writer in the order
    the client sent them; the tick and every wake-up retry the queue."""

    __slots__ = ()

    def send(self, *parts) -> None:
        self.post(*parts)
        self.flush()


class WorkerChannel(Channel):
    """A channel to a worker that publishes its generation (writers, fetchers): requests remember
    the generation they were addressed to, so a restart of the worker fails them at once instead
    of after a timeout."""

    __slots__ = ("page", "inflight")

    def __init__(self, topo: Topology, src: str, dst: str, bells: BellSender, fields) -> None:
        super().__init__(topo, src, dst, bells)
        self.page = StatePage.open(topo.page_path(dst), fields, readonly=True)
        self.inflight: dict[int, int] = {}   # request id -> generation it was addressed to

    def generation(self) -> int:
        return self.page.read().generation


class WriterChannel(WorkerChannel):
    """A channel to a writer process (its page: generation, status, pid)."""
    __slots__ = ()

    def __init__(self, topo: Topology, src: str, dst: str, bells: BellSender) -> None:
        super().__init__(topo, src, dst, bells, WRITER_PROCESS_PAGE_FIELDS)


class Route:
    """Where a partition's records go: its writer process's channel. Its state page is opened
    when asked (``Broker.partition_state``, rare): ten thousand partitions' pages held open in
    every frontend would be ten thousand descriptors each (every mapping holds one)."""
    __slots__ = ("ch", "topic_id", "partition")

    def __init__(self, ch: WriterChannel, topic_id: bytes, partition: int) -> None:
        self.ch = ch
        self.topic_id = topic_id
        self.partition = partition


class WorkerRestarted(TimeoutError):
    """The worker a request was sent to died before answering (handled like a timeout)."""


class Broker:
    """Built by the frontend worker (``workers.frontend.server.Frontend``) from its prologue:
    the topology, doorbell sender, mailbox (fetchers, supervisor and coordinator are inputs
    from the start; writers join with the catalog) and catalog view are the worker's."""

    def __init__(self, worker) -> None:
        ctx = worker.ctx
        self.ctx = ctx
        self.cfg = ctx.config       # replaced by a SIGHUP reload (Frontend.reload)
        self.counters = None        # the frontend's FrontendMetrics (handlers count through it)
        self.name = ctx.name
        self.topo: Topology = worker.topo
        self.bells: BellSender = worker.bells
        self._catalog = worker.catalog
        self._catalog_seen = -1
        self._missing_writers = False
        self.mailbox = worker.mailbox
        self.fetchers = [WorkerChannel(self.topo, self.name, fx, self.bells, WORKER_PAGE_FIELDS)
                         for fx in ctx.fetchers]
        self.supervisor = Channel(self.topo, self.name, SUPERVISOR, self.bells)
        self.coordinator = WorkerChannel(self.topo, self.name, COORDINATOR, self.bells,
                                         COORDINATOR_PAGE_FIELDS)
        self.writers: dict[str, WriterChannel] = {}      # by writer process
        self.routes: dict[tuple[bytes, int], Route] = {}  # by partition
        self._assignment = AssignmentView(self.topo.file_path(ASSIGNMENT_FILE),
                                          lambda: worker.sup_page.read().assignment_version)
        self._assignment_seen = -1
        self.futures: dict[int, asyncio.Future] = {}
        self.produce_owner: dict[int, WriterChannel] = {}
        self._ids = itertools.count((ctx.generation & 0xFFFFFF) << 40 | 1)
        self._rr = itertools.count()
        # Each listener's advertised (host, port); a connection answers with its listener's.
        self.endpoints = ctx.config.advertised_endpoints(
            {b.listener.name: b.port for b in ctx.listeners})
        self.advertised = next(iter(self.endpoints.values()))   # the first listener's
        self.credentials = CredentialsView(self.topo.file_path(credentials.PUBLISHED_FILE),
                                           lambda: worker.sup_page.read().credentials_version)
        self.node_id = ctx.config.server.node_id
        self.cluster_id = read_cluster_id(ctx.data_dir)
        self.loop: asyncio.AbstractEventLoop | None = None
        # Read-only maps of segment files, for splicing fetched ranges into responses.
        self.segment_views = SegmentViews()
        # KIP-227: this frontend's share of the broker's fetch sessions (appliance.fetch_session).
        n = max(1, len(ctx.frontends))
        index = ctx.frontends.index(ctx.name) if ctx.name in ctx.frontends else 0
        self.fetch_sessions = FetchSessionCache(
            -(-ctx.config.server.max_incremental_fetch_session_cache_slots // n), index, n)
        self._topic_names: dict[bytes, str] = {}
        self._next_sweep = 0.0
        self._sweeping = False
        # KIP-714: the client instances pushing through this frontend, published for the
        # metrics server at most once a second when they changed.
        self.telemetry = ClientTelemetry(ctx.config.telemetry,
                                         lambda: self.catalog.client_metrics)
        self._next_telemetry = 0.0
        self.backlog: set[Channel] = set()     # channels with sends queued behind a full ring
        # Client quotas (KIP-13, KIP-124): this frontend's sensors, counted with the others'.
        self.client_quotas = QuotaShell(worker, ctx.config.quotas)
        self.quotas = self.client_quotas.quotas
        # The ACLs the supervisor published (appliance.acl): checked by every handler through
        # RequestContext.authorize, without a round trip.
        self.authorizer = Authorizer.from_config(
            ctx.config.authorizer, AclView(self.topo.file_path(ACL_PUBLISHED_FILE), worker.sup_page))

    # -- wiring into the event loop -------------------------------------------------------------
    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """The worker base has put the mailbox into the event loop; open the writers' rings."""
        self.loop = loop
        self._sync_writers(self.catalog)

    def tick(self, now: float) -> None:
        """Every tick of the worker (20 ms): catch lost wake-ups, retry queued sends, notice
        worker restarts."""
        # Look at the catalog even when no request asks: an idle frontend must arm the ack rings
        # of writers created since, and retry writers whose rings were not there yet.
        cat = self.catalog                      # syncs the writers if the catalog changed
        if self._missing_writers or self._assignment_seen != self._assignment.get().version:
            self._sync_writers(cat)
        self.drain()
        for ch in self.writers.values():
            if ch.queued:
                ch.flush()
            if ch.inflight:
                self._check_generation(ch)
        for ch in (*self.fetchers, self.coordinator):
            if ch.queued:
                ch.flush()
            if ch.inflight:
                self._check_generation(ch)
        if self.supervisor.queued:
            self.supervisor.flush()
        self.client_quotas.tick(now)
        if now >= self._next_telemetry:
            self._next_telemetry = now + 1.0
            self._publish_telemetry()
            if self.counters is not None:
                fs = self.fetch_sessions
                self.counters.fetch_sessions(len(fs.sessions), fs.partitions_cached(),
                                             fs.evictions)
        if self._sweeping or now >= self._next_sweep:
            # Release the maps of segments retention deleted: a round every 5 s, a few
            # directories a tick (SegmentViews.sweep).
            self._sweeping = not self.segment_views.sweep(SWEEP_DIRS_PER_TICK)
            if not self._sweeping:
                self._next_sweep = now + 5.0

    def _publish_telemetry(self) -> None:
        t = self.telemetry
        t.settings = self.cfg.telemetry          # a reload's new [telemetry]
        t.expire(int(time.time() * 1000))
        if not t.dirty:
            return
        path = self.topo.file_path(SNAPSHOT_PREFIX + self.name + ".msgpack")
        tmp = path + ".tmp"
        try:
            with open(tmp, "wb") as f:
                f.write(t.snapshot())
            os.replace(tmp, path)                # the runtime dir is tmpfs: no fsync
        except OSError as e:
            log.warning("client telemetry not published: %s", e)

    def drain(self) -> None:
        """Deliver every ack and reply waiting in the rings the ready map marked (shm.ready),
        and once a second in every ring (``Mailbox.to_read``: what costs a look at each of
        hundreds of writers' rings is done once a second, not at every wake-up)."""
        for src, ring in self.mailbox.to_read(time.monotonic()):
            while (mv := ring.peek()) is not None:
                try:
                    self._deliver(mv)
                except Exception:
                    log.exception("bad message from %s dropped", src)
                finally:
                    ring.advance()
        # Acks free room in produce rings: push what waited for it (the channels a send left
        # with a queue; the tick looks at every channel too).
        if self.backlog:
            for ch in list(self.backlog):
                if not ch.queued or not ch.flush():
                    self.backlog.discard(ch)

    def _deliver(self, mv: memoryview) -> None:
        if mv[0] == ipc.KIND_PRODUCE_ACK:
            (_, _, err, gen, req_id, base, lat, lso, mlen, _) = ipc.PRODUCE_ACK.unpack_from(mv, 0)
            ch = self.produce_owner.pop(req_id, None)
            if ch is not None:
                ch.inflight.pop(req_id, None)
            fut = self.futures.pop(req_id, None)
            if fut is not None and not fut.done():
                msg = bytes(mv[ipc.PRODUCE_ACK.size:ipc.PRODUCE_ACK.size + mlen]).decode() if mlen else None
                fut.set_result(ProduceResult(err, base, lat, lso, msg))
            return
        req_id, body = ipc.decode(mv)
        fut = self.futures.pop(req_id, None)
        if fut is not None and not fut.done():
            fut.set_result(body)

    def _check_generation(self, ch: WorkerChannel) -> None:
        gen = ch.generation()
        for req_id, sent_gen in list(ch.inflight.items()):
            if sent_gen == gen:
                continue
            ch.inflight.pop(req_id, None)
            was_produce = self.produce_owner.pop(req_id, None) is not None
            fut = self.futures.pop(req_id, None)
            if fut is None or fut.done():
                continue
            if was_produce:
                # Its successor refuses the request. The batch may or may not be in the log (as
                # when a Kafka leader dies before answering): the client retries.
                fut.set_result(ProduceResult(int(ErrorCode.not_leader_or_follower),
                                             error_message="partition writer restarted"))
            else:
                fut.set_exception(WorkerRestarted(f"{ch.dst} restarted"))

    # -- catalog --------------------------------------------------------------------------------
    @property
    def catalog(self) -> Catalog:
        cat = self._catalog.get()
        if cat.version != self._catalog_seen:
            self._catalog_seen = cat.version
            self._sync_writers(cat)
        return cat

    def _sync_writers(self, cat: Catalog) -> None:
        """Routes to every partition of the catalog through the writer process the published
        assignment names (the catalog shows a partition only once it is READY in its process;
        the assignment is published before)."""
        asg = self._assignment.get()
        self._assignment_seen = asg.version
        if self._topic_names:
            # A deleted topic's partition dirs may come back under the same name with new files:
            # drop every map of them now.
            for tid, tname in self._topic_names.items():
                if cat.by_id(tid) is None:
                    self.segment_views.forget_prefix(os.path.join(self.ctx.data_dir, f"{tname}-"))
        self._topic_names = {t.topic_id: t.name for t in cat.topics.values()}
        wanted: dict[tuple[bytes, int], str] = {}
        for t in cat.topics.values():
            for p in range(t.partitions):
                proc = asg.process_of(t.topic_id, p)
                if proc is not None:
                    wanted[(t.topic_id, p)] = proc
        self._missing_writers = len(wanted) < cat.partition_count()
        procs = set(wanted.values())
        for name in list(self.writers):
            if name not in procs and name not in asg.processes:
                ch = self.writers.pop(name)
                for req_id in list(ch.inflight):
                    self.produce_owner.pop(req_id, None)
                    fut = self.futures.pop(req_id, None)
                    if fut is not None and not fut.done():
                        fut.set_result(ProduceResult(int(ErrorCode.unknown_topic_or_partition)))
                self.backlog.discard(ch)
                self.mailbox.remove(name)
                self.topo.forget(name, self.bells)
        for name in procs - self.writers.keys():
            try:
                self.writers[name] = WriterChannel(self.topo, self.name, name, self.bells)
                self.mailbox.add(name)
            except FileNotFoundError:
                self._missing_writers = True        # retried by the next tick
                log.debug("rings of %s not found yet", name)
        for key in [k for k, r in self.routes.items()
                    if wanted.get(k) != r.ch.dst or r.ch is not self.writers.get(r.ch.dst)]:
            del self.routes[key]
        for key, proc in wanted.items():
            if key not in self.routes and proc in self.writers:
                self.routes[key] = Route(self.writers[proc], *key)
        # We sleep in epoll, never in Mailbox.wait: every input, new ones included, must stay
        # armed so that writers ring our bell after each ack (regression: acks of topics created
        # after start waited for the 20 ms tick). The worker armed the mailbox before attach(),
        # and an armed mailbox arms each input add() gives it.

    # -- calls ----------------------------------------------------------------------------------
    def _future(self, req_id: int, timeout_s: float, on_timeout) -> asyncio.Future:
        fut = self.loop.create_future()
        self.futures[req_id] = fut
        handle = self.loop.call_later(timeout_s, _expire, self.futures, req_id, on_timeout)
        fut.add_done_callback(lambda f: handle.cancel())
        return fut

    def produce(self, topic: TopicInfo, partition: int, acks: int, batch: bytes,
                timeout_s: float, version: int = 0,
                transactional_id: str | None = None) -> asyncio.Future | None:
        """Hand one batch to its writer. Returns a future of ProduceResult, or None for acks=0."""
        route = self.routes.get((topic.topic_id, partition))
        if route is None:
            self._sync_writers(self.catalog)
            route = self.routes.get((topic.topic_id, partition))
        if route is None:
            fut = self.loop.create_future()
            fut.set_result(ProduceResult(int(ErrorCode.unknown_topic_or_partition)))
            return fut
        ch = route.ch
        req_id = next(self._ids)
        gen = ch.page.read().generation
        header = ipc.produce_header(acks, gen, req_id, len(batch), version, transactional_id,
                                    topic.topic_id, partition)
        if len(header) + len(batch) > ch.ring.max_payload:
            # A topic's max.message.bytes may allow more than the produce ring carries (it is
            # sized for the broker's message_max_bytes): refused like a batch over the limit.
            fut = self.loop.create_future()
            fut.set_result(ProduceResult(int(ErrorCode.message_too_large), error_message=(
                f"a batch of {len(batch)} bytes is more than this broker's produce ring carries "
                f"({ch.ring.max_payload} bytes, shm.produce_ring_bytes / 2)")))
            return fut
        ch.send(header, batch)
        if ch.queued:
            self.backlog.add(ch)
        fut = None
        if acks != 0:
            # Registered after the send: a send that raises leaves no future behind to expire
            # unawaited (asyncio's "Future exception was never retrieved").
            fut = self._future(req_id, timeout_s,
                               ProduceResult(int(ErrorCode.request_timed_out),
                                             error_message="the partition writer did not answer in time"))
            ch.inflight[req_id] = gen
            self.produce_owner[req_id] = ch
        return fut

    async def call(self, ch: WorkerChannel, req: ipc.Request, timeout_s: float,
                   on_timeout: ErrorCode | None = None) -> ipc.Message:
        """Send ``req`` to a worker and await its answer. After ``timeout_s``, or as soon as the
        worker's generation changes under the request: ``req.error_reply(on_timeout)``, or
        without ``on_timeout`` TimeoutError (WorkerRestarted, a TimeoutError, for the restart)."""
        req_id = next(self._ids)
        ch.send(ipc.encode(req_id, req))
        if ch.queued:
            self.backlog.add(ch)
        # After the send (the answer cannot come before we await): a send that raises must not
        # leave a future behind that expires with nobody awaiting it.
        fut = self._future(req_id, timeout_s, None)
        ch.inflight[req_id] = ch.generation()
        try:
            return await fut
        except TimeoutError:
            if on_timeout is None:
                raise
            return req.error_reply(on_timeout)
        finally:
            ch.inflight.pop(req_id, None)

    async def call_fetcher(self, req: ipc.Request, fetcher: int, timeout_s: float,
                           on_timeout: ErrorCode) -> ipc.Message:
        return await self.call(self.fetchers[fetcher % len(self.fetchers)], req, timeout_s,
                               on_timeout)

    async def call_coordinator(self, req: ipc.Request, timeout_s: float | None = None) -> ipc.Message:
        """A coordinator request (``appliance.txn.messages``, ``appliance.group.messages``);
        COORDINATOR_NOT_AVAILABLE when the coordinator does not answer in time (what Kafka's
        clients retry after looking the coordinator up again)."""
        return await self.call(self.coordinator, req,
                               timeout_s or self.cfg.server.internal_request_timeout_ms / 1000,
                               ErrorCode.coordinator_not_available)

    def coordinator_epoch(self) -> int:
        """The coordinator epoch the coordinator published (bumped at each of its starts)."""
        return self.coordinator.page.read().coordinator_epoch

    async def call_writer(self, topic: TopicInfo, partition: int, req: ipc.Request,
                          timeout_s: float | None = None) -> ipc.Message | None:
        """A non-produce request to a partition writer (on its produce ring, answered on the
        ack ring); ``req`` is addressed to the partition here. None when the partition does not
        exist."""
        route = self.routes.get((topic.topic_id, partition))
        if route is None:
            return None
        return await self.call(route.ch, ipc.for_partition(req, topic.topic_id, partition),
                               timeout_s or self.cfg.server.internal_request_timeout_ms / 1000)

    def partition_state(self, topic: TopicInfo, partition: int):
        """The partition's state page as its writer last published it (high watermark, log
        start, active segment...), or None when this frontend has no route to it."""
        route = self.routes.get((topic.topic_id, partition))
        if route is None:
            self._sync_writers(self.catalog)
            route = self.routes.get((topic.topic_id, partition))
        if route is None:
            return None
        try:
            with StatePage.open(self.topo.page_path(writer_name(topic.topic_id, partition)),
                                PARTITION_PAGE_FIELDS, readonly=True) as page:
                return page.read()
        except FileNotFoundError:
            return None

    async def call_supervisor(self, req: ipc.Request, timeout_s: float) -> ipc.Message:
        """A topic, ACL or credential change; REQUEST_TIMED_OUT when the supervisor did not
        answer in ``timeout_s`` (Kafka's answer when its controller is slower than the request's
        timeout: the change may still complete). Before, the timeout closed the connection (a
        1,024-partition CreateTopics took longer than 70 s to fork its writers)."""
        req_id = next(self._ids)
        self.supervisor.send(ipc.encode(req_id, req))
        fut = self._future(req_id, timeout_s, None)
        try:
            return await fut
        except TimeoutError:
            return req.error_reply(ErrorCode.request_timed_out)

    def scram_credentials(self, user: str):
        """The SCRAM credentials of ``user`` by mechanism (None: no such user), as the
        supervisor last published them."""
        return self.credentials.get().get(user)

    def next_fetcher(self) -> int:
        return next(self._rr)


def _expire(futures: dict, req_id: int, result) -> None:
    fut = futures.pop(req_id, None)
    if fut is not None and not fut.done():
        if result is None:
            fut.set_exception(TimeoutError("internal request timed out"))
        else:
            fut.set_result(result)


def read_cluster_id(data_dir: str) -> str:
    try:
        with open(os.path.join(data_dir, "meta.properties")) as f:
            for line in f:
                k, _, v = line.strip().partition("=")
                if k == "cluster.id":
                    return v
    except FileNotFoundError:
        pass
    return ""
