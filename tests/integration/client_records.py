"""The records tests send through the real clients, and the comparison of what came back.

``make_records``: a deterministic mix of records (null/empty/short keys, null/empty/small/~10 KiB
values, no/one/several/duplicate/null-valued headers, explicit partitions, explicit CreateTime
timestamps) that a given client is able to send (its ``Caps``); ``Rec`` as produced, ``Got`` as a
client consumed it, normalised; ``expected_positions`` (the offsets the broker must have given
them), ``assert_same_records`` (byte-for-byte, with a short readable failure message) and
Kafka's answers to ListOffsets by time (``expected_offset_for_time``, ``time_targets``).

The clients themselves are client_drivers.py's. Pure Python, in the pytest process.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Iterable, NamedTuple

from raw_wire import CREATE_TIME, LOG_APPEND_TIME  # noqa: F401 (a Got's timestamp types)

CODECS = ("none", "gzip", "zstd", "lz4", "snappy")


# ------------------------------------------------------------------------------------------------
# Records
# ------------------------------------------------------------------------------------------------

Headers = tuple[tuple[str, "bytes | None"], ...]


class Rec(NamedTuple):
    """One record as a test produces it."""
    partition: int
    key: bytes | None
    value: bytes | None
    headers: Headers
    timestamp: int


class Got(NamedTuple):
    """One record as a client consumed it, normalised."""
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Headers
    timestamp: int
    timestamp_type: str          # CREATE_TIME or LOG_APPEND_TIME


@dataclass(frozen=True)
class Caps:
    """What a client's producer API can express."""
    null_key_and_value: bool     # kafka-python and aiokafka refuse key=None with value=None
    null_header_value: bool      # kafka-python accepts only (str, bytes) headers


def _blob(rng: random.Random, n: int) -> bytes:
    """n bytes, half random and half repetitive, so every codec has work and something to gain."""
    if n == 0:
        return b""
    head = rng.randbytes(n // 2)
    word = rng.randbytes(rng.randint(1, 8))
    return head + (word * (n // len(word) + 1))[: n - len(head)]


def _value(rng: random.Random) -> bytes | None:
    r = rng.random()
    if r < 0.10:
        return None
    if r < 0.20:
        return b""
    if r < 0.80:
        return _blob(rng, rng.randint(1, 200))
    if r < 0.98:
        return _blob(rng, rng.randint(200, 3000))
    return _blob(rng, 10240 + rng.randint(-100, 100))   # ~10 KiB


def _key(rng: random.Random) -> bytes | None:
    r = rng.random()
    if r < 0.25:
        return None
    if r < 0.30:
        return b""
    if r < 0.40:
        return bytes([0xff, 0xfe, 0x00]) + rng.randbytes(rng.randint(0, 5))   # not UTF-8
    return f"key-{rng.randint(0, 999)}".encode()


HEADER_KEYS = ("trace", "ключ-ü", "", "x" * 40)


def _headers(rng: random.Random, caps: Caps) -> Headers:
    r = rng.random()
    if r < 0.40:
        return ()
    if r < 0.70:
        return ((rng.choice(HEADER_KEYS), _blob(rng, rng.randint(0, 30))),)
    hs = []
    for _ in range(rng.randint(2, 4)):
        v = _blob(rng, rng.randint(0, 20))
        if caps.null_header_value and rng.random() < 0.3:
            v = None
        hs.append((rng.choice(HEADER_KEYS), v))
    hs.append(("dup", b"1"))
    hs.append(("dup", b""))               # same key twice, order must survive
    return tuple(hs)


def make_records(n: int, partitions: int, caps: Caps, *, seed: int, base_ts: int) -> list[Rec]:
    """n records spread over every partition, timestamps rising (pairs share one timestamp)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        key, value = _key(rng), _value(rng)
        if key is None and value is None and not caps.null_key_and_value:
            key = b"k"
        # The first records hit every partition in turn, so that none stays empty.
        p = i if i < partitions else rng.randrange(partitions)
        out.append(Rec(p, key, value, _headers(rng, caps), base_ts + (i // 2) * 5))
    return out


def expected_positions(recs: list[Rec], positions: list[tuple[int, int]]) -> dict[tuple[int, int], Rec]:
    """(partition, offset) -> record, checking that the broker kept the production order."""
    assert len(positions) == len(recs)
    nxt: dict[int, int] = {}
    out = {}
    for r, (p, off) in zip(recs, positions):
        assert p == r.partition, f"record sent to partition {r.partition} landed in {p}"
        want = nxt.get(p, 0)
        assert off == want, f"partition {p}: record got offset {off}, expected {want} (production order)"
        nxt[p] = want + 1
        out[(p, off)] = r
    return out


def partition_counts(recs: Iterable[Rec], partitions: int) -> dict[int, int]:
    counts = dict.fromkeys(range(partitions), 0)
    for r in recs:
        counts[r.partition] += 1
    return counts


def assert_same_records(expected: dict[tuple[int, int], Rec], got: list[Got], *,
                        start: dict[int, int] | None = None, timestamp_type: str = CREATE_TIME,
                        who: str = "") -> None:
    """Every expected record at or after ``start`` (per partition) came back once, in offset order
    per partition, byte for byte (key, value, headers in order, CreateTime timestamp)."""
    start = start or {}
    by_part: dict[int, list[Got]] = {}
    for g in got:
        by_part.setdefault(g.partition, []).append(g)
    want_parts: dict[int, list[int]] = {}
    for (p, off) in sorted(expected):
        if off >= start.get(p, 0):
            want_parts.setdefault(p, []).append(off)
    problems = []
    for p in sorted(set(want_parts) | set(by_part)):
        offs = [g.offset for g in by_part.get(p, [])]
        if offs != want_parts.get(p, []):
            w = want_parts.get(p, [])
            problems.append(f"partition {p}: got {len(offs)} offsets {offs[:5]}..{offs[-3:]}, "
                            f"expected {len(w)} {w[:5]}..{w[-3:]}")
            continue
        for g in by_part[p]:
            r = expected[(p, g.offset)]
            diffs = []
            if g.key != r.key:
                diffs.append(f"key {_short(g.key)} != {_short(r.key)}")
            if g.value != r.value:
                diffs.append(f"value {_short(g.value)} != {_short(r.value)}")
            if g.headers != r.headers:
                diffs.append(f"headers {g.headers!r:.200} != {r.headers!r:.200}")
            if g.timestamp_type != timestamp_type:
                diffs.append(f"timestamp type {g.timestamp_type} != {timestamp_type}")
            if timestamp_type == CREATE_TIME and g.timestamp != r.timestamp:
                diffs.append(f"timestamp {g.timestamp} != {r.timestamp}")
            if diffs:
                problems.append(f"{p}@{g.offset}: " + "; ".join(diffs))
            if len(problems) > 10:
                break
    assert not problems, f"{who}: {len(problems)} mismatches:\n" + "\n".join(problems[:10])


def _short(b: bytes | None) -> str:
    if b is None:
        return "None"
    return f"{len(b)}B:{b[:16]!r}"


def expected_offset_for_time(expected: dict[tuple[int, int], Rec], partition: int,
                             target: int) -> tuple[int, int] | None:
    """Kafka's answer to ListOffsets(timestamp): the first offset whose timestamp >= target."""
    for (p, off) in sorted(expected):
        if p == partition and expected[(p, off)].timestamp >= target:
            return off, expected[(p, off)].timestamp
    return None


def time_targets(expected: dict[tuple[int, int], Rec], partition: int) -> list[int]:
    """Timestamps worth asking for: below everything, each edge, exact hits, gaps, past the end."""
    ts = [expected[k].timestamp for k in sorted(expected) if k[0] == partition]
    mid = ts[len(ts) // 2]
    return [ts[0] - 100_000, ts[0], ts[0] + 1, mid - 1, mid, mid + 1, ts[-1], ts[-1] + 1]
