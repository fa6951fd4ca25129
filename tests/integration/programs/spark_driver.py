"""A Spark driver for the integration tests, run as its own process so that a test can kill -9
it (the Python driver and its JVM, one process group) and start it again on the same checkpoint.
Started by spark_jobs.py (``batch_driver``, ``stream_driver``).

    python spark_driver.py stream BOOTSTRAP SOURCE SINK CHECKPOINT [--max-offsets N] [--available-now]
    python spark_driver.py batch BOOTSTRAP --job TOPIC[:JOB_ID] [--job ...] [--rows N] [--partitions N]
                                 [--prefix P] [--job-timeout-ms MS]

``batch`` writes, for each ``--job``, the rows ``key = id, value = "v-<id>"`` (``id`` in
0..N-1) to TOPIC, with the option ``jobId`` when one is given, one job after the other. With the
environment variable APPLIANCE_SPARK_TEST_KILL_AT set, the sink kills this driver at that phase
(``appliance.spark.jobs.test_hook``).

``stream`` copies SOURCE to SINK through the appliance source and sink (values upper-cased, key
kept). It runs until killed, or with ``--available-now`` until everything readable now is
written, then exits 0. The same environment variable kills it at a phase of a micro-batch.
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

from pyspark.sql import SparkSession  # noqa: E402

from appliance.spark import register  # noqa: E402


def batch(spark, args) -> int:
    for job in args.job:
        topic, _, job_id = job.partition(":")
        df = spark.range(0, args.rows, 1, numPartitions=args.partitions).selectExpr(
            "cast(id as string) as key", "concat('v-', cast(id as string)) as value")
        w = (df.write.format("appliance").option("kafka.bootstrap.servers", args.bootstrap)
             .option("topic", topic).option("transactionalIdPrefix", args.prefix)
             .option("kafka.batch.size", "4096"))
        if job_id:
            w = w.option("jobId", job_id)
        if args.job_timeout_ms:
            w = w.option("jobTimeoutMs", str(args.job_timeout_ms))
        w.mode("append").save()
        print(f"wrote {topic}", flush=True)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["stream", "batch"])
    ap.add_argument("bootstrap")
    ap.add_argument("source", nargs="?")
    ap.add_argument("sink", nargs="?")
    ap.add_argument("checkpoint", nargs="?")
    ap.add_argument("--max-offsets", type=int, default=1000)
    ap.add_argument("--available-now", action="store_true")
    ap.add_argument("--job", action="append", default=[])
    ap.add_argument("--rows", type=int, default=1000)
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--prefix", default="spark")
    ap.add_argument("--job-timeout-ms", type=int, default=None)
    args = ap.parse_args()

    spark = (SparkSession.builder.master("local[2]").appName(f"appliance-test-{args.mode}")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.sql.execution.arrow.maxRecordsPerBatch", "100").getOrCreate())
    spark.sparkContext.setLogLevel("WARN")
    register(spark)
    if args.mode == "batch":
        code = batch(spark, args)
        spark.stop()
        return code
    src = (spark.readStream.format("appliance").option("kafka.bootstrap.servers", args.bootstrap)
           .option("subscribe", args.source).option("startingOffsets", "earliest")
           .option("maxOffsetsPerTrigger", args.max_offsets).load())
    out = src.selectExpr("key", "upper(cast(value as string)) as value")
    w = (out.writeStream.format("appliance").option("kafka.bootstrap.servers", args.bootstrap)
         .option("topic", args.sink).option("checkpointLocation", args.checkpoint))
    w = w.trigger(availableNow=True) if args.available_now else w.trigger(processingTime="0 seconds")
    q = w.start()
    print("started", flush=True)
    q.awaitTermination()
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
