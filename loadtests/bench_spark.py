"""Throughput of the Spark writer and reader (``format("appliance")``) beside plain clients, in one run.

Not a test; run by hand:

    .venv/bin/python loadtests/bench_spark.py [--rows 1000000] [--value-size 100] [--rounds 2]
        [--warm-up-rows 1000] [--work-dir DIR] [--keep]

It starts one appliance (two-phase commit on, flush policy os) and measures, one after the
other, writing the same rows (a key of up to 7 bytes, a value of ``--value-size`` bytes) to a
fresh 2-partition topic:

* spark: a PySpark job in local[2] (two executor cores) writing a DataFrame built with
  ``spark.range`` and ``selectExpr`` (no Python UDF: what is measured is the sink) through the
  appliance data source: per task one KIP-939 transaction, prepared, then committed by the
  driver (with its job log records). Only ``save()`` is timed (the session is started and warmed
  up by a small write of ``--warm-up-rows`` first; 0 skips it, for a smoke run that only checks
  the tool works).
* client, Arrow batches: the appliance client in this process, one thread, fed the same rows as
  Arrow record batches of 10,000 rows made beforehand (what Spark hands its writer), encoded
  column-wise and sent with ``send_encoded`` (the Spark writer's path, without Spark), idempotent.
* client, per record: ``Producer.send`` row by row, idempotent, then transactional (a commit
  every 100,000 rows).
* librdkafka idempotent: confluent-kafka's producer, enable.idempotence, linger.ms=5.

Two more Spark rows show where the Spark writer's time goes: the same DataFrame written to Spark's
``noop`` sink (the JVM making the rows), and handed to a Python function that drops every Arrow
batch (``mapInArrow``, then ``noop``: the JVM making the rows and sending them to Python workers as
Arrow, which every Python data source writer pays before its first line runs).

Then the reader: Spark (local[2]) reading the topic the Spark writer wrote, read_committed, every
value's length summed (so that every row is decoded and handed to Spark), against a
confluent-kafka consumer (read_committed, one core) reading the same topic.

The producers and the consumer use one core each; Spark uses both. Prints markdown tables with
rows/s and MB/s (10**6 bytes of keys and values) and the ratios, and checks that the
read_committed end offsets account for every row Spark wrote.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from brokers import appliance as start_appliance  # noqa: E402


SPARK = "spark local[2] (2 cores)"
LIBRDKAFKA = "librdkafka idempotent (1 core)"
CLIENT_ARROW = "appliance client, Arrow batches, idempotent (1 core)"
CLIENT_RECORD = "appliance client, per record, idempotent (1 core)"
ARROW_ROWS = 10_000


def key_value(i: int, size: int) -> tuple[bytes, bytes]:
    k = b"%d" % (i % 1_000_000)
    return k, (b"%d-" % i).ljust(size, b"x")


def payload_bytes(rows: int, size: int) -> int:
    return sum(len(b"%d" % (i % 1_000_000)) for i in range(rows)) + rows * size


def create(bootstrap: str, topic: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient({"bootstrap.servers": bootstrap})      # kept alive until the answer
    admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(60)


def bench_spark(spark, bootstrap: str, rows: int, size: int, **options) -> tuple[float, str]:
    topic = f"bench-spark-{uuid.uuid4().hex[:6]}"
    create(bootstrap, topic)
    df = spark_df(spark, rows, size)
    t0 = time.perf_counter()
    w = df.write.format("appliance").option("kafka.bootstrap.servers", bootstrap).option("topic", topic)
    for k, v in options.items():
        w = w.option(k, v)
    w.mode("append").save()
    return time.perf_counter() - t0, topic


def spark_df(spark, rows: int, size: int):
    return spark.range(0, rows, 1, numPartitions=2).selectExpr(
        "cast(id % 1000000 as string) as key",
        f"rpad(concat(cast(id as string), '-'), {size}, 'x') as value")


def bench_spark_floor(spark, rows: int, size: int, to_python: bool) -> float:
    df = spark_df(spark, rows, size)
    if to_python:
        df = df.mapInArrow(lambda batches: (b.slice(0, 0) for b in batches), df.schema)
    t0 = time.perf_counter()
    df.write.format("noop").mode("overwrite").save()
    return time.perf_counter() - t0


def arrow_batches(rows: int, size: int) -> list:
    import pyarrow as pa
    out = []
    for start in range(0, rows, ARROW_ROWS):
        kvs = [key_value(i, size) for i in range(start, min(rows, start + ARROW_ROWS))]
        out.append(pa.RecordBatch.from_arrays([pa.array([k for k, _ in kvs], pa.binary()),
                                               pa.array([v for _, v in kvs], pa.binary())],
                                              names=["key", "value"]))
    return out


def bench_client_arrow(bootstrap: str, batches: list) -> float:
    from appliance.client import Producer
    from appliance.spark.encode import Partitioner, encode_partitions
    topic = f"bench-arrow-{uuid.uuid4().hex[:6]}"
    create(bootstrap, topic)
    with Producer(bootstrap_servers=bootstrap, batch_size=512 * 1024) as p:
        p.send(topic, b"warm-up")
        p.flush()
        count = p.cluster.partitions_for(topic)
        partitioner = Partitioner()
        t0 = time.perf_counter()
        for b in batches:
            keys, values = b.column(0), b.column(1)
            parts = partitioner.assign(topic, count, keys, None)
            for part, records in encode_partitions(keys, values, parts, 512 * 1024, int(time.time() * 1000)):
                p.send_encoded(topic, part, records)
        p.flush()
        return time.perf_counter() - t0


def bench_client(bootstrap: str, rows: int, size: int, transactional: bool) -> float:
    from appliance.client import Producer
    topic = f"bench-client-{uuid.uuid4().hex[:6]}"
    create(bootstrap, topic)
    cfg = {"bootstrap_servers": bootstrap}
    if transactional:
        cfg["transactional_id"] = f"bench-{uuid.uuid4().hex[:6]}"
    with Producer(cfg) as p:
        if transactional:
            p.init_transactions()
            p.begin_transaction()
        p.send(topic, b"warm-up")
        p.flush()
        t0 = time.perf_counter()
        for i in range(rows):
            k, v = key_value(i, size)
            p.send(topic, v, k)
            if transactional and (i + 1) % 100_000 == 0:
                p.commit_transaction()
                p.begin_transaction()
        if transactional:
            p.commit_transaction()
        else:
            p.flush()
        return time.perf_counter() - t0


def bench_librdkafka(bootstrap: str, rows: int, size: int) -> float:
    from confluent_kafka import Producer
    topic = f"bench-rdk-{uuid.uuid4().hex[:6]}"
    create(bootstrap, topic)
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5,
                  "queue.buffering.max.messages": 2_000_000})
    p.produce(topic, b"warm-up")
    p.flush(30)
    t0 = time.perf_counter()
    for i in range(rows):
        k, v = key_value(i, size)
        while True:
            try:
                p.produce(topic, v, k)
                break
            except BufferError:
                p.poll(0.01)
        p.poll(0)
    left = p.flush(120)
    if left:
        raise SystemExit(f"librdkafka: {left} rows not delivered")
    return time.perf_counter() - t0


def read_spark(spark, bootstrap: str, topic: str) -> tuple[float, int]:
    t0 = time.perf_counter()
    (row,) = (spark.read.format("appliance").option("kafka.bootstrap.servers", bootstrap)
              .option("subscribe", topic).load()
              .selectExpr("count(*) as n", "sum(length(value)) as bytes").collect())
    return time.perf_counter() - t0, row.n


def read_confluent(bootstrap: str, topic: str, rows: int) -> float:
    from confluent_kafka import Consumer
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex[:6]}",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False,
                  "isolation.level": "read_committed"})
    try:
        c.subscribe([topic])
        n = 0
        t0 = time.perf_counter()
        deadline = time.monotonic() + 300
        while n < rows:
            if time.monotonic() > deadline:
                raise SystemExit(f"confluent-kafka read {n} of {rows} rows")
            for m in c.consume(10_000, 1.0):
                if m.error() is None:
                    n += 1
                    len(m.value())
        return time.perf_counter() - t0
    finally:
        c.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--value-size", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--warm-up-rows", type=int, default=1000,
                    help="rows of the untimed first Spark write (0: none, the first round is cold)")
    ap.add_argument("--work-dir", default=None,
                    help="parent of the temporary dir (appliance data and log, removed at the end)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory (logs, data)")
    args = ap.parse_args()
    if args.rows < 1 or args.value_size < 1 or args.rounds < 1:
        ap.error("--rows, --value-size and --rounds must be positive")
    if args.warm_up_rows < 0:
        ap.error("--warm-up-rows must not be negative")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    workdir = tempfile.mkdtemp(prefix="bench-spark-", dir=args.work_dir)
    nbytes = payload_bytes(args.rows, args.value_size)
    try:
        return run(args, workdir, nbytes)
    finally:
        # A full run leaves about 1.5 GB of appliance data (every writer, every round).
        if args.keep:
            print(f"kept {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)


def run(args: argparse.Namespace, workdir: str, nbytes: int) -> int:
    batches = arrow_batches(args.rows, args.value_size)
    with start_appliance(workdir, "os", 2, 60.0,
                         "[transactions]\ntwo_phase_commit_enable = true\n") as started:
        bootstrap = started[0]
        from pyspark.sql import SparkSession

        from appliance.client import Consumer
        from appliance.spark import register
        spark = (SparkSession.builder.master("local[2]").appName("bench-spark")
                 .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
                 .getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        register(spark)
        try:
            if args.warm_up_rows:
                bench_spark(spark, bootstrap, args.warm_up_rows, args.value_size)   # warm-up
            runs: dict[str, list[float]] = {}
            reads: dict[str, list[float]] = {}
            for _ in range(args.rounds):           # interleaved, best of the rounds per writer
                secs, topic = bench_spark(spark, bootstrap, args.rows, args.value_size)
                runs.setdefault(SPARK, []).append(secs)
                with Consumer(bootstrap_servers=bootstrap) as c:
                    end = sum(c.end_offsets([(topic, 0), (topic, 1)]).values())
                if end < args.rows:
                    print(f"spark wrote {end} offsets read_committed, fewer than {args.rows} rows",
                          file=sys.stderr)
                    return 1
                runs.setdefault("spark, kafka.batch.size=16384 (Kafka's default)", []).append(
                    bench_spark(spark, bootstrap, args.rows, args.value_size,
                                **{"kafka.batch.size": "16384"})[0])
                runs.setdefault("spark JVM alone: the rows to the noop sink", []).append(
                    bench_spark_floor(spark, args.rows, args.value_size, False))
                runs.setdefault("spark to Python as Arrow, dropped (mapInArrow)", []).append(
                    bench_spark_floor(spark, args.rows, args.value_size, True))
                runs.setdefault(CLIENT_ARROW, []).append(bench_client_arrow(bootstrap, batches))
                runs.setdefault(CLIENT_RECORD, []).append(
                    bench_client(bootstrap, args.rows, args.value_size, False))
                runs.setdefault("appliance client, per record, transactional (1 core)", []).append(
                    bench_client(bootstrap, args.rows, args.value_size, True))
                runs.setdefault(LIBRDKAFKA, []).append(
                    bench_librdkafka(bootstrap, args.rows, args.value_size))
                secs, got = read_spark(spark, bootstrap, topic)
                if got != args.rows:
                    print(f"spark read {got} rows of {topic}, not {args.rows}", file=sys.stderr)
                    return 1
                reads.setdefault(f"spark read, {SPARK}", []).append(secs)
                reads.setdefault("confluent-kafka consumer, read_committed (1 core)", []).append(
                    read_confluent(bootstrap, topic, args.rows))
        finally:
            spark.stop()

    print("\n## Spark writer throughput\n")
    print(f"- {args.rows:,} rows, {args.value_size} B values and short keys ({nbytes / 1e6:.1f} MB), "
          f"to a 2-partition topic; one appliance, flush policy os; {os.cpu_count()} cores; "
          f"best of {args.rounds} interleaved rounds")
    print(f"- read_committed end offsets after the Spark write: {end:,} "
          f"(the rows plus one commit marker per task and partition)\n")
    table(runs, args.rows, nbytes, SPARK, "spark / this")
    print(f"\nspark / librdkafka = {min(runs[LIBRDKAFKA]) / min(runs[SPARK]):.2f}; "
          f"client (Arrow batches) / librdkafka = {min(runs[LIBRDKAFKA]) / min(runs[CLIENT_ARROW]):.2f}; "
          f"client (per record) / librdkafka = {min(runs[LIBRDKAFKA]) / min(runs[CLIENT_RECORD]):.2f}")
    print("\n## Spark reader throughput (the Spark writer's topic, read_committed)\n")
    table(reads, args.rows, nbytes, f"spark read, {SPARK}", "spark / this")
    return 0


def table(runs: dict[str, list[float]], rows: int, nbytes: int, ref: str, ratio: str) -> None:
    results = {name: min(secs) for name, secs in runs.items()}
    print(f"| run | seconds | rows/s | MB/s | {ratio} |")
    print("|---|---|---|---|---|")
    ref_s = results[ref]
    for name, secs in results.items():
        print(f"| {name} | {secs:.2f} | {rows / secs:,.0f} | {nbytes / secs / 1e6:.1f} | "
              f"{secs / ref_s:.2f} |")


if __name__ == "__main__":
    sys.exit(main())
