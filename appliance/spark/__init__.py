"""The ``appliance`` data source for PySpark (the Python Data Source API of pyspark 4.2+):
Spark reads the appliance read_committed and writes to it exactly once, in batch and streaming
queries, with the options and the row schema of Spark's Kafka source and sink.

    from appliance.spark import register
    register(spark)
    df.write.format("appliance").option("kafka.bootstrap.servers", "127.0.0.1:9092") \\
        .option("topic", "events").save()
    spark.read.format("appliance").option("kafka.bootstrap.servers", "127.0.0.1:9092") \\
        .option("subscribe", "events").load()

Installed with the ``spark`` extra (``pip install 'appliance[spark]'``: pyspark and pyarrow).
Owns nothing; the classes below are instantiated by Spark in its Python workers, on the driver
(planning, commit, abort) and on executors (reading and writing partitions). See
``appliance.spark.reader`` and ``appliance.spark.writer`` for how each part works, and
docs/spark.md for the guarantees and their limits.

The writer needs two-phase commit on the broker (``[transactions] two_phase_commit_enable =
true``, KIP-939): each task prepares its transaction, and the driver commits them all.
"""

from __future__ import annotations

from pyspark.sql.datasource import DataSource
from pyspark.sql.types import StructType

from appliance.spark.options import OptionError, flag
from appliance.spark.reader import BatchReader, DataLossError, StreamReader, source_schema
from appliance.spark.writer import BatchWriter, StreamWriter, TransactionLostError

__all__ = ["ApplianceDataSource", "register", "OptionError", "DataLossError", "TransactionLostError"]


class ApplianceDataSource(DataSource):
    """``format("appliance")``."""

    @classmethod
    def name(cls) -> str:
        return "appliance"

    def schema(self) -> StructType:
        return source_schema(flag(self.options, "includeHeaders", False))

    def reader(self, schema: StructType) -> BatchReader:
        return BatchReader(self.options)

    def streamReader(self, schema: StructType) -> StreamReader:
        return StreamReader(self.options)

    def writer(self, schema: StructType, overwrite: bool) -> BatchWriter:
        _append_only(overwrite)
        return BatchWriter(self.options, schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> StreamWriter:
        _append_only(overwrite)
        return StreamWriter(self.options, schema)


def _append_only(overwrite: bool) -> None:
    if overwrite:
        raise OptionError("the appliance sink appends; save mode overwrite is not supported "
                          "(as with Spark's Kafka sink)")


def register(spark) -> None:
    """Make ``format("appliance")`` available in ``spark`` (a SparkSession)."""
    spark.dataSource.register(ApplianceDataSource)
