#!/usr/bin/env python3
"""A PySpark pipeline through the appliance: one job loads orders and writes them exactly once,
a second job reads them back read_committed and aggregates them.

    # the broker must allow two-phase commit: [transactions] two_phase_commit_enable = true,
    # e.g. APPLIANCE_TRANSACTIONS__TWO_PHASE_COMMIT_ENABLE=true make run
    .venv/bin/python examples/spark_pipeline.py load [--bootstrap 127.0.0.1:9092] \\
        [--topic spark-orders] [--csv orders.csv | --rows 100000]
    .venv/bin/python examples/spark_pipeline.py report [--bootstrap 127.0.0.1:9092] \\
        [--topic spark-orders] [--json]

``load`` reads a CSV file with a header (columns order_id, customer, amount) or generates
``--rows`` orders, keeps the valid ones (a positive amount), and writes each as a record: key =
customer, value = the order as JSON. With ``--fail-after N`` the job fails after N orders of its
last partition, the rows before it already sent: nothing of the job becomes visible, and running
``load`` again writes every order once.

``report`` reads the topic (batch, read_committed) and prints orders and total amount per
customer, and the overall count; ``--json`` prints them as one JSON object. Records that are not
orders (not JSON with an order_id, a customer and an amount) are refused, and their count is
printed, rather than counted under a customer "null".

An error of the data source itself (two-phase commit off, a bad option ...) is printed as one
line, not as the traceback Spark wraps it in.

The same two jobs written for Spark's Kafka connector would differ only in the format name
("kafka" instead of "appliance") and in the ``register(spark)`` call.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


def session(name: str):
    from pyspark.sql import SparkSession

    from appliance.spark import register

    spark = (SparkSession.builder.master(os.environ.get("SPARK_MASTER", "local[2]")).appName(name)
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("WARN")
    register(spark)
    return spark


def load(args) -> int:
    from pyspark.sql import functions as F

    spark = session("orders-load")
    if args.csv:
        orders = (spark.read.option("header", "true")
                  .schema("order_id long, customer string, amount double").csv(args.csv))
    else:
        orders = spark.range(args.rows, numPartitions=args.partitions).select(
            F.col("id").alias("order_id"),
            F.concat(F.lit("customer-"), (F.col("id") % 50).cast("string")).alias("customer"),
            (F.round((F.col("id") * 7919) % 10000 / 100.0, 2) - 5).alias("amount"))
    valid = orders.where(F.col("amount") > 0)
    if args.fail_after is not None:
        valid = valid.withColumn("amount", _fail_after(args.fail_after, args.bootstrap,
                                                       args.topic)(F.col("amount")))
    records = valid.select(
        F.col("customer").alias("key"),
        F.to_json(F.struct("order_id", "customer", "amount")).alias("value"))
    (records.write.format("appliance").option("kafka.bootstrap.servers", args.bootstrap)
     .option("topic", args.topic).mode("append").save())
    print(f"loaded {valid.count()} orders into {args.topic}")
    spark.stop()
    return 0


def _fail_after(n: int, bootstrap: str, topic: str):
    """A pass-through column function that fails the last partition's task after ``n`` rows,
    once the job's rows have started to reach the topic's log (uncommitted)."""
    from pyspark.sql.functions import udf

    @udf("double")
    def check(amount):
        import time

        from pyspark import TaskContext
        ctx = TaskContext.get()
        state = check.__dict__.setdefault("seen", {})
        key = (ctx.stageId(), ctx.partitionId(), ctx.attemptNumber())
        state[key] = state.get(key, 0) + 1
        if ctx.partitionId() == int(os.environ.get("PIPELINE_FAIL_PARTITION", "1")) and state[key] > n:
            from appliance.client import Consumer
            with Consumer(bootstrap_servers=bootstrap, isolation_level="read_uncommitted") as c:
                tps = [(topic, p) for p in range(c.cluster.partitions_for(topic))]
                deadline = time.monotonic() + 120
                while not sum(c.end_offsets(tps).values()) and time.monotonic() < deadline:
                    time.sleep(0.05)
            raise RuntimeError(f"injected failure after {n} orders")
        return amount

    return check


def report(args) -> int:
    from pyspark.sql import functions as F

    spark = session("orders-report")
    raw = (spark.read.format("appliance").option("kafka.bootstrap.servers", args.bootstrap)
           .option("subscribe", args.topic).option("startingOffsets", "earliest").load())
    parsed = raw.select(F.from_json(F.col("value").cast("string"),
                                    "order_id long, customer string, amount double").alias("o"))
    is_order = (F.col("o").isNotNull() & F.col("o.order_id").isNotNull()
                & F.col("o.customer").isNotNull() & F.col("o.amount").isNotNull())
    parsed = parsed.select(is_order.alias("ok"), "o").cache()
    refused = parsed.where(~F.col("ok")).count()
    orders = parsed.where(F.col("ok")).select("o.*")
    per_customer = (orders.groupBy("customer")
                    .agg(F.count("*").alias("orders"), F.round(F.sum("amount"), 2).alias("total"))
                    .orderBy("customer").collect())
    summary = orders.agg(F.count("*").alias("orders"),
                         F.countDistinct("order_id").alias("distinct_orders")).collect()[0]
    if refused:
        print(f"refused {refused} records of {args.topic} that are not orders (JSON with "
              f"order_id, customer and amount); they are not in the report", file=sys.stderr)
    if args.json:
        print(json.dumps({"orders": summary.orders, "distinct_orders": summary.distinct_orders,
                          "refused": refused,
                          "customers": {r.customer: {"orders": r.orders, "total": r.total}
                                        for r in per_customer}}))
    else:
        for r in per_customer:
            print(f"{r.customer:>14} {r.orders:>8} {r.total:>14.2f}")
        print(f"{summary.orders} orders ({summary.distinct_orders} distinct)"
              + (f", {refused} records refused" if refused else ""))
    spark.stop()
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("job", choices=["load", "report"])
    ap.add_argument("--bootstrap", default="127.0.0.1:9092")
    ap.add_argument("--topic", default="spark-orders",
                    help="default spark-orders (examples/dual_write.py writes dual-write-orders)")
    ap.add_argument("--csv", help="orders CSV (header: order_id,customer,amount)")
    ap.add_argument("--rows", type=int, default=100_000, help="orders to generate without --csv")
    ap.add_argument("--partitions", type=int, default=2, help="Spark partitions of generated orders")
    ap.add_argument("--fail-after", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    try:
        return load(args) if args.job == "load" else report(args)
    except Exception as exc:
        from appliance.spark import error_line
        line = error_line(exc)
        if line is None:
            raise
        print(f"error: {line}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
