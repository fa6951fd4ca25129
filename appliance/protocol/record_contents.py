"""The records inside a v2 batch: bounded decompression and Kafka's per-record rules.

Owns nothing and does no I/O; imported by frontends (``validate_records``, after
``records.validate_batch`` has checked the header, on every produced batch), partition writers
(``records_ok``, by recovery on the segments it scans), fetchers (``offsets_and_timestamps``,
ListOffsets by timestamp) and the log cleaner (``stored_records``).

What Kafka's LogValidator checks on the records of a produced batch, all done here before the
batch is handed to its writer, so that nothing a consumer cannot read is ever stored:

* framing (DefaultRecord.readFrom, DefaultRecordBatch's iterators): every record's length,
  varints, key, value and header sizes inside the record and the batch; exactly
  ``records_count`` records and no bytes after them. Kafka throws InvalidRecordException:
  INVALID_RECORD, without per-record errors.
* compressed batches: the codec's stream must decode. Kafka fails there with a plain
  KafkaException (UNKNOWN_SERVER_ERROR); we answer CORRUPT_MESSAGE, which tells the producer what
  is wrong. Kafka never bounds the decompressed size; we do (``max_bytes``, a multiple of
  message.max.bytes: ``[log] decompressed_batch_max_factor``), so that a small batch cannot make
  a frontend, writer or fetcher inflate gigabytes: INVALID_RECORD beyond it.
* per record (LogValidator.validateRecord), each failure a per-record error ``(batch_index,
  message)`` that Produce v8+ returns in ``record_errors``, all records checked:
  - offset deltas must be 0, 1, ..., n-1. Kafka rewrites (recompresses) a compressed batch whose
    inner offsets are off and keeps an uncompressed one's deltas as they are; we append batches
    as sent and never recompress, so we refuse them (INVALID_RECORD);
  - a record without a key on a compacted topic (INVALID_RECORD);
  - a CreateTime timestamp outside [now - message.timestamp.before.max.ms, now +
    message.timestamp.after.max.ms] (INVALID_TIMESTAMP).
  The batch's error is INVALID_TIMESTAMP if any record's is, else INVALID_RECORD, with Kafka's
  messages (LogValidator.processRecordErrors).

The hot path (every produced batch) walks the records in C (``_recwalk.c``, built with the
package by setup.py): it allocates nothing and costs a few nanoseconds a record, where aiokafka's
Cython parser, the walk before it, made a Python record object per record (0.15-0.28 us a
record: the largest item of the frontend's cost per record at 100 B). Without a C compiler at
install time the extension is missing and aiokafka's parser takes its place. Either fast walk only
says "valid" or "not": when it refuses a batch, or none is importable, the Python walk below
decides and words the error, so the rules and messages are ours and Kafka's, written once.
"""

from __future__ import annotations

import zlib
from operator import attrgetter
from typing import Iterator

import cramjam
import zstandard

from appliance.errors import CorruptRecord, ErrorCode, InvalidRecord, KafkaError
from appliance.protocol.records import (_CODEC_NAMES, _XERIAL_MAGIC, COMPRESSION_GZIP,
                                        COMPRESSION_LZ4, COMPRESSION_NONE, COMPRESSION_SNAPPY,
                                        COMPRESSION_ZSTD, HEADER_SIZE, LOG_OVERHEAD, BatchHeader, _i,
                                        read_header, xerial_blocks)

try:   # built by setup.py where a C compiler is at hand
    from appliance.protocol._recwalk import records_ok as _native_ok
except ImportError:    # pragma: no cover - an install without a compiler
    _native_ok = None
try:   # the Cython build only; its pure-Python fallback is slower than our own walk
    from aiokafka.record._crecords.default_records import DefaultRecordBatch as _FastBatch
except ImportError:    # pragma: no cover - depends on the platform's wheels
    _FastBatch = None

__all__ = ["RecordValidationError", "NO_TIMESTAMP_LIMIT", "DEFAULT_DECOMPRESSED_FACTOR", "decompress_bounded",
           "validate_records", "records_ok", "offsets_and_timestamps", "stored_records"]

# Kafka's defaults for message.timestamp.before.max.ms / after.max.ms: no limit.
NO_TIMESTAMP_LIMIT = (1 << 63) - 1
DEFAULT_DECOMPRESSED_FACTOR = 64
_CHUNK = 256 * 1024
_NO_TIMESTAMP = -1
_offset = attrgetter("offset")
_timestamp = attrgetter("timestamp")
_key = attrgetter("key")


class RecordValidationError(KafkaError):
    """Kafka's RecordValidationException: the batch's error with its per-record errors
    ``[(batch_index, message)]`` (Produce v8+ ``record_errors``)."""

    def __init__(self, code: ErrorCode, message: str, record_errors: list[tuple[int, str]]) -> None:
        super().__init__(code, message)
        self.record_errors = record_errors


# --------------------------------------------------------------------------------------------
# Bounded, streaming decompression
# --------------------------------------------------------------------------------------------

def _too_big(codec: int, max_bytes: int) -> InvalidRecord:
    return InvalidRecord(f"{_CODEC_NAMES[codec]} record data decompresses to more than "
                         f"{max_bytes} bytes, the limit for one record batch")


def _gzip_chunks(data: bytes, max_bytes: int) -> Iterator[bytes]:
    # Java's GZIPInputStream reads concatenated members and ignores bytes after the last one
    # that do not start another member.
    total = 0
    d = zlib.decompressobj(31)
    buf = data
    while True:
        out = d.decompress(buf, _CHUNK)
        buf = d.unconsumed_tail
        if out:
            total += len(out)
            if total > max_bytes:
                raise _too_big(COMPRESSION_GZIP, max_bytes)
            yield out
        if d.eof:
            rest = d.unused_data
            if rest[:2] != b"\x1f\x8b":
                return
            d, buf = zlib.decompressobj(31), rest
        elif not out and not buf:
            raise CorruptRecord("truncated gzip record data")


def _zstd_chunks(data: bytes, max_bytes: int) -> Iterator[bytes]:
    total = 0
    with zstandard.ZstdDecompressor().stream_reader(data, read_across_frames=True) as r:
        while True:
            out = r.read(_CHUNK)
            if not out:
                return
            total += len(out)
            if total > max_bytes:
                raise _too_big(COMPRESSION_ZSTD, max_bytes)
            yield out


def _snappy_chunks(data: bytes, max_bytes: int) -> Iterator[bytes]:
    # A snappy block starts with its decompressed length: checked before anything is inflated.
    sn = cramjam.snappy
    if data[:8] != _XERIAL_MAGIC:                  # librdkafka writes one plain snappy block
        if sn.decompress_raw_len(data) > max_bytes:
            raise _too_big(COMPRESSION_SNAPPY, max_bytes)
        yield bytes(sn.decompress_raw(data))
        return
    total = 0
    for block in xerial_blocks(data):
        total += sn.decompress_raw_len(block)
        if total > max_bytes:
            raise _too_big(COMPRESSION_SNAPPY, max_bytes)
        yield bytes(sn.decompress_raw(block))


_LZ4_BLOCK_MAX = {4: 64 << 10, 5: 256 << 10, 6: 1 << 20, 7: 4 << 20}


def _lz4_frames(data: bytes) -> Iterator[tuple[int, bool, bool, memoryview]]:
    """``(block_max, independent, stored, block)`` of each data block of a sequence of LZ4
    frames (skippable frames skipped), from the frame and block headers alone."""
    mv = memoryview(data)
    n, pos = len(data), 0
    while pos < n:
        if pos + 4 > n:
            raise CorruptRecord("truncated lz4 frame header")
        magic = int.from_bytes(data[pos:pos + 4], "little")
        if magic & 0xFFFFFFF0 == 0x184D2A50:       # skippable frame
            if pos + 8 > n:
                raise CorruptRecord("truncated lz4 skippable frame")
            pos += 8 + int.from_bytes(data[pos + 4:pos + 8], "little")
            continue
        if magic != 0x184D2204 or pos + 7 > n:
            raise CorruptRecord("bad lz4 frame header")
        flg, bd = data[pos + 4], data[pos + 5]
        block_max = _LZ4_BLOCK_MAX.get((bd >> 4) & 7)
        if flg >> 6 != 1 or block_max is None:
            raise CorruptRecord("bad lz4 frame descriptor")
        independent = bool(flg & 0x20)
        pos += 7 + (8 if flg & 0x08 else 0) + (4 if flg & 0x01 else 0)
        block_checksum = 4 if flg & 0x10 else 0
        while True:
            if pos + 4 > n:
                raise CorruptRecord("truncated lz4 block header")
            word = int.from_bytes(data[pos:pos + 4], "little")
            pos += 4
            if word == 0:                          # end mark
                pos += 4 if flg & 0x04 else 0      # content checksum
                break
            size = word & 0x7FFFFFFF
            if pos + size > n or size > block_max:
                raise CorruptRecord("truncated or oversized lz4 block")
            yield block_max, independent, bool(word & 0x80000000), mv[pos:pos + size]
            pos += size + block_checksum


def _lz4_chunks(data: bytes, max_bytes: int) -> Iterator[bytes]:
    blocks = list(_lz4_frames(data))
    if all(independent for _, independent, _, _ in blocks):
        # Kafka's and librdkafka's framing: every block decodes alone, each straight into its
        # place in one buffer (a copy per block cost 20x the decoding: 2.3 ms for 1 MB of
        # records). The buffer never exceeds max_bytes plus one block: past max_bytes we stop.
        room = sum(len(b) if stored else block_max for block_max, _, stored, b in blocks)
        out = bytearray(min(room, max_bytes + max((b for b, _, _, _ in blocks), default=0)))
        view = memoryview(out)
        pos = 0
        try:
            for block_max, _, stored, block in blocks:
                if stored:
                    k = len(block)
                    view[pos:pos + k] = block
                else:
                    k = cramjam.lz4.decompress_block_into(block, view[pos:pos + block_max])
                pos += k
                if pos > max_bytes:
                    raise _too_big(COMPRESSION_LZ4, max_bytes)
        finally:
            view.release()
        del out[pos:]
        yield out
        return
    # Linked blocks reach into the previous 64 KiB, so such a frame decodes as a whole: allowed
    # only when the headers bound it (each block at most its frame's maximum block size).
    if sum(len(b) if stored else block_max for block_max, _, stored, b in blocks) > max_bytes:
        raise _too_big(COMPRESSION_LZ4, max_bytes)
    yield bytes(cramjam.lz4.decompress(data))


_CHUNKERS = {COMPRESSION_GZIP: _gzip_chunks, COMPRESSION_SNAPPY: _snappy_chunks,
             COMPRESSION_LZ4: _lz4_chunks, COMPRESSION_ZSTD: _zstd_chunks}


def decompress_bounded(codec: int, data, max_bytes: int) -> bytes:
    """Decompress a batch's record data, refusing (INVALID_RECORD) as soon as more than
    ``max_bytes`` come out; undecodable data is CORRUPT_MESSAGE. Never allocates more than
    ``max_bytes`` plus one chunk."""
    if codec == COMPRESSION_NONE:
        return bytes(data)
    chunker = _CHUNKERS.get(codec)
    if chunker is None:
        raise CorruptRecord(f"unknown compression codec {codec}")
    try:
        # Each chunker checks the bound as it goes; one join copies the chunks once (a growing
        # bytearray and a bytes() of it were two copies of every byte).
        chunks = list(chunker(bytes(data), max_bytes))
    except KafkaError:
        raise
    except Exception as e:  # every codec library has its own error type
        raise CorruptRecord(f"failed to decompress {_CODEC_NAMES[codec]} record data: {e}") from None
    return b"".join(chunks)


# --------------------------------------------------------------------------------------------
# The Python walk: Kafka's DefaultRecord.readFrom, without building records
# --------------------------------------------------------------------------------------------

def _structure(detail: str) -> InvalidRecord:
    return InvalidRecord(f"Found invalid record structure: {detail}")


def _varint(data, pos: int, max_len: int) -> tuple[int, int]:
    """A zig-zag varint of at most ``max_len`` bytes (5 for int32, 10 for int64, as Kafka's
    ByteUtils.readVarint / readVarlong)."""
    result = shift = 0
    n = len(data)
    for _ in range(max_len):
        if pos >= n:
            raise _structure("premature end of record data")
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7
    raise _structure("varint is too long")


def _walk(data, count: int) -> Iterator[tuple[int, int, bool]]:
    """``(timestamp_delta, offset_delta, has_key)`` of each record of a batch's (decompressed)
    record data, raising INVALID_RECORD with Kafka's messages where its framing is broken."""
    n = len(data)
    pos = 0
    for _ in range(count):
        if pos >= n:
            raise InvalidRecord("Incorrect declared batch size, premature EOF reached")
        length, pos = _varint(data, pos, 5)
        if n - pos < length:
            raise InvalidRecord(f"Invalid record size: expected {length} bytes of record payload, but "
                                f"instead the buffer has only {n - pos} remaining bytes.")
        start = pos
        if pos >= n:
            raise _structure("premature end of record data")
        pos += 1                                          # attributes (unused in v2)
        ts_delta, pos = _varint(data, pos, 10)
        offset_delta, pos = _varint(data, pos, 5)
        key_len, pos = _varint(data, pos, 5)
        if key_len > 0:
            pos += key_len
        value_len, pos = _varint(data, pos, 5)
        if value_len > 0:
            pos += value_len
        if pos > n:
            raise _structure("key or value runs past the end of the record data")
        headers, pos = _varint(data, pos, 5)
        if headers < 0:
            raise InvalidRecord(f"Found invalid number of record headers {headers}")
        if headers > n - pos:
            raise InvalidRecord(f"Found invalid number of record headers. {headers} is larger than "
                                f"the remaining size of the buffer")
        for _h in range(headers):
            hk, pos = _varint(data, pos, 5)
            if hk < 0:
                raise InvalidRecord(f"Invalid negative header key size {hk}")
            pos += hk
            hv, pos = _varint(data, pos, 5)
            if hv > 0:
                pos += hv
            if pos > n:
                raise _structure("header runs past the end of the record data")
        if pos - start != length:
            raise InvalidRecord(f"Invalid record size: expected to read {length} bytes in record "
                                f"payload, but instead read {pos - start}")
        yield ts_delta, offset_delta, key_len >= 0
    if pos != n:
        raise InvalidRecord("Incorrect declared batch size, records still remaining in file")


# --------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------

def _record_data(mv: memoryview, h: BatchHeader, max_bytes: int):
    data = mv[HEADER_SIZE:h.batch_length + LOG_OVERHEAD]
    return decompress_bounded(h.compression, data, max_bytes) if h.compression else data


def _uncompressed_batch(mv: memoryview, h: BatchHeader, data):
    """The batch with its records as ``data`` (inflated when ``h`` says compressed): a parser
    that would inflate the records itself, unbounded, is handed them behind an uncompressed copy
    of the header instead (its length fixed; no parser here checks the CRC)."""
    if not h.compression:
        return mv[:h.batch_length + LOG_OVERHEAD]
    head = bytearray(mv[:HEADER_SIZE])
    head[22] &= 0xF8
    _i.pack_into(head, 8, HEADER_SIZE - LOG_OVERHEAD + len(data))
    return bytes(head) + data


def _fast_ok(mv: memoryview, h: BatchHeader, data, *, now_ms: int, before_ms: int, after_ms: int,
             compacted: bool) -> bool:
    """True when a fast walk (ours in C, else aiokafka's parser) vouches that every record is
    framed right and keeps every per-record rule; False leaves the verdict to the Python walk."""
    if _native_ok is not None:
        try:
            return _native_ok(data, h.records_count, compacted, h.timestamp_type == 0,
                              h.base_timestamp, now_ms, before_ms, after_ms)
        except OverflowError:       # a limit beyond int64: the Python walk has no bounds
            return False
    if _FastBatch is None:
        return False
    batch = _uncompressed_batch(mv, h, data)
    check_ts = h.timestamp_type == 0 and (before_ms < NO_TIMESTAMP_LIMIT or after_ms < NO_TIMESTAMP_LIMIT)
    base = h.base_offset
    try:
        if not (check_ts or compacted):
            # The common case: only offsets are needed, each record freed as soon as it is read.
            return list(map(_offset, _FastBatch(batch))) == list(range(base, base + h.records_count))
        recs = list(_FastBatch(batch))
    except Exception:
        return False
    if list(map(_offset, recs)) != list(range(base, base + h.records_count)):
        return False
    if compacted and None in map(_key, recs):
        return False
    if check_ts:
        stamps = [t for t in map(_timestamp, recs) if t != _NO_TIMESTAMP]
        if stamps and (now_ms - min(stamps) > before_ms or max(stamps) - now_ms > after_ms):
            return False
    return True


def validate_records(buf, h: BatchHeader | None = None, *, max_bytes: int, now_ms: int = 0,
                     before_ms: int = NO_TIMESTAMP_LIMIT, after_ms: int = NO_TIMESTAMP_LIMIT,
                     compacted: bool = False, topic_partition: str = "") -> None:
    """Kafka's per-record checks of one produced batch whose header ``records.validate_batch``
    has accepted (see the module docstring). Raises CorruptRecord, InvalidRecord or
    RecordValidationError; returns None when the batch may be stored."""
    mv = memoryview(buf)
    if h is None:
        h = read_header(mv, 0)
    data = _record_data(mv, h, max_bytes)
    kw = dict(now_ms=now_ms, before_ms=before_ms, after_ms=after_ms, compacted=compacted)
    if _fast_ok(mv, h, data, **kw):
        return
    _validate_slow(h, data, topic_partition=topic_partition, **kw)


def _validate_slow(h: BatchHeader, data, *, now_ms: int, before_ms: int, after_ms: int,
                   compacted: bool, topic_partition: str) -> None:
    errors: list[tuple[int, str]] = []
    any_timestamp = False
    create_time = h.timestamp_type == 0
    base_ts = h.base_timestamp
    tp = f" in topic partition {topic_partition}" if topic_partition else ""
    for index, (ts_delta, offset_delta, has_key) in enumerate(_walk(data, h.records_count)):
        if offset_delta != index:
            errors.append((index, f"Record at index {index} has offset delta {offset_delta}; the "
                                  f"records of a batch must have offset deltas 0, 1, 2, ...{tp}"))
        elif compacted and not has_key:
            errors.append((index, f"Compacted topic cannot accept message without key{tp}"))
        elif create_time:
            ts = base_ts + ts_delta
            if ts != _NO_TIMESTAMP and (now_ms - ts > before_ms or ts - now_ms > after_ms):
                any_timestamp = True
                lo = now_ms - before_ms if before_ms < NO_TIMESTAMP_LIMIT else -NO_TIMESTAMP_LIMIT - 1
                hi = now_ms + after_ms if after_ms < NO_TIMESTAMP_LIMIT else NO_TIMESTAMP_LIMIT
                errors.append((index, f"Timestamp {ts} of message with offset "
                                      f"{h.base_offset + offset_delta} is out of range. The timestamp "
                                      f"should be within [{lo}, {hi}]"))
    if not errors:
        return
    if any_timestamp:
        raise RecordValidationError(ErrorCode.invalid_timestamp,
                                    "One or more records have been rejected due to invalid timestamp",
                                    errors)
    shown = ", ".join(f"RecordError(batchIndex={i}, message='{m}')" for i, m in errors[:3])
    raise RecordValidationError(ErrorCode.invalid_record,
                                f"One or more records have been rejected due to {len(errors)} record "
                                f"errors in total, and only showing the first three errors at most: "
                                f"[{shown}]", errors)


def records_ok(buf, pos: int, h: BatchHeader, *, max_bytes: int) -> bool:
    """Recovery's check of a stored batch (CRC already verified): its records can be read
    (framing, decompression within ``max_bytes``, offset deltas 0..n-1). Control batches and
    broker-stamped timestamps are legitimate here, so only the framing rules apply."""
    mv = memoryview(buf)[pos:pos + h.batch_length + LOG_OVERHEAD]
    try:
        data = _record_data(mv, h, max_bytes)
        if _fast_ok(mv, h, data, now_ms=0, before_ms=NO_TIMESTAMP_LIMIT, after_ms=NO_TIMESTAMP_LIMIT,
                    compacted=False):
            return True
        _validate_slow(h, data, now_ms=0, before_ms=NO_TIMESTAMP_LIMIT, after_ms=NO_TIMESTAMP_LIMIT,
                       compacted=False, topic_partition="")
    except KafkaError:
        return False
    finally:
        mv.release()
    return True


def offsets_and_timestamps(batch, *, max_bytes: int) -> Iterator[tuple[int, int]]:
    """``(offset, timestamp)`` of each record of one stored batch, decompressing within
    ``max_bytes`` and never building keys, values or headers (ListOffsets by timestamp). In a
    LogAppendTime batch every record's timestamp is the batch's max timestamp (as in Kafka)."""
    mv = memoryview(batch)
    h = read_header(mv, 0)
    data = _record_data(mv, h, max_bytes)
    base, base_ts = h.base_offset, h.base_timestamp
    log_append = h.timestamp_type == 1
    for ts_delta, offset_delta, _key in _walk(data, h.records_count):
        yield base + offset_delta, (h.max_timestamp if log_append else base_ts + ts_delta)



def stored_records(batch, h: BatchHeader | None = None, *, max_bytes: int) -> list:
    """Every record of one stored batch, compressed data inflated within ``max_bytes``: the log
    cleaner's read of a batch whose records it filters. Each record has ``offset``,
    ``timestamp``, ``key``, ``value`` and ``headers`` (aiokafka's record objects when its parser
    takes the batch - it then sees the inflated records behind an uncompressed copy of the
    header, as in ``_fast_ok`` - else ``records.DecodedRecord``)."""
    from appliance.protocol.records import decode_records
    mv = memoryview(batch)
    if h is None:
        h = read_header(mv, 0)
    plain = _uncompressed_batch(mv, h, _record_data(mv, h, max_bytes))
    if _FastBatch is not None:
        try:
            return list(_FastBatch(plain))
        except Exception:
            pass           # what the parser refuses, ours words (or refuses) below
    return decode_records(plain)
