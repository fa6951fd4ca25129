"""A Spark driver for the integration tests, run as its own process so that a test can kill -9
it (the Python driver and its JVM, one process group) and start it again on the same checkpoint.

    python spark_job.py stream BOOTSTRAP SOURCE SINK CHECKPOINT [--max-offsets N] [--available-now]
                               [--crash-in-commit BATCH]

``stream`` copies SOURCE to SINK through the appliance source and sink (values upper-cased, key
kept). It runs until killed, or with ``--available-now`` until everything readable now is
written, then exits 0. ``--crash-in-commit BATCH`` uses a sink whose driver-side commit of
micro-batch BATCH commits the first task's transaction only and then kills its own process: the
state a driver dies in between committing some partitions and recording the batch.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

from pyspark.sql import SparkSession  # noqa: E402

from appliance.spark import ApplianceDataSource, register  # noqa: E402
from appliance.spark.writer import StreamWriter  # noqa: E402


class CrashingStreamWriter(StreamWriter):
    crash_batch = -1

    def commit(self, messages, batchId):
        if batchId == self.crash_batch:
            self.sink.commit_all(messages[:1])
            os.kill(os.getpid(), signal.SIGKILL)
        super().commit(messages, batchId)


class CrashingSource(ApplianceDataSource):
    @classmethod
    def name(cls):
        return "appliance_crashing"

    def streamWriter(self, schema, overwrite):
        w = CrashingStreamWriter(self.options, schema)
        w.crash_batch = int(self.options["crash_batch"])
        return w


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["stream"])
    ap.add_argument("bootstrap")
    ap.add_argument("source")
    ap.add_argument("sink")
    ap.add_argument("checkpoint")
    ap.add_argument("--max-offsets", type=int, default=1000)
    ap.add_argument("--available-now", action="store_true")
    ap.add_argument("--crash-in-commit", type=int, default=None)
    args = ap.parse_args()

    spark = (SparkSession.builder.master("local[2]").appName("appliance-test-stream")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    spark.sparkContext.setLogLevel("WARN")
    register(spark)
    spark.dataSource.register(CrashingSource)
    src = (spark.readStream.format("appliance").option("kafka.bootstrap.servers", args.bootstrap)
           .option("subscribe", args.source).option("startingOffsets", "earliest")
           .option("maxOffsetsPerTrigger", args.max_offsets).load())
    out = src.selectExpr("key", "upper(cast(value as string)) as value")
    sink = "appliance" if args.crash_in_commit is None else "appliance_crashing"
    w = (out.writeStream.format(sink).option("kafka.bootstrap.servers", args.bootstrap)
         .option("topic", args.sink).option("checkpointLocation", args.checkpoint))
    if args.crash_in_commit is not None:
        w = w.option("crash_batch", str(args.crash_in_commit))
    w = w.trigger(availableNow=True) if args.available_now else w.trigger(processingTime="0 seconds")
    q = w.start()
    print("started", flush=True)
    q.awaitTermination()
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
