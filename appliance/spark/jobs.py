"""The Spark sink's job log: the transaction manager's durable decisions (KIP-939's premise that
the external transaction manager persists its decision), and the recovery that reads them.

Runs wherever the sink runs: the driver's Python workers (planning a write, committing or
aborting it), the executors' Python workers (a task's stale-attempt check and heartbeat), and the
operator's shell (``appliance spark recover``). Owns no state in memory beyond one call: the
state is the topic ``__spark_sink_jobs`` on the appliance (one partition, LogAppendTime, no
retention: trimmed by the sink itself, below), written by an idempotent producer (acks=all: an
appended record is durable, and visible to every later read) and read whole.

Records (JSON values; the record key is ``<prefix>/<key>``, what a compacted log would keep):

- ``begin``: a batch write was planned (the driver, before any task). Its offset is the run's
  *generation*: later records of the run carry it, and a newer ``begin`` of the same key (a
  rerun with the same ``jobId``) supersedes the older run.
- ``hb``: a heartbeat, from a task that has been running for a quarter of the job's timeout.
- ``seal``: the driver is about to take the tasks' transactions over; task attempts that start
  later give up (they would otherwise abort what the driver is committing).
- ``commit``: the commit decision, with every (transactional id, PreparedTxnState). Written once
  the driver holds every prepared transaction (``init_transactions(keep_prepared_txn=True)`` has
  fenced every other user of the ids and matched each state).
- ``done``: every transaction of the decision is committed.
- ``abort`` / ``aborted``: the roll-back decision, and its completion (every id of the job fenced,
  its open transaction aborted).
- ``recover``: written by a recovery before it judges liveness: its LogAppendTime is the broker's
  "now", so that no two clocks are compared.

The first decision of a run wins, in log order: a ``commit`` after an ``abort`` of the same run
is void, and so is an ``abort`` after a ``commit``. Whoever writes a decision reads the log back
up to it to learn whether it won. That is what makes a recovery that misjudges a slow job as dead
safe: the job then fails loudly, with nothing of it visible, instead of committing half.

Trimming (``JobLog.trim``): once a batch job is resolved, its driver deletes the records before
the first one still needed (DeleteRecords): the ``begin`` of every batch job that is unresolved
or was last heard of within ``jobRetentionMs`` (default 7 days, as Kafka keeps an idle
transactional id), and the last heartbeat of every streaming query heard of within it. A rerun
with the ``jobId`` of a job trimmed away is a new job. ``fold`` ignores the records of a run whose
``begin`` is not in what it reads (trimmed, or before a read's start).

Streaming queries write no decisions (a replayed micro-batch finds its committed partitions by
their marker offsets, see ``appliance.spark.writer``); their tasks write heartbeats, and their
open transactions are found by their ids (``<prefix>-<query id>-<partition>``).

Recovery of a prefix (``Recovery.run``): the candidates are the batch jobs of the prefix whose
last run is unresolved in the log, and the keys of the prefix's open transactions
(ListTransactions). A candidate is dead when neither a record of it nor the start of one of its
transactions is more recent than its timeout (``jobTimeoutMs``, recorded with the job) by the
broker's clock. A dead job with a commit decision is rolled forward (each listed id taken over
with ``keep_prepared_txn=True`` and committed if its prepared state is the decided one), one
without is rolled back (``abort`` written and won, then every id of the job force-terminated:
that also fences a task attempt that had just started), a dead streaming query's open
transactions are aborted (its restart replays them). Live candidates are left alone.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from appliance.client import transaction_admin as admin
from appliance.client import Consumer, PreparedTxnState, Producer, security
from appliance.client.errors import ErrorCode, KafkaError

log = logging.getLogger("appliance.spark")

JOB_LOG_TOPIC = "__spark_sink_jobs"
JOB_LOG_CONFIGS = {"message.timestamp.type": "LogAppendTime", "retention.ms": "-1",
                   "retention.bytes": "-1"}
DEFAULT_JOB_TIMEOUT_MS = 60_000
DEFAULT_JOB_RETENTION_MS = 7 * 24 * 3600 * 1000
NAME_RE = re.compile(r"[A-Za-z0-9._-]+")
# The keys the sink makes itself: a batch write's 16 hex digits, a streaming query's id.
_OWN_KEY = re.compile(r"[0-9a-f]{16}|[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_STREAM_KEY = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
# Transaction states in which a transaction is open: 2PC transactions stay Ongoing once prepared.
OPEN_STATES = ["Ongoing"]

RUNNING, SEALED, COMMITTING, DONE, ABORTING, ABORTED = (
    "running", "sealed", "committing", "done", "aborting", "aborted")
RESOLVED = (DONE, ABORTED)
KILL_ENV = "APPLIANCE_SPARK_TEST_KILL_AT"


def transactional_id(prefix: str, key: str, partition: int) -> str:
    return f"{prefix}-{key}-{partition}"


def test_hook(phase: str, detail: int | None = None) -> None:
    """For the tests only: kill -9 this Spark driver (its session: the Python driver, its JVM and
    the workers) when ``APPLIANCE_SPARK_TEST_KILL_AT`` names ``phase`` (or ``phase:detail``).
    The driver's workers inherit the driver's environment."""
    want = os.environ.get(KILL_ENV)
    if not want:
        return
    name, _, at = want.partition(":")
    if name != phase or (at and detail is not None and int(at) != detail):
        return
    log.warning("test hook: killing the Spark driver at %s", want)
    for kill in (lambda: os.killpg(os.getsid(0), signal.SIGKILL),
                 lambda: os.killpg(os.getpgrp(), signal.SIGKILL)):
        try:
            kill()
        except (ProcessLookupError, PermissionError):
            pass
    os.kill(os.getpid(), signal.SIGKILL)


# -- records and their fold --------------------------------------------------------------------

@dataclass(frozen=True)
class Entry:
    """One record of the job log."""
    offset: int
    timestamp: int              # LogAppendTime: the broker's clock
    type: str
    prefix: str
    key: str
    gen: int                    # the run's begin offset (batch), 0 for streaming queries
    kind: str = "batch"         # or "stream"
    timeout_ms: int = 0
    txns: tuple[tuple[str, str], ...] = ()


@dataclass
class Job:
    """The latest run of one (prefix, key), as the log tells it."""
    prefix: str
    key: str
    kind: str
    gen: int
    phase: str
    first_offset: int
    last_offset: int
    last_seen_ms: int
    timeout_ms: int
    txns: tuple[tuple[str, str], ...] = ()

    @property
    def resolved(self) -> bool:
        return self.phase in RESOLVED


def fold(entries: Iterable[Entry]) -> dict[tuple[str, str], Job]:
    """Each (prefix, key)'s latest run and its phase, from records in offset order."""
    jobs: dict[tuple[str, str], Job] = {}
    first = None
    for e in entries:
        if first is None:
            first = e.offset
        if e.type == "recover" or not e.key:
            continue
        k = (e.prefix, e.key)
        gen = e.offset if e.type == "begin" else e.gen
        if e.kind == "batch" and gen < first:
            continue                       # its run's begin was trimmed, or precedes this read
        j = jobs.get(k)
        if j is None or gen > j.gen:
            j = jobs[k] = Job(e.prefix, e.key, e.kind, gen, RUNNING, e.offset, e.offset, e.timestamp,
                              e.timeout_ms or DEFAULT_JOB_TIMEOUT_MS)
        elif gen < j.gen:
            continue                       # a late record of a run that a newer one replaced
        j.last_offset = e.offset
        j.last_seen_ms = max(j.last_seen_ms, e.timestamp)
        if e.timeout_ms:
            j.timeout_ms = e.timeout_ms
        if e.type == "seal" and j.phase == RUNNING:
            j.phase = SEALED
        elif e.type == "commit" and j.phase in (RUNNING, SEALED):
            j.phase, j.txns = COMMITTING, e.txns
        elif e.type == "done" and j.phase == COMMITTING:
            j.phase = DONE
        elif e.type == "abort" and j.phase in (RUNNING, SEALED):
            j.phase = ABORTING
        elif e.type == "aborted" and j.phase == ABORTING:
            j.phase = ABORTED
    return jobs


def _entry(offset: int, timestamp: int, value: bytes | None) -> Entry | None:
    try:
        d = json.loads(value or b"")
        return Entry(offset, timestamp, str(d["type"]), str(d["prefix"]), str(d.get("key") or ""),
                     int(d.get("gen", 0)), str(d.get("kind", "batch")), int(d.get("timeout_ms", 0)),
                     tuple((str(t), str(s)) for t, s in d.get("txns", ())))
    except (ValueError, KeyError, TypeError):
        log.warning("%s offset %d: not a job record, skipped", JOB_LOG_TOPIC, offset)
        return None


# -- the log itself ----------------------------------------------------------------------------

def connection_config(client_config: dict[str, Any]) -> dict[str, Any]:
    """The keys of a producer config that say how to reach the broker, TLS and SASL included:
    the job log, the admin connections, the consumers and the producers of the sink all reach
    it the same way."""
    keep = {"bootstrap_servers", "client_id", "request_timeout_ms", "retry_backoff_ms",
            "max_versions", *security.DEFAULTS}
    return {k: v for k, v in client_config.items() if k in keep}


class JobLog:
    """Appends to and reads ``__spark_sink_jobs`` (created on first use)."""

    def __init__(self, client_config: dict[str, Any]) -> None:
        self.config = connection_config(client_config)
        self.security = security.Security.from_config({**security.DEFAULTS, **self.config})
        self._producer: Producer | None = None
        self._created = False

    def close(self) -> None:
        if self._producer is not None:
            self._producer.close()
            self._producer = None

    def __enter__(self) -> "JobLog":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def bootstrap(self) -> str:
        servers = self.config["bootstrap_servers"]
        return (servers.split(",") if isinstance(servers, str) else list(servers))[0].strip()

    def admin(self):
        return admin.connect(self.bootstrap(), security=self.security)

    def ensure_topic(self) -> None:
        if self._created:
            return
        conn = self.admin()
        try:
            admin.create_topic(conn, JOB_LOG_TOPIC, 1, JOB_LOG_CONFIGS)
        finally:
            conn.close()
        self._created = True

    def append(self, type_: str, prefix: str, key: str = "", *, gen: int = 0, kind: str = "batch",
               timeout_ms: int = 0, txns: Iterable[tuple[str, str]] = ()) -> Entry:
        """Write one record and wait until it is acknowledged (durable)."""
        self.ensure_topic()
        if self._producer is None:
            self._producer = Producer({**self.config, "linger_ms": 0, "acks": "all",
                                       "allow_auto_create_topics": False})
        doc = {"type": type_, "prefix": prefix, "key": key, "gen": gen, "kind": kind,
               "timeout_ms": timeout_ms}
        txns = [[t, s] for t, s in txns]
        if txns:
            doc["txns"] = txns
        d = self._producer.send(JOB_LOG_TOPIC, json.dumps(doc, separators=(",", ":")).encode(),
                                f"{prefix}/{key}".encode(), partition=0)
        self._producer.flush()
        d.get()
        if d.offset < 0:
            # DUPLICATE_SEQUENCE_NUMBER: an earlier attempt was written; find it.
            raise KafkaError(ErrorCode.unknown_server_error, "job log append answered without an offset")
        return Entry(d.offset, d.timestamp, type_, prefix, key, d.offset if type_ == "begin" else gen,
                     kind, timeout_ms, tuple((t, s) for t, s in txns))

    def trim(self, retention_ms: int = DEFAULT_JOB_RETENTION_MS) -> int | None:
        """Delete the records no job needs any more (module docstring); returns the new log
        start offset, or None when there was nothing to delete."""
        entries = self.read()
        keep = trim_point(entries, retention_ms)
        if keep is None or keep <= entries[0].offset:
            return None
        conn = self.admin()
        try:
            return admin.delete_records(conn, JOB_LOG_TOPIC, 0, keep)
        finally:
            conn.close()

    def read(self, start: int = 0) -> list[Entry]:
        """Every record from ``start`` to the end of the log as it is now."""
        self.ensure_topic()
        tp = (JOB_LOG_TOPIC, 0)
        out: list[Entry] = []
        with Consumer({**self.config, "isolation_level": "read_uncommitted",
                       "allow_auto_create_topics": False}) as c:
            c.assign([tp])
            end = c.end_offsets([tp])[tp]
            first = c.beginning_offsets([tp])[tp]
            c.seek(tp, max(start, first))
            while c.position(tp) < end:
                for r in c.poll(timeout_ms=1000):
                    if r.offset < end:
                        e = _entry(r.offset, r.timestamp, r.value)
                        if e is not None:
                            out.append(e)
        return out


def trim_point(entries: list[Entry], retention_ms: int) -> int | None:
    """The first offset the log still needs (module docstring, "Trimming"), judged at the
    newest record's LogAppendTime; None for an empty read."""
    if not entries:
        return None
    now = max(e.timestamp for e in entries)
    keep = entries[-1].offset + 1
    for j in fold(entries).values():
        recent = now - j.last_seen_ms <= retention_ms
        if j.kind == "batch" and (recent or not j.resolved):
            keep = min(keep, j.first_offset)
        elif j.kind != "batch" and recent:
            keep = min(keep, j.last_offset)
    return keep


# -- recovery ------------------------------------------------------------------------------------

@dataclass
class Action:
    """What a recovery did to one job (or saw of it)."""
    prefix: str
    key: str
    kind: str
    outcome: str                # "rolled forward", "rolled back", "running", "already resolved"
    committed: list[str] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)
    detail: str = ""

    def line(self) -> str:
        what = f"{self.prefix} {self.kind} job {self.key}: {self.outcome}"
        if self.committed:
            what += f"; committed {', '.join(self.committed)}"
        if self.aborted:
            what += f"; aborted {', '.join(self.aborted)}"
        return what + (f" ({self.detail})" if self.detail else "")


class Recovery:
    """Resolves the jobs of one prefix that their drivers left behind (module docstring)."""

    def __init__(self, joblog: JobLog, prefix: str, producer_config: dict[str, Any]) -> None:
        self.log = joblog
        self.prefix = prefix
        self.producer_config = producer_config

    # -- building blocks, also used by the writer's driver -------------------------------------
    def _producer(self, txn_id: str) -> Producer:
        return Producer(self.producer_config, transactional_id=txn_id, enable_two_phase_commit=True)

    def ids_of(self, key: str, known: Iterable[str] = ()) -> list[str]:
        """Every transactional id of the job ``key`` the coordinator knows (any state), and
        ``known`` ones: ``<prefix>-<key>-<n>``."""
        pattern = re.compile(re.escape(f"{self.prefix}-{key}-") + r"\d+")
        conn = self.log.admin()
        try:
            listed = admin.list_transactions(conn)
        finally:
            conn.close()
        ids = {t["transactional_id"] for t in listed if pattern.fullmatch(t["transactional_id"])}
        return sorted(ids | set(known))

    def fence_all(self, ids: Iterable[str]) -> list[str]:
        """Force-terminate (KIP-939) each id: its open transaction, prepared or not, is aborted,
        and every producer using it is fenced. Returns the ids whose transaction was open."""
        aborted = []
        conn = self.log.admin()
        try:
            for txn_id in sorted(set(ids)):
                try:
                    state = admin.describe_transaction(conn, txn_id)["state"]
                except KafkaError as exc:
                    if exc.code != ErrorCode.transactional_id_not_found:
                        raise
                    continue
                admin.force_terminate(conn, txn_id)
                if state in OPEN_STATES:
                    aborted.append(txn_id)
        finally:
            conn.close()
        return aborted

    def roll_forward(self, job: Job) -> Action:
        """Commit each decided transaction that is still prepared as decided; abort any other
        open transaction of the job (a dead job's); record ``done``."""
        act = Action(job.prefix, job.key, job.kind, "rolled forward")
        for txn_id, state in job.txns:
            want = PreparedTxnState.from_string(state)
            with self._producer(txn_id) as p:
                p.init_transactions(keep_prepared_txn=True)
                if p.prepared_state == want:
                    p.commit_transaction()
                    act.committed.append(txn_id)
        # Anything else open under the job's ids belongs to no decision of a live run.
        others = [t for t in self.open_ids(job.key) if t not in act.committed]
        act.aborted = self.fence_all(others) if others else []
        self.log.append("done", job.prefix, job.key, gen=job.gen, timeout_ms=job.timeout_ms)
        return act

    def roll_back(self, job: Job, known_ids: Iterable[str] = ()) -> Action:
        """Write the abort decision; if it won, fence every id of the job and record
        ``aborted``; if a commit decision came first, roll forward instead."""
        mine = self.log.append("abort", job.prefix, job.key, gen=job.gen, kind=job.kind,
                               timeout_ms=job.timeout_ms)
        test_hook("abort_decided")
        now = fold(e for e in self.log.read(job.first_offset) if e.offset <= mine.offset)
        cur = now.get((job.prefix, job.key))
        if cur is None or cur.gen != job.gen:
            return Action(job.prefix, job.key, job.kind, "running", detail="a newer run of the job began")
        if cur.phase in (COMMITTING, DONE):
            return self.roll_forward(cur)
        return self.finish_abort(cur, known_ids)

    def finish_abort(self, job: Job, known_ids: Iterable[str] = ()) -> Action:
        act = Action(job.prefix, job.key, job.kind, "rolled back")
        act.aborted = self.fence_all(self.ids_of(job.key, known_ids))
        if job.kind == "batch":
            self.log.append("aborted", job.prefix, job.key, gen=job.gen, timeout_ms=job.timeout_ms)
        return act

    def open_ids(self, key: str | None = None) -> list[str]:
        """Open transactions of this prefix (of one key)."""
        conn = self.log.admin()
        try:
            listed = admin.list_transactions(conn, states=OPEN_STATES)
        finally:
            conn.close()
        head = f"{self.prefix}-" if key is None else f"{self.prefix}-{key}-"
        return sorted(t["transactional_id"] for t in listed if t["transactional_id"].startswith(head))

    # -- the recovery ---------------------------------------------------------------------------
    def run(self, *, include_running: bool = False, skip_keys: Iterable[str] = (),
            entries: list[Entry] | None = None) -> list[Action]:
        """Resolve the dead jobs of the prefix; returns what was done and what was left alone.
        ``include_running``: take every unresolved job as dead (its driver is known to be gone)."""
        skip = set(skip_keys)
        opened = self.open_ids()
        entries = self.log.read() if entries is None else entries
        jobs = {k: j for (p, k), j in fold(entries).items() if p == self.prefix}
        by_key: dict[str, list[str]] = {}
        for txn_id in opened:
            m = re.fullmatch(r"(.+)-(\d+)", txn_id[len(self.prefix) + 1:])
            if m is None:
                continue
            key = m.group(1)
            if key in jobs or _OWN_KEY.fullmatch(key):
                by_key.setdefault(key, []).append(txn_id)
        candidates = {k for k, j in jobs.items() if j.kind == "batch" and not j.resolved}
        candidates |= set(by_key)
        candidates -= skip
        if not candidates:
            return []
        clock = self.log.append("recover", self.prefix)
        later = [e for e in self.log.read(entries[-1].offset + 1 if entries else 0)
                 if e.offset <= clock.offset]
        jobs = {k: j for (p, k), j in fold(list(entries) + later).items() if p == self.prefix}
        starts: dict[str, int] = {}
        if by_key:
            conn = self.log.admin()
            try:
                for d in admin.describe_transactions(conn, [t for ids in by_key.values() for t in ids]):
                    key = d["transactional_id"][len(self.prefix) + 1:].rsplit("-", 1)[0]
                    starts[key] = max(starts.get(key, -1), d["start_time_ms"])
            finally:
                conn.close()
        out = []
        for key in sorted(candidates):
            job = jobs.get(key)
            kind = job.kind if job is not None else ("stream" if _STREAM_KEY.fullmatch(key) else "batch")
            timeout = job.timeout_ms if job is not None else DEFAULT_JOB_TIMEOUT_MS
            seen = max(job.last_seen_ms if job is not None else -1, starts.get(key, -1))
            if job is not None and job.resolved and key not in by_key:
                continue
            if not include_running and clock.timestamp - seen <= timeout:
                out.append(Action(self.prefix, key, kind, "running",
                                  detail=f"heard of {max(0, clock.timestamp - seen) / 1000:.0f} s ago, "
                                         f"timeout {timeout / 1000:.0f} s"))
                continue
            try:
                out.append(self.resolve(key, job, kind, by_key.get(key, [])))
            except KafkaError as exc:
                out.append(Action(self.prefix, key, kind, "failed", detail=str(exc)))
        return out

    def resolve(self, key: str, job: Job | None, kind: str, open_ids: list[str]) -> Action:
        """Resolve one job taken as dead."""
        if kind == "stream" or job is None:
            # A streaming query (or a job the log does not know): nothing was decided durably;
            # its restart replays what is aborted here.
            job = job or Job(self.prefix, key, kind, 0, RUNNING, 0, 0, -1, DEFAULT_JOB_TIMEOUT_MS)
            act = Action(self.prefix, key, kind, "rolled back")
            act.aborted = self.fence_all(open_ids)
            return act
        if job.phase == COMMITTING:
            return self.roll_forward(job)
        if job.phase == ABORTING:
            return self.finish_abort(job, open_ids)
        if job.phase in RESOLVED:
            act = Action(self.prefix, key, kind, "already resolved")
            act.aborted = self.fence_all(open_ids)
            return act
        return self.roll_back(job, open_ids)


def prefixes(joblog: JobLog, entries: list[Entry] | None = None) -> list[str]:
    """Every prefix the job log or an open transaction of a streaming query names."""
    entries = joblog.read() if entries is None else entries
    found = {e.prefix for e in entries if e.prefix}
    conn = joblog.admin()
    try:
        listed = admin.list_transactions(conn, states=OPEN_STATES)
    finally:
        conn.close()
    for t in listed:
        m = re.fullmatch(r"(.+)-(" + _STREAM_KEY.pattern + r")-\d+", t["transactional_id"])
        if m:
            found.add(m.group(1))
    return sorted(found)


class Heartbeat:
    """A task's heartbeat: every quarter of the job's timeout, an ``hb`` record, from a thread of
    its own (a task may wait long on its input). Started when the task starts, stopped when it
    returns; a failure to write is logged (the job may then be taken as dead, and fails)."""

    def __init__(self, joblog_config: dict[str, Any], prefix: str, key: str, gen: int, kind: str,
                 timeout_ms: int) -> None:
        self.args = (prefix, key)
        self.fields = {"gen": gen, "kind": kind, "timeout_ms": timeout_ms}
        self.interval = timeout_ms / 4000.0
        self.config = joblog_config
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"heartbeat {prefix}/{key}", daemon=True)

    def __enter__(self) -> "Heartbeat":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        with JobLog(self.config) as jl:
            while not self._stop.wait(self.interval):
                try:
                    jl.append("hb", *self.args, **self.fields)
                except Exception as exc:        # noqa: BLE001 - the thread must not die silently
                    log.warning("heartbeat of %s/%s not written: %s", *self.args, exc)

