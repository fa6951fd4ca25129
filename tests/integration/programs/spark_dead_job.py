"""A Spark write job's driver and tasks without Spark, for the recovery tests (test_spark_recover.py):
the sink's own code (``appliance.spark.writer``) driven in one process with task contexts of our
own, killed -9 by the sink's test hook at a given phase. It leaves exactly what a dead Spark
driver leaves: the job log's records and the transactions, open or prepared.

    python spark_dead_job.py BOOTSTRAP TOPIC PHASE [--prefix P] [--stream] [--rows N]
                             [--job-retention-ms MS]

It prints the job's key (the streaming query's id) first. 3 tasks write ``--rows`` rows each (key = id, value = "v-<id>"); then the driver commits (or,
for the phase ``abort_decided``, aborts). With ``--stream`` the tasks are micro-batch 0 of a
streaming query. Run it in a session of its own: the hook kills the session. The phase ``none``
runs the job to its end (exit 0).
"""

from __future__ import annotations

import argparse
import os
import sys
import uuid

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.types import StringType, StructField, StructType

from appliance.spark.jobs import KILL_ENV
from appliance.spark.writer import BatchWriter, StreamWriter

SCHEMA = StructType([StructField("key", StringType()), StructField("value", StringType())])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("bootstrap")
    ap.add_argument("topic")
    ap.add_argument("phase")
    ap.add_argument("--prefix", default="spark")
    ap.add_argument("--stream", action="store_true")
    ap.add_argument("--rows", type=int, default=200)
    ap.add_argument("--job-retention-ms")
    args = ap.parse_args()
    os.environ[KILL_ENV] = args.phase
    options = {"kafka.bootstrap.servers": args.bootstrap, "topic": args.topic,
               "transactionalIdPrefix": args.prefix, "jobTimeoutMs": "600000",
               "kafka.batch.size": "1024"}
    if args.job_retention_ms:
        options["jobRetentionMs"] = args.job_retention_ms
    writer = (StreamWriter if args.stream else BatchWriter)(options, SCHEMA)
    query = str(uuid.uuid4())
    print(query if args.stream else writer.key, flush=True)
    messages = []
    for part in range(3):
        ctx = TaskContext._getOrCreate()
        ctx._partitionId, ctx._attemptNumber = part, 0
        ctx._localProperties = {"sql.streaming.queryId": query, "streaming.sql.batchId": "0"}
        ids = range(part * args.rows, (part + 1) * args.rows)
        batches = [pa.RecordBatch.from_pydict({"key": [str(i) for i in ids[j:j + 50]],
                                               "value": [f"v-{i}" for i in ids[j:j + 50]]})
                   for j in range(0, len(ids), 50)]
        messages.append(writer.write(iter(batches)))
    if args.stream:
        writer.commit(messages, 0)
    elif args.phase == "abort_decided":
        writer.abort(messages)
    else:
        writer.commit(messages)
    if args.phase == "none":
        return 0
    print("the job ended without being killed", file=sys.stderr)
    return 3


if __name__ == "__main__":
    sys.exit(main())
