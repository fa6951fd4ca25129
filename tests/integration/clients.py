"""Drive the real appliance with real Kafka clients: confluent-kafka, kafka-python and aiokafka.

Used by ``test_clients_*.py`` (runs in the pytest process; the clients' own threads and event loops
are theirs, not ours). Owns:

- ``make_records``: a deterministic mix of records (null/empty/short keys, null/empty/small/~10 KiB
  values, no/one/several/duplicate/null-valued headers, explicit partitions, explicit CreateTime
  timestamps) that a given client is able to send;
- one ``Driver`` per client with the same small surface (create/delete topics, produce and return
  each record's (partition, offset), consume by assignment from given offsets, ListOffsets,
  DescribeConfigs, topic metadata), every call through THAT client's public API, normalised into
  ``Got`` / plain tuples so that tests compare clients with each other and with what was produced;
- ``assert_same_records``: byte-for-byte comparison with a short, readable failure message;
- ``shared_appliance``: a module-scoped appliance (one per test module; topics are named per case),
  plus an autouse guard that fails a test when the appliance logged an error or died during it
  (clients retry, and a retry must not hide a crashed worker) and prints the log tail on failure;
- ``raw_batches`` / ``raw_fetch_sizes`` / ``raw_topic_error``: what the broker itself answers
  (RawClient Fetch v12 and Metadata v12): batch boundaries, codecs and timestamp types as stored,
  so that tests can prove an offset really lies inside a batch or a codec really went through.

No consumer groups: the appliance has no group coordinator yet, so every consumer assigns
partitions and seeks. confluent-kafka insists on a group.id even for assign(); it never joins.
"""

from __future__ import annotations

import asyncio
import functools
import os
import random
import time
import uuid
from dataclasses import dataclass
from typing import Iterable, NamedTuple

import pytest

from appliance.protocol.records import iter_batch_headers
from harness import Appliance
from rawclient import RawClient

CODECS = ("none", "gzip", "zstd", "lz4", "snappy")
CREATE_TIME, LOG_APPEND_TIME = "CreateTime", "LogAppendTime"
# ListOffsets specs; an int is a timestamp. MAX_TIMESTAMP (KIP-734) only through admin APIs.
EARLIEST, LATEST, MAX_TIMESTAMP = "earliest", "latest", "max_timestamp"
TIMEOUT_S = 60.0


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


# ------------------------------------------------------------------------------------------------
# Drivers
# ------------------------------------------------------------------------------------------------

class Driver:
    name = ""
    caps = Caps(True, True)

    def create_topics(self, bootstrap: str, topics: dict[str, tuple[int, dict[str, str]]]) -> None:
        raise NotImplementedError

    def delete_topics(self, bootstrap: str, names: list[str]) -> None:
        raise NotImplementedError

    def topic_partitions(self, bootstrap: str) -> dict[str, int]:
        """Every topic the cluster metadata lists, with its partition count."""
        raise NotImplementedError

    def describe_topic_configs(self, bootstrap: str, topic: str) -> dict[str, tuple[str, int]]:
        """name -> (value, Kafka ConfigSource id) of every config of the topic."""
        raise NotImplementedError

    def produce(self, bootstrap: str, topic: str, recs: list[Rec], codec: str,
                **overrides) -> list[tuple[int, int, int | None]]:
        """Send every record (acks=all, no idempotence); per record (partition, offset,
        timestamp as the producer reports it, or None when the client cannot be trusted with it)."""
        raise NotImplementedError

    def consume(self, bootstrap: str, topic: str, start: dict[int, int], count: int,
                **overrides) -> list[Got]:
        """Assign the partitions of ``start``, seek each to its offset, read ``count`` records."""
        raise NotImplementedError

    def list_offsets(self, bootstrap: str, topic: str, specs: dict[int, object], *,
                     via: str = "consumer") -> dict[int, tuple[int, int | None] | None]:
        """ListOffsets for each partition: spec EARLIEST, LATEST, MAX_TIMESTAMP (admin only) or a
        timestamp. Answers (offset, timestamp, or None when the client does not report one, as for
        EARLIEST / LATEST), or None when nothing matches (Kafka's offset -1)."""
        raise NotImplementedError

    admin_list_offsets = False   # list_offsets(via="admin") exists


def _deadline_loop(count: int, what: str, timeout: float = TIMEOUT_S):
    """Yields until the caller has collected ``count`` records; fails after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        yield
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: timed out waiting for {count} records")


class ConfluentDriver(Driver):
    name = "confluent"
    caps = Caps(null_key_and_value=True, null_header_value=True)
    admin_list_offsets = True

    def __init__(self, timeout: float = TIMEOUT_S):
        self.timeout = timeout
        import confluent_kafka
        from confluent_kafka import admin
        self.ck, self.admin = confluent_kafka, admin

    def _admin(self, bootstrap):
        return self.admin.AdminClient({"bootstrap.servers": bootstrap})

    def create_topics(self, bootstrap, topics):
        a = self._admin(bootstrap)      # keep a reference: a collected AdminClient fails its futures
        fs = a.create_topics(
            [self.admin.NewTopic(name, num_partitions=n, replication_factor=1, config=cfg)
             for name, (n, cfg) in topics.items()], operation_timeout=30, request_timeout=self.timeout)
        for f in fs.values():
            f.result(timeout=self.timeout)

    def delete_topics(self, bootstrap, names):
        a = self._admin(bootstrap)
        fs = a.delete_topics(names, operation_timeout=30, request_timeout=self.timeout)
        for f in fs.values():
            f.result(timeout=self.timeout)

    def topic_partitions(self, bootstrap):
        md = self._admin(bootstrap).list_topics(timeout=self.timeout)
        return {name: len(t.partitions) for name, t in md.topics.items() if t.error is None}

    def describe_topic_configs(self, bootstrap, topic):
        res = self.admin.ConfigResource(self.admin.ResourceType.TOPIC, topic)
        a = self._admin(bootstrap)
        fs = a.describe_configs([res], request_timeout=self.timeout)
        entries = fs[res].result(timeout=self.timeout)
        return {name: (e.value, int(e.source)) for name, e in entries.items()}

    def produce(self, bootstrap, topic, recs, codec, **overrides):
        conf = {"bootstrap.servers": bootstrap, "acks": "all", "compression.type": codec,
                "linger.ms": 5, **overrides}
        p = self.ck.Producer(conf)
        out: list = [None] * len(recs)

        def done(i, err, msg):
            out[i] = err if err is not None else (msg.partition(), msg.offset(), msg.timestamp()[1])

        for i, r in enumerate(recs):
            while True:
                try:
                    p.produce(topic, value=r.value, key=r.key, partition=r.partition,
                              timestamp=r.timestamp, headers=list(r.headers) or None,
                              on_delivery=functools.partial(done, i))
                    break
                except BufferError:
                    p.poll(0.05)
            if i % 1000 == 0:
                p.poll(0)
        assert p.flush(self.timeout) == 0, "confluent producer: messages left after flush"
        bad = [o for o in out if not isinstance(o, tuple)]
        assert not bad, f"confluent producer: {len(bad)} failed deliveries, first: {bad[0]}"
        return out

    def _consumer(self, bootstrap, **overrides):
        return self.ck.Consumer({"bootstrap.servers": bootstrap,
                                 "group.id": f"assign-only-{uuid.uuid4().hex}",
                                 "enable.auto.commit": False, "enable.auto.offset.store": False,
                                 **overrides})

    def consume(self, bootstrap, topic, start, count, **overrides):
        c = self._consumer(bootstrap, **overrides)
        out: list[Got] = []
        try:
            c.assign([self.ck.TopicPartition(topic, p, off) for p, off in start.items()])
            for _ in _deadline_loop(count, "confluent consumer", self.timeout):
                if len(out) >= count:
                    break
                for m in c.consume(num_messages=min(count - len(out), 10000), timeout=0.5):
                    if m.error():
                        raise self.ck.KafkaException(m.error())
                    ttype, ts = m.timestamp()
                    out.append(Got(m.partition(), m.offset(), m.key(), m.value(),
                                   tuple(m.headers() or ()), ts,
                                   {self.ck.TIMESTAMP_CREATE_TIME: CREATE_TIME,
                                    self.ck.TIMESTAMP_LOG_APPEND_TIME: LOG_APPEND_TIME}.get(ttype, str(ttype))))
        finally:
            c.close()
        return out

    def list_offsets(self, bootstrap, topic, specs, *, via="consumer"):
        TP = self.ck.TopicPartition
        out = {}
        if via == "admin":
            OS = self.admin.OffsetSpec

            def spec_of(s):
                return {EARLIEST: OS.earliest, LATEST: OS.latest, MAX_TIMESTAMP: OS.max_timestamp}.get(
                    s, lambda: OS.for_timestamp(s))()
            a = self._admin(bootstrap)
            fs = a.list_offsets({TP(topic, p): spec_of(s) for p, s in specs.items()},
                                request_timeout=self.timeout)
            for tp, f in fs.items():
                info, s = f.result(timeout=self.timeout), specs[tp.partition]
                out[tp.partition] = None if info.offset < 0 else (
                    info.offset, None if s in (EARLIEST, LATEST) else info.timestamp)
            return out
        c = self._consumer(bootstrap)
        try:
            times = [TP(topic, p, s) for p, s in specs.items() if s not in (EARLIEST, LATEST)]
            for tp in c.offsets_for_times(times, timeout=self.timeout) if times else []:
                assert tp.error is None, tp.error
                out[tp.partition] = None if tp.offset < 0 else (tp.offset, None)
            for p, s in specs.items():
                if s in (EARLIEST, LATEST):
                    lo, hi = c.get_watermark_offsets(TP(topic, p), timeout=self.timeout, cached=False)
                    out[p] = (lo if s == EARLIEST else hi, None)
        finally:
            c.close()
        return out


class KafkaPythonDriver(Driver):
    name = "kafka-python"
    caps = Caps(null_key_and_value=False, null_header_value=False)
    admin_list_offsets = True

    def __init__(self, timeout: float = TIMEOUT_S):
        self.timeout = timeout
        import kafka
        import kafka.admin
        self.k, self.ka = kafka, kafka.admin

    def _admin(self, bootstrap):
        return self.ka.KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=int(self.timeout * 1000))

    def create_topics(self, bootstrap, topics):
        with self._admin(bootstrap) as a:
            r = a.create_topics({name: {"num_partitions": n, "replication_factor": 1, "configs": cfg}
                                 for name, (n, cfg) in topics.items()})
        assert all(t["error_code"] == 0 for t in r["topics"]), r

    def delete_topics(self, bootstrap, names):
        with self._admin(bootstrap) as a:
            a.delete_topics(names)

    def topic_partitions(self, bootstrap):
        with self._admin(bootstrap) as a:
            return {t["name"]: len(t["partitions"]) for t in a.describe_topics() if t["error_code"] == 0}

    def describe_topic_configs(self, bootstrap, topic):
        CS = self.ka.ConfigSourceType
        with self._admin(bootstrap) as a:
            r = a.describe_configs([self.ka.ConfigResource(self.ka.ConfigResourceType.TOPIC, topic)],
                                   config_filter="all")
        return {name: (c["value"], int(CS[c["config_source"]])) for name, c in r["topic"][topic].items()}

    def produce(self, bootstrap, topic, recs, codec, **overrides):
        conf = dict(bootstrap_servers=bootstrap, acks="all", enable_idempotence=False, linger_ms=5,
                    compression_type=None if codec == "none" else codec)
        conf.update(overrides)
        p = self.k.KafkaProducer(**conf)
        try:
            futs = [p.send(topic, value=r.value, key=r.key, partition=r.partition,
                           timestamp_ms=r.timestamp, headers=list(r.headers)) for r in recs]
            p.flush(timeout=self.timeout)
            out = []
            for f in futs:
                md = f.get(timeout=self.timeout)
                out.append((md.partition, md.offset, md.timestamp))
        finally:
            p.close(timeout=10)
        return out

    def _consumer(self, bootstrap, **overrides):
        conf = dict(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                    auto_offset_reset="none", request_timeout_ms=int(self.timeout * 1000))
        conf.update(overrides)
        return self.k.KafkaConsumer(**conf)

    def consume(self, bootstrap, topic, start, count, **overrides):
        TP = self.k.TopicPartition
        c = self._consumer(bootstrap, **overrides)
        out: list[Got] = []
        try:
            c.assign([TP(topic, p) for p in start])
            for p, off in start.items():
                c.seek(TP(topic, p), off)
            for _ in _deadline_loop(count, "kafka-python consumer", self.timeout):
                if len(out) >= count:
                    break
                for tp, msgs in c.poll(timeout_ms=500, max_records=min(count - len(out), 10000)).items():
                    for m in msgs:
                        out.append(Got(m.partition, m.offset, m.key, m.value, tuple(m.headers or ()),
                                       m.timestamp, LOG_APPEND_TIME if m.timestamp_type == 1 else CREATE_TIME))
        finally:
            c.close()
        return out

    def list_offsets(self, bootstrap, topic, specs, *, via="consumer"):
        TP = self.k.TopicPartition
        out = {}
        if via == "admin":
            OS = self.ka.OffsetSpec
            with self._admin(bootstrap) as a:
                r = a.list_partition_offsets({TP(topic, p): {EARLIEST: OS.EARLIEST, LATEST: OS.LATEST,
                                                             MAX_TIMESTAMP: OS.MAX_TIMESTAMP}.get(s, s)
                                              for p, s in specs.items()})
            for tp, x in r.items():
                s = specs[tp.partition]
                out[tp.partition] = None if x.offset < 0 else (
                    x.offset, None if s in (EARLIEST, LATEST) else x.timestamp)
            return out
        c = self._consumer(bootstrap)
        try:
            out = _offsets_from(specs, lambda ps: c.beginning_offsets([TP(topic, p) for p in ps]),
                                lambda ps: c.end_offsets([TP(topic, p) for p in ps]),
                                lambda ts: c.offsets_for_times({TP(topic, p): t for p, t in ts.items()}))
        finally:
            c.close()
        return out


def _offsets_from(specs, earliest, latest, for_times):
    """Answer ``specs`` with one batched kafka-python consumer call per kind of spec."""
    out = {}
    kinds = {EARLIEST: [p for p, s in specs.items() if s == EARLIEST],
             LATEST: [p for p, s in specs.items() if s == LATEST]}
    if kinds[EARLIEST]:
        out.update({tp.partition: (off, None) for tp, off in earliest(kinds[EARLIEST]).items()})
    if kinds[LATEST]:
        out.update({tp.partition: (off, None) for tp, off in latest(kinds[LATEST]).items()})
    times = {p: s for p, s in specs.items() if s not in (EARLIEST, LATEST)}
    if times:
        out.update({tp.partition: None if r is None else (r.offset, r.timestamp)
                    for tp, r in for_times(times).items()})
    return out


class AiokafkaDriver(Driver):
    name = "aiokafka"
    caps = Caps(null_key_and_value=False, null_header_value=True)

    def __init__(self, timeout: float = TIMEOUT_S):
        self.timeout = timeout
        import aiokafka
        import aiokafka.admin
        import aiokafka.admin.config_resource
        self.ak, self.aka, self.cr = aiokafka, aiokafka.admin, aiokafka.admin.config_resource

    def _run(self, coro):
        return asyncio.run(asyncio.wait_for(coro, self.timeout * 2))

    async def _with_admin(self, bootstrap, fn):
        a = self.aka.AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=int(self.timeout * 1000))
        await a.start()
        try:
            return await fn(a)
        finally:
            await a.close()

    def create_topics(self, bootstrap, topics):
        new = [self.aka.NewTopic(name, n, 1, topic_configs=cfg) for name, (n, cfg) in topics.items()]
        r = self._run(self._with_admin(bootstrap, lambda a: a.create_topics(new)))
        assert all(t[1] == 0 for t in r.topic_errors), r

    def delete_topics(self, bootstrap, names):
        r = self._run(self._with_admin(bootstrap, lambda a: a.delete_topics(names)))
        assert all(t[1] == 0 for t in r.topic_error_codes), r

    def topic_partitions(self, bootstrap):
        ts = self._run(self._with_admin(bootstrap, lambda a: a.describe_topics()))
        return {t["topic"]: len(t["partitions"]) for t in ts if t["error_code"] == 0}

    def describe_topic_configs(self, bootstrap, topic):
        res = self.cr.ConfigResource(self.cr.ConfigResourceType.TOPIC, topic)
        [resp] = self._run(self._with_admin(bootstrap, lambda a: a.describe_configs([res])))
        [r] = resp.resources
        assert r[0] == 0, r
        return {e[0]: (e[1], e[3]) for e in r[4]}

    def produce(self, bootstrap, topic, recs, codec, **overrides):
        async def go():
            conf = dict(bootstrap_servers=bootstrap, acks="all", enable_idempotence=False, linger_ms=5,
                        compression_type=None if codec == "none" else codec,
                        request_timeout_ms=int(self.timeout * 1000))
            conf.update(overrides)
            p = self.ak.AIOKafkaProducer(**conf)
            await p.start()
            try:
                futs = [await p.send(topic, value=r.value, key=r.key, partition=r.partition,
                                     timestamp_ms=r.timestamp, headers=list(r.headers)) for r in recs]
                mds = await asyncio.gather(*futs)
            finally:
                await p.stop()
            # aiokafka 0.14 reports the first record's CreateTime for every record of a batch
            # (BatchBuilder.done overwrites its ``timestamp`` in the loop): only a LogAppendTime
            # (the broker's, one per batch) is worth reporting.
            return [(md.partition, md.offset, md.timestamp if md.timestamp_type == 1 else None)
                    for md in mds]
        return self._run(go())

    async def _consumer(self, bootstrap, **overrides):
        conf = dict(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                    auto_offset_reset="none", request_timeout_ms=int(self.timeout * 1000))
        conf.update(overrides)
        c = self.ak.AIOKafkaConsumer(**conf)
        await c.start()
        return c

    def consume(self, bootstrap, topic, start, count, **overrides):
        TP = self.ak.TopicPartition

        async def go():
            c = await self._consumer(bootstrap, **overrides)
            out: list[Got] = []
            try:
                c.assign([TP(topic, p) for p in start])
                for p, off in start.items():
                    c.seek(TP(topic, p), off)
                for _ in _deadline_loop(count, "aiokafka consumer", self.timeout):
                    if len(out) >= count:
                        break
                    batch = await c.getmany(timeout_ms=500, max_records=min(count - len(out), 10000))
                    for tp, msgs in batch.items():
                        for m in msgs:
                            out.append(Got(m.partition, m.offset, m.key, m.value, tuple(m.headers or ()),
                                           m.timestamp,
                                           LOG_APPEND_TIME if m.timestamp_type == 1 else CREATE_TIME))
            finally:
                await c.stop()
            return out
        return self._run(go())

    def list_offsets(self, bootstrap, topic, specs, *, via="consumer"):
        assert via == "consumer"
        TP = self.ak.TopicPartition

        async def go():
            c = await self._consumer(bootstrap)
            try:
                out = {}
                ps = [p for p, s in specs.items() if s == EARLIEST]
                if ps:
                    got = await c.beginning_offsets([TP(topic, p) for p in ps])
                    out.update({tp.partition: (off, None) for tp, off in got.items()})
                ps = [p for p, s in specs.items() if s == LATEST]
                if ps:
                    got = await c.end_offsets([TP(topic, p) for p in ps])
                    out.update({tp.partition: (off, None) for tp, off in got.items()})
                times = {TP(topic, p): s for p, s in specs.items() if s not in (EARLIEST, LATEST)}
                if times:
                    got = await c.offsets_for_times(times)
                    out.update({tp.partition: None if r is None else (r.offset, r.timestamp)
                                for tp, r in got.items()})
            finally:
                await c.stop()
            return out
        return self._run(go())


DRIVERS: dict[str, type[Driver]] = {d.name: d for d in (ConfluentDriver, KafkaPythonDriver, AiokafkaDriver)}
CLIENTS = tuple(DRIVERS)
# Who cross-checks whom: each client's records are also read by the next one.
OTHER = {"confluent": "kafka-python", "kafka-python": "aiokafka", "aiokafka": "confluent"}


def driver(name: str, timeout: float = TIMEOUT_S) -> Driver:
    """A driver whose every call gives up after about ``timeout`` seconds."""
    return DRIVERS[name](timeout)


def case_topic(*parts) -> str:
    return "-".join(str(p) for p in parts).replace("_", "-")


# ------------------------------------------------------------------------------------------------
# Raw views
# ------------------------------------------------------------------------------------------------

class RawBatch(NamedTuple):
    base_offset: int
    last_offset: int
    size: int
    codec: str
    timestamp_type: str
    max_timestamp: int


def _fetch12(bootstrap: str, topic: str, partition: int, offset: int, partition_max_bytes: int,
             max_bytes: int):
    with RawClient(bootstrap) as raw:
        r = raw.request(1, 12, {
            "replica_id": -1, "max_wait_ms": 0, "min_bytes": 0, "max_bytes": max_bytes,
            "isolation_level": 0, "session_id": 0, "session_epoch": -1,
            "topics": [{"topic": topic, "partitions": [
                {"partition": partition, "current_leader_epoch": -1, "fetch_offset": offset,
                 "log_start_offset": -1, "last_fetched_epoch": -1,
                 "partition_max_bytes": partition_max_bytes}]}],
            "forgotten_topics_data": [], "rack_id": ""})
    p = r.responses[0].partitions[0]
    assert p.error_code == 0, p
    return p


def raw_batches(bootstrap: str, topic: str, partition: int, offset: int = 0) -> list[RawBatch]:
    """Every batch the broker holds for the partition from ``offset`` on, read with Fetch v12."""
    out: list[RawBatch] = []
    while True:
        p = _fetch12(bootstrap, topic, partition, offset, 16 << 20, 16 << 20)
        data = bytes(p.records or b"")
        for _, h in iter_batch_headers(data):
            out.append(RawBatch(h.base_offset, h.base_offset + h.last_offset_delta, h.batch_length + 12,
                                CODECS_BY_ID[h.attributes & 7],
                                LOG_APPEND_TIME if h.attributes & 8 else CREATE_TIME, h.max_timestamp))
        if not out or out[-1].last_offset + 1 >= p.high_watermark:
            return out
        offset = out[-1].last_offset + 1


CODECS_BY_ID = ("none", "gzip", "snappy", "lz4", "zstd", "5?", "6?", "7?")


def raw_fetch_sizes(bootstrap: str, topic: str, partition: int, offset: int,
                    partition_max_bytes: int, max_bytes: int) -> tuple[int, list[RawBatch]]:
    """(bytes of records returned, the batches in them) for one Fetch v12."""
    p = _fetch12(bootstrap, topic, partition, offset, partition_max_bytes, max_bytes)
    data = bytes(p.records or b"")
    return len(data), [RawBatch(h.base_offset, h.base_offset + h.last_offset_delta, h.batch_length + 12,
                                CODECS_BY_ID[h.attributes & 7],
                                LOG_APPEND_TIME if h.attributes & 8 else CREATE_TIME, h.max_timestamp)
                       for _, h in iter_batch_headers(data)]


def raw_topic_error(bootstrap: str, topic: str) -> int:
    """The Metadata v12 error code of one topic, without auto-creating it."""
    with RawClient(bootstrap) as raw:
        r = raw.request(3, 12, {"topics": [{"name": topic, "topic_id": None}],
                                "allow_auto_topic_creation": False,
                                "include_topic_authorized_operations": False})
    return r.topics[0].error_code


# ------------------------------------------------------------------------------------------------
# Fixtures
# ------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def shared_appliance(tmp_path_factory, request):
    """One appliance for the whole test module (config from the module's APPLIANCE_CONFIG)."""
    d = tmp_path_factory.mktemp(request.module.__name__.rsplit(".", 1)[-1])
    a = Appliance(data_dir=str(d / "data"), log_path=str(d / "appliance.log"),
                  config=getattr(request.module, "APPLIANCE_CONFIG", {}))
    a.start()
    yield a
    a.terminate()


ERROR_MARKERS = (" ERROR ", " CRITICAL ", "Traceback")


def log_errors(a: Appliance, since: int) -> list[str]:
    with open(a.log_path, "rb") as f:
        f.seek(since)
        text = f.read().decode(errors="replace")
    return [line for line in text.splitlines() if any(m in line for m in ERROR_MARKERS)]


@pytest.fixture(autouse=True)
def _watch_shared_appliance(request):
    """For tests on ``shared_appliance``: print its log tail when the test fails, and fail a test
    that passed while the appliance logged an error or died (clients retry and hide crashes)."""
    if "shared_appliance" not in request.fixturenames:
        yield
        return
    a: Appliance = request.getfixturevalue("shared_appliance")
    since = os.path.getsize(a.log_path)
    yield
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        print(f"\n--- appliance log {a.log_path} (tail) ---\n{a.log_tail(120)}")
        return
    if request.node.get_closest_marker("xfail") is not None:
        return
    errors = log_errors(a, since)
    alive = a.proc is not None and a.proc.poll() is None
    if errors or not alive:
        pytest.fail(f"appliance {'died' if not alive else 'logged errors'} during the test "
                    f"(log {a.log_path}):\n" + "\n".join(errors[:20]) + "\n" + a.log_tail(60))
