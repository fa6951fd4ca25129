"""Reading the appliance into Spark, batch and streaming, read_committed by default.

Runs in two places: planning (``partitions``, the offsets of a micro-batch) in the driver's
Python workers, and ``read`` in the executors' Python workers, one task per topic-partition range.
Owns no state across calls: a streaming query's offsets live in Spark's checkpoint, as
``{"topic": {"partition": offset}}`` (the form Spark's Kafka source writes).

An offset range ``[start, end)`` is read with the appliance client's consumer until its position
reaches ``end``. Under read_committed ``end`` is at most the last stable offset, and the
consumer's position moves past transaction markers and aborted batches, so the gaps those leave
in the offsets never look like lost data. Data is lost only when retention deleted offsets the
range still needed (the log start offset passed ``start``): with ``failOnDataLoss`` (the default)
that is an error naming the partition and the offsets, otherwise the range starts at the log
start offset and a warning says what was skipped.

Rows are handed to Spark as Arrow record batches in the row schema of Spark's Kafka source, decoded
from the fetched record batches a column at a time (``appliance.spark.decode``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping
from typing import Any

from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, SupportsTriggerAvailableNow
from pyspark.sql.types import (ArrayType, BinaryType, IntegerType, LongType, StringType, StructField,
                               StructType, TimestampType)

from appliance.client import Consumer
from appliance.client.errors import ErrorCode, KafkaError
from appliance.spark import decode
from appliance.spark.options import (EARLIEST, LATEST, OptionError, TopicPartition, TopicSelector,
                                     client_config, flag, from_json_offsets, offsets_spec,
                                     positive_int, text, to_json_offsets)

log = logging.getLogger("appliance.spark")

ARROW_BATCH_ROWS = 8192
HEADERS_TYPE = ArrayType(StructType([StructField("key", StringType()), StructField("value", BinaryType())]))


def source_schema(include_headers: bool) -> StructType:
    """The columns of Spark's Kafka source (``headers`` only with ``includeHeaders``, as there)."""
    fields = [StructField("key", BinaryType()), StructField("value", BinaryType()),
              StructField("topic", StringType()), StructField("partition", IntegerType()),
              StructField("offset", LongType()), StructField("timestamp", TimestampType()),
              StructField("timestampType", IntegerType())]
    if include_headers:
        fields.append(StructField("headers", HEADERS_TYPE))
    return StructType(fields)


class DataLossError(RuntimeError):
    """Offsets a query needs were deleted by retention (``failOnDataLoss=true``)."""


class OffsetRange(InputPartition):
    """One task's work: offsets ``[start, end)`` of one partition."""

    def __init__(self, topic: str, partition: int, start: int, end: int) -> None:
        super().__init__((topic, partition, start, end))
        self.topic, self.partition, self.start, self.end = topic, partition, start, end

    def __eq__(self, other: object) -> bool:
        return isinstance(other, OffsetRange) and self.value == other.value

    def __hash__(self) -> int:
        return hash(self.value)


class _Settings:
    """What every reader takes from the options (checked on the driver)."""

    def __init__(self, options: Mapping[str, Any]) -> None:
        self.options = dict(options)
        cfg = client_config(options, "consumer")
        cfg.setdefault("isolation_level", "read_committed")
        cfg["allow_auto_create_topics"] = False
        cfg["auto_offset_reset"] = "none"           # an out-of-range position is ours to judge
        cfg.setdefault("client_id", "appliance-spark-reader")
        self.consumer_config = cfg
        self.selector = TopicSelector(options)
        self.fail_on_data_loss = flag(options, "failOnDataLoss", True)
        self.include_headers = flag(options, "includeHeaders", False)
        self.poll_timeout_ms = positive_int(options, "kafkaConsumer.pollTimeoutMs") or 120000

    def consumer(self) -> Consumer:
        return Consumer(self.consumer_config)


def _resolve(consumer: Consumer, tps: list[TopicPartition], spec: int | dict[TopicPartition, int],
             default: int) -> dict[TopicPartition, int]:
    """Concrete offsets for ``tps`` from an offsets spec (EARLIEST, LATEST or a map whose values
    may themselves be -2 / -1; partitions the map leaves out take ``default``)."""
    want: dict[TopicPartition, int] = {}
    for tp in tps:
        want[tp] = spec if isinstance(spec, int) else spec.get(tp, default)
    out = {tp: off for tp, off in want.items() if off >= 0}
    earliest = [tp for tp, off in want.items() if off == EARLIEST]
    latest = [tp for tp, off in want.items() if off == LATEST]
    if earliest:
        out.update(consumer.beginning_offsets(earliest))
    if latest:
        out.update(consumer.end_offsets(latest))
    return out


def _check_loss(settings: _Settings, consumer: Consumer, ranges: list[OffsetRange]) -> list[OffsetRange]:
    """Ranges whose start retention has deleted: an error, or moved up to the log start."""
    if not ranges:
        return ranges
    starts = consumer.beginning_offsets([(r.topic, r.partition) for r in ranges])
    out = []
    for r in ranges:
        first = starts[(r.topic, r.partition)]
        if r.start >= first:
            out.append(r)
            continue
        _lost(settings, r.topic, r.partition, r.start, first)
        if first < r.end:
            out.append(OffsetRange(r.topic, r.partition, first, r.end))
    return out


def _lost(settings: _Settings, topic: str, partition: int, wanted: int, first: int) -> None:
    msg = (f"{topic}-{partition}: offsets {wanted}..{first - 1} were deleted by retention before "
           f"they were read (the log now starts at {first})")
    if settings.fail_on_data_loss:
        raise DataLossError(msg + ". Set the option failOnDataLoss=false to skip them.")
    log.warning("%s; skipped (failOnDataLoss=false)", msg)


def read_range(settings: _Settings, r: OffsetRange) -> Iterator[Any]:
    """The rows of ``r`` as pyarrow RecordBatches (yields nothing for an empty range): the
    consumer's kept record batches, decoded column-wise (``appliance.spark.decode``)."""
    if not isinstance(r, OffsetRange):
        # Nothing to read (an empty or missing topic): partitions() returned no range, and
        # Spark hands read() one plain InputPartition of its own instead.
        return
    import numpy as np
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    schema = to_arrow_schema(source_schema(settings.include_headers), timezone="UTC")
    tp = (r.topic, r.partition)
    topic = pa.scalar(r.topic, pa.string())

    def arrow(cols: decode.Columns):
        n = len(cols)
        arrays = [cols.key, cols.value, pa.repeat(topic, n),
                  pa.array(np.full(n, r.partition, np.int32)), pa.array(cols.offset),
                  pa.array(cols.timestamp * 1000).cast(schema.field("timestamp").type),
                  pa.array(cols.timestamp_type)]
        if settings.include_headers:
            arrays.append(pa.array([[{"key": k, "value": v} for k, v in hs] if hs else None
                                    for hs in cols.headers], type=schema.field("headers").type))
        batch = pa.RecordBatch.from_arrays(arrays, schema=schema)
        for start in range(0, n, ARROW_BATCH_ROWS):
            yield batch.slice(start, ARROW_BATCH_ROWS)

    with settings.consumer() as consumer:
        consumer.assign([tp])
        consumer.seek(tp, r.start)
        last_progress = time.monotonic()
        position = r.start
        while position < r.end:
            try:
                fetched = consumer.poll_batches(timeout_ms=1000)
            except KafkaError as exc:
                if exc.code != ErrorCode.offset_out_of_range:
                    raise
                first = consumer.beginning_offsets([tp])[tp]
                if first <= position:
                    raise
                _lost(settings, r.topic, r.partition, position, first)
                if first >= r.end:
                    break
                consumer.seek(tp, first)
                position = first
                continue
            for _tp, batches in fetched:
                cols = decode.decode_batches(batches, r.end, headers=settings.include_headers)
                if len(cols):
                    yield from arrow(cols)
            new_position = consumer.position(tp)
            if new_position > position:
                position = new_position
                last_progress = time.monotonic()
            elif time.monotonic() - last_progress > settings.poll_timeout_ms / 1000.0:
                raise TimeoutError(f"{r.topic}-{r.partition}: no progress from offset {position} "
                                   f"towards {r.end} in {settings.poll_timeout_ms} ms")


class BatchReader(DataSourceReader):
    """``spark.read.format("appliance")``: from ``startingOffsets`` (default earliest) to
    ``endingOffsets`` (default latest: the last stable offset under read_committed), both fixed
    when the query is planned."""

    def __init__(self, options: Mapping[str, Any]) -> None:
        self.settings = _Settings(options)
        self.starting = offsets_spec(options, "startingOffsets", "earliest")
        self.ending = offsets_spec(options, "endingOffsets", "latest")
        if self.starting == LATEST:
            raise OptionError("option 'startingOffsets' cannot be latest for a batch query")
        if self.ending == EARLIEST:
            raise OptionError("option 'endingOffsets' cannot be earliest for a batch query")

    def partitions(self) -> list[OffsetRange]:
        with self.settings.consumer() as consumer:
            tps = self.settings.selector.partitions(consumer.cluster)
            starts = _resolve(consumer, tps, self.starting, EARLIEST)
            ends = _resolve(consumer, tps, self.ending, LATEST)
            ranges = [OffsetRange(t, p, starts[(t, p)], ends[(t, p)]) for t, p in tps
                      if starts[(t, p)] < ends[(t, p)]]
            return _check_loss(self.settings, consumer, ranges)

    def read(self, partition: OffsetRange) -> Iterator[Any]:
        yield from read_range(self.settings, partition)


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("appliance")``: each micro-batch reads up to the last stable
    offset of every selected partition (new partitions and matching topics join from their
    earliest offset), at most ``maxOffsetsPerTrigger`` offsets in all, shared out in proportion
    to each partition's backlog as Spark's Kafka source does."""

    def __init__(self, options: Mapping[str, Any]) -> None:
        self.settings = _Settings(options)
        self.starting = offsets_spec(options, "startingOffsets", "latest")
        if text(options, "endingOffsets") is not None:
            raise OptionError("option 'endingOffsets' is for batch queries only")
        self.max_offsets = positive_int(options, "maxOffsetsPerTrigger")
        self._consumer: Consumer | None = None
        self._available_now: dict[TopicPartition, int] | None = None

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_consumer"] = None             # sockets stay in the driver's worker
        return state

    @property
    def consumer(self) -> Consumer:
        if self._consumer is None:
            self._consumer = self.settings.consumer()
        return self._consumer

    def initialOffset(self) -> dict:
        tps = self.settings.selector.partitions(self.consumer.cluster)
        return to_json_offsets(_resolve(self.consumer, tps, self.starting, LATEST))

    def _latest(self) -> dict[TopicPartition, int]:
        tps = self.settings.selector.partitions(self.consumer.cluster)
        return self.consumer.end_offsets(tps) if tps else {}

    def getDefaultReadLimit(self):
        return ReadMaxRows(self.max_offsets) if self.max_offsets else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now = self._latest()

    def _begin(self, start: dict, tps) -> dict[TopicPartition, int]:
        """The start offsets of a micro-batch: the checkpoint's, and for partitions new since
        (a topic created or grown) their earliest offset."""
        begin = from_json_offsets(start)
        new = [tp for tp in tps if tp not in begin]
        if new:
            begin.update(self.consumer.beginning_offsets(new))
        return begin

    def latestOffset(self, start: dict, limit) -> dict:
        latest = self._latest() if self._available_now is None else dict(self._available_now)
        begin = self._begin(start, latest)
        end = {tp: max(off, begin[tp]) for tp, off in latest.items()}
        if isinstance(limit, ReadMaxRows):
            end = _rate_limit(begin, end, limit.max_rows)
        # A partition that vanished (topic deleted) keeps its last offset.
        for tp, off in begin.items():
            end.setdefault(tp, off)
        return to_json_offsets(end)

    def reportLatestOffset(self) -> dict | None:
        return to_json_offsets(self._latest())

    def partitions(self, start: dict, end: dict) -> list[OffsetRange]:
        stop = from_json_offsets(end)
        begin = self._begin(start, stop)
        ranges = [OffsetRange(t, p, begin[(t, p)], off) for (t, p), off in sorted(stop.items())
                  if begin[(t, p)] < off]
        return _check_loss(self.settings, self.consumer, ranges)

    def read(self, partition: OffsetRange) -> Iterator[Any]:
        yield from read_range(self.settings, partition)

    def commit(self, end: dict) -> None:
        """Offsets live in Spark's checkpoint: nothing to commit to the appliance."""

    def stop(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None


def _rate_limit(begin: dict[TopicPartition, int], end: dict[TopicPartition, int],
                limit: int) -> dict[TopicPartition, int]:
    """At most ``limit`` offsets in all, each partition's share in proportion to its backlog
    (a share below one offset is rounded up, so that every partition moves)."""
    sizes = {tp: end[tp] - begin.get(tp, end[tp]) for tp in end}
    total = sum(s for s in sizes.values() if s > 0)
    if total <= limit:
        return dict(end)
    out = {}
    for tp, off in end.items():
        size = sizes[tp]
        if size <= 0:
            out[tp] = off
            continue
        share = limit * size / total
        step = int(share) if share >= 1 else 1
        out[tp] = min(off, begin[tp] + step)
    return out
