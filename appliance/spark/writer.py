"""Writing Spark rows to the appliance exactly once, batch and streaming, by two-phase commit
(KIP-939).

Runs in three places:

- ``write`` in the executors' Python workers, once per task: it opens a transactional producer
  whose transactional id is ``<prefix>-<key>-<spark partition>``, ``init_transactions()`` (which
  aborts whatever an earlier attempt of the same task left open and fences it, should it still
  run), writes every row in one transaction and prepares it. The task's commit message carries
  the transactional id and the ``PreparedTxnState`` ("producer id:epoch").
- ``commit`` in a driver's Python worker once every task succeeded: for each message a producer
  with the same transactional id calls ``init_transactions(keep_prepared_txn=True)``, which keeps
  the prepared transaction, and checks that it is still the one the task prepared; only when
  every one is are they committed. Anything else (a transaction was aborted or replaced by
  another writer using the same id) is an error before any partition is visible: the job fails
  rather than reporting rows that were not written.
- ``abort`` in a driver's Python worker when a task failed: every transaction of the job still
  open (prepared by a task that succeeded, or left by one that died) is aborted, so that nothing
  of the job ever becomes visible to read_committed readers.

Stale task attempts. When a task fails, Spark may end its writer's input as if the rows were
all there, and the writer's Python process may still be starting while the next attempt runs.
Two-phase-commit transactions never time out, so such a stale writer must not leave one open:

- a writer opens its producer only once its first rows arrive (a writer whose task died before
  feeding it touches nothing);
- a newer attempt's ``init_transactions`` fences an older one; an older one that starts later
  aborts the newer one's transaction, which the driver then finds gone: the job fails (loudly,
  with nothing of it visible) rather than commit partial rows;
- before committing or aborting a batch write, the driver creates the marker transactional id
  ``<prefix>-<key>-done``; a writer checks it right after ``init_transactions`` and gives up if it
  exists. One that checked before the marker existed is fenced by the driver's own
  InitProducerId calls that follow. (In streaming, the replay check below does this job.)

``<key>`` is stable across task attempts: for a batch write it is made once per write on the
driver; for a streaming query it is the query id, which Spark keeps in the checkpoint, so that
after a driver restart the replayed micro-batch's tasks fence and abort what the dead driver's
tasks prepared.

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

import contextlib
import itertools
import logging
import re
import uuid
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import ArrayType, BinaryType, IntegerType, StringType, StructType

from appliance import admin
from appliance.client import Consumer, PreparedTxnState, Producer
from appliance.client.config import PRODUCER_DEFAULTS
from appliance.client.connection import BrokerConnection
from appliance.client.errors import ErrorCode, KafkaError
from appliance.client.security import Security
from appliance.spark.options import OptionError, client_config, text

log = logging.getLogger("appliance.spark")

MARKER_TOPIC = "spark-sink-commits"
COMMIT_THREADS = 8
WRITER_BATCH_SIZE = 512 * 1024      # below Kafka's default max.message.bytes (1 MiB + 12)
_BROKERS_CHECKED: set[tuple[str, str]] = set()      # (bootstrap, prefix) that allowed 2PC


class TransactionLostError(RuntimeError):
    """A prepared transaction was no longer there to commit: the job's rows are not all written."""


@dataclass
class PreparedTask(WriterCommitMessage):
    """A task's commit message."""
    transactional_id: str
    partition: int
    state: str              # PreparedTxnState as text; ":" when the task wrote nothing
    rows: int
    skipped: bool = False   # a replayed streaming batch whose rows this partition already committed


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


class _Sink:
    """What the batch and the streaming writer share: options, the task body, commit, abort."""

    def __init__(self, options: Mapping[str, Any], schema: StructType) -> None:
        self.topic = text(options, "topic")
        check_schema(schema, self.topic)
        cfg = client_config(options, "producer")
        cfg.setdefault("client_id", "appliance-spark-writer")
        # A task sends everything and waits only at prepare: big batches mean fewer round trips
        # of the synchronous client (1.7x the rows/s of the 16 KiB default, loadtests/README.md).
        cfg.setdefault("batch_size", WRITER_BATCH_SIZE)
        self.producer_config = cfg
        # The admin connections (ListTransactions, DescribeTransactions, force-terminate) use
        # the same TLS and SASL settings as the producers.
        self.security = Security.from_config({**PRODUCER_DEFAULTS, **cfg})
        self.prefix = text(options, "transactionalIdPrefix", "spark")
        if not re.fullmatch(r"[A-Za-z0-9._-]+", self.prefix or ""):
            raise OptionError("option 'transactionalIdPrefix' may hold letters, digits, '.', '_' "
                              f"and '-' only, not {self.prefix!r}")
        self.marker_topic = self.topic or MARKER_TOPIC
        # Fails now, on the driver, if the broker refuses two-phase commit (KIP-939).
        self._check_broker()

    def _check_broker(self) -> None:
        # Once per process: a streaming query makes a writer for every micro-batch.
        checked = (str(self.producer_config["bootstrap_servers"]), str(self.prefix))
        if checked in _BROKERS_CHECKED:
            return
        probe = f"{self.prefix}-probe"          # one id per prefix: probes leave no litter
        with self._producer(probe) as p:
            try:
                p.init_transactions()
            except KafkaError as exc:
                if exc.code == ErrorCode.transactional_id_authorization_failed:
                    raise OptionError(
                        "the broker refused a two-phase-commit transaction (KIP-939): set "
                        "[transactions] two_phase_commit_enable = true in the appliance's config") from None
                raise
        _BROKERS_CHECKED.add(checked)

    def _producer(self, transactional_id: str) -> Producer:
        return Producer(self.producer_config, transactional_id=transactional_id,
                        enable_two_phase_commit=True)

    def _consumer(self) -> Consumer:
        cfg = {k: v for k, v in self.producer_config.items()
               if k in ("bootstrap_servers", "client_id", "request_timeout_ms", "retry_backoff_ms")}
        return Consumer(cfg)

    # -- executors --------------------------------------------------------------------------------
    def write_task(self, key: str, batches: Iterator[Any], batch_id: int | None,
                   done_marker: str | None = None) -> PreparedTask:
        """One task: its rows in one transaction, prepared. ``batch_id``: a streaming
        micro-batch (the replay check and the marker offset); ``done_marker``: a batch write's
        marker, whose existence means the driver has already committed or aborted the job."""
        from pyspark import TaskContext

        partition = TaskContext.get().partitionId()
        txn_id = f"{self.prefix}-{key}-{partition}"
        batches = iter(batches)
        # The producer starts with the first rows, not before: when a task fails, Spark may end
        # the input of its writer cleanly (as if all rows were there) and start another attempt.
        # A writer that had not received rows by then must not open a transaction (2PC
        # transactions never time out), nor fence the new attempt.
        first = next((b for b in batches if b.num_rows), None)
        if first is None:
            return PreparedTask(txn_id, partition, str(PreparedTxnState()), 0)
        with self._producer(txn_id) as producer:
            producer.init_transactions()                # aborts and fences an earlier attempt
            if done_marker is not None and self._exists(done_marker):
                # A zombie of a job the driver has finished: anything it wrote now would stay
                # open for ever (init_transactions has just aborted what was open).
                raise RuntimeError(f"{txn_id}: the write job has already ended; this task attempt "
                                   "is stale and writes nothing")
            if batch_id is not None and self._committed_batch(txn_id) > batch_id:
                log.info("%s: batch %d already committed, nothing written", txn_id, batch_id)
                for _ in batches:                       # Spark streams the input in: take it all
                    pass
                return PreparedTask(txn_id, partition, str(PreparedTxnState()), 0, skipped=True)
            producer.begin_transaction()
            try:
                rows = self._send_rows(producer, itertools.chain([first], batches))
                if batch_id is not None:
                    producer.send_offsets_to_transaction({(self.marker_topic, 0): batch_id + 1}, txn_id)
                state = producer.prepare_transaction()
            except BaseException:
                try:
                    producer.abort_transaction()
                except Exception:                       # the driver's abort resolves it then
                    log.exception("%s: abort after a failed write", txn_id)
                raise
        return PreparedTask(txn_id, partition, str(state), rows)

    @contextlib.contextmanager
    def _admin(self) -> Iterator[BrokerConnection]:
        """One admin connection to the broker (``appliance.admin``), closed after the block."""
        conn = admin.connect(self._bootstrap(), security=self.security)
        try:
            yield conn
        finally:
            conn.close()

    @staticmethod
    def _describe(conn: BrokerConnection, transactional_id: str) -> dict | None:
        """DescribeTransactions of one id; None when the id was never used."""
        try:
            return admin.describe_transaction(conn, transactional_id)
        except KafkaError as exc:
            if exc.code == ErrorCode.transactional_id_not_found:
                return None
            raise

    def _exists(self, transactional_id: str) -> bool:
        with self._admin() as conn:
            return self._describe(conn, transactional_id) is not None

    def mark_done(self, marker: str) -> None:
        """Create the marker transactional id (InitProducerId; it holds no transaction)."""
        with self._admin() as conn:
            admin.force_terminate(conn, marker)

    def _committed_batch(self, group: str) -> int:
        """The batch id after the last one this partition committed (0: none yet)."""
        with self._consumer() as c:
            got = c.committed([(self.marker_topic, 0)], group, require_stable=True)
        return got.get((self.marker_topic, 0)) or 0

    def _send_rows(self, producer: Producer, batches: Iterator[Any]) -> int:
        send = producer.send
        fixed_topic = self.topic
        rows = 0
        for batch in batches:
            n = batch.num_rows
            if n == 0:
                continue
            names = [name.lower() for name in batch.schema.names]
            col = {name: batch.column(i) for i, name in enumerate(names)}

            def values(name: str, default: Any = None) -> list:
                return col[name].to_pylist() if name in col else [default] * n

            vals = [_as_bytes(v) for v in values("value")]
            keys = [_as_bytes(k) for k in values("key")]
            topics = [fixed_topic] * n if fixed_topic else values("topic")
            parts = values("partition")
            headers = values("headers")
            for i in range(n):
                topic = topics[i]
                if topic is None:
                    raise ValueError("null topic present in the data; use the topic option or "
                                     "a non-null topic column")
                hs = headers[i]
                send(topic, vals[i], keys[i], partition=parts[i],
                     headers=[(h["key"], h["value"]) for h in hs] if hs else None)
            rows += n
        return rows

    # -- driver -----------------------------------------------------------------------------------
    def commit_all(self, messages: list[PreparedTask | None]) -> int:
        """Commit every prepared transaction; returns the rows made visible.

        Two rounds, each over a few threads: first take every transactional id over
        (``init_transactions(keep_prepared_txn=True)``, which fences any other user of it) and
        check that its open transaction is the one the task prepared; only when all are, commit
        them. A transaction found gone therefore fails the job before any partition of it is
        visible."""
        todo = []
        for m in messages:
            if m is None:
                raise TransactionLostError("commit called with a task that has no commit message")
            want = PreparedTxnState.from_string(m.state)
            if not m.skipped and want.has_transaction:
                todo.append((m, want))
        if not todo:
            return 0
        producers: list[Producer] = []

        def take_over(item) -> Producer:
            m, want = item
            p = self._producer(m.transactional_id)
            producers.append(p)
            p.init_transactions(keep_prepared_txn=True)
            if p.prepared_state != want:
                raise TransactionLostError(
                    f"{m.transactional_id}: the prepared transaction {want} is gone (the open one "
                    f"is {p.prepared_state}); another writer uses this transactional id, or it was "
                    "aborted by an operator. The job's rows were not written.")
            return p

        with ThreadPoolExecutor(max_workers=min(COMMIT_THREADS, len(todo))) as pool:
            try:
                taken = list(pool.map(take_over, todo))
                list(pool.map(lambda p: p.commit_transaction(), taken))
            finally:
                for p in producers:
                    p.close()
        return sum(m.rows for m, _ in todo)

    def job_ids(self, key: str, messages: list[PreparedTask | None]) -> set[str]:
        """Every transactional id a job's tasks may have used, including those of tasks that
        died before answering (messages are indexed by Spark partition)."""
        ids = {m.transactional_id for m in messages if m is not None}
        return ids | {f"{self.prefix}-{key}-{i}" for i in range(len(messages))}

    def abort_open(self, ids: set[str]) -> None:
        """Abort those of ``ids`` whose transaction is open (a task that died left its
        transaction open, and two-phase-commit transactions never time out)."""
        with self._admin() as conn:
            for txn_id in sorted(ids):
                info = self._describe(conn, txn_id)
                if info is not None and info["state"] == "Ongoing":
                    admin.force_terminate(conn, txn_id)

    def open_transactions(self, id_prefix: str) -> list[str]:
        """Open transactions whose ids start with ``id_prefix`` (ListTransactions, KIP-664)."""
        with self._admin() as conn:
            found = admin.list_transactions(conn, states=["Ongoing"])
        return [t["transactional_id"] for t in found if t["transactional_id"].startswith(id_prefix)]

    def _bootstrap(self) -> str:
        servers = self.producer_config["bootstrap_servers"]
        return (servers.split(",") if isinstance(servers, str) else list(servers))[0].strip()


class BatchWriter(DataSourceArrowWriter):
    """``df.write.format("appliance")``: one transaction per task, all committed together by the
    driver, or all aborted."""

    def __init__(self, options: Mapping[str, Any], schema: StructType) -> None:
        self.sink = _Sink(options, schema)
        self.key = uuid.uuid4().hex[:16]        # one per write, the same for every task attempt
        self.done_marker = f"{self.sink.prefix}-{self.key}-done"

    def write(self, iterator: Iterator[Any]) -> PreparedTask:
        return self.sink.write_task(self.key, iterator, None, self.done_marker)

    def commit(self, messages: list[PreparedTask | None]) -> None:
        # The marker first: a stale attempt that starts after it aborts itself; one that started
        # before is fenced by what follows (module docstring).
        self.sink.mark_done(self.done_marker)
        try:
            self.sink.commit_all(messages)
        except BaseException:
            self.sink.abort_open(self.sink.job_ids(self.key, messages))
            raise

    def abort(self, messages: list[PreparedTask | None]) -> None:
        self.sink.mark_done(self.done_marker)
        self.sink.abort_open(self.sink.job_ids(self.key, messages))


class StreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream.format("appliance")``: each micro-batch as in ``BatchWriter``; the key is
    the query id, and replays of committed batches are recognised (module docstring)."""

    def __init__(self, options: Mapping[str, Any], schema: StructType) -> None:
        self.sink = _Sink(options, schema)

    def write(self, iterator: Iterator[Any]) -> PreparedTask:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        query_id = ctx.getLocalProperty("sql.streaming.queryId")
        batch_id = ctx.getLocalProperty("streaming.sql.batchId")
        if not query_id or batch_id is None:
            raise RuntimeError("the appliance stream writer runs only inside a streaming query")
        return self.sink.write_task(query_id, iterator, int(batch_id))

    def commit(self, messages: list[PreparedTask | None], batchId: int) -> None:
        self.sink.commit_all(messages)
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
