"""Broker-side recompression (appliance/protocol/recompress.py): a batch rewritten in the topic's
codec keeps every record and the producer's header fields, passes the batch and record checks,
and uses the KIP-390 levels."""

from __future__ import annotations

import pytest

from appliance.protocol import records as R
from appliance.protocol.record_contents import validate_records
from appliance.protocol.recompress import TOPIC_CODECS, level_for, recompress, target_codec
from appliance.topic_config import LogSettings

CODECS = [R.COMPRESSION_NONE, R.COMPRESSION_GZIP, R.COMPRESSION_SNAPPY, R.COMPRESSION_LZ4,
          R.COMPRESSION_ZSTD]


def batch(codec: int) -> bytes:
    recs = [R.Record(f"k{i}".encode(), (f"value {i} " * 30).encode(), [("h", b"x")], 1_700_000_000_000 + i)
            for i in range(50)]
    return R.build_batch(recs, producer_id=7, producer_epoch=3, base_sequence=11,
                         compression=codec, transactional=True)


@pytest.mark.parametrize("src", CODECS)
@pytest.mark.parametrize("dst", CODECS)
def test_recompressed_batch_keeps_its_records_and_header(src, dst):
    b = batch(src)
    h = R.validate_batch(b, 1 << 20)
    out = recompress(b, h, dst, None, 1 << 24)
    h2 = R.validate_batch(out, 1 << 20)                      # CRC and framing hold
    validate_records(out, h2, max_bytes=1 << 24)
    assert h2.compression == dst
    for f in ("producer_id", "producer_epoch", "base_sequence", "records_count", "last_offset_delta",
              "base_timestamp", "max_timestamp", "is_transactional"):
        assert getattr(h2, f) == getattr(h, f), f
    assert [(r.key, r.value, r.headers, r.timestamp) for r in R.decode_records(out)] == \
        [(r.key, r.value, r.headers, r.timestamp) for r in R.decode_records(b)]


def test_levels_and_the_producer_codec():
    s = LogSettings(compression_type="zstd", compression_zstd_level=19)
    assert target_codec(s) == R.COMPRESSION_ZSTD and level_for(s, R.COMPRESSION_ZSTD) == 19
    assert target_codec(LogSettings()) is None                  # producer: the fast path
    assert set(TOPIC_CODECS) == {"producer", "uncompressed", "gzip", "snappy", "lz4", "zstd"}
    raw = bytes(range(256)) * 400
    fast = R.compress(R.COMPRESSION_GZIP, raw, 1)
    best = R.compress(R.COMPRESSION_GZIP, raw, 9)
    assert R.decompress(R.COMPRESSION_GZIP, fast) == raw == R.decompress(R.COMPRESSION_GZIP, best)
    hc = R.compress(R.COMPRESSION_LZ4, raw, 17)
    assert R.decompress(R.COMPRESSION_LZ4, hc) == raw
