"""The Spark pipeline against the real appliance: PySpark in local mode (a JVM, Python workers)
with the ``appliance`` data source (appliance.spark), checked with other clients.

- a batch write of 100,000 rows appears exactly once, and leaves no transaction open;
- a write job whose task fails mid-way (its rows already sent) leaves nothing visible to
  read_committed; running it again writes every row once; a task that fails once and is retried
  by Spark (same transactional id: the retry fences and aborts its first attempt) also writes
  every row once;
- batch jobs without a jobId whose drivers were killed are resolved by the next write with their
  prefix, once their timeout has passed;
- the reader returns what kafka-python wrote, committed only, with Spark's Kafka schema and
  headers; streaming with maxOffsetsPerTrigger takes several batches and returns the same;
- offsets deleted by retention are a clear error (failOnDataLoss), or skipped when allowed;
- over SASL_SSL with SCRAM (Spark's Kafka options: kafka.security.protocol, kafka.sasl.mechanism,
  kafka.sasl.jaas.config, a PEM truststore), a batch write and a read back.

Drivers killed at each phase of a job: test_spark_killed_drivers.py; the example pipeline:
test_spark_example.py (split from here so that no one file holds a test process for most of the
suite's time).
"""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from appliance.client import transaction_admin as admin
from appliance.client import Producer
from appliance_harness import Appliance
from client_drivers import create, read_all, settle, uid
from spark_jobs import (batch_driver, broker, java, listed,  # noqa: F401 (fixtures)
                        open_transactions, rows_once, values, wait_nothing_open)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def spark():
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    from pyspark.sql import SparkSession

    from appliance.spark import register
    # local[2, 2]: two cores, and a failed task is tried twice (as on a cluster).
    s = (SparkSession.builder.master("local[2,2]").appName("appliance-tests")
         .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
         .config("spark.sql.shuffle.partitions", "4")
         # Small Arrow batches: a task's writer gets rows before the row that fails it.
         .config("spark.sql.execution.arrow.maxRecordsPerBatch", "2000").getOrCreate())
    s.sparkContext.setLogLevel("ERROR")
    register(s)
    yield s
    s.stop()

def rows_df(spark, n: int, parts: int, fail_at: int | None = None, fail_attempts: int = 99,
            written: tuple[str, str, int] | None = None):
    """n rows (key = id, value = "v-<id>"); with ``fail_at`` the row of that id raises in the
    first ``fail_attempts`` attempts of its task; with ``written`` = (bootstrap, topic, count),
    only once the topic's log holds ``count`` records (the writer has sent rows before it)."""
    from pyspark.sql.functions import col, udf

    @udf("string")
    def value_of(i):
        import time

        from pyspark import TaskContext
        if i == fail_at and TaskContext.get().attemptNumber() < fail_attempts:
            if written is not None:
                from appliance.client import Consumer
                bootstrap, topic, count = written
                with Consumer(bootstrap_servers=bootstrap, isolation_level="read_uncommitted") as c:
                    deadline = time.monotonic() + 120
                    while sum(c.end_offsets([(topic, 0), (topic, 1)]).values()) < count \
                            and time.monotonic() < deadline:
                        time.sleep(0.05)
            raise RuntimeError(f"injected failure at row {i}")
        return f"v-{i}"

    return (spark.range(0, n, 1, numPartitions=parts)
            .select(col("id").cast("string").alias("key"), value_of("id").alias("value")))


def write(df, broker, topic, **options):
    w = df.write.format("appliance").option("kafka.bootstrap.servers", broker.bootstrap).option("topic", topic)
    for k, v in options.items():
        w = w.option(k, v)
    w.mode("append").save()

def test_batch_write_of_100000_rows_appears_exactly_once(spark, broker):
    topic = uid("spark-batch")
    create(broker.bootstrap, {topic: 3})
    write(rows_df(spark, 100_000, 4), broker, topic)
    got = values(read_all(broker.bootstrap, topic, 3))
    assert len(got) == 100_000
    assert set(got) == {b"v-%d" % i for i in range(100_000)}
    assert not [t for t in open_transactions(broker.bootstrap) if t.startswith("spark-")]
    # The operator's list holds the tasks' transactional ids only: no probe, no marker ids.
    conn = admin.connect(broker.bootstrap)
    try:
        listed = [t["transactional_id"] for t in admin.list_transactions(conn)]
    finally:
        conn.close()
    assert not [t for t in listed if t.endswith(("-probe", "-done"))], listed


def test_failed_task_leaves_nothing_visible_and_a_rerun_writes_everything_once(spark, broker):
    topic = uid("spark-fail")
    create(broker.bootstrap, {topic: 2})
    # Partition 1 of 2 holds ids 20000..39999: it fails at its last row, in every attempt, once
    # at least 1,000 of its rows are in the log besides partition 0's 20,000.
    with pytest.raises(Exception, match="injected failure"):
        write(rows_df(spark, 40_000, 2, fail_at=39_999, written=(broker.bootstrap, topic, 21_000)),
              broker, topic)
    settle(broker.bootstrap, topic, 2)
    uncommitted = values(read_all(broker.bootstrap, topic, 2, "read_uncommitted"))
    # Partition 0's task prepared its 20,000 rows; the failing one had sent some too.
    assert len(uncommitted) > 20_000, "the failing task had sent rows before it failed"
    assert values(read_all(broker.bootstrap, topic, 2)) == []
    assert not [t for t in open_transactions(broker.bootstrap) if t.startswith("spark-")]

    write(rows_df(spark, 40_000, 2), broker, topic)
    got = values(read_all(broker.bootstrap, topic, 2))
    assert sorted(got) == sorted(b"v-%d" % i for i in range(40_000))


def test_task_retried_by_spark_writes_every_row_once(spark, broker):
    topic = uid("spark-retry")
    create(broker.bootstrap, {topic: 2})
    # Partition 2 of 3 holds ids 60000..89999: its first attempt fails at its last row, once at
    # least 1,000 of its rows are in the log besides the other tasks' 60,000. (The rows a UDF
    # returns reach the JVM, and so the writer, in buffers of 64 KiB: with fewer rows before
    # the failing one than fill one, nothing reached the writer and the wait ran out.)
    write(rows_df(spark, 90_000, 3, fail_at=89_999, fail_attempts=1,
                  written=(broker.bootstrap, topic, 61_000)), broker, topic)
    settle(broker.bootstrap, topic, 2)
    uncommitted = values(read_all(broker.bootstrap, topic, 2, "read_uncommitted"))
    assert len(uncommitted) > 90_000, "the first attempt had sent rows before it failed"
    got = values(read_all(broker.bootstrap, topic, 2))
    assert sorted(got) == sorted(b"v-%d" % i for i in range(90_000))

def _dead_per_log(bootstrap: str, prefix: str) -> bool:
    """Every unresolved batch job of the prefix is past its timeout, by the job log's clock."""
    from appliance.spark.jobs import JobLog, fold
    with JobLog({"bootstrap_servers": bootstrap}) as jl:
        jobs = [j for (p, _), j in fold(jl.read()).items() if p == prefix and not j.resolved]
    return all(time.time() * 1000 > j.last_seen_ms + j.timeout_ms for j in jobs)


@pytest.mark.timeout(1200)
def test_dead_jobs_without_job_id_are_resolved_by_the_next_write_with_the_prefix(spark, broker):
    """Without jobId: one driver killed after sealing its job (every task prepared, nothing
    decided), one killed in the middle of its commit loop (decided, one partition committed).
    Once their jobTimeoutMs has passed, an unrelated write with the same prefix recovers both:
    the first job's rows are all invisible, the second's all visible, nothing stays open."""
    prefix = "solo"
    undecided, decided = uid("spark-solo"), uid("spark-solo")
    create(broker.bootstrap, {undecided: 2, decided: 2})
    # (The second killed driver's own start may already recover the first job, once its
    # jobTimeoutMs has passed: that is a next write with the prefix too.)
    for topic, phase, left, still_open in ((undecided, "after_seal", "sealed", 3),
                                           (decided, "mid_commit", "committing", 2)):
        r = batch_driver(broker, topic, kill_at=phase, prefix=prefix, timeout_ms=1000)
        assert r.returncode == -signal.SIGKILL, f"{phase}: {r.stdout[-3000:]}"
        from appliance.spark.jobs import JobLog, fold
        with JobLog({"bootstrap_servers": broker.bootstrap}) as jl:
            newest = max((j for (p, _), j in fold(jl.read()).items() if p == prefix),
                         key=lambda j: j.first_offset)
        assert newest.phase == left, phase
        opened = [t for t in listed(broker.bootstrap, prefix, ["Ongoing"]) if newest.key in t]
        assert len(opened) == still_open, (phase, opened)
    deadline = time.monotonic() + 60
    while not _dead_per_log(broker.bootstrap, prefix):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    other = uid("spark-solo")
    create(broker.bootstrap, {other: 1})
    write(rows_df(spark, 10, 1), broker, other, transactionalIdPrefix=prefix)
    wait_nothing_open(broker.bootstrap, prefix)
    assert values(read_all(broker.bootstrap, undecided, 2)) == []
    rows_once(broker.bootstrap, decided, 2, 600)
    assert len(values(read_all(broker.bootstrap, other, 1))) == 10

def test_reader_returns_what_kafka_python_wrote_committed_only(spark, broker):
    from kafka import KafkaProducer
    topic = uid("spark-read")
    create(broker.bootstrap, {topic: 2})
    p = KafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id=uid("kp"))
    p.init_transactions()
    expected = []
    for t in range(9):
        p.begin_transaction()
        for i in range(100):
            v = b"kp-%d-%d" % (t, i)
            p.send(topic, value=v, key=b"k%d" % i, headers=[("h", b"%d" % t)])
            if t % 3 != 1:
                expected.append(v)
        p.flush()
        if t % 3 == 1:
            p.abort_transaction()
        else:
            p.commit_transaction()
    p.close()
    settle(broker.bootstrap, topic, 2)

    # Regression: a topic with nothing to read made every task fail with an AttributeError
    # (Spark hands read() a plain InputPartition when partitions() returns none).
    empty = uid("spark-empty")
    create(broker.bootstrap, {empty: 2})
    assert spark.read.format("appliance").option("kafka.bootstrap.servers", broker.bootstrap) \
        .option("subscribe", empty).load().collect() == []

    df = (spark.read.format("appliance").option("kafka.bootstrap.servers", broker.bootstrap)
          .option("subscribe", topic).option("includeHeaders", "true").load())
    assert df.columns == ["key", "value", "topic", "partition", "offset", "timestamp",
                          "timestampType", "headers"]
    rows = df.collect()
    assert sorted(r.value for r in rows) == sorted(expected)
    assert {r.topic for r in rows} == {topic}
    assert all(r.headers[0].key == "h" and r.value.startswith(b"kp-" + r.headers[0].value + b"-")
               for r in rows)
    offsets = {(r.partition, r.offset) for r in rows}
    assert len(offsets) == len(rows)
    # The markers and the aborted transactions leave gaps in the offsets, which are not data loss.
    assert max(o for _, o in offsets) >= len(rows) // 2

    # endingOffsets / startingOffsets as JSON, and the same rows through a streaming query that
    # takes several micro-batches.
    part0 = [r for r in rows if r.partition == 0]
    first = min(r.offset for r in part0)
    cut = sorted(r.offset for r in part0)[len(part0) // 2]
    some = (spark.read.format("appliance").option("kafka.bootstrap.servers", broker.bootstrap)
            .option("assign", f'{{"{topic}": [0]}}')
            .option("startingOffsets", f'{{"{topic}": {{"0": {first}}}}}')
            .option("endingOffsets", f'{{"{topic}": {{"0": {cut}}}}}').load().collect())
    assert sorted(r.offset for r in some) == sorted(r.offset for r in part0 if r.offset < cut)

    q = (spark.readStream.format("appliance").option("kafka.bootstrap.servers", broker.bootstrap)
         .option("subscribe", topic).option("startingOffsets", "earliest")
         .option("maxOffsetsPerTrigger", 150).load()
         .writeStream.format("memory").queryName("spark_read_stream").trigger(availableNow=True).start())
    q.awaitTermination(300)
    streamed = spark.sql("select value from spark_read_stream").collect()
    assert sorted(r.value for r in streamed) == sorted(expected)
    assert len([p for p in q.recentProgress if p["numInputRows"] > 0]) >= 4


def test_offsets_deleted_by_retention_are_a_clear_error(spark, broker):
    from confluent_kafka.admin import AdminClient, NewTopic
    topic = uid("spark-retention")
    admin_client = AdminClient({"bootstrap.servers": broker.bootstrap})
    fut = admin_client.create_topics([NewTopic(topic, 1, config={"segment.bytes": "4096",
                                                                 "retention.bytes": "8192"})])
    fut[topic].result(30)
    with Producer(bootstrap_servers=broker.bootstrap, linger_ms=0) as p:
        for i in range(400):
            p.send(topic, b"x" * 100 + b"%d" % i, partition=0)
            p.flush()
    from appliance.client import Consumer
    with Consumer(bootstrap_servers=broker.bootstrap) as c:
        deadline = time.monotonic() + 60
        while (start := c.beginning_offsets([(topic, 0)])[(topic, 0)]) == 0:
            assert time.monotonic() < deadline, "retention deleted nothing"
            time.sleep(0.2)

    def load(**options):
        r = (spark.read.format("appliance").option("kafka.bootstrap.servers", broker.bootstrap)
             .option("subscribe", topic).option("startingOffsets", f'{{"{topic}": {{"0": 0}}}}'))
        for k, v in options.items():
            r = r.option(k, v)
        return r.load().collect()

    with pytest.raises(Exception, match="deleted by retention"):
        load()
    rows = load(failOnDataLoss="false")
    assert rows and min(r.offset for r in rows) >= start
    assert [r.offset for r in sorted(rows, key=lambda r: r.offset)] == \
        list(range(min(r.offset for r in rows), 400))

def test_driver_commit_refuses_when_a_prepared_transaction_is_gone(broker):
    """The driver's commit takes every task's transaction over before committing any: one
    aborted by an operator (force-terminate) fails the job, which is rolled back (the abort
    decision in the job log, every id fenced): the other task's rows stay invisible."""
    from pyspark.sql.types import StringType, StructField, StructType

    from appliance.spark import TransactionLostError
    from appliance.spark.jobs import ABORTED, JobLog, fold
    from appliance.spark.writer import PreparedTask, _Sink

    topic = uid("spark-lost")
    create(broker.bootstrap, {topic: 2})
    sink = _Sink({"kafka.bootstrap.servers": broker.bootstrap, "topic": topic},
                 StructType([StructField("value", StringType())]))
    key = uid("job")
    with JobLog(sink.producer_config) as jl:
        gen = jl.append("begin", "spark", key).offset
    messages = []
    for part in range(2):
        txn_id = f"spark-{key}-{part}"
        with Producer(bootstrap_servers=broker.bootstrap, transactional_id=txn_id,
                      enable_two_phase_commit=True) as p:
            p.init_transactions()
            p.begin_transaction()
            for i in range(10):
                p.send(topic, b"%d-%d" % (part, i), partition=part)
            state = p.prepare_transaction()
        messages.append(PreparedTask(txn_id, part, str(state), 10))
    conn = admin.connect(broker.bootstrap)
    try:
        admin.force_terminate(conn, messages[1].transactional_id)
    finally:
        conn.close()
    with pytest.raises(TransactionLostError, match="is gone"):
        sink.commit_batch(key, gen, messages)
    with JobLog(sink.producer_config) as jl:
        assert fold(jl.read())[("spark", key)].phase == ABORTED
    assert not [t for t in open_transactions(broker.bootstrap) if key in t]
    assert values(read_all(broker.bootstrap, topic, 2)) == []


def test_stale_task_attempt_after_the_driver_ended_the_job_writes_nothing(broker):
    """A writer that starts after the driver aborted its job (Spark ended its input as if it were
    complete, and its process was slow to start) reads the job log, finds the job ended, and
    gives up: no transaction stays open. A writer whose input is empty opens no producer at all.
    Driven in this process with a task context of our own (no JVM)."""
    import pyarrow as pa
    from pyspark import TaskContext
    from pyspark.sql.types import StringType, StructField, StructType

    from appliance.client import PreparedTxnState
    from appliance.spark.writer import BatchWriter

    topic = uid("spark-stale")
    create(broker.bootstrap, {topic: 1})
    ctx = TaskContext._getOrCreate()
    ctx._partitionId, ctx._attemptNumber = 0, 1
    try:
        writer = BatchWriter({"kafka.bootstrap.servers": broker.bootstrap, "topic": topic},
                             StructType([StructField("value", StringType())]))
        txn_id = f"spark-{writer.key}-0"
        empty = writer.write(iter([pa.RecordBatch.from_pydict({"value": pa.array([], pa.string())})]))
        assert empty.rows == 0 and not PreparedTxnState.from_string(empty.state).has_transaction
        conn = admin.connect(broker.bootstrap)
        try:
            assert txn_id not in {t["transactional_id"] for t in admin.list_transactions(conn)}, \
                "an empty task opened a producer"
        finally:
            conn.close()

        writer.abort([None])                                   # the driver gave up on the job
        with pytest.raises(RuntimeError, match="stale"):
            writer.write(iter([pa.RecordBatch.from_pydict({"value": ["late"]})]))
    finally:
        TaskContext._setTaskContext(None)
    assert txn_id not in open_transactions(broker.bootstrap)
    assert values(read_all(broker.bootstrap, topic, 1, "read_uncommitted")) == []


@pytest.fixture(scope="module")
def secure_broker(tmp_path_factory):
    from security_setup import secure_appliance
    d = tmp_path_factory.mktemp("spark-secure")
    made = []

    def factory(data_dir=None, start=True, **config):
        a = Appliance(data_dir=data_dir, log_path=str(d / "appliance.log"), config=config)
        made.append(a)
        return a.start() if start else a
    yield secure_appliance(factory, d, protocols=("SASL_SSL",),
                           transactions={"two_phase_commit_enable": True})
    for a in made:
        a.terminate()


def test_write_and_read_over_sasl_ssl_with_sparks_kafka_options(spark, secure_broker, tmp_path):
    from security_setup import ADMIN, ADMIN_PASSWORD
    s = secure_broker
    options = {
        "kafka.bootstrap.servers": s.bootstrap("SASL_SSL"),
        "kafka.security.protocol": "SASL_SSL", "kafka.sasl.mechanism": "SCRAM-SHA-512",
        "kafka.sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule "
                                  f'required username="{ADMIN}" password="{ADMIN_PASSWORD}";',
        "kafka.ssl.truststore.type": "PEM", "kafka.ssl.truststore.location": s.pki.ca}
    topic = uid("spark-sasl")
    rows_df(spark, 1000, 2).write.format("appliance").option("topic", topic).options(**options) \
        .mode("append").save()
    r = spark.read.format("appliance").option("subscribe", topic).options(**options)
    got = sorted(row.value.decode() for row in r.load().select("value").collect())
    assert got == sorted(f"v-{i}" for i in range(1000))

    # A streaming query over the same listener: read from the topic, write to another through
    # the two-phase sink (its driver commits over SASL_SSL too), then read that back.
    sink = uid("spark-sasl-out")
    stream = spark.readStream.format("appliance").option("subscribe", topic) \
        .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", 400).options(**options)
    q = stream.load().selectExpr("key", "upper(cast(value as string)) as value").writeStream \
        .format("appliance").option("topic", sink).option("checkpointLocation", str(tmp_path / "cp")) \
        .options(**options).trigger(availableNow=True).start()
    q.awaitTermination(300)
    assert q.exception() is None, q.exception()
    back = spark.read.format("appliance").option("subscribe", sink).options(**options)
    assert sorted(row.value.decode() for row in back.load().select("value").collect()) == \
        sorted(f"V-{i}" for i in range(1000))
    # Without the credentials the same read is refused by the broker.
    bad = spark.read.format("appliance").option("subscribe", topic).options(**{
        **options, "kafka.sasl.jaas.config": options["kafka.sasl.jaas.config"].replace(ADMIN_PASSWORD, "wrong")})
    with pytest.raises(Exception, match="SASL_AUTHENTICATION_FAILED|invalid credentials"):
        bad.load().collect()
