"""RecordBatch v2 (magic 2): header access, produce-time validation, building and decoding.

Owns nothing and does no I/O; every process imports it. Frontends call ``validate_batch`` on each
partition's bytes of a Produce request; partition writers call ``set_base_offset`` and
``stamp_log_append_time`` on the batch before copying it into a segment; recovery calls
``scan_valid``; the coordinator and tests build batches with ``build_batch`` /
``build_control_batch``; ``decode_records`` is the slow path (ListOffsets by timestamp, tests,
internal logs). The hot paths work per batch: one ``struct.unpack_from`` for the header, one CRC-32C
pass over the bytes, never a loop over records.

Layout (all integers big-endian; facts from Kafka's DefaultRecordBatch)::

    pos  size  field                     covered by CRC?
    ---  ----  ------------------------  ---------------------------------------------
      0     8  base_offset       int64   no  - assigned by the broker (set_base_offset)
      8     4  batch_length      int32   no  - bytes after this field (size = length + 12)
     12     4  partition_leader_epoch    no  - assigned by the broker
     16     1  magic             int8    no  - must be 2
     17     4  crc               uint32  -   - CRC-32C (Castagnoli) of bytes 21 .. end
     21     2  attributes        int16   yes  bits 0-2 codec, 3 timestamp type,
                                              4 transactional, 5 control, 6 delete horizon
     23     4  last_offset_delta int32   yes  last offset = base_offset + delta
     27     8  base_timestamp    int64   yes  record timestamps are deltas from it
     35     8  max_timestamp     int64   yes  the broker's clock for LogAppendTime batches
     43     8  producer_id       int64   yes  -1 = none
     51     2  producer_epoch    int16   yes
     53     4  base_sequence     int32   yes  -1 = none
     57     4  records_count     int32   yes
     61     .  records                   yes  compressed as a whole when codec != 0

    Record := length varint, attributes int8, timestamp_delta varlong, offset_delta varint,
              key_length varint (-1 = null), key, value_length varint (-1 = null), value,
              header_count varint, [header_key_length varint, header_key utf-8,
              header_value_length varint (-1 = null), header_value]
    (varints are zig-zag signed, protobuf style.)

    Control record (batch attributes transactional + control, one record):
        key   = version int16 (0), type int16 (ABORT = 0, COMMIT = 1)
        value = version int16 (0), coordinator_epoch int32
"""

from __future__ import annotations

import gzip
import struct
import time
import zlib
from typing import Iterator, NamedTuple, Sequence

import cramjam
import zstandard
from crc32c import crc32c

from appliance.errors import CorruptRecord, ErrorCode, InvalidRecord, KafkaError
from appliance.protocol.primitives import uvarint

__all__ = [
    "HEADER_SIZE", "LOG_OVERHEAD", "MAGIC", "CRC_OFFSET", "ATTRIBUTES_OFFSET",
    "COMPRESSION_NONE", "COMPRESSION_GZIP", "COMPRESSION_SNAPPY", "COMPRESSION_LZ4",
    "COMPRESSION_ZSTD", "CONTROL_ABORT", "CONTROL_COMMIT",
    "BatchHeader", "Record", "DecodedRecord",
    "read_header", "validate_batch", "set_base_offset", "stamp_log_append_time",
    "iter_batch_headers", "scan_valid", "batch_crc_ok",
    "ATTR_DELETE_HORIZON", "build_batch", "build_batch_from_body", "build_control_batch",
    "build_retained_batch", "build_empty_batch", "decode_records", "parse_control_record",
    "compress", "decompress",
]

MAGIC = 2
LOG_OVERHEAD = 12            # base_offset + batch_length: the part before the length's count
HEADER_SIZE = 61             # Kafka's RECORD_BATCH_OVERHEAD
CRC_OFFSET = 17
ATTRIBUTES_OFFSET = 21
MAX_TIMESTAMP_OFFSET = 35
# Kafka's ByteBufferLogInputStream refuses a length below the legacy v0 record overhead (14)
# before it even looks at the magic byte.
MIN_LENGTH_FIELD = 14
# The partition leader epoch every batch is stored with: this node leads every partition, from its
# creation on, in one leader epoch (Kafka's leader stamps its epoch into each batch it appends,
# KIP-101). Metadata, ListOffsets and OffsetForLeaderEpoch answer the same epoch, so consumers
# that validate their position after a restart (KIP-320) find it valid.
LEADER_EPOCH = 0

COMPRESSION_NONE, COMPRESSION_GZIP, COMPRESSION_SNAPPY, COMPRESSION_LZ4, COMPRESSION_ZSTD = range(5)
_CODEC_NAMES = ("none", "gzip", "snappy", "lz4", "zstd")

_ATTR_CODEC = 0x07
_ATTR_LOG_APPEND_TIME = 0x08
_ATTR_TRANSACTIONAL = 0x10
_ATTR_CONTROL = 0x20
# KIP-534: the base timestamp of a batch with this bit is its delete horizon, the time after which
# the cleaner may remove its tombstones or its transaction marker (set by the cleaner only).
ATTR_DELETE_HORIZON = 0x40

CONTROL_ABORT = 0            # wire values (ControlRecordType); the KIP text has them swapped
CONTROL_COMMIT = 1

_HEADER = struct.Struct(">qiibIhiqqqhii")
assert _HEADER.size == HEADER_SIZE
_unpack_header = _HEADER.unpack_from
_tuple_new = tuple.__new__
_Q = struct.Struct(">q")
_I = struct.Struct(">I")
_i = struct.Struct(">i")
_h = struct.Struct(">h")
_CRC_I = struct.Struct(">I")


class BatchHeader(NamedTuple):
    """The 61-byte v2 batch header, as read by one ``struct.unpack_from``."""

    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int

    @property
    def compression(self) -> int:
        return self.attributes & _ATTR_CODEC

    @property
    def timestamp_type(self) -> int:
        return 1 if self.attributes & _ATTR_LOG_APPEND_TIME else 0

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & _ATTR_TRANSACTIONAL)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & _ATTR_CONTROL)

    @property
    def delete_horizon_ms(self) -> int | None:
        """KIP-534: the batch's delete horizon (its base timestamp when the bit is set)."""
        return self.base_timestamp if self.attributes & ATTR_DELETE_HORIZON else None

    @property
    def size(self) -> int:
        return self.batch_length + LOG_OVERHEAD

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta


def read_header(buf, pos: int = 0) -> BatchHeader:
    """Unpack the header at ``pos`` (no checks; the caller knows 61 bytes are there)."""
    return _tuple_new(BatchHeader, _unpack_header(buf, pos))


def batch_crc_ok(buf, pos: int, size: int, stored_crc: int) -> bool:
    """True when the CRC-32C of bytes attributes..end of the batch at ``pos`` matches."""
    mv = memoryview(buf)
    return crc32c(mv[pos + ATTRIBUTES_OFFSET:pos + size]) == stored_crc


# --------------------------------------------------------------------------------------------
# Produce-time validation
# --------------------------------------------------------------------------------------------

def validate_batch(buf, max_batch_bytes: int, *, produce_version: int | None = None) -> BatchHeader:
    """Check the bytes of one Produce v3+ partition, which must hold exactly one v2 batch.

    Kafka's rules, applied in Kafka's order (ProduceRequest.validateRecords in KafkaApis, then
    UnifiedLog.analyzeAndValidateRecords, then LogValidator.validateBatch); per-record checks
    (timestamp range, compacted keys, declared vs actual record count) are not done here - they
    would need decompression and a loop over records:

    ====================================================  ============================  ===============================================
    condition                                             error code                    Kafka source
    ====================================================  ============================  ===============================================
    fewer than 12 bytes, or 12..16 bytes                  INVALID_RECORD (87)           ProduceRequest.validateRecords: no batch at all
    length field < 14                                     CORRUPT_MESSAGE (2)           ByteBufferLogInputStream.nextBatchSize
    magic < 0 or > 2                                      CORRUPT_MESSAGE (2)           ByteBufferLogInputStream.nextBatchSize
    length field claims more bytes than the buffer holds  INVALID_RECORD (87)           validateRecords: no complete batch
    magic 0 or 1                                          INVALID_RECORD (87)           validateRecords: v3+ requires magic 2
    a second complete batch after the first               INVALID_RECORD (87)           validateRecords: exactly one batch
    other bytes after the batch                           CORRUPT_MESSAGE (2)           (*) see below
    base_offset != 0                                      INVALID_RECORD (87)           UnifiedLog.analyzeAndValidateRecords
    size (length + 12) > max_batch_bytes                  MESSAGE_TOO_LARGE (10)        analyzeAndValidateRecords (RecordTooLarge)
    size < 61                                             CORRUPT_MESSAGE (2)           DefaultRecordBatch.isValid
    CRC-32C mismatch                                      CORRUPT_MESSAGE (2)           analyzeAndValidateRecords (batch.isValid)
    codec 5..7                                            UNSUPPORTED_COMPRESSION_TYPE  (*) Kafka fails with an internal error
    zstd and produce_version < 7                          UNSUPPORTED_COMPRESSION_TYPE  validateRecords
    last_offset_delta < 0                                 INVALID_RECORD (87)           LogValidator.validateBatch (offset range)
    records_count <= 0                                    INVALID_RECORD (87)           LogValidator.validateBatch (reported count)
    records_count != last_offset_delta + 1                INVALID_RECORD (87)           LogValidator.validateBatch (inconsistent)
    control bit set                                       INVALID_RECORD (87)           LogValidator.validateBatch (client control)
    producer_id >= 0 and base_sequence < 0                INVALID_RECORD (87)           LogValidator.validateBatch (invalid sequence)
    transactional bit and producer_id < 0                 INVALID_RECORD (87)           (*) ours
    LogAppendTime bit set by the client                   INVALID_TIMESTAMP (32)        (*) LogValidator.validateTimestamp, stricter
    ====================================================  ============================  ===============================================

    (*) Departures, all stricter than Kafka, because the writer appends the buffer as is:
    Kafka silently drops a torn partial batch after the first one (trimInvalidBytes), we refuse
    it; Kafka cannot interpret an unknown codec id and answers UNKNOWN_SERVER_ERROR; a
    transactional batch without a producer id would be unmatchable by any marker; Kafka refuses
    the LogAppendTime bit from a client only on LogAppendTime topics (and on CreateTime topics
    rewrites the bit and the max timestamp, a per-record pass we do not make), we refuse it
    everywhere - no client sets it.
    """
    mv = memoryview(buf)
    n = mv.nbytes
    if n < 17:
        if n >= 12 and _i.unpack_from(mv, 8)[0] < MIN_LENGTH_FIELD:
            raise CorruptRecord(f"record batch length {_i.unpack_from(mv, 8)[0]} is less than the "
                                f"minimum record overhead ({MIN_LENGTH_FIELD})")
        raise InvalidRecord(f"produce requests must carry one record batch per partition; got "
                            f"{n} bytes, less than a batch header")
    h = _tuple_new(BatchHeader, _unpack_header(mv, 0)) if n >= HEADER_SIZE else None
    length = _i.unpack_from(mv, 8)[0]
    if length < MIN_LENGTH_FIELD:
        raise CorruptRecord(f"record batch length {length} is less than the minimum record overhead "
                            f"({MIN_LENGTH_FIELD})")
    magic = mv[16]
    if magic > 127:
        magic -= 256
    if magic < 0 or magic > MAGIC:
        raise CorruptRecord(f"invalid magic {magic} found in record batch")
    size = length + LOG_OVERHEAD
    if size > n:
        raise InvalidRecord(f"record batch length field says {size} bytes but the partition carries "
                            f"only {n}: no complete record batch")
    if magic != MAGIC:
        raise InvalidRecord(f"produce requests v3+ must carry magic 2 record batches, got magic {magic}")
    if n > size:
        _check_trailing(mv, size, n)
    base_offset = _Q.unpack_from(mv, 0)[0]
    if base_offset != 0:
        raise InvalidRecord(f"the base offset of a produced record batch must be 0, got {base_offset}")
    if size > max_batch_bytes:
        raise KafkaError(ErrorCode.message_too_large,
                         f"record batch is {size} bytes, larger than the maximum of {max_batch_bytes}")
    if size < HEADER_SIZE or h is None:
        raise CorruptRecord(f"record batch size {size} is smaller than the minimum batch overhead "
                            f"{HEADER_SIZE}")
    computed = crc32c(mv[ATTRIBUTES_OFFSET:size])
    if computed != h.crc:
        raise CorruptRecord(f"record batch is corrupt (stored crc {h.crc}, computed crc {computed})")
    attrs = h.attributes
    codec = attrs & _ATTR_CODEC
    if codec > COMPRESSION_ZSTD:
        raise KafkaError(ErrorCode.unsupported_compression_type, f"unknown compression codec id {codec}")
    if codec == COMPRESSION_ZSTD and produce_version is not None and produce_version < 7:
        raise KafkaError(ErrorCode.unsupported_compression_type,
                         f"produce requests with version {produce_version} may not use zstd compression")
    delta = h.last_offset_delta
    if delta < 0:
        raise InvalidRecord(f"record batch has an invalid offset range: last offset delta {delta}")
    count = h.records_count
    if count <= 0:
        raise InvalidRecord(f"invalid reported count for record batch: {count}")
    if count != delta + 1:
        raise InvalidRecord(f"inconsistent batch offset range [0, {delta}] and count of records {count}")
    if attrs & _ATTR_CONTROL:
        raise InvalidRecord("clients are not allowed to write control records")
    if h.producer_id >= 0 and h.base_sequence < 0:
        raise InvalidRecord(f"invalid sequence number {h.base_sequence} in record batch with "
                            f"producer id {h.producer_id}")
    if attrs & _ATTR_TRANSACTIONAL and h.producer_id < 0:
        raise InvalidRecord("transactional record batch without a producer id")
    if attrs & _ATTR_LOG_APPEND_TIME:
        raise KafkaError(ErrorCode.invalid_timestamp,
                         "producers must not set the timestamp type to LogAppendTime")
    return h


def _check_trailing(mv: memoryview, pos: int, n: int) -> None:
    rest = n - pos
    if rest >= 17:
        length = _i.unpack_from(mv, pos + 8)[0]
        magic = mv[pos + 16]
        if length >= MIN_LENGTH_FIELD and magic <= MAGIC and length + LOG_OVERHEAD <= rest:
            raise InvalidRecord("produce requests v3+ must carry exactly one record batch per partition")
    raise CorruptRecord(f"{rest} bytes after the record batch do not form a batch")


# --------------------------------------------------------------------------------------------
# In-place header edits (partition writer)
# --------------------------------------------------------------------------------------------

def set_base_offset(buf, base_offset: int, pos: int = 0) -> None:
    """Write the assigned base offset; the field is outside the CRC so nothing else changes."""
    _Q.pack_into(buf, pos, base_offset)


def set_partition_leader_epoch(buf, epoch: int, pos: int = 0) -> None:
    """Stamp the leader epoch the batch was appended in (Kafka's leader sets it on every append;
    consumers carry it into their positions and commits, and validate them with
    OffsetForLeaderEpoch). Outside the CRC, like the base offset."""
    _i.pack_into(buf, pos + 12, epoch)


def stamp_log_append_time(buf, timestamp_ms: int, pos: int = 0) -> None:
    """Mark the batch LogAppendTime and set its max timestamp to the broker's clock.

    What Kafka's DefaultRecordBatch.setMaxTimestamp does for a LogAppendTime topic: the
    timestamp-type attribute bit and max_timestamp change, base_timestamp and the record deltas do
    not (readers use max_timestamp as every record's timestamp), and the CRC is recomputed.
    """
    mv = memoryview(buf)
    attrs, length = _h.unpack_from(mv, pos + ATTRIBUTES_OFFSET)[0], _i.unpack_from(mv, pos + 8)[0]
    new_attrs = attrs | _ATTR_LOG_APPEND_TIME
    if new_attrs == attrs and _Q.unpack_from(mv, pos + MAX_TIMESTAMP_OFFSET)[0] == timestamp_ms:
        return
    _h.pack_into(mv, pos + ATTRIBUTES_OFFSET, new_attrs)
    _Q.pack_into(mv, pos + MAX_TIMESTAMP_OFFSET, timestamp_ms)
    end = pos + length + LOG_OVERHEAD
    _CRC_I.pack_into(mv, pos + CRC_OFFSET, crc32c(mv[pos + ATTRIBUTES_OFFSET:end]))


# --------------------------------------------------------------------------------------------
# Walking a log
# --------------------------------------------------------------------------------------------

def iter_batch_headers(buf, start: int = 0, end: int | None = None) -> Iterator[tuple[int, BatchHeader]]:
    """Yield ``(position, header)`` for consecutive batches; no CRC. Stops at the first header
    that does not fit, has a length below the v2 header size (e.g. preallocated zeros), or whose
    batch would run past ``end``."""
    if end is None:
        end = len(buf)
    pos = start
    last_header_pos = end - HEADER_SIZE
    while pos <= last_header_pos:
        h = _tuple_new(BatchHeader, _unpack_header(buf, pos))
        size = h[1] + LOG_OVERHEAD
        if size < HEADER_SIZE or pos + size > end:
            return
        yield pos, h
        pos += size


def scan_valid(buf, start: int = 0, end: int | None = None) -> tuple[list[tuple[int, BatchHeader]], int]:
    """Validate length, magic and CRC of each batch from ``start``; stop at the first torn,
    corrupt or zero batch. Returns the valid ``(position, header)`` list and the position just
    after the last valid batch (where recovery truncates)."""
    if end is None:
        end = len(buf)
    mv = memoryview(buf)
    out: list[tuple[int, BatchHeader]] = []
    pos = start
    last_header_pos = end - HEADER_SIZE
    try:
        while pos <= last_header_pos:
            h = _tuple_new(BatchHeader, _unpack_header(mv, pos))
            size = h[1] + LOG_OVERHEAD
            if size < HEADER_SIZE or pos + size > end or h[3] != MAGIC:
                break
            if crc32c(mv[pos + ATTRIBUTES_OFFSET:pos + size]) != h[4]:
                break
            out.append((pos, h))
            pos += size
    finally:
        mv.release()
    return out, pos


# --------------------------------------------------------------------------------------------
# Compression
# --------------------------------------------------------------------------------------------

_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = _XERIAL_MAGIC + struct.pack(">ii", 1, 1)   # version 1, min compatible 1
_XERIAL_BLOCK = 32 * 1024                                   # xerial SnappyOutputStream default
_LZ4_MAGIC = b"\x04\x22\x4d\x18"
_LZ4_BLOCK = 64 * 1024


def _xxh32(data: bytes, seed: int = 0) -> int:
    """xxHash32 for short inputs (< 16 bytes): the LZ4 frame descriptor checksum."""
    p1, p2, p3, p4, p5 = 2654435761, 2246822519, 3266489917, 668265263, 374761393
    m = 0xFFFFFFFF

    def rotl(x: int, r: int) -> int:
        return ((x << r) | (x >> (32 - r))) & m

    assert len(data) < 16
    h = (seed + p5 + len(data)) & m
    i = 0
    while i + 4 <= len(data):
        h = (h + int.from_bytes(data[i:i + 4], "little") * p3) & m
        h = (rotl(h, 17) * p4) & m
        i += 4
    while i < len(data):
        h = (h + data[i] * p5) & m
        h = (rotl(h, 11) * p1) & m
        i += 1
    h ^= h >> 15
    h = (h * p2) & m
    h ^= h >> 13
    h = (h * p3) & m
    h ^= h >> 16
    return h


# Kafka's Lz4BlockOutputStream frame: FLG = version 01 + independent blocks (Java's reader refuses
# linked blocks), no block or content checksum, no content size; BD = 64 KiB maximum block size;
# HC = second byte of xxHash32(FLG, BD).
_LZ4_DESCRIPTOR = bytes([0x60, 0x40])
_LZ4_FRAME_HEADER = _LZ4_MAGIC + _LZ4_DESCRIPTOR + bytes([(_xxh32(_LZ4_DESCRIPTOR) >> 8) & 0xFF])


def _lz4_frame(data, level: int | None = None) -> bytes:
    out = bytearray(_LZ4_FRAME_HEADER)
    mv = memoryview(data)
    # A level is LZ4 HC's (Kafka's compression.lz4.level, KIP-390); without one, fast LZ4.
    kw = {} if level is None else {"mode": "high_compression", "compression": level}
    for off in range(0, len(mv), _LZ4_BLOCK):
        chunk = mv[off:off + _LZ4_BLOCK]
        comp = bytes(cramjam.lz4.compress_block(chunk, store_size=False, **kw))
        if len(comp) >= len(chunk):
            out += (len(chunk) | 0x80000000).to_bytes(4, "little")   # stored: high bit set
            out += chunk
        else:
            out += len(comp).to_bytes(4, "little")
            out += comp
    out += b"\x00\x00\x00\x00"                                       # end mark
    return bytes(out)


def _snappy_xerial(data) -> bytes:
    out = bytearray(_XERIAL_HEADER)
    mv = memoryview(data)
    for off in range(0, len(mv), _XERIAL_BLOCK):
        comp = bytes(cramjam.snappy.compress_raw(mv[off:off + _XERIAL_BLOCK]))
        out += _i.pack(len(comp))
        out += comp
    return bytes(out)


def xerial_blocks(data) -> Iterator[memoryview]:
    """The raw snappy blocks of a xerial stream (Kafka's Java client's snappy framing: a 16-byte
    header, then int32 length + block, repeated; concatenated streams each start with the
    header again). The caller has checked the first header. Raises CorruptRecord on a
    truncated chunk."""
    mv = memoryview(data)
    pos, n = 16, len(mv)
    while pos < n:
        if mv[pos:pos + 8] == _XERIAL_MAGIC:              # concatenated xerial streams
            pos += 16
            continue
        if pos + 4 > n:
            raise CorruptRecord("truncated xerial snappy chunk header")
        clen = _i.unpack_from(mv, pos)[0]
        pos += 4
        if clen < 0 or pos + clen > n:
            raise CorruptRecord("truncated xerial snappy chunk")
        yield mv[pos:pos + clen]
        pos += clen


def _snappy_decode(data) -> bytes:
    mv = memoryview(data)
    if mv[:8] != _XERIAL_MAGIC:
        return bytes(cramjam.snappy.decompress_raw(mv))   # librdkafka writes plain snappy blocks
    out = bytearray()
    for block in xerial_blocks(mv):
        out += cramjam.snappy.decompress_raw(block)
    return bytes(out)


def compress(codec: int, data, level: int | None = None) -> bytes:
    """Compress a record body the way Kafka's Java client does for ``codec``, at ``level``
    (KIP-390's compression.gzip/lz4/zstd.level; None: the codec's default)."""
    if codec == COMPRESSION_NONE:
        return bytes(data)
    if codec == COMPRESSION_GZIP:
        # gzip container; -1 is Deflater's default level (6)
        c = zlib.compressobj(6 if level is None or level < 0 else level, zlib.DEFLATED, 31)
        return c.compress(data) + c.flush()
    if codec == COMPRESSION_SNAPPY:
        return _snappy_xerial(data)
    if codec == COMPRESSION_LZ4:
        return _lz4_frame(data, level)
    if codec == COMPRESSION_ZSTD:
        return zstandard.ZstdCompressor(level=3 if level is None else level).compress(bytes(data))
    raise ValueError(f"unknown compression codec {codec}")


def decompress(codec: int, data) -> bytes:
    """Inverse of ``compress``; accepts what Java clients and librdkafka write."""
    try:
        if codec == COMPRESSION_NONE:
            return bytes(data)
        if codec == COMPRESSION_GZIP:
            return gzip.decompress(bytes(data))
        if codec == COMPRESSION_SNAPPY:
            return _snappy_decode(data)
        if codec == COMPRESSION_LZ4:
            return bytes(cramjam.lz4.decompress(bytes(data)))
        if codec == COMPRESSION_ZSTD:
            return zstandard.ZstdDecompressor().decompressobj(read_across_frames=True).decompress(bytes(data))
    except CorruptRecord:
        raise
    except Exception as e:  # every codec library has its own error type
        raise CorruptRecord(f"failed to decompress {_CODEC_NAMES[codec]} record data: {e}") from None
    raise CorruptRecord(f"unknown compression codec {codec}")


# --------------------------------------------------------------------------------------------
# Building
# --------------------------------------------------------------------------------------------

class Record(NamedTuple):
    """One record to put into a batch. ``timestamp`` None = the batch's base timestamp."""

    key: bytes | None
    value: bytes | None
    headers: Sequence[tuple[str, bytes | None]] = ()
    timestamp: int | None = None


class DecodedRecord(NamedTuple):
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]


# Zig-zag varints of -8192..8191, indexed by the zig-zagged value: the deltas and lengths of
# almost every record, looked up rather than computed (record encoding is the client's per-record
# cost). A zig-zagged value is an unsigned varint.
_SMALL = 1 << 14
_ZIGZAG = tuple(uvarint(v) for v in range(_SMALL))


def _varint(n: int) -> bytes:
    v = (n << 1) ^ (n >> 63)       # zig-zag (valid for the int64 range)
    return _ZIGZAG[v] if v < _SMALL else uvarint(v)


def _encode_record(out: bytearray, offset_delta: int, ts_delta: int, rec: Record) -> None:
    key, value, headers = rec.key, rec.value, rec.headers
    # attributes (unused), timestamp delta, offset delta, key, value, headers
    parts = [b"\x00", _varint(ts_delta), _varint(offset_delta)]
    if key is None:
        parts.append(_ZIGZAG[1])
    else:
        parts += (_varint(len(key)), key)
    if value is None:
        parts.append(_ZIGZAG[1])
    else:
        parts += (_varint(len(value)), value)
    if headers:
        parts.append(_varint(len(headers)))
        for hk, hv in headers:
            kb = hk.encode("utf-8")
            parts += (_varint(len(kb)), kb)
            if hv is None:
                parts.append(_ZIGZAG[1])
            else:
                parts += (_varint(len(hv)), hv)
    else:
        parts.append(b"\x00")
    body = b"".join(parts)
    out += _varint(len(body))
    out += body


def build_batch(records: Sequence[Record], *, base_offset: int = 0, producer_id: int = -1,
                producer_epoch: int = -1, base_sequence: int = -1, transactional: bool = False,
                control: bool = False, compression: int = COMPRESSION_NONE, timestamp_type: int = 0,
                base_timestamp: int | None = None, partition_leader_epoch: int = -1) -> bytes:
    """Encode ``records`` as one v2 batch (with a correct CRC)."""
    if not records:
        raise ValueError("a record batch needs at least one record")
    if base_timestamp is None:
        first = records[0].timestamp
        base_timestamp = first if first is not None else int(time.time() * 1000)
    body = bytearray()
    max_ts = -1
    for i, rec in enumerate(records):
        ts = base_timestamp if rec.timestamp is None else rec.timestamp
        if ts > max_ts:
            max_ts = ts
        _encode_record(body, i, ts - base_timestamp, rec)
    payload = compress(compression, body) if compression else body
    attrs = compression & _ATTR_CODEC
    if timestamp_type:
        attrs |= _ATTR_LOG_APPEND_TIME
    if transactional:
        attrs |= _ATTR_TRANSACTIONAL
    if control:
        attrs |= _ATTR_CONTROL
    size = HEADER_SIZE + len(payload)
    out = bytearray(size)
    _HEADER.pack_into(out, 0, base_offset, size - LOG_OVERHEAD, partition_leader_epoch, MAGIC, 0, attrs,
                      len(records) - 1, base_timestamp, max_ts, producer_id, producer_epoch,
                      base_sequence, len(records))
    out[HEADER_SIZE:] = payload
    _CRC_I.pack_into(out, CRC_OFFSET, crc32c(memoryview(out)[ATTRIBUTES_OFFSET:]))
    return bytes(out)


def build_batch_from_body(body, count: int, *, base_timestamp: int, max_timestamp: int,
                          producer_id: int = -1, producer_epoch: int = -1, base_sequence: int = -1,
                          transactional: bool = False, compression: int = COMPRESSION_NONE) -> bytes:
    """One v2 batch around records already encoded (``body``: ``count`` records, offset deltas
    0..count-1, timestamp deltas from ``base_timestamp``), compressed as a whole when asked; the
    column-wise encoder of the Spark sink builds such bodies."""
    if count <= 0:
        raise ValueError("a record batch needs at least one record")
    payload = compress(compression, body) if compression else body
    attrs = compression & _ATTR_CODEC
    if transactional:
        attrs |= _ATTR_TRANSACTIONAL
    size = HEADER_SIZE + len(payload)
    out = bytearray(size)
    _HEADER.pack_into(out, 0, 0, size - LOG_OVERHEAD, -1, MAGIC, 0, attrs, count - 1, base_timestamp,
                      max_timestamp, producer_id, producer_epoch, base_sequence, count)
    out[HEADER_SIZE:] = payload
    _CRC_I.pack_into(out, CRC_OFFSET, crc32c(memoryview(out)[ATTRIBUTES_OFFSET:]))
    return bytes(out)


def build_retained_batch(h: BatchHeader, records: Sequence["DecodedRecord"],
                         delete_horizon_ms: int | None) -> bytes:
    """The batch a cleaner writes for the records of ``h`` it keeps (Kafka's
    MemoryRecords.buildRetainedRecordsInto): the same base offset and last offset delta (the
    producer's last sequence stays readable), producer id, epoch, base sequence, partition leader
    epoch, codec, timestamp type and flags; each record keeps its offset and timestamp. The base
    timestamp is the delete horizon when one is given (KIP-534, the attribute bit set), else the
    first record's timestamp, as Kafka's builder takes it."""
    base_ts = delete_horizon_ms if delete_horizon_ms is not None else records[0].timestamp
    body = bytearray()
    max_ts = -1
    for rec in records:
        if rec.timestamp > max_ts:
            max_ts = rec.timestamp
        _encode_record(body, rec.offset - h.base_offset, rec.timestamp - base_ts,
                       Record(rec.key, rec.value, rec.headers))
    if h.timestamp_type == 1:
        max_ts = h.max_timestamp                     # LogAppendTime: the broker's stamp stays
    codec = h.compression
    payload = compress(codec, body) if codec else body
    attrs = h.attributes & ~ATTR_DELETE_HORIZON
    if delete_horizon_ms is not None:
        attrs |= ATTR_DELETE_HORIZON
    size = HEADER_SIZE + len(payload)
    out = bytearray(size)
    _HEADER.pack_into(out, 0, h.base_offset, size - LOG_OVERHEAD, h.partition_leader_epoch, MAGIC,
                      0, attrs, h.last_offset_delta, base_ts, max_ts, h.producer_id,
                      h.producer_epoch, h.base_sequence, len(records))
    out[HEADER_SIZE:] = payload
    _CRC_I.pack_into(out, CRC_OFFSET, crc32c(memoryview(out)[ATTRIBUTES_OFFSET:]))
    return bytes(out)


def build_empty_batch(h: BatchHeader) -> bytes:
    """A batch whose records were all removed but which the cleaner keeps (Kafka's
    DefaultRecordBatch.writeEmptyHeader): the header alone, no records, no compression, base
    timestamp -1, the max timestamp, offsets, producer id, epoch, base sequence and flags kept."""
    attrs = h.attributes & (_ATTR_LOG_APPEND_TIME | _ATTR_TRANSACTIONAL | _ATTR_CONTROL)
    out = bytearray(HEADER_SIZE)
    _HEADER.pack_into(out, 0, h.base_offset, HEADER_SIZE - LOG_OVERHEAD, h.partition_leader_epoch,
                      MAGIC, 0, attrs, h.last_offset_delta, -1, h.max_timestamp, h.producer_id,
                      h.producer_epoch, h.base_sequence, 0)
    _CRC_I.pack_into(out, CRC_OFFSET, crc32c(memoryview(out)[ATTRIBUTES_OFFSET:]))
    return bytes(out)


def build_control_batch(*, commit: bool, producer_id: int, producer_epoch: int, coordinator_epoch: int,
                        timestamp_ms: int, base_offset: int = 0, partition_leader_epoch: int = -1) -> bytes:
    """An end-transaction marker batch, as Kafka's MemoryRecords.withEndTransactionMarker builds it:
    CreateTime with the coordinator's timestamp (a LogAppendTime topic restamps it), transactional
    + control attributes, base sequence -1, one record whose key is (version 0, type) and whose
    value is (version 0, coordinator epoch)."""
    key = struct.pack(">hh", 0, CONTROL_COMMIT if commit else CONTROL_ABORT)
    value = struct.pack(">hi", 0, coordinator_epoch)
    return build_batch([Record(key, value, (), timestamp_ms)], base_offset=base_offset,
                       producer_id=producer_id, producer_epoch=producer_epoch, base_sequence=-1,
                       transactional=True, control=True, base_timestamp=timestamp_ms,
                       partition_leader_epoch=partition_leader_epoch)


# --------------------------------------------------------------------------------------------
# Decoding (slow path: per record)
# --------------------------------------------------------------------------------------------

def _get_varint(buf, pos: int) -> tuple[int, int]:
    result = 0
    shift = 0
    while True:
        try:
            b = buf[pos]
        except IndexError:
            raise InvalidRecord("incorrect declared batch size, premature end of record data") from None
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7
        if shift > 63:
            raise CorruptRecord("varint is longer than 10 bytes")


def _get_bytes(buf, pos: int, end: int) -> tuple[bytes | None, int]:
    n, pos = _get_varint(buf, pos)
    if n < 0:
        return None, pos
    if pos + n > end:
        raise InvalidRecord("record field runs past the end of the record")
    return bytes(buf[pos:pos + n]), pos + n


def decode_records(batch) -> list[DecodedRecord]:
    """Every record of one batch (decompressed), with absolute offsets and timestamps. In a
    LogAppendTime batch every record's timestamp is the batch's max timestamp (as in Kafka)."""
    return list(iter_records(batch))


def iter_records(batch) -> Iterator[DecodedRecord]:
    """``decode_records`` one record at a time: a reader that needs the first few records of a
    large batch (the console's record browser) stops early; the batch is decompressed whole."""
    mv = memoryview(batch)
    h = read_header(mv, 0)
    size = h.size
    if size < HEADER_SIZE or size > mv.nbytes:
        raise CorruptRecord(f"record batch size {size} does not fit the {mv.nbytes} bytes given")
    count = h.records_count
    if count < 0:
        raise InvalidRecord(f"found invalid record count {count} in record batch")
    data = mv[HEADER_SIZE:size]
    if h.compression:
        data = decompress(h.compression, data)
    log_append = h.timestamp_type == 1
    pos, n = 0, len(data)
    for _ in range(count):
        length, pos = _get_varint(data, pos)
        end = pos + length
        if length < 0 or end > n:
            raise InvalidRecord("incorrect declared batch size, premature end of record data")
        pos += 1                                   # record attributes
        ts_delta, pos = _get_varint(data, pos)
        offset_delta, pos = _get_varint(data, pos)
        key, pos = _get_bytes(data, pos, end)
        value, pos = _get_bytes(data, pos, end)
        hcount, pos = _get_varint(data, pos)
        if hcount < 0:
            raise InvalidRecord(f"invalid negative header count {hcount}")
        headers: list[tuple[str, bytes | None]] = []
        for _h_ in range(hcount):
            hk, pos = _get_bytes(data, pos, end)
            if hk is None:
                raise InvalidRecord("invalid negative header key size")
            hv, pos = _get_bytes(data, pos, end)
            headers.append((hk.decode("utf-8"), hv))
        if pos != end:
            raise InvalidRecord(f"invalid record size: expected to read {length} bytes, read "
                                f"{length - (end - pos)}")
        ts = h.max_timestamp if log_append else h.base_timestamp + ts_delta
        yield DecodedRecord(h.base_offset + offset_delta, ts, key, value, headers)
    if pos != n:
        raise InvalidRecord("incorrect declared batch size, records still remaining")


def parse_control_record(batch) -> tuple[int, int]:
    """``(type, coordinator_epoch)`` of a control batch's record (ABORT = 0, COMMIT = 1);
    coordinator_epoch is -1 for control types other than transaction markers."""
    h = read_header(batch, 0)
    if not h.is_control:
        raise InvalidRecord("not a control batch")
    recs = decode_records(batch)
    if not recs or recs[0].key is None or len(recs[0].key) < 4:
        raise InvalidRecord("control record key must have at least 4 bytes")
    version, ctype = struct.unpack_from(">hh", recs[0].key)
    if version < 0:
        raise InvalidRecord(f"invalid version {version} found for control record")
    if ctype not in (CONTROL_ABORT, CONTROL_COMMIT):
        return ctype, -1
    value = recs[0].value
    if value is None or len(value) < 6:
        raise InvalidRecord("end transaction marker value must have at least 6 bytes")
    vversion, coordinator_epoch = struct.unpack_from(">hi", value)
    if vversion < 0:
        raise InvalidRecord(f"invalid version {vversion} found for end transaction marker")
    return ctype, coordinator_epoch

