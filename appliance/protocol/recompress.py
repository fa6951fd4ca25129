"""Broker-side recompression: a produced batch rewritten in its topic's codec (Kafka's
LogValidator, ``compression.type`` other than ``producer``; levels of KIP-390).

Owns nothing and does no I/O; the frontends call it from Produce, after a batch has passed
``validate_batch`` and ``validate_records`` and before it goes to its writer. A topic whose
``compression.type`` is ``producer`` (the default) never gets here: its batches go to the writer
as they came, validated once and patched in place there.

Kafka rebuilds a recompressed batch from its records; here the records' bytes are kept as they
are (every offset delta, timestamp delta, key, value and header the producer wrote) and only the
compressed body, the codec bits of the attributes, the batch length and the CRC-32C change: the
producer id, epoch, base sequence, timestamps and transactional flag are the producer's, so
idempotence, transactions and the per-record checks already made hold for the new batch.
"""

from __future__ import annotations

import struct

from crc32c import crc32c

from appliance.protocol.record_contents import decompress_bounded
from appliance.protocol.records import (ATTRIBUTES_OFFSET, COMPRESSION_GZIP, COMPRESSION_LZ4,
                                        COMPRESSION_NONE, COMPRESSION_SNAPPY, COMPRESSION_ZSTD,
                                        CRC_OFFSET, HEADER_SIZE, LOG_OVERHEAD, BatchHeader, compress)

# compression.type -> the codec id of the batch attributes (None: keep the producer's).
TOPIC_CODECS: dict[str, int | None] = {
    "producer": None, "uncompressed": COMPRESSION_NONE, "gzip": COMPRESSION_GZIP,
    "snappy": COMPRESSION_SNAPPY, "lz4": COMPRESSION_LZ4, "zstd": COMPRESSION_ZSTD}

_i = struct.Struct(">i")
_I = struct.Struct(">I")
_h = struct.Struct(">h")


def target_codec(settings) -> int | None:
    """The codec a topic's batches are stored in (None: the producer's)."""
    return TOPIC_CODECS[settings.compression_type]


def level_for(settings, codec: int) -> int | None:
    """The topic's KIP-390 level for ``codec`` (None: the codec has no level)."""
    if codec == COMPRESSION_GZIP:
        return settings.compression_gzip_level
    if codec == COMPRESSION_LZ4:
        return settings.compression_lz4_level
    if codec == COMPRESSION_ZSTD:
        return settings.compression_zstd_level
    return None


def recompress(buf, h: BatchHeader, codec: int, level: int | None, max_bytes: int) -> bytes:
    """The batch ``buf`` (header ``h``, already validated) with its records in ``codec``.
    ``max_bytes`` bounds the inflation, as the validation did."""
    mv = memoryview(buf)
    body = mv[HEADER_SIZE:h.batch_length + LOG_OVERHEAD]
    raw = decompress_bounded(h.compression, body, max_bytes) if h.compression else body
    data = compress(codec, raw, level)
    out = bytearray(HEADER_SIZE + len(data))
    out[:HEADER_SIZE] = mv[:HEADER_SIZE]
    out[HEADER_SIZE:] = data
    _i.pack_into(out, 8, HEADER_SIZE - LOG_OVERHEAD + len(data))
    _h.pack_into(out, ATTRIBUTES_OFFSET, (h.attributes & ~0x07) | codec)
    _I.pack_into(out, CRC_OFFSET, crc32c(memoryview(out)[ATTRIBUTES_OFFSET:]))
    return bytes(out)
