"""Arrow columns from fetched Kafka record batches, decoded column-wise: the Spark reader's hot path.

Runs in the executors' Python workers (``appliance.spark.reader``). Owns nothing. Input: the
batches a consumer kept for one partition (``Consumer.poll_batches``: read_committed filtering is
done per batch there). Output: the reader's columns, as numpy and pyarrow arrays.

Kafka's records are chained: each starts with its length, so the start of record i+1 is known
only once record i's length is read. That chain is the one per-record step (``record_starts``: a
loop over the length varints). Everything else is computed a column at a time over all the
records of all the batches: the varints of every field (``varints``: numpy, one byte position per
record per step), the offsets and timestamps from each batch's base, and the keys and values as
pyarrow arrays made directly over the records' bytes (a ``binary_view`` array pointing at each
key or value in place, then one cast to ``binary``). Headers, when asked for and present, are
read record by record (they are rare).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa

from appliance.errors import CorruptRecord, InvalidRecord
from appliance.protocol.records import HEADER_SIZE, decompress

__all__ = ["Columns", "decode_batches", "record_starts", "varints"]


class Columns(NamedTuple):
    offset: np.ndarray          # int64
    timestamp: np.ndarray       # int64, milliseconds
    timestamp_type: np.ndarray  # int32: 0 CreateTime, 1 LogAppendTime
    key: pa.Array               # binary
    value: pa.Array             # binary
    headers: list | None        # per record: [(key, value)] or None; only when asked for

    def __len__(self) -> int:
        return len(self.offset)


def record_starts(section: bytes, count: int, base: int) -> list[int]:
    """Where each record's attributes byte is (after its length varint), ``base`` added, in a
    records section of ``count`` records."""
    out = [0] * count
    pos, n = 0, len(section)
    try:
        for i in range(count):
            x = section[pos]
            pos += 1
            length = x & 0x7F
            shift = 7
            while x & 0x80:
                x = section[pos]
                pos += 1
                length |= (x & 0x7F) << shift
                shift += 7
                if shift > 63:
                    raise CorruptRecord("varint is longer than 10 bytes")
            length = (length >> 1) ^ -(length & 1)
            if length < 0 or pos + length > n:
                raise InvalidRecord("incorrect declared batch size, premature end of record data")
            out[i] = pos + base
            pos += length
    except IndexError:
        raise InvalidRecord("incorrect declared batch size, premature end of record data") from None
    if pos != n:
        raise InvalidRecord("incorrect declared batch size, records still remaining")
    return out


def varints(buf: np.ndarray, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The zig-zag varint at each position of ``buf``: (values int64, sizes int64)."""
    try:
        b = buf[pos].astype(np.uint64)
        value = b & np.uint64(0x7F)
        size = np.ones(len(pos), np.int64)
        more = np.nonzero(b >= 0x80)[0]
        shift = 7
        while more.size:
            if shift > 63:
                raise CorruptRecord("varint is longer than 10 bytes")
            bj = buf[pos[more] + size[more]].astype(np.uint64)
            value[more] |= (bj & np.uint64(0x7F)) << np.uint64(shift)
            size[more] += 1
            more = more[bj >= 0x80]
            shift += 7
    except IndexError:
        raise InvalidRecord("record field runs past the end of the records") from None
    signed = (value >> np.uint64(1)).astype(np.int64) ^ -(value & np.uint64(1)).astype(np.int64)
    return signed, size


def _binary(buf: np.ndarray, data: pa.Buffer, start: np.ndarray, length: np.ndarray) -> pa.Array:
    """A binary array of the byte ranges (``length`` -1: null) of ``buf``, made as a
    binary_view array over the bytes in place, then cast."""
    n = len(start)
    ln = np.maximum(length, 0).astype(np.int32)
    views = np.zeros((n, 16), np.uint8)
    views[:, 0:4] = ln.view(np.uint8).reshape(n, 4)
    if n:
        idx = np.minimum(start[:, None] + np.arange(12), max(len(buf) - 1, 0))
        inline = buf[idx] if len(buf) else np.zeros((n, 12), np.uint8)
        inline[np.arange(12)[None, :] >= ln[:, None]] = 0
        short = ln <= 12
        views[short, 4:16] = inline[short]
        far = ~short
        if far.any():
            views[far, 4:8] = inline[far, 0:4]
            views[far, 12:16] = start[far].astype(np.int32).view(np.uint8).reshape(-1, 4)
    validity = None
    if (length < 0).any():
        validity = pa.array(length >= 0).buffers()[1]
    arr = pa.Array.from_buffers(pa.binary_view(), n, [validity, pa.py_buffer(views), data])
    return arr.cast(pa.binary())


def _headers(section: bytes, start: int, count: int) -> list[tuple[str, bytes | None]]:
    """``count`` headers from ``start`` (the slow path, record by record)."""
    out = []
    pos = start

    def varint() -> int:
        nonlocal pos
        shift = value = 0
        while True:
            x = section[pos]
            pos += 1
            value |= (x & 0x7F) << shift
            if not x & 0x80:
                return (value >> 1) ^ -(value & 1)
            shift += 7

    for _ in range(count):
        n = varint()
        if n < 0:
            raise InvalidRecord("invalid negative header key size")
        k = section[pos:pos + n].decode("utf-8")
        pos += n
        n = varint()
        v = None if n < 0 else section[pos:pos + n]
        pos += max(n, 0)
        out.append((k, v))
    return out


def decode_batches(batches: list[tuple[Any, Any, int]], end: int, *, headers: bool = False) -> Columns:
    """The records of ``batches`` (bytes, header, first offset wanted) below offset ``end``."""
    sections: list[bytes] = []
    starts: list[int] = []
    counts: list[int] = []
    base = 0
    for data, h, _first in batches:
        section = bytes(data[HEADER_SIZE:h.size])
        if h.compression:
            section = bytes(decompress(h.compression, section))
        starts += record_starts(section, h.records_count, base)
        counts.append(h.records_count)
        sections.append(section)
        base += len(section)
    whole = b"".join(sections)
    buf = np.frombuffer(whole, np.uint8)
    data = pa.py_buffer(whole)
    which = np.repeat(np.arange(len(batches)), counts)
    base_offset = np.array([h.base_offset for _, h, _ in batches], np.int64)[which]
    base_ts = np.array([h.base_timestamp for _, h, _ in batches], np.int64)[which]
    max_ts = np.array([h.max_timestamp for _, h, _ in batches], np.int64)[which]
    log_append = np.array([h.timestamp_type for _, h, _ in batches], np.int32)[which]
    first = np.array([f for _, _, f in batches], np.int64)[which]

    pos = np.asarray(starts, np.int64) + 1                     # after the attributes byte
    ts_delta, size = varints(buf, pos)
    pos += size
    offset_delta, size = varints(buf, pos)
    pos += size
    key_len, size = varints(buf, pos)
    pos += size
    key_start = pos.copy()
    pos += np.maximum(key_len, 0)
    value_len, size = varints(buf, pos)
    pos += size
    value_start = pos.copy()
    pos += np.maximum(value_len, 0)
    header_count, size = varints(buf, pos)

    offset = base_offset + offset_delta
    keep = (offset >= first) & (offset < end)
    if not keep.all():
        sel = np.nonzero(keep)[0]
        offset, ts_delta, base_ts, max_ts, log_append = (a[sel] for a in (offset, ts_delta, base_ts,
                                                                          max_ts, log_append))
        key_start, key_len, value_start, value_len = (a[sel] for a in (key_start, key_len,
                                                                       value_start, value_len))
        pos, size, header_count = pos[sel], size[sel], header_count[sel]
    timestamp = np.where(log_append == 1, max_ts, base_ts + ts_delta)
    hs = None
    if headers:
        hs = [None] * len(offset)
        for i in np.nonzero(header_count > 0)[0].tolist():
            hs[i] = _headers(whole, int(pos[i] + size[i]), int(header_count[i]))
    return Columns(offset, timestamp, log_append, _binary(buf, data, key_start, key_len),
                   _binary(buf, data, value_start, value_len), hs)
