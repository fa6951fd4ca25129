"""Fetch worker: answers Fetch and ListOffsets from read-only views of the partition logs.

Runs as a child of the supervisor (``server.fetchers`` of them), on the worker base's loop
(``workers.base.Worker``): its registry serves Fetch and ListOffsets. Owns nothing durable: only
its parked long-polls. Reads partition state pages (high watermark, LSO, log start, active segment
end) and read-only maps of segments and indexes (``appliance.log.reader.LogReader``); never reads
at or past what a writer has published.

A Fetch that cannot yet satisfy ``min_bytes`` is parked until ``max_wait_ms``: the fetcher sets its
flag byte on each involved partition's state page (the writer rings this fetcher's bell after it
publishes while the flag is set) and re-evaluates parked fetches on every wake-up. Replies carry
byte ranges (segment, position, length); the frontend copies them from its own read-only maps.

Bit rot (issue 34): the reader checks the CRC of every batch it hands out (``[log.scrub]
verify_fetches``); a batch that fails ends the read before it, and a read that starts there
answers KAFKA_STORAGE_ERROR for that partition alone (the others of the request are served). The
fetcher logs each such batch once (file, position, offset) and counts every refused read in its
metrics table (``appliance_log_fetch_corrupt_batches_total{topic,partition}``). It keeps no
state about corrupt ranges beyond that: the next read of the range finds it again.
"""

from __future__ import annotations

import collections
import logging
import time
from dataclasses import dataclass

from appliance import ipc
from appliance.data_layout import partition_dir
from appliance.errors import ErrorCode, KafkaError
from appliance.log.reader import CorruptBatch, LogReader
from appliance.metrics import key
from appliance.runtime import (PARTITION_PAGE_FIELDS, RECOVERING, STARTING, WorkerContext,
                               writer_name)
from appliance.service import Responder, serves
from shm.doorbell import MARK_STATE
from shm.statepage import StatePage
from shm.topology import Topology
from workers.base import IDLE_WAIT_S, Worker

log = logging.getLogger("appliance.fetcher")
# Partition handles a fetcher keeps open at least (least recently used closed first); more when
# its descriptor and map limits allow (handle_limit).
MAX_HANDLES = 2048
# What one handle costs: its state page, its segment's map and the segment's offset and time
# index maps; each map keeps a descriptor in Python 3.11 (mmap dups the file's).
FDS_PER_HANDLE = 4
# Descriptors and maps kept for everything else (sockets to frontends, bells, catalog, metrics).
RESERVED = 1024
# Tests shrink the table to reach its eviction with few partitions (not an APPLIANCE_ key: the
# configuration never reads it).
HANDLES_ENV = "TESTHOOK_FETCHER_MAX_HANDLES"

READ_COMMITTED = 1
EARLIEST, LATEST, MAX_TIMESTAMP, EARLIEST_LOCAL, LATEST_TIERED = -2, -1, -3, -4, -5


def main(ctx: WorkerContext) -> int:
    return Fetcher(ctx).main()


def handle_limit(open_files: int, max_map_count: int) -> int:
    """How many partition handles a fetcher keeps: as many as its open-files limit
    (RLIMIT_NOFILE) and the kernel's vm.max_map_count leave room for, never fewer than
    MAX_HANDLES. A consumer group of 10,000 partitions names them all in turn; a table smaller
    than that reopened most of each fetch's partitions (page, segment and index maps: LRU over a
    cycle larger than the table never hits), 7,785 records/s against 302,944 at 64 partitions
    (issue 32 goal 6)."""
    room = min(open_files, max_map_count) - RESERVED
    return max(MAX_HANDLES, room // FDS_PER_HANDLE)


def _system_handle_limit() -> int:
    import os
    import resource
    forced = os.environ.get(HANDLES_ENV)
    if forced:
        return int(forced)
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 20
    try:
        with open("/proc/sys/vm/max_map_count") as f:
            maps = int(f.read())
    except (OSError, ValueError):
        maps = 65530     # the kernel's default
    return handle_limit(soft, maps)


class PartitionHandle:
    """Read-only access to one partition: its state page and its log reader."""

    def __init__(self, topo: Topology, data_dir: str, topic: str, topic_id: bytes, partition: int,
                 max_decompressed_bytes: int, verify_crc: bool = True,
                 listed: dict | None = None) -> None:
        """``listed``: (topic id, partition) -> ((generation, segments_version), segment bases) of the
        fetcher's last listing of each partition directory, used and kept up to date: a handle
        reopened while its segments_version has not moved lists nothing (at 10,000 partitions
        over a smaller handle table most fetches reopen most of their partitions, and the
        directory's listing was a fifth of the fetcher, issue 32 goal 6)."""
        self.name = writer_name(topic_id, partition)
        self.topic, self.partition = topic, partition
        self.page = StatePage.open(topo.page_path(self.name), PARTITION_PAGE_FIELDS, readonly=False)
        try:
            # The version before the listing: the listing is at least that new (a change after
            # the read makes the next state() list again). Once listed at the reader's start,
            # not again at the first state() (it was listed twice).
            st = self.page.read()
            version = st.segments_version
            # With the writer's generation: a restarted writer counts its versions anew.
            stamp = (st.generation, version)
            key = (topic_id, partition)
            known = listed.get(key) if listed is not None else None
            self.reader = LogReader(partition_dir(data_dir, topic, partition),
                                    max_decompressed_bytes=max_decompressed_bytes,
                                    verify_crc=verify_crc,
                                    bases=known[1] if known and known[0] == stamp else None)
        except BaseException:
            self.page.close()
            raise
        self.seen_segments = version
        self.listed = listed
        self.key = key
        if listed is not None:
            listed[key] = (stamp, self.reader.segment_bases())
        self.waiters = 0

    def close(self) -> None:
        self.page.close()
        self.reader.close()

    def state(self):
        st = self.page.read()
        if st.segments_version != self.seen_segments:
            self.reader.refresh()
            self.seen_segments = st.segments_version
            if self.listed is not None:
                self.listed[self.key] = ((st.generation, st.segments_version),
                                         self.reader.segment_bases())
        return st


@dataclass
class Parked:
    respond: Responder
    req: ipc.FetchRequest
    deadline: float
    handles: list[PartitionHandle]
    # The handles' page sequence numbers taken before the last evaluation, and the catalog's
    # version then: while none moved, evaluating again would give the same answer.
    seqs: list[int]
    catalog_version: int
    # Parked this turn: its pages are compared once whatever the doorbell said (a publish
    # between its evaluation and its flags being set rang no bell).
    fresh: bool = True


class Fetcher(Worker):
    def __init__(self, ctx: WorkerContext) -> None:
        super().__init__(ctx)
        # The partitions read lately, least recently used first: at most max_handles stay open
        # (each holds its page's and its segments' and indexes' maps, a descriptor each: as many
        # as the open-files limit and vm.max_map_count leave room for, see handle_limit).
        self.handles: collections.OrderedDict[tuple[bytes, int], PartitionHandle] = \
            collections.OrderedDict()
        self.max_handles = _system_handle_limit()
        # The table's size that starts the next eviction walk: above max_handles after a walk
        # that could not get under it (every handle held by a parked long-poll), so that the
        # walk is not repeated for every handle opened after it.
        self._evict_at = self.max_handles
        log.info("keeps up to %d partition handles open", self.max_handles)
        self.parked: list[Parked] = []
        # (topic id, partition) -> ((generation, segments_version), segment bases): PartitionHandle's listing
        # kept past the handle's eviction (a few ints a partition).
        self.listed: dict[tuple[bytes, int], tuple[int, list[int]]] = {}
        self._bounds_version = -1      # catalog version the handles' inflation bounds follow
        self._corrupt_logged: set[tuple[str, int]] = set()    # (file, position) logged once
        self.serve(self)

    # Frontends compare the generation in our state page with the one they sent to: a restart
    # fails what our predecessor held (its parked long-polls) at once.

    def on_turn(self, now: float) -> None:
        # Writers ring with MARK_STATE when a page a parked fetch watches moved; a wake-up
        # without it (a request, a tick) leaves the parked fetches' pages unread but for their
        # deadlines: comparing the page sequence numbers of every parked fetch on every turn was
        # a quarter of the fetcher's time with four consumers of 2,500 partitions each parked
        # (issue 32 goal 6).
        moved = bool(self.mailbox.doorbell.take_marks() & MARK_STATE) if self.parked else False
        self._recheck_parked(moved)

    def wait_timeout(self, now: float) -> float:
        if self.parked:
            return max(0.0, min(IDLE_WAIT_S, min(p.deadline for p in self.parked) - now))
        return IDLE_WAIT_S

    def reload(self, old, new) -> None:
        # The bound on inflating a batch (ListOffsets by timestamp) follows the new defaults.
        self._refresh_bounds(self.catalog.get(), new.log)
        for h in self.handles.values():
            h.reader.verify_crc = new.log.scrub.verify_fetches

    def _refresh_bounds(self, cat, log_cfg) -> None:
        """Every open partition's inflation bound from the topic's current max.message.bytes
        (changed live by AlterConfigs, or by a reload of the broker defaults)."""
        self._bounds_version = cat.version
        for (topic_id, _), h in self.handles.items():
            t = cat.by_id(topic_id)
            if t is not None:
                h.reader.max_decompressed_bytes = cat.settings(t, log_cfg).max_decompressed_bytes

    def on_stop(self) -> None:
        for p in self.parked:   # answer what we hold so frontends can drain
            p.respond(self._evaluate(p.req)[0])

    # A bug or a damaged file costs its request (the registry answers UNKNOWN_SERVER_ERROR),
    # never the fetcher and every parked long-poll with it.

    @serves(ipc.FetchRequest, late=True)
    def _fetch(self, req: ipc.FetchRequest, respond: Responder) -> None:
        version = self.catalog.get().version
        seqs: list[int] = []
        resp, nbytes, final = self._evaluate(req, seqs)
        if final or nbytes >= req.min_bytes or req.max_wait_ms <= 0:
            respond(resp)
        else:
            self._park(respond, req, seqs, version)

    # -- fetch ----------------------------------------------------------------------------------
    def _catalog(self):
        """The published catalog, the segment bounds brought up to it: looked at once per request
        (a look reads the supervisor's page; once per partition it was a tenth of the fetcher's
        time at 1,024 partitions a fetch, issue 32 goal 5)."""
        cat = self.catalog.get()
        if cat.version != self._bounds_version:
            self._refresh_bounds(cat, self.cfg.log)
        return cat

    def _handle(self, topic_id: bytes, partition: int, cat=None) -> PartitionHandle | None:
        key = (topic_id, partition)
        h = self.handles.get(key)
        if cat is None:
            cat = self._catalog()
        t = cat.by_id(topic_id)
        if t is None or partition >= t.partitions:
            self.listed.pop(key, None)
            if h is not None:
                self.handles.pop(key, None)
                if not h.waiters:
                    h.close()
            return None
        if h is None:
            try:
                h = PartitionHandle(self.topo, self.ctx.data_dir, t.name, topic_id, partition,
                                    cat.settings(t, self.cfg.log).max_decompressed_bytes,
                                    self.cfg.log.scrub.verify_fetches, self.listed)
            except FileNotFoundError:
                return None
            self._add_handle(key, h)
        else:
            self.handles.move_to_end(key)
        return h

    def _add_handle(self, key: tuple[bytes, int], h) -> None:
        """Put a handle just opened into the table, evicting when the table is past its size."""
        self.handles[key] = h
        if len(self.handles) > self._evict_at:
            self._evict(keep=key)

    def _evict(self, keep: tuple[bytes, int]) -> None:
        """Close the least recently used handles no parked long-poll holds, never ``keep`` (the
        one just opened for the caller: when every older handle was held by a long-poll, the walk
        reached it and closed it under its caller, and every fetch and ListOffsets of a consumer
        of more than max_handles partitions failed with UNKNOWN_SERVER_ERROR).

        When long-polls hold too many to get under the limit, the next walk waits for another
        quarter of the table to be opened: four consumers parked on 2,500 partitions each hold
        a full table, and a walk per opened handle made every fetch quadratic in its partitions
        (py-spy: most of the fetcher's time in this walk, issue 32 goal 6)."""
        target = self.max_handles * 3 // 4
        for key in list(self.handles):
            if len(self.handles) <= target:
                break
            h = self.handles[key]
            if not h.waiters and key != keep:
                del self.handles[key]
                h.close()
        self._evict_at = max(self.max_handles, len(self.handles) + self.max_handles // 4)

    def _evaluate(self, req: ipc.FetchRequest, seqs: list[int] | None = None
                  ) -> tuple[ipc.FetchResult, int, bool]:
        """Read every partition now. Returns (response, bytes, final) where final means an error
        that makes waiting pointless (Kafka completes a delayed fetch early on partition errors).
        ``seqs`` gets each partition's page sequence number, taken before its state is read."""
        remaining = req.max_bytes
        total = 0
        final = False
        out: list[ipc.FetchPartResult] = []
        cat = self._catalog()
        for part in req.parts:
            h = self._handle(part.topic_id, part.partition, cat)
            if h is None:
                out.append(ipc.FetchPartResult(int(ErrorCode.unknown_topic_or_partition)))
                final = True
                continue
            if seqs is not None:
                seqs.append(h.page.seq)
            st = h.state()
            if st.status in (STARTING, RECOVERING) or st.generation == 0:
                # A recovering writer may be rebuilding the aborted-transaction index: nothing is
                # served until it is READY (retriable, like a leader election).
                out.append(ipc.FetchPartResult(int(ErrorCode.not_leader_or_follower)))
                final = True
                continue
            upper = st.last_stable_offset if req.isolation_level == READ_COMMITTED else st.high_watermark
            try:
                if remaining <= 0 and total > 0:
                    slices = []
                else:
                    rr = h.reader.read(part.fetch_offset, min(part.max_bytes, max(remaining, 0)),
                                       high_watermark=st.high_watermark, max_offset=upper,
                                       log_start_offset=st.log_start_offset,
                                       min_one_batch=(total == 0), through=part.through,
                                       ahead=part.ahead)
                    slices = [ipc.Slice(s.segment_base, s.position, s.length, s.inode)
                              for s in rr.slices]
                    remaining -= rr.bytes
                    total += rr.bytes
                aborted = None
                if req.isolation_level == READ_COMMITTED:
                    # Every aborted transaction overlapping the returned range, including one that
                    # holds nothing but its abort marker there (as Kafka's fetch collects them).
                    aborted = (h.reader.collect_aborted(part.fetch_offset, rr.next_offset, st.high_watermark)
                               if slices else [])
            except KafkaError as e:
                if isinstance(e, CorruptBatch):
                    self._corrupt(h, e)
                out.append(ipc.FetchPartResult(int(e.code), st.high_watermark, st.last_stable_offset,
                                               st.log_start_offset))
                final = True
                continue
            out.append(ipc.FetchPartResult(0, st.high_watermark, st.last_stable_offset,
                                           st.log_start_offset, aborted, slices))
        return ipc.FetchResult(out), total, final

    def _corrupt(self, h: PartitionHandle, e: CorruptBatch) -> None:
        """A read refused at a batch that fails its CRC: counted every time, logged once (the
        count after the line, so whoever sees the count finds the line)."""
        where = (e.path, e.position)
        if where not in self._corrupt_logged:
            if len(self._corrupt_logged) < 10000:
                self._corrupt_logged.add(where)
            log.error("%s-%d: %s; fetches from offset %d answer KAFKA_STORAGE_ERROR (the "
                      "records up to offset %d cannot be served; `appliance dump-log --verify` "
                      "lists every damaged batch)", h.topic, h.partition, e, e.offset, e.last_offset)
        self.metrics.add(key("appliance_log_fetch_corrupt_batches",
                             [("topic", h.topic), ("partition", h.partition)]))

    def _park(self, respond: Responder, req: ipc.FetchRequest, seqs: list[int],
              catalog_version: int) -> None:
        handles = []
        cat = self._catalog()
        for part in req.parts:
            h = self._handle(part.topic_id, part.partition, cat)
            if h is not None:
                h.waiters += 1
                if h.waiters == 1:
                    h.page.set_flag(self.ctx.index, 1)
                handles.append(h)
        self.parked.append(Parked(respond, req, time.monotonic() + req.max_wait_ms / 1000, handles,
                                  seqs, catalog_version))

    def _unpark(self, p: Parked) -> None:
        for h in p.handles:
            h.waiters -= 1
            if h.waiters == 0:
                h.page.set_flag(self.ctx.index, 0)

    def _recheck_parked(self, moved: bool = True) -> None:
        """Evaluate again the parked fetches whose pages moved (``moved``: a writer said some
        did; else only those parked this turn are compared), whose deadline passed, or all of
        them when the catalog changed."""
        if not self.parked:
            return
        now = time.monotonic()
        version = self.catalog.get().version
        keep = []
        for p in self.parked:
            fresh, p.fresh = p.fresh, False
            if (not moved and not fresh and now < p.deadline
                    and version == p.catalog_version):
                keep.append(p)
                continue
            # Every turn (any request, any doorbell) used to evaluate every parked fetch again:
            # four consumers parked on 2,500 partitions each made each incoming request cost
            # 7,500 partition reads (17 % of the fetcher's first read of 10,000 partitions,
            # issue 32). A parked fetch none of whose pages moved is skipped until its deadline.
            if (now < p.deadline and version == p.catalog_version
                    and all(h.page.seq == s for h, s in zip(p.handles, p.seqs))):
                keep.append(p)
                continue
            seqs: list[int] = []
            try:
                resp, nbytes, final = self._evaluate(p.req, seqs)
            except Exception:
                log.exception("parked fetch %d failed", p.respond.req_id)
                resp, nbytes, final = p.req.error_reply(ErrorCode.unknown_server_error), 0, True
            if final or nbytes >= p.req.min_bytes or now >= p.deadline:
                self._unpark(p)
                p.respond(resp)
            else:
                p.seqs, p.catalog_version = seqs, version
                keep.append(p)
        self.parked = keep

    # -- list offsets ---------------------------------------------------------------------------
    @serves(ipc.ListOffsetsRequest)
    def _list_offsets(self, req: ipc.ListOffsetsRequest) -> ipc.ListOffsetsResult:
        out = []
        cat = self._catalog()
        for part in req.parts:
            h = self._handle(part.topic_id, part.partition, cat)
            if h is None:
                out.append(ipc.ListOffsetsPartResult(int(ErrorCode.unknown_topic_or_partition)))
                continue
            st = h.state()
            if st.status in (STARTING, RECOVERING) or st.generation == 0:
                out.append(ipc.ListOffsetsPartResult(int(ErrorCode.not_leader_or_follower)))
                continue
            upper = st.last_stable_offset if req.isolation_level == READ_COMMITTED else st.high_watermark
            ts = part.timestamp
            if ts in (EARLIEST, EARLIEST_LOCAL):
                out.append(ipc.ListOffsetsPartResult(0, -1, st.log_start_offset))
            elif ts == LATEST:
                out.append(ipc.ListOffsetsPartResult(0, -1, upper))
            elif ts == LATEST_TIERED:
                # No tiered storage: Kafka answers offset -1 (UnifiedLog.fetchOffsetByTimestamp).
                out.append(ipc.ListOffsetsPartResult(0, -1, -1))
            elif ts == MAX_TIMESTAMP:
                found = h.reader.max_timestamp(upper, log_start_offset=st.log_start_offset)
                out.append(ipc.ListOffsetsPartResult(0, found[1], found[0]) if found
                           else ipc.ListOffsetsPartResult(0, -1, -1))
            else:
                # Kafka only answers offsets below the last fetchable one (HW or LSO).
                found = h.reader.offset_for_timestamp(ts, upper, log_start_offset=st.log_start_offset)
                out.append(ipc.ListOffsetsPartResult(0, found[1], found[0]) if found and found[0] < upper
                           else ipc.ListOffsetsPartResult(0, -1, -1))
        return ipc.ListOffsetsResult(out)

