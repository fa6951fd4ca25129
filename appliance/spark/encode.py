"""Kafka record batches from Arrow columns, computed column-wise: the Spark sink's hot path.

Runs in the executors' Python workers, once per Arrow batch Spark hands a writing task. Owns
nothing. Where the appliance client's ``Producer.send`` spends Python work on every record, this
works on whole columns with numpy and pyarrow's kernels:

- the partition of every keyed row: Kafka's murmur2 of the key (``murmur2_column``: the keys of
  one length at a time, as a matrix of bytes, in 32-bit arithmetic), positive, modulo the
  partition count; a ``partition`` column where it is set; rows without a key all go to one
  partition per Arrow batch, the next one each time (Kafka's sticky partitioner keeps a partition
  until its batch is full);
- the rows of each partition together (a stable sort: their order is kept), cut into record
  batches of at most ``batch_size`` bytes (from an upper bound of every record's size);
- every record's varints (its length, offset delta, key and value lengths) as a column of bytes
  (``varint_column``), then one pyarrow join of [prefix, key, value length, value, header count]
  per row, whose data buffer is every record of the partition back to back: each record batch is
  a slice of it (``EncodedRecords``), sent with ``Producer.send_encoded``.

Every record gets the Arrow batch's timestamp (CreateTime) and no headers; a batch with a
non-empty ``headers`` column is left to the row-by-row path.

Record layout (Kafka's DefaultRecord): length varint, attributes int8 (0), timestamp delta
varlong (0), offset delta varint, key length varint (-1: null), key, value length varint, value,
header count varint (0). Varints are zig-zag, 7 bits a byte, low bits first.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from appliance.client.accumulator import EncodedRecords

__all__ = ["encode_partitions", "murmur2_column", "varint_column", "binary_column"]

_M = np.uint32(0x5BD1E995)
_SEED = 0x9747B28C
BATCH_OVERHEAD = 61
_ZERO = pa.scalar(b"\x00", pa.binary())
_EMPTY = pa.scalar(b"", pa.binary())


def binary_column(col: pa.Array | None, n: int) -> pa.Array:
    """A key or value column as ``binary`` (a string's UTF-8 bytes as they are); all nulls when
    the column is missing."""
    if col is None or pa.types.is_null(col.type):
        return pa.nulls(n, pa.binary())
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    if pa.types.is_binary(col.type):
        return col
    return col.cast(pa.binary())            # string: the same buffers; large types: 32-bit offsets


def _views(arr: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(offsets int64, data uint8, lengths int64 with -1 for nulls) of a binary array."""
    n = len(arr)
    bufs = arr.buffers()
    offsets = np.frombuffer(bufs[1], dtype=np.int32, count=n + 1, offset=arr.offset * 4).astype(np.int64)
    data = np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None and len(bufs[2]) else \
        np.zeros(0, np.uint8)
    lengths = np.diff(offsets)
    if arr.null_count:
        lengths[~pc.is_valid(arr).to_numpy(zero_copy_only=False)] = -1
    return offsets, data, lengths


def murmur2_column(offsets: np.ndarray, data: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Kafka's murmur2 (seed 0x9747b28c) of each key (``offsets`` into ``data``, ``lengths`` >= 0)
    as uint32: the keys of each length together, their bytes a matrix, four columns a step."""
    out = np.empty(len(lengths), np.uint32)
    for length in np.unique(lengths):
        sel = np.nonzero(lengths == length)[0]
        ln = int(length)
        h = np.full(len(sel), (_SEED ^ ln) & 0xFFFFFFFF, np.uint32)
        if ln:
            mat = data[offsets[sel][:, None] + np.arange(ln)].astype(np.uint32)
        n4 = ln // 4
        for c in range(n4):
            k = mat[:, 4 * c] | (mat[:, 4 * c + 1] << 8) | (mat[:, 4 * c + 2] << 16) | (mat[:, 4 * c + 3] << 24)
            k *= _M
            k ^= k >> 24
            k *= _M
            h *= _M
            h ^= k
        rest, base = ln % 4, 4 * n4
        if rest == 3:
            h ^= mat[:, base + 2] << 16
        if rest >= 2:
            h ^= mat[:, base + 1] << 8
        if rest >= 1:
            h ^= mat[:, base]
            h *= _M
        h ^= h >> 13
        h *= _M
        h ^= h >> 15
        out[sel] = h
    return out


def _zigzag(v: np.ndarray) -> np.ndarray:
    v = v.astype(np.int64)
    return ((v << 1) ^ (v >> 63)).astype(np.uint64)


def _varint_sizes(u: np.ndarray) -> np.ndarray:
    return (1 + (u >= 1 << 7).astype(np.int64) + (u >= 1 << 14) + (u >= 1 << 21) + (u >= 1 << 28)
            + (u >= 1 << 35))


def _put_varints(data: np.ndarray, pos: np.ndarray, u: np.ndarray, sizes: np.ndarray) -> None:
    """Write the varint of each ``u`` (``sizes`` bytes) at ``pos`` in ``data``."""
    for j in range(int(sizes.max(initial=0))):
        m = sizes > j
        if not m.all():
            idx = np.nonzero(m)[0]
            uj, more = u[idx], sizes[idx] > j + 1
            at = pos[idx] + j
        else:
            uj, more, at = u, sizes > j + 1, pos + j
        byte = ((uj >> np.uint64(7 * j)) & np.uint64(0x7F)).astype(np.uint8)
        byte[more] |= 0x80
        data[at] = byte


def varint_column(*fields: np.ndarray, fixed: bytes = b"", after: int = 0) -> pa.Array:
    """One binary value per row: the zig-zag varints of ``fields`` (int arrays of one length),
    with the bytes ``fixed`` inserted after the first ``after`` of them."""
    n = len(fields[0])
    us = [_zigzag(f) for f in fields]
    sizes = [_varint_sizes(u) for u in us]
    row = np.full(n, len(fixed), np.int64)
    for s in sizes:
        row += s
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(row, out=offsets[1:])
    data = np.empty(int(offsets[-1]), np.uint8)
    pos = offsets[:-1].copy()
    for i, (u, s) in enumerate(zip(us, sizes)):
        if i == after and fixed:
            for j, b in enumerate(fixed):
                data[pos + j] = b
            pos += len(fixed)
        _put_varints(data, pos, u, s)
        pos += s
    if after >= len(fields) and fixed:
        for j, b in enumerate(fixed):
            data[pos + j] = b
    return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets.astype(np.int32)),
                                                  pa.py_buffer(data)])


def _batches(key_len: np.ndarray, value_len: np.ndarray, batch_size: int) -> np.ndarray:
    """The first row of each record batch: greedy, on an upper bound of each record's size."""
    body = (2 + 3 + _varint_sizes(_zigzag(key_len)) + np.maximum(key_len, 0)
            + _varint_sizes(_zigzag(value_len)) + np.maximum(value_len, 0) + 1)
    size = body + _varint_sizes(_zigzag(body))
    cum = np.cumsum(size)
    limit = max(1, batch_size - BATCH_OVERHEAD)
    starts = [0]
    n = len(size)
    while True:
        a = starts[-1]
        before = cum[a - 1] if a else 0
        b = int(np.searchsorted(cum, before + limit, side="right"))
        b = max(b, a + 1)
        if b >= n:
            return np.asarray(starts, np.int64)
        starts.append(b)


def encode_rows(keys: pa.Array, values: pa.Array, batch_size: int, timestamp: int) -> list[EncodedRecords]:
    """The rows (binary keys and values, one partition's, in order) as record batches."""
    n = len(keys)
    if n == 0:
        return []
    _, _, key_len = _views(keys)
    _, _, value_len = _views(values)
    starts = _batches(key_len, value_len, batch_size)
    batch_of = np.zeros(n, np.int64)
    batch_of[starts[1:]] = 1
    np.cumsum(batch_of, out=batch_of)
    delta = np.arange(n, dtype=np.int64) - starts[batch_of]
    zk, zv, zd = _zigzag(key_len), _zigzag(value_len), _zigzag(delta)
    body = (2 + _varint_sizes(zd) + _varint_sizes(zk) + np.maximum(key_len, 0)
            + _varint_sizes(zv) + np.maximum(value_len, 0) + 1)
    # prefix: length, attributes 0, timestamp delta 0, offset delta, key length
    prefix = varint_column(body, delta, key_len, fixed=b"\x00\x00", after=1)
    middle = varint_column(value_len)
    if keys.null_count:
        keys = pc.fill_null(keys, _EMPTY)
    if values.null_count:
        values = pc.fill_null(values, _EMPTY)
    joined = pc.binary_join_element_wise(prefix, keys, middle, values, _ZERO, _EMPTY)
    jbufs = joined.buffers()
    offs = np.frombuffer(jbufs[1], dtype=np.int32, count=n + 1, offset=joined.offset * 4)
    data = memoryview(jbufs[2])
    ends = np.append(starts[1:], n)
    return [EncodedRecords(data[offs[a]:offs[b]], int(b - a), timestamp, timestamp)
            for a, b in zip(starts.tolist(), ends.tolist())]


class Partitioner:
    """Which partition each row of an Arrow batch goes to (module docstring). One per task: it
    keeps the sticky partition of rows without a key."""

    def __init__(self) -> None:
        self._sticky: dict[str, int] = {}

    def assign(self, topic: str, count: int, keys: pa.Array, explicit: pa.Array | None) -> np.ndarray:
        n = len(keys)
        offsets, data, key_len = _views(keys)
        parts = np.empty(n, np.int64)
        keyed = key_len >= 0
        if keyed.any():
            idx = np.nonzero(keyed)[0]
            h = murmur2_column(offsets[idx], data, key_len[idx])
            parts[idx] = (h & np.uint32(0x7FFFFFFF)).astype(np.int64) % count
        if not keyed.all():
            sticky = self._sticky[topic] = (self._sticky.get(topic, -1) + 1) % count
            parts[~keyed] = sticky
        if explicit is not None and explicit.null_count < len(explicit):
            given = explicit.to_numpy(zero_copy_only=False)
            mask = pc.is_valid(explicit).to_numpy(zero_copy_only=False)
            chosen = given[mask].astype(np.int64)
            if chosen.size and (chosen.min() < 0 or chosen.max() >= count):
                bad = int(chosen[(chosen < 0) | (chosen >= count)][0])
                raise ValueError(f"topic {topic!r} has {count} partitions, not partition {bad}")
            parts[mask] = chosen
        return parts


def encode_partitions(keys: pa.Array, values: pa.Array, parts: np.ndarray, batch_size: int,
                      timestamp: int) -> list[tuple[int, EncodedRecords]]:
    """(partition, record batch) for every batch the rows make, partition by partition, each
    partition's rows in their order."""
    if len(keys) == 0:
        return []
    first = int(parts[0])
    if (parts == first).all():
        return [(first, e) for e in encode_rows(keys, values, batch_size, timestamp)]
    order = np.argsort(parts, kind="stable")
    sorted_parts = parts[order]
    idx = pa.array(order)
    keys, values = pc.take(keys, idx), pc.take(values, idx)
    bounds = np.flatnonzero(np.diff(sorted_parts)) + 1
    out: list[tuple[int, EncodedRecords]] = []
    for a, b in zip(np.concatenate(([0], bounds)).tolist(), np.concatenate((bounds, [len(order)])).tolist()):
        p = int(sorted_parts[a])
        out += [(p, e) for e in encode_rows(keys.slice(a, b - a), values.slice(a, b - a), batch_size,
                                            timestamp)]
    return out


def column(batch: Any, name: str) -> pa.Array | None:
    """A column of an Arrow record batch by lower-case name (Spark keeps the user's case)."""
    for i, field in enumerate(batch.schema.names):
        if field.lower() == name:
            return batch.column(i)
    return None
