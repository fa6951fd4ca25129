"""``ApplianceDataSource``: the class Spark instantiates for ``format("appliance")``.

Owns nothing; Spark creates it in its Python workers (the driver's, to plan; the executors', to
read and write) and asks it for a reader or a writer (``appliance.spark.reader`` /
``appliance.spark.writer``).
"""

from __future__ import annotations

from pyspark.sql.datasource import DataSource
from pyspark.sql.types import StructType

from appliance.spark.options import OptionError, flag
from appliance.spark.reader import BatchReader, StreamReader, source_schema
from appliance.spark.writer import BatchWriter, StreamWriter


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
