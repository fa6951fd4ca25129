"""Log cleaner process: compacts the partitions of the topics whose cleanup.policy has "compact".

Runs as a child of the supervisor, ``[log.cleaner] processes`` of them (endpoints ``cl<i>``,
process title ``appliance: cleaner``, ``cleaner 1``...), each cleaning the partitions that
``runtime.cleaner_of`` gives it. On the worker base's loop (``workers.base.Worker``). Owns no
durable state: its key -> offset map, and the ``.cleaned`` copies it is writing (the partition's
writer removes a copy it never swapped, at the next round's start or at its own open). It reads
segments through read-only maps, never takes part in a writer's append path, and changes a
partition's files only by asking its writer to swap a copy in (``appliance.log.swap``).

Rings: one pair per assigned partition (cleaner -> writer, writer -> cleaner), made by the
supervisor with the writer; the cleaner attaches them as the catalog names the partitions.
Topic configs are read from the published catalog at every round (a changed config applies to
the next round), the broker defaults and the cleaner's own settings from the running
configuration (``reload``).

A round (``on_turn`` when one is due; it blocks the loop, beating the heartbeat and looking at
SIGTERM between batches):

1. plan every assigned compacted partition whose writer is READY: its state page (log start,
   high watermark, LSO, active segment), its sealed segment files and its cleaner checkpoint
   (``appliance.log.cleaner.plan``); take the dirtiest that is due, as Kafka's
   grabFilthiestCompactedLog;
2. ``CleanerBeginRequest`` to its writer: stale copies go; the producers that have not expired,
   with their last records;
3. ``Cleaner.clean``: the map, then per group the ``.cleaned`` files and a ``CleanerSwapRequest``,
   answered once the writer has swapped the group in (the last one moves the checkpoint);
4. metrics (Kafka's ``kafka.log:type=LogCleaner`` and ``LogCleanerManager`` gauges, one series
   per cleaner process). Nothing due: the next look is ``backoff_ms`` later.

The scrub (issue 34, bit rot; ``appliance.log.scrub``): between rounds the cleaner reads every
sealed segment of every partition of its writer processes (compacted or not; the cleaner that
``cleaner_of`` gives the coordinator also the coordinator's two logs), at
``[log.scrub] bytes_per_second`` shared by the cleaners, and checks each batch's CRC. A batch
that fails is logged once with its file, position and offset and counted
(``appliance_log_scrub_corrupt_batches_total{topic,partition}``); the fetchers refuse to serve it
by themselves (they check what they serve), so nothing else needs telling. A pass over every
partition is followed by a pause of ``pass_interval_ms``.

A round that fails on something other than a stop, a changed segment, a refused swap or a full
disk marks the partition uncleanable until the process restarts (Kafka's
markPartitionUncleanable) and is logged; the other partitions go on. A full disk (ENOSPC writing a
copy, or KAFKA_STORAGE_ERROR from the writer's commit) stops the round, has the copy removed and
tries again after ``backoff_ms``.
"""

from __future__ import annotations

import itertools
import logging
import os
import time
from dataclasses import dataclass

from appliance import ipc, testhooks
from appliance.catalog.assignment import ASSIGNMENT_FILE, AssignmentView
from appliance.data_layout import COORDINATOR_DIR, GROUP_LOG_DIR, partition_dir
from appliance.group.store import LOG_DIR as GROUP_STORE_LOG_DIR
from appliance.errors import ErrorCode
from appliance.log.cleaner import messages as cm
from appliance.log.cleaner.clean import Cleaner, CleaningAborted, LastRecord
from appliance.log.cleaner.offset_map import OffsetMap
from appliance.log.cleaner.plan import NoSuchSegment, cleanable, sealed_segments
from appliance.log.files import CLEANER_CHECKPOINT_FILE, list_segment_bases
from appliance.durable import is_no_space, read_checkpoint
from appliance.log.partition_log import LogSettings
from appliance.log.scrub import Scrubber, ScrubTarget
from appliance.txn.state_manager import LOG_DIR as TXN_STORE_LOG_DIR
from appliance.metrics import key
from appliance.runtime import (COORDINATOR, COORDINATOR_PAGE_FIELDS, PARTITION_PAGE_FIELDS, READY,
                               WorkerContext, cleaner_of, writer_name)
from shm.statepage import StalePage, StatePage
from shm.topology import Outbox
from workers.base import IDLE_WAIT_S, Worker

log = logging.getLogger("appliance.cleaner")

# The coordinator worker's two logs (``workers/coordinator.py``), scrubbed by one cleaner
# (``cleaner_of`` the coordinator) and named in the metric and the log line by the internal
# topics Kafka keeps them in (one partition each here).
COORDINATOR_LOGS = (("__transaction_state", (COORDINATOR_DIR, TXN_STORE_LOG_DIR)),
                    ("__consumer_offsets", (COORDINATOR_DIR, GROUP_LOG_DIR, GROUP_STORE_LOG_DIR)))


def main(ctx: WorkerContext) -> int:
    return CleanerWorker(ctx).main()


# ioprio_set(2) (no Python binding): the idle I/O class, so that the copies' writes and fsyncs
# wait for the writers' own (Linux, x86-64 and arm64; elsewhere the cleaner keeps its class).
_SYS_IOPRIO_SET = {"x86_64": 251, "aarch64": 30}
_IOPRIO_CLASS_IDLE, _IOPRIO_WHO_PROCESS = 3, 1


def _idle_io() -> None:
    nr = _SYS_IOPRIO_SET.get(os.uname().machine)
    if nr is None:
        return
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).syscall(nr, _IOPRIO_WHO_PROCESS, 0, _IOPRIO_CLASS_IDLE << 13)
    except (OSError, AttributeError):
        pass


@dataclass
class _Link:
    """An assigned partition: the rings of the writer process that carries it (``proc``), and
    its own state page."""
    topic: str
    partition: int
    directory: str
    outbox: Outbox
    page: object
    topic_id: bytes = b""
    proc: str = ""


class Throttler:
    """Kafka's Throttler: sleeps when more than ``rate`` bytes a second went by (checked every
    ``check_s``), sleeping in slices that call ``beat``."""

    def __init__(self, rate: int, beat, check_s: float = 0.3) -> None:
        self.rate = rate
        self.beat = beat
        self.check_s = check_s
        self.start = time.monotonic()
        self.observed = 0

    def __call__(self, n: int) -> None:
        if self.rate <= 0:
            return
        self.observed += n
        now = time.monotonic()
        elapsed = now - self.start
        if elapsed < self.check_s:
            return
        sleep = self.observed / self.rate - elapsed
        while sleep > 0:
            self.beat()
            time.sleep(min(sleep, 0.5))
            sleep -= 0.5
        self.start = time.monotonic()
        self.observed = 0


class CleanerWorker(Worker):
    tick_s = 1.0

    def __init__(self, ctx: WorkerContext) -> None:
        super().__init__(ctx)
        self.links: dict[str, _Link] = {}
        self.outboxes_to: dict[str, Outbox] = {}          # by writer process
        self.assignment = AssignmentView(self.topo.file_path(ASSIGNMENT_FILE),
                                         lambda: self.sup_page.read().assignment_version)
        self.next_round = 0.0
        self.last_run = time.monotonic()
        self.uncleanable: set[str] = set()
        self.no_space: set[str] = set()         # partitions whose last round met a full disk
        self._ids = itertools.count(((self.generation & 0xFFFF) << 40) | 1)
        self.scrubber = Scrubber(0.0)
        self.next_scrub = 0.0
        self._scrub_seen = (-1, -1)        # (catalog, assignment) versions of the targets
        self._apply(self.cfg)
        m = self.metrics
        who = [("cleaner", ctx.index)]
        self.mv = m.values
        self.k_recopy = m.slot(key("kafka_log_logcleaner_cleaner_recopy_percent", who))
        self.k_clean_time = m.slot(key("kafka_log_logcleaner_max_clean_time_secs", who))
        self.k_buffer = m.slot(key("kafka_log_logcleaner_max_buffer_utilization_percent", who))
        self.k_delay = m.slot(key("kafka_log_logcleaner_max_compaction_delay_secs", who))
        self.k_dirty = m.slot(key("kafka_log_logcleanermanager_max_dirty_percent", who))
        self.k_since = m.slot(key("kafka_log_logcleanermanager_time_since_last_run_ms", who))
        self.k_uncleanable = m.slot(key("kafka_log_logcleanermanager_uncleanable_partitions_count", who))
        self.k_read = m.slot(key("appliance_log_cleaner_bytes_read", who))
        self.k_written = m.slot(key("appliance_log_cleaner_bytes_written", who))
        self.k_rounds = m.slot(key("appliance_log_cleaner_rounds", who))
        self.k_scrub_bytes = m.slot(key("appliance_log_scrub_bytes", who))
        self.k_scrub_passes = m.slot(key("appliance_log_scrub_passes", who))

    def inputs(self) -> list[str]:
        return []            # writer processes' rings are attached as the assignment names them

    outputs = inputs

    def _apply(self, cfg) -> None:
        cl = cfg.log.cleaner
        self.enabled = cl.enable
        self.backoff_s = cl.backoff_ms / 1000
        self.map_bytes = cl.dedupe_buffer_size // cl.processes
        self.throttler = Throttler(cl.io_max_bytes_per_second // cl.processes, self._beat)
        self.scrub_rate = cfg.log.scrub.bytes_per_second // cl.processes
        self.scrubber.pass_interval_s = cfg.log.scrub.pass_interval_ms / 1000

    def setup(self) -> int | None:
        # Spare cycles only: produce and fetch come first (Linux SCHED_IDLE: the scheduler runs
        # this process when no other wants the CPU, and still gives it a trickle under full load,
        # enough for its heartbeat).
        try:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        except (AttributeError, OSError):
            try:
                os.nice(19)
            except OSError:
                pass
        _idle_io()
        return None

    def reload(self, old, new) -> None:
        self._apply(new)
        if new.log.scrub != old.log.scrub:
            self.next_scrub = 0.0
            self.scrubber.next_pass_at = min(self.scrubber.next_pass_at, time.monotonic() +
                                             self.scrubber.pass_interval_s)
        if new.log.cleaner != old.log.cleaner:
            self.next_round = 0.0      # look again under the new settings

    # -- the loop -------------------------------------------------------------------------------
    def drain_inputs(self) -> bool:
        """Answers that arrive outside a call belong to a call that gave up: dropped."""
        worked = False
        for ring in self.mailbox.inputs.values():
            while ring.get() is not None:
                worked = True
        return worked

    def on_tick(self, now: float) -> None:
        self.mv[self.k_since] = int((now - self.last_run) * 1000)

    def wait_timeout(self, now: float) -> float:
        nxt = self.next_round
        if self.scrub_rate > 0:
            nxt = min(nxt, max(self.next_scrub, self.scrubber.next_pass_at))
        return max(0.0, min(IDLE_WAIT_S, nxt - now))

    def on_turn(self, now: float) -> None:
        if not self.stop:
            self._scrub(now)
        if now < self.next_round or self.stop:
            return
        self.next_round = now + self.backoff_s
        if not self.enabled:
            return
        self._sync_links()
        job = self._filthiest()
        self.last_run = time.monotonic()
        if job is None:
            return
        name, settings, segs, c, st = job
        try:
            self._clean(name, settings, segs, c, st)
            self.next_round = 0.0                  # more may be due: look again at once
            if name in self.no_space:
                self.no_space.discard(name)
                log.info("%s-%d: cleaning works again", self.links[name].topic,
                         self.links[name].partition)
        except CleaningAborted as e:
            if not self.stop:
                log.info("%s-%d: cleaning stopped: %s", self.links[name].topic,
                         self.links[name].partition, e)
        except OSError as e:
            if not is_no_space(e):
                self._uncleanable(name)
            else:
                self._no_space(name, e)
        except Exception:
            self._uncleanable(name)

    def _uncleanable(self, name: str) -> None:
        link = self.links[name]
        log.exception("%s-%d: cleaning failed; the partition is not cleaned again until this "
                      "process restarts", link.topic, link.partition)
        self.uncleanable.add(name)
        self.mv[self.k_uncleanable] = len(self.uncleanable)

    def _no_space(self, name: str, e: OSError) -> None:
        """A full disk while writing a copy: nothing is wrong with the partition. The copy made
        so far gives its blocks back at once (the writer removes copies no swap named when a
        round begins: asked now rather than at the next round), and the round is tried again
        after the back-off, as Kafka's cleaner retries a partition after an I/O error."""
        link = self.links[name]
        if name not in self.no_space:           # once an episode, as the writers log a full disk
            self.no_space.add(name)
            log.warning("%s-%d: cleaning stopped, file system full (%s); tried again every %.1f s",
                        link.topic, link.partition, e.strerror, self.backoff_s)
        try:
            self._call(name, cm.CleanerBeginRequest(-1),
                       self.cfg.server.internal_request_timeout_ms / 1000)
        except CleaningAborted:
            pass

    # -- the scrub ------------------------------------------------------------------------------
    def _scrub(self, now: float) -> None:
        """One step of the scrub when one is due: about a quarter of a second's worth of the
        rate, then the next step as much later as the bytes read take at that rate."""
        if self.scrub_rate <= 0 or now < self.next_scrub:
            return
        self._scrub_targets()
        sc = self.scrubber
        if not sc.due(now):
            return
        budget = max(65536, min(4 << 20, self.scrub_rate // 4))
        read, damage = sc.step(now, budget, self._active_base)
        self.mv[self.k_scrub_bytes] += read
        self.mv[self.k_scrub_passes] = sc.passes
        self.next_scrub = now + read / self.scrub_rate
        for t, d in damage:
            what = ("the coordinator runs on what it loaded, but will refuse to start on it: "
                    "restore the file from a backup" if t.name == COORDINATOR
                    else "fetches from there answer KAFKA_STORAGE_ERROR")
            log.error("%s-%d: scrub: %s at position %d of %s (batch offset %d); %s "
                      "(`appliance dump-log --verify` lists every damaged batch)", t.topic,
                      t.partition, d.reason, d.position, d.path, d.offset, what)
            # Counted after the line is written: whoever sees the count finds the line.
            self.metrics.add(key("appliance_log_scrub_corrupt_batches",
                                 [("topic", t.topic), ("partition", t.partition)]))

    def _scrub_targets(self) -> None:
        """Every partition of the writer processes this cleaner serves, compacted or not, and
        the coordinator's logs if it is the coordinator's cleaner."""
        cat = self.catalog.get()
        seen = (cat.version, self.sup_page.read().assignment_version)
        if seen == self._scrub_seen:
            return
        self._scrub_seen = seen
        asg = self.assignment.get()
        procs = self.cfg.log.cleaner.processes
        targets = []
        for t in cat.topics.values():
            for p in range(t.partitions):
                proc = asg.process_of(t.topic_id, p)
                if proc is not None and cleaner_of(proc, procs) == self.name:
                    targets.append(ScrubTarget(writer_name(t.topic_id, p), t.name, p,
                                               partition_dir(self.ctx.data_dir, t.name, p)))
        if cleaner_of(COORDINATOR, procs) == self.name:
            for topic, parts in COORDINATOR_LOGS:
                targets.append(ScrubTarget(COORDINATOR, topic, 0,
                                           os.path.join(self.ctx.data_dir, *parts)))
        self.scrubber.set_targets(targets)

    def _active_base(self, t: ScrubTarget) -> int | None:
        """The partition's active segment base while its writer is READY, else None. For a
        coordinator log: the last segment's base while the coordinator is READY (its load and
        recovery are over; a segment below the last one is sealed: a roll seals the old segment
        before it makes the new one, and a compaction swaps in a log sealed whole)."""
        if t.name == COORDINATOR:
            return self._coordinator_active_base(t)
        link = self.links.get(t.name)
        try:
            if link is not None:
                st = link.page.read()
            else:
                with StatePage.open(self.topo.page_path(t.name), PARTITION_PAGE_FIELDS,
                                    readonly=True) as page:
                    st = page.read()
        except (FileNotFoundError, ValueError, StalePage):
            return None
        if st.status != READY or st.generation == 0:
            return None
        return st.active_base_offset

    def _coordinator_active_base(self, t: ScrubTarget) -> int | None:
        try:
            with StatePage.open(self.topo.page_path(COORDINATOR), COORDINATOR_PAGE_FIELDS,
                                readonly=True) as page:
                st = page.read()
            if st.status != READY or st.generation == 0:
                return None
            bases = list_segment_bases(t.directory)
        except (FileNotFoundError, ValueError, StalePage):
            return None
        return bases[-1] if bases else None

    # -- partitions -----------------------------------------------------------------------------
    def _sync_links(self) -> None:
        """The partitions of the writer processes this cleaner serves (``cleaner_of`` each
        process: the rings are the process's), by their writer's name."""
        cat = self.catalog.get()
        asg = self.assignment.get()
        procs = self.cfg.log.cleaner.processes
        wanted = {}
        for t in cat.topics.values():
            if not cat.settings(t, self.cfg.log).compact:
                continue        # nothing to clean: no page held open for it (a descriptor each)
            for p in range(t.partitions):
                proc = asg.process_of(t.topic_id, p)
                if proc is not None and cleaner_of(proc, procs) == self.name:
                    wanted[writer_name(t.topic_id, p)] = (t.name, t.topic_id, p, proc)
        for w in [w for w in self.links if w not in wanted or wanted[w][3] != self.links[w].proc]:
            link = self.links.pop(w)
            link.page.close()
            self.uncleanable.discard(w)
            self.no_space.discard(w)
        in_use = {proc for *_, proc in wanted.values()}
        for proc in [p for p in self.outboxes_to if p not in in_use]:
            del self.outboxes_to[proc]
            self.mailbox.remove(proc)
            self.topo.forget(proc, self.bells)
        for w, (topic, tid, p, proc) in wanted.items():
            if w in self.links:
                continue
            try:
                page = StatePage.open(self.topo.page_path(w), PARTITION_PAGE_FIELDS, readonly=True)
                out = self.outboxes_to.get(proc)
                if out is None:
                    out = Outbox(self.topo, self.name, proc, self.bells)
                    self.mailbox.add(proc)
                    self.outboxes_to[proc] = out
            except FileNotFoundError:
                continue                        # not made yet: the next round
            self.links[w] = _Link(topic, p, partition_dir(self.ctx.data_dir, topic, p), out, page,
                                  tid, proc)

    def _settings(self, topic: str) -> LogSettings | None:
        """The topic's effective settings: its own configs over the dynamic broker configs over
        ``[log]`` (``Catalog.settings``), as its writer has them."""
        cat = self.catalog.get()
        t = cat.topics.get(topic)
        return None if t is None else cat.settings(t, self.cfg.log)

    def _filthiest(self):
        now_ms = time.time_ns() // 1_000_000
        best = None
        max_ratio = 0.0
        max_delay = 0
        for name, link in self.links.items():
            if name in self.uncleanable:
                continue
            s = self._settings(link.topic)
            if s is None or not s.compact:
                continue
            st = link.page.read()
            if st.status != READY or st.generation == 0:
                continue
            try:
                segs = sealed_segments(link.directory, st.active_base_offset)
            except (NoSuchSegment, FileNotFoundError):
                continue
            c = cleanable(segs, log_start=st.log_start_offset, log_end=st.high_watermark,
                          last_stable=st.last_stable_offset, active_base=st.active_base_offset,
                          checkpoint=read_checkpoint(os.path.join(link.directory,
                                                                  CLEANER_CHECKPOINT_FILE)),
                          min_compaction_lag_ms=s.min_compaction_lag_ms,
                          max_compaction_lag_ms=s.max_compaction_lag_ms, now_ms=now_ms)
            if c.total_bytes == 0:
                continue
            max_ratio = max(max_ratio, c.ratio)
            max_delay = max(max_delay, c.compaction_delay_ms)
            if c.due(s.min_cleanable_ratio) and (best is None or c.ratio > best[3].ratio):
                best = (name, s, segs, c, st)
        self.mv[self.k_dirty] = int(max_ratio * 10000)
        self.mv[self.k_delay] = max_delay
        return best

    # -- one round ------------------------------------------------------------------------------
    def _beat(self) -> None:
        self.hb.beat(self.ctx.heartbeat_slot)

    def _check_done(self) -> None:
        self._beat()
        if self.stop:
            raise CleaningAborted("stopping")

    def _call(self, name: str, req: ipc.Request, timeout_s: float):
        """Send ``req`` to the writer and wait for its answer (None: no answer in time, or the
        writer restarted meanwhile)."""
        link = self.links[name]
        rid = next(self._ids)
        link.outbox.post(ipc.encode(rid, ipc.for_partition(req, link.topic_id, link.partition)))
        link.outbox.flush()
        gen = link.page.read().generation
        deadline = time.monotonic() + timeout_s
        while True:
            self._check_done()
            for src, ring in self.mailbox.inputs.items():
                while (raw := ring.get()) is not None:
                    got, body = ipc.decode(raw)
                    if got == rid and src == link.proc:
                        return body
            now = time.monotonic()
            if now >= deadline or link.page.read().generation != gen:
                return None
            if link.outbox.queued:
                link.outbox.flush()
            self.mailbox.wait(min(0.2, deadline - now))

    def _clean(self, name: str, s: LogSettings, segs, c, st) -> None:
        link = self.links[name]
        timeout = self.cfg.server.internal_request_timeout_ms / 1000
        producers: dict[int, LastRecord] = {}
        cursor = -1
        while True:
            r = self._call(name, cm.CleanerBeginRequest(cursor), timeout)
            if r is None or r.error != ErrorCode.none:
                raise CleaningAborted("the writer did not answer the start of the round")
            for pid, last, epoch in cm.unpack_producers(r.producers):
                producers[pid] = LastRecord(last, epoch)
            if r.next_cursor < 0:
                break
            cursor = r.next_cursor

        def swap(groups, checkpoint) -> bool:
            testhooks.crash_point("cleaner", "written")
            res = self._call(name, cm.CleanerSwapRequest(
                [(g.base, [(x.base, x.ino, x.size) for x in g.old]) for g in groups], checkpoint),
                timeout)
            if res is None:
                raise CleaningAborted("the writer did not answer a swap")
            if res.error != ErrorCode.none:
                log.info("%s-%d: swap refused: %s", link.topic, link.partition, res.message)
            return res.error == ErrorCode.none

        cleaner = Cleaner(link.directory, s, OffsetMap(self.map_bytes),
                          check_done=self._check_done, throttle=self.throttler)
        try:
            stats = cleaner.clean(segs, c, hw=st.high_watermark, producers=producers, swap=swap)
        except FileNotFoundError as e:
            if os.path.isdir(link.directory):
                raise
            raise CleaningAborted(f"the partition went away ({e})") from None
        mv = self.mv
        mv[self.k_rounds] += 1
        mv[self.k_read] += stats.bytes_read + stats.map_bytes_read
        mv[self.k_written] += stats.bytes_written
        mv[self.k_recopy] = int(stats.recopy_percent * 100)
        mv[self.k_clean_time] = int(stats.elapsed_s * 1e6)
        mv[self.k_buffer] = int(stats.buffer_utilization * 10000)
        mb = (stats.bytes_read + stats.map_bytes_read) / 1048576
        log.info("%s-%d: cleaned offsets [0, %d) in %d groups: %.1f MB read, %.1f MB written "
                 "(%.0f%%), %d of %d messages kept, %.2f s (%.1f MB/s), map %.0f%% full",
                 link.topic, link.partition, stats.end_offset, stats.groups, mb,
                 stats.bytes_written / 1048576, stats.recopy_percent, stats.messages_written,
                 stats.messages_read, stats.elapsed_s, mb / stats.elapsed_s if stats.elapsed_s else 0,
                 stats.buffer_utilization * 100)
