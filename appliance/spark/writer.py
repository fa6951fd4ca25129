"""Writing Spark rows to the appliance exactly once, batch and streaming, by two-phase commit
(KIP-939), with the job log (``appliance.spark.jobs``) as the transaction manager's memory.

Runs in three places:

- ``BatchWriter.__init__`` / ``StreamWriter.__init__`` in a driver's Python worker, when Spark
  plans the write: the options and the broker are checked (two-phase commit must be on), and the
  prefix's dead jobs are recovered (a batch write each time, a streaming query once per worker
  process). A batch write then records ``begin`` in the job log; with the ``jobId`` option the
  earlier runs of the same job are resolved first, and a job already committed writes nothing.
- ``write`` in the executors' Python workers, once per task: a transactional producer whose id is
  ``<prefix>-<key>-<spark partition>`` (the key: the job id, a key made per batch write, or the
  streaming query's id), every row in one transaction, prepared. The task's commit message
  carries the id and the ``PreparedTxnState`` ("producer id:epoch"). A task that runs longer than
  a quarter of ``jobTimeoutMs`` writes heartbeats to the job log.
- ``commit`` / ``abort`` in a driver's Python worker once every task has answered.

Batch commit, in this order: ``seal`` (task attempts that start later give up), take every
transaction over (``init_transactions(keep_prepared_txn=True)`` fences every other user of the id,
and the open transaction must be the one the task prepared: anything else fails the job before
any partition is visible), the ``commit`` decision (read back: it must be the run's first
decision), commit each transaction, ``done``. Batch abort: the ``abort`` decision (if a commit
decision came first, that one is completed instead), then every id of the job is fenced and its
open transaction aborted, ``aborted``.

Stale task attempts. When a task fails, Spark may end its writer's input as if the rows were all
there, and the writer's Python process may still be starting while the next attempt runs.
Two-phase-commit transactions never time out, so such a stale writer must neither leave a
transaction open nor abort one the driver is committing:

- a writer opens its producer only once its first rows arrive (a writer whose task died before
  feeding it touches nothing);
- a batch task starts with ``init_transactions(keep_prepared_txn=True)``, which fences an earlier
  attempt without aborting what it prepared, then reads the job log: if the driver has sealed or
  decided the run (or a newer run of the job began), it gives up; otherwise it aborts what an
  earlier attempt left and writes. The driver's seal comes before its take-over: a task that read
  the log before the seal is fenced by the take-over;
- a streaming task resolves its id with ``init_transactions()`` as before, and the replay check
  below keeps it from writing a batch twice; a commit that finds a transaction gone fails the
  micro-batch, which the query's restart replays.

Replay of a streaming micro-batch that was already (partly) committed: each task's transaction
also commits, through ``send_offsets_to_transaction``, the offset ``batch id + 1`` to a group
named after its transactional id, on partition 0 of a marker topic (the ``topic`` option, or
``spark-sink-commits``). That offset becomes visible atomically with the rows. A replayed task
first resolves any transaction left open (``init_transactions``), then reads the group's stable
offset (OffsetFetch with require_stable, KIP-447): if its batch is already committed it writes
nothing. So a driver killed between committing some partitions and recording the batch in its
checkpoint does not duplicate them.

Rows take the columns of Spark's Kafka sink: ``value`` (required), ``key``, ``topic``,
``partition`` and ``headers``; strings are written as UTF-8.
"""

from __future__ import annotations

import itertools
import logging
import time
import uuid
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import ArrayType, BinaryType, IntegerType, StringType, StructType

from appliance.client import transaction_admin as admin
from appliance.client import Consumer, PreparedTxnState, Producer
from appliance.client.errors import ErrorCode, FatalProducerError, KafkaError
from appliance.spark import encode, jobs
from appliance.spark.jobs import (ABORTED, COMMITTING, DONE, RUNNING, JobLog, Recovery, fold,
                                  test_hook, transactional_id)
from appliance.spark.options import OptionError, client_config, positive_int, text

log = logging.getLogger("appliance.spark")

MARKER_TOPIC = "spark-sink-commits"
COMMIT_THREADS = 8
WRITER_BATCH_SIZE = 512 * 1024      # below Kafka's default max.message.bytes (1 MiB + 12)
TWO_PHASE_COMMIT = "transaction.two.phase.commit.enable"
_BROKERS_CHECKED: set[str] = set()              # bootstrap servers that allow two-phase commit
_RECOVERED: set[tuple[str, str]] = set()        # (bootstrap, prefix) a stream writer recovered


class TransactionLostError(RuntimeError):
    """A prepared transaction was no longer there to commit: the job's rows are not all written."""


class TwoPhaseCommitDisabled(OptionError):
    """The broker refuses two-phase commit (KIP-939), which the sink needs."""


@dataclass
class PreparedTask(WriterCommitMessage):
    """A task's commit message."""
    transactional_id: str
    partition: int
    state: str              # PreparedTxnState as text; "" when the task wrote nothing
    rows: int
    skipped: bool = False   # a replayed streaming batch, or a job already committed


def check_schema(schema: StructType, topic_option: str | None) -> None:
    """The checks of Spark's Kafka sink, made on the driver before any task runs."""
    types = {f.name.lower(): f.dataType for f in schema.fields}
    if "value" not in types:
        raise OptionError("required attribute 'value' not found")
    for name in ("key", "value"):
        if name in types and not isinstance(types[name], (StringType, BinaryType)):
            raise OptionError(f"{name} attribute type must be a string or binary, not {types[name].simpleString()}")
    if topic_option is None:
        if "topic" not in types:
            raise OptionError("topic option required when no 'topic' attribute is present")
    if "topic" in types and not isinstance(types["topic"], StringType):
        raise OptionError(f"topic attribute type must be a string, not {types['topic'].simpleString()}")
    if "partition" in types and not isinstance(types["partition"], IntegerType):
        raise OptionError(f"partition attribute type must be an int, not {types['partition'].simpleString()}")
    if "headers" in types:
        h = types["headers"]
        ok = (isinstance(h, ArrayType) and isinstance(h.elementType, StructType)
              and [f.name for f in h.elementType.fields] == ["key", "value"]
              and isinstance(h.elementType.fields[0].dataType, StringType)
              and isinstance(h.elementType.fields[1].dataType, BinaryType))
        if not ok:
            raise OptionError("headers attribute type must be array<struct<key:string,value:binary>>, "
                              f"not {h.simpleString()}")


def _as_bytes(v: Any) -> bytes | None:
    return v.encode() if isinstance(v, str) else v


def _name(options: Mapping[str, Any], option: str, default: str | None) -> str | None:
    value = text(options, option, default)
    if value is not None and not jobs.NAME_RE.fullmatch(value):
        raise OptionError(f"option {option!r} may hold letters, digits, '.', '_' and '-' only, "
                          f"not {value!r}")
    return value


class _Sink:
    """What the batch and the streaming writer share: options, the task body, commit, abort."""

    def __init__(self, options: Mapping[str, Any], schema: StructType) -> None:
        self.topic = text(options, "topic")
        check_schema(schema, self.topic)
        cfg = client_config(options, "producer")
        cfg.setdefault("client_id", "appliance-spark-writer")
        # A task sends everything and waits only at prepare: big batches mean fewer round trips.
        cfg.setdefault("batch_size", WRITER_BATCH_SIZE)
        self.producer_config = cfg
        self.batch_size = int(cfg["batch_size"])
        self.prefix = _name(options, "transactionalIdPrefix", "spark")
        self.timeout_ms = positive_int(options, "jobTimeoutMs") or jobs.DEFAULT_JOB_TIMEOUT_MS
        retention = positive_int(options, "jobRetentionMs")
        self.retention_ms = jobs.DEFAULT_JOB_RETENTION_MS if retention is None else retention
        self.marker_topic = self.topic or MARKER_TOPIC
        # Fails now, on the driver, if the broker refuses two-phase commit (KIP-939).
        self._check_broker()

    def _check_broker(self) -> None:
        """Two-phase commit must be on: the broker's ``transaction.two.phase.commit.enable``
        (DescribeConfigs), or for a broker that does not report it, a probe (InitProducerId with
        Enable2Pc). Once per process and broker."""
        servers = str(self.producer_config["bootstrap_servers"])
        if servers in _BROKERS_CHECKED:
            return
        with self.joblog() as jl:
            conn = jl.admin()
            try:
                try:
                    value = admin.broker_config(conn, TWO_PHASE_COMMIT)
                except KafkaError:
                    value = None
            finally:
                conn.close()
        if value is None:
            value = "true" if self._probe() else "false"
        if value.strip().lower() != "true":
            raise TwoPhaseCommitDisabled(
                f"the broker at {servers} has two-phase commit off (KIP-939), which the appliance "
                f"sink needs: start the appliance with [transactions] two_phase_commit_enable = true "
                f"in its config.toml, or APPLIANCE_TRANSACTIONS__TWO_PHASE_COMMIT_ENABLE=true")
        _BROKERS_CHECKED.add(servers)

    def _probe(self) -> bool:
        with self._producer(f"{self.prefix}-probe") as p:
            try:
                p.init_transactions(keep_prepared_txn=True)
            except KafkaError as exc:
                if exc.code == ErrorCode.transactional_id_authorization_failed:
                    return False
                raise
        return True

    def joblog(self) -> JobLog:
        return JobLog(self.producer_config)

    def recovery(self, jl: JobLog) -> Recovery:
        return Recovery(jl, self.prefix, self.producer_config)

    def _producer(self, txn_id: str) -> Producer:
        return Producer(self.producer_config, transactional_id=txn_id, enable_two_phase_commit=True)

    def _consumer(self) -> Consumer:
        return Consumer(jobs.connection_config(self.producer_config))

    def heartbeat(self, key: str, gen: int, kind: str) -> jobs.Heartbeat:
        return jobs.Heartbeat(self.producer_config, self.prefix, key, gen, kind, self.timeout_ms)

    # -- executors --------------------------------------------------------------------------------
    def write_task(self, key: str, batches: Iterator[Any], *, gen: int | None = None,
                   batch_id: int | None = None) -> PreparedTask:
        """One task: its rows in one transaction, prepared. A batch write's run is ``gen`` (its
        begin offset in the job log); a streaming micro-batch is ``batch_id``."""
        from pyspark import TaskContext

        partition = TaskContext.get().partitionId()
        txn_id = transactional_id(self.prefix, key, partition)
        batches = iter(batches)
        # The producer starts with the first rows, not before: when a task fails, Spark may end
        # the input of its writer cleanly (as if all rows were there) and start another attempt.
        # A writer that had not received rows by then must not open a transaction (2PC
        # transactions never time out), nor fence the new attempt.
        first = next((b for b in batches if b.num_rows), None)
        if first is None:
            return PreparedTask(txn_id, partition, str(PreparedTxnState()), 0)
        streaming = batch_id is not None
        with self.heartbeat(key, 0 if streaming else gen, "stream" if streaming else "batch"), \
                self._producer(txn_id) as producer:
            if streaming:
                producer.init_transactions()            # aborts and fences an earlier attempt
                if self._committed_batch(txn_id) > batch_id:
                    log.info("%s: batch %d already committed, nothing written", txn_id, batch_id)
                    for _ in batches:                   # Spark streams the input in: take it all
                        pass
                    return PreparedTask(txn_id, partition, str(PreparedTxnState()), 0, skipped=True)
            else:
                # Fences an earlier attempt but keeps what it prepared: the driver may be
                # committing it. Only once the log says the run is still open is it aborted.
                producer.init_transactions(keep_prepared_txn=True)
                self._check_not_stale(key, gen, txn_id)
                if producer.prepared_state is not None:
                    producer.abort_transaction()
            producer.begin_transaction()
            try:
                rows = self._send_rows(producer, itertools.chain([first], batches), partition)
                if streaming:
                    producer.send_offsets_to_transaction({(self.marker_topic, 0): batch_id + 1}, txn_id)
                state = producer.prepare_transaction()
            except BaseException:
                try:
                    producer.abort_transaction()
                except Exception:                       # the driver's abort resolves it then
                    log.exception("%s: abort after a failed write", txn_id)
                raise
            test_hook("task_prepared", partition)
        return PreparedTask(txn_id, partition, str(state), rows)

    def _check_not_stale(self, key: str, gen: int, txn_id: str) -> None:
        with self.joblog() as jl:
            job = fold(jl.read(gen)).get((self.prefix, key))
        if job is None or job.gen != gen or job.phase != RUNNING:
            what = "a newer run of the job began" if job is not None and job.gen != gen else \
                f"the driver has {'ended' if job is None else job.phase} the job"
            raise RuntimeError(f"{txn_id}: {what}; this task attempt is stale and writes nothing")

    def _committed_batch(self, group: str) -> int:
        """The batch id after the last one this partition committed (0: none yet)."""
        with self._consumer() as c:
            got = c.committed([(self.marker_topic, 0)], group, require_stable=True)
        return got.get((self.marker_topic, 0)) or 0

    def _send_rows(self, producer: Producer, batches: Iterator[Any], partition: int) -> int:
        """Every row of the task's Arrow batches to the producer: column-wise record batches
        (``appliance.spark.encode``), or row by row for a batch that carries headers."""
        fixed_topic = self.topic
        partitioner = encode.Partitioner()
        rows = batches_sent = 0
        for batch in batches:
            n = batch.num_rows
            if n == 0:
                continue
            headers = encode.column(batch, "headers")
            if headers is not None and headers.null_count < n:
                self._send_row_by_row(producer, batch)
            else:
                keys = encode.binary_column(encode.column(batch, "key"), n)
                values = encode.binary_column(encode.column(batch, "value"), n)
                explicit = encode.column(batch, "partition")
                now = time.time_ns() // 1_000_000
                for topic, sel in self._by_topic(batch, fixed_topic):
                    k, v = (keys, values) if sel is None else (keys.filter(sel), values.filter(sel))
                    e = explicit if explicit is None or sel is None else explicit.filter(sel)
                    parts = partitioner.assign(topic, producer.cluster.partitions_for(topic), k, e)
                    for part, records in encode.encode_partitions(k, v, parts, self.batch_size, now):
                        producer.send_encoded(topic, part, records)
            rows += n
            batches_sent += 1
            if batches_sent == 2:
                test_hook("task_writing", partition)
        return rows

    @staticmethod
    def _by_topic(batch: Any, fixed_topic: str | None) -> list[tuple[str, Any]]:
        """(topic, row mask or None for all rows) for each topic the rows name."""
        if fixed_topic:
            return [(fixed_topic, None)]
        col = encode.column(batch, "topic")
        if col is None or col.null_count:
            raise ValueError("null topic present in the data; use the topic option or a non-null "
                             "topic column")
        names = col.unique().to_pylist()
        if len(names) == 1:
            return [(names[0], None)]
        import pyarrow.compute as pc
        return [(name, pc.equal(col, name)) for name in names]

    def _send_row_by_row(self, producer: Producer, batch: Any) -> None:
        n = batch.num_rows

        def values(name: str) -> list:
            col = encode.column(batch, name)
            return col.to_pylist() if col is not None else [None] * n

        topics = [self.topic] * n if self.topic else values("topic")
        for topic, v, k, part, hs in zip(topics, values("value"), values("key"), values("partition"),
                                        values("headers")):
            if topic is None:
                raise ValueError("null topic present in the data; use the topic option or a "
                                 "non-null topic column")
            producer.send(topic, _as_bytes(v), _as_bytes(k), partition=part,
                          headers=[(h["key"], h["value"]) for h in hs] if hs else None)

    # -- driver -----------------------------------------------------------------------------------
    def prepared(self, messages: list[PreparedTask | None]) -> list[tuple[PreparedTask, PreparedTxnState]]:
        """The messages whose task prepared a transaction (a failed task has no message)."""
        todo = []
        for m in messages:
            if m is None:
                raise TransactionLostError("commit called with a task that has no commit message")
            want = PreparedTxnState.from_string(m.state)
            if not m.skipped and want.has_transaction:
                todo.append((m, want))
        return todo

    def take_over(self, todo: list[tuple[PreparedTask, PreparedTxnState]]) -> list[Producer]:
        """``init_transactions(keep_prepared_txn=True)`` on every id, over a few threads: it
        fences any other user of the id, and the open transaction must be the one the task
        prepared. Returns the producers (in ``todo``'s order); raises TransactionLostError, after
        closing them, if any transaction is gone."""
        producers: dict[str, Producer] = {}

        def one(item) -> Producer:
            m, want = item
            p = producers[m.transactional_id] = self._producer(m.transactional_id)
            p.init_transactions(keep_prepared_txn=True)
            if p.prepared_state != want:
                raise TransactionLostError(
                    f"{m.transactional_id}: the prepared transaction {want} is gone (the open one "
                    f"is {p.prepared_state}); another writer uses this transactional id, or it was "
                    "aborted by an operator. The job's rows were not written.")
            return p

        with ThreadPoolExecutor(max_workers=max(1, min(COMMIT_THREADS, len(todo)))) as pool:
            try:
                return list(pool.map(one, todo))
            except BaseException:
                for p in producers.values():
                    p.close()
                raise

    def commit_one(self, p: Producer, m: PreparedTask, want: PreparedTxnState) -> None:
        """Commit a taken-over transaction. Fenced meanwhile (a stale task attempt's
        InitProducerId, or a recovery rolling the same decision forward): take it over again;
        if nothing is open any more, the transaction must show as committed."""
        try:
            p.commit_transaction()
            return
        except FatalProducerError as exc:
            log.info("%s: fenced while committing (%s); taking it over again", m.transactional_id, exc)
        with self._producer(m.transactional_id) as again:
            again.init_transactions(keep_prepared_txn=True)
            if again.prepared_state == want:
                again.commit_transaction()
                return
            if again.prepared_state is None:
                with self.joblog() as jl:
                    conn = jl.admin()
                    try:
                        state = admin.describe_transaction(conn, m.transactional_id)["state"]
                    finally:
                        conn.close()
                if state == "CompleteCommit":
                    return                              # a recovery committed it
        raise TransactionLostError(f"{m.transactional_id}: the decided transaction {want} was "
                                   "completed otherwise (aborted by an operator?)")

    def commit_each(self, todo, producers: list[Producer], hook: str, detail: int | None = None) -> None:
        """Commit each transaction: the first alone (the tests' hook then sees one partition
        committed and the rest prepared), the rest over a few threads."""
        pairs = list(zip(producers, todo))
        if not pairs:
            return
        (p0, (m0, w0)), rest = pairs[0], pairs[1:]
        self.commit_one(p0, m0, w0)
        test_hook(hook, detail)
        with ThreadPoolExecutor(max_workers=max(1, min(COMMIT_THREADS, len(rest)))) as pool:
            list(pool.map(lambda pm: self.commit_one(pm[0], *pm[1]), rest))

    def commit_batch(self, key: str, gen: int, messages: list[PreparedTask | None]) -> None:
        """A batch write's commit (module docstring): seal, take over, decide, commit, done."""
        todo = self.prepared(messages)
        with self.joblog() as jl:
            test_hook("before_seal")
            jl.append("seal", self.prefix, key, gen=gen, timeout_ms=self.timeout_ms)
            test_hook("after_seal")
            try:
                producers = self.take_over(todo)
            except BaseException:
                self.abort_batch(key, gen, messages)
                raise
            try:
                mine = jl.append("commit", self.prefix, key, gen=gen, timeout_ms=self.timeout_ms,
                                 txns=[(m.transactional_id, str(w)) for m, w in todo])
                job = fold(e for e in jl.read(gen) if e.offset <= mine.offset).get((self.prefix, key))
                if job is None or job.gen != gen or job.phase != COMMITTING:
                    raise TransactionLostError(
                        f"job {self.prefix}/{key} was rolled back by a recovery in another writer, "
                        f"which took it as dead (nothing heard of it for jobTimeoutMs="
                        f"{self.timeout_ms}); none of its rows were written")
                test_hook("after_decision")
                self.commit_each(todo, producers, "mid_commit")
                test_hook("after_commit")
            finally:
                for p in producers:
                    p.close()
            jl.append("done", self.prefix, key, gen=gen, timeout_ms=self.timeout_ms)
            test_hook("after_done")
            self.trim(jl)

    def trim(self, jl: JobLog) -> None:
        """Drop the job log's records that no job needs any more (``JobLog.trim``). Best
        effort: the job is resolved either way; a principal without DELETE on the job log's
        topic, say, only keeps it growing."""
        try:
            start = jl.trim(self.retention_ms)
        except Exception as exc:                   # never fails the job it follows
            log.warning("could not trim %s: %s", jobs.JOB_LOG_TOPIC, exc)
            return
        if start is not None:
            log.info("%s trimmed: it now starts at offset %d", jobs.JOB_LOG_TOPIC, start)

    def abort_batch(self, key: str, gen: int, messages: list[PreparedTask | None]) -> None:
        """A batch write's abort: the abort decision, then every id of the job fenced and its
        transaction aborted. If a commit decision came first, it is completed instead."""
        with self.joblog() as jl:
            job = fold(jl.read(gen)).get((self.prefix, key))
            if job is not None and job.gen == gen and job.phase in (DONE, ABORTED):
                return                                  # an earlier commit or abort finished it
            rec = self.recovery(jl)
            known = self.job_ids(key, messages)
            if job is None or job.gen != gen:
                rec.fence_all(known)
                return
            act = rec.roll_back(job, known)
            if act.outcome == "rolled forward":
                log.warning("job %s/%s: its commit decision was recorded before the abort, so it "
                            "was completed: %s", self.prefix, key, act.line())
            self.trim(jl)

    def job_ids(self, key: str, messages: list[PreparedTask | None]) -> set[str]:
        """Every transactional id a job's tasks may have used, including those of tasks that
        died before answering (messages are indexed by Spark partition)."""
        ids = {m.transactional_id for m in messages if m is not None}
        return ids | {transactional_id(self.prefix, key, i) for i in range(len(messages))}

    def abort_open(self, ids: set[str]) -> None:
        """Abort those of ``ids`` whose transaction is open (a task that died left its
        transaction open, and two-phase-commit transactions never time out)."""
        with self.joblog() as jl:
            conn = jl.admin()
            try:
                for txn_id in sorted(ids):
                    try:
                        info = admin.describe_transaction(conn, txn_id)
                    except KafkaError as exc:
                        if exc.code == ErrorCode.transactional_id_not_found:
                            continue
                        raise
                    if info["state"] in jobs.OPEN_STATES:
                        admin.force_terminate(conn, txn_id)
            finally:
                conn.close()

    def open_transactions(self, id_prefix: str) -> list[str]:
        """Open transactions whose ids start with ``id_prefix`` (ListTransactions, KIP-664)."""
        with self.joblog() as jl:
            conn = jl.admin()
            try:
                found = admin.list_transactions(conn, states=jobs.OPEN_STATES)
            finally:
                conn.close()
        return [t["transactional_id"] for t in found if t["transactional_id"].startswith(id_prefix)]


class BatchWriter(DataSourceArrowWriter):
    """``df.write.format("appliance")``: one transaction per task, all committed together by the
    driver, or all aborted; with ``jobId``, a rerun after the driver died writes every row
    exactly once."""

    def __init__(self, options: Mapping[str, Any], schema: StructType) -> None:
        self.sink = _Sink(options, schema)
        job_id = _name(options, "jobId", None)
        self.key = job_id or uuid.uuid4().hex[:16]     # the same for every task attempt
        self.gen = -1
        self.skip = False
        prefix = self.sink.prefix
        with self.sink.joblog() as jl:
            rec = self.sink.recovery(jl)
            entries = jl.read()
            if job_id is not None:
                job = fold(entries).get((prefix, job_id))
                if job is not None and not job.resolved:
                    # The user runs the job again: its earlier run is over, whatever it was doing.
                    act = rec.resolve(job_id, job, "batch", rec.open_ids(job_id))
                    log.warning("job %s: an earlier run was left unfinished: %s", job_id, act.line())
                    entries = jl.read()
                    job = fold(entries).get((prefix, job_id))
                if job is not None and job.phase == DONE:
                    log.warning("job %s/%s is already committed: this run writes nothing", prefix, job_id)
                    self.skip = True
            for act in rec.run(skip_keys={self.key}, entries=entries):
                (log.info if act.outcome == "running" else log.warning)("recovery: %s", act.line())
            if not self.skip:
                self.gen = jl.append("begin", prefix, self.key, timeout_ms=self.sink.timeout_ms).offset
        test_hook("after_begin")

    def write(self, iterator: Iterator[Any]) -> PreparedTask:
        if self.skip:
            from pyspark import TaskContext
            for _ in iterator:
                pass
            part = TaskContext.get().partitionId()
            return PreparedTask(transactional_id(self.sink.prefix, self.key, part), part, "", 0, skipped=True)
        return self.sink.write_task(self.key, iterator, gen=self.gen)

    def commit(self, messages: list[PreparedTask | None]) -> None:
        if not self.skip:
            self.sink.commit_batch(self.key, self.gen, messages)

    def abort(self, messages: list[PreparedTask | None]) -> None:
        if not self.skip:
            self.sink.abort_batch(self.key, self.gen, messages)


class StreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream.format("appliance")``: each micro-batch as in ``BatchWriter``; the key is
    the query id, and replays of committed batches are recognised (module docstring)."""

    def __init__(self, options: Mapping[str, Any], schema: StructType) -> None:
        self.sink = _Sink(options, schema)
        # Spark makes a stream writer when the query starts and for every micro-batch's commit:
        # recover the prefix's dead jobs once per process, not at every micro-batch.
        once = (str(self.sink.producer_config["bootstrap_servers"]), self.sink.prefix)
        if once not in _RECOVERED:
            with self.sink.joblog() as jl:
                for act in self.sink.recovery(jl).run():
                    (log.info if act.outcome == "running" else log.warning)("recovery: %s", act.line())
            _RECOVERED.add(once)

    def write(self, iterator: Iterator[Any]) -> PreparedTask:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        query_id = ctx.getLocalProperty("sql.streaming.queryId")
        batch_id = ctx.getLocalProperty("streaming.sql.batchId")
        if not query_id or batch_id is None:
            raise RuntimeError("the appliance stream writer runs only inside a streaming query")
        return self.sink.write_task(query_id, iterator, batch_id=int(batch_id))

    def commit(self, messages: list[PreparedTask | None], batchId: int) -> None:
        todo = self.sink.prepared(messages)
        test_hook("stream_before_commit", batchId)
        producers = self.sink.take_over(todo)
        try:
            self.sink.commit_each(todo, producers, "stream_mid_commit", batchId)
        finally:
            for p in producers:
                p.close()
        # Open transactions of this query that no task of this batch owns were left by an
        # earlier run with more partitions whose driver died: they would hold the LSO forever.
        key = _query_key(self.sink.prefix, messages)
        if key is not None:
            ours = {m.transactional_id for m in messages if m is not None}
            stale = set(self.sink.open_transactions(f"{self.sink.prefix}-{key}-")) - ours
            if stale:
                log.warning("aborting transactions left open by an earlier run: %s", sorted(stale))
                self.sink.abort_open(stale)

    def abort(self, messages: list[PreparedTask | None], batchId: int) -> None:
        key = _query_key(self.sink.prefix, messages)
        if key is None:
            log.warning("micro-batch %d aborted before any task answered; the tasks of its next "
                        "attempt abort what it left open", batchId)
            return
        self.sink.abort_open(self.sink.job_ids(key, messages))


def _query_key(prefix: str, messages: list[PreparedTask | None]) -> str | None:
    """The query id in any message's transactional id (``<prefix>-<query id>-<partition>``)."""
    for m in messages:
        if m is not None:
            return m.transactional_id[len(prefix) + 1:m.transactional_id.rfind("-")]
    return None

