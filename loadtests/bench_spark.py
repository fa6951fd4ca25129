"""Throughput of the Spark writer (``format("appliance")``) beside plain producers, in one run.

Not a test; run by hand:

    .venv/bin/python loadtests/bench_spark.py [--rows 1000000] [--value-size 100] [--rounds 2]
        [--warm-up-rows 1000] [--work-dir DIR] [--keep]

It starts one appliance (two-phase commit on, flush policy os) and measures, one after the
other, writing the same rows (a key of up to 7 bytes, a value of ``--value-size`` bytes) to a
fresh 2-partition topic:

* spark: a PySpark job in local[2] (two executor cores) writing a DataFrame built with
  ``spark.range`` and ``selectExpr`` (no Python UDF: what is measured is the sink) through the
  appliance data source: per task one KIP-939 transaction, prepared, then committed by the
  driver. Only ``save()`` is timed (the session is started and warmed up by a small write of
  ``--warm-up-rows`` first; 0 skips it, for a smoke run that only checks the tool works).
* client idempotent / client transactional: the appliance's own client (``appliance.client``)
  in this process, one thread; the transactional one commits every 100,000 rows.
* librdkafka idempotent: confluent-kafka's producer, enable.idempotence, linger.ms=5.

The producers use one core each; Spark uses both. Prints a markdown table with rows/s and MB/s
(10**6 bytes of keys and values) and the Spark writer's ratio to each producer, and checks that
the read_committed end offsets account for every row Spark wrote.
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

from bench_produce import appliance as start_appliance  # noqa: E402


SPARK = "spark local[2] (2 cores)"


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
    df = spark.range(0, rows, 1, numPartitions=2).selectExpr(
        "cast(id % 1000000 as string) as key",
        f"rpad(concat(cast(id as string), '-'), {size}, 'x') as value")
    t0 = time.perf_counter()
    w = df.write.format("appliance").option("kafka.bootstrap.servers", bootstrap).option("topic", topic)
    for k, v in options.items():
        w = w.option(k, v)
    w.mode("append").save()
    return time.perf_counter() - t0, topic


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
        # A full run leaves about 1 GB of appliance data (every writer, every round).
        if args.keep:
            print(f"kept {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)


def run(args: argparse.Namespace, workdir: str, nbytes: int) -> int:
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
                runs.setdefault("appliance client, idempotent (1 core)", []).append(
                    bench_client(bootstrap, args.rows, args.value_size, False))
                runs.setdefault("appliance client, transactional (1 core)", []).append(
                    bench_client(bootstrap, args.rows, args.value_size, True))
                runs.setdefault("librdkafka idempotent (1 core)", []).append(
                    bench_librdkafka(bootstrap, args.rows, args.value_size))
        finally:
            spark.stop()
    results = {name: min(secs) for name, secs in runs.items()}

    print("\n## Spark writer throughput\n")
    print(f"- {args.rows:,} rows, {args.value_size} B values and short keys ({nbytes / 1e6:.1f} MB), "
          f"to a 2-partition topic; one appliance, flush policy os; {os.cpu_count()} cores; "
          f"best of {args.rounds} interleaved rounds")
    print(f"- read_committed end offsets after the Spark write: {end:,} "
          f"(the rows plus one commit marker per task and partition)\n")
    print("| writer | seconds | rows/s | MB/s | spark / this |")
    print("|---|---|---|---|---|")
    spark_s = results[SPARK]
    for name, secs in results.items():
        print(f"| {name} | {secs:.2f} | {args.rows / secs:,.0f} | {nbytes / secs / 1e6:.1f} | "
              f"{secs / spark_s:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
