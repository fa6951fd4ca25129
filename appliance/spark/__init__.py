"""The ``appliance`` data source for PySpark (the Python Data Source API of pyspark 4.2+):
Spark reads the appliance read_committed and writes to it exactly once, in batch and streaming
queries, with the options and the row schema of Spark's Kafka source and sink.

    from appliance.spark import register
    register(spark)
    df.write.format("appliance").option("kafka.bootstrap.servers", "127.0.0.1:9092") \\
        .option("topic", "events").save()
    spark.read.format("appliance").option("kafka.bootstrap.servers", "127.0.0.1:9092") \\
        .option("subscribe", "events").load()

Installed with the ``spark`` extra (``pip install 'appliance[spark]'``: pyspark, pyarrow, pandas,
numpy). Owns nothing; the classes are instantiated by Spark in its Python workers, on the driver
(planning, commit, abort) and on executors (reading and writing partitions). Modules:
``source`` (the DataSource), ``reader``, ``writer``, ``encode`` (record batches from Arrow
columns), ``jobs`` (the sink's job log and its recovery, which needs no pyspark: the
``appliance spark recover`` command uses it), ``options``. docs/spark.md has the guarantees
and their limits.

The writer needs two-phase commit on the broker (``[transactions] two_phase_commit_enable =
true``, KIP-939): each task prepares its transaction, and the driver commits them all.

pyspark is imported when one of the names below is first used, not with the package, so that
``appliance.spark.jobs`` works where pyspark is not installed.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ApplianceDataSource", "register", "OptionError", "DataLossError", "TransactionLostError",
           "TwoPhaseCommitDisabled", "error_line"]

_WHERE = {"ApplianceDataSource": "source", "OptionError": "options", "DataLossError": "reader",
          "TransactionLostError": "writer", "TwoPhaseCommitDisabled": "writer", "error_line": "options"}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        import importlib
        return getattr(importlib.import_module(f"appliance.spark.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'appliance.spark' has no attribute {name!r}")


def register(spark) -> None:
    """Make ``format("appliance")`` available in ``spark`` (a SparkSession)."""
    from appliance.spark.source import ApplianceDataSource
    spark.dataSource.register(ApplianceDataSource)
