"""Frame fuzzing for ``test_fuzz_frames.py``: record real clients' requests, mutate them with a
seeded generator, send them to the appliance and classify what it did.

- ``record_real_clients(bootstrap)`` drives confluent-kafka (admin, idempotent and transactional
  producers, a consumer group), kafka-python (admin, producer, transactional producer, consumer
  group) and aiokafka (producer, consumer group) against ``bootstrap``: a ``fault_proxy.FaultyProxy``
  whose ``on_request`` hook keeps every request frame in a ``Corpus``.
- ``Mutator`` turns corpus frames into hostile cases, reproducibly from a seed: byte flips,
  truncation, huge and negative lengths, varint bombs, another API's key, other versions,
  trailing garbage inside and after the frame, a bad size prefix, pure noise.
- ``run_cases`` sends each case on its own connection, framed by two ApiVersions requests (one
  before, which must always be answered, as Kafka answers the requests that came before a bad
  one; one after, answered unless the connection is closed), many connections at a time.

Test-only code; runs in the pytest process.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import io
import random
import struct
import time
import uuid
from dataclasses import dataclass, field

from kio.serial import entity_writer

from appliance.api import api_ranges, load_handlers
from appliance.protocol import frames, messages

API_VERSIONS_V0 = struct.pack(">hhih", 18, 0, 0, -1)     # header only: ApiVersions v0 has no body
BEFORE, AFTER = 0x0BEF0BEF, 0x0AF70AF7                  # correlation ids of the framing requests
# A case's answer is waited for this long; requests that may legitimately wait (a parked Fetch,
# a JoinGroup waiting for its rebalance, a Produce waiting for its timeout) are cut off there.
CASE_TIMEOUT_S = 2.0
# Requests that may legitimately stay unanswered for CASE_TIMEOUT_S when their fields are mutated
# (timeouts and waits come from the request). Any other request must be answered or closed.
MAY_WAIT = {0, 1, 11, 14, 19, 20}


# ---------------------------------------------------------------------------------------------
# Recording
# ---------------------------------------------------------------------------------------------

class Corpus:
    """Request frames (size prefix included) by (api key, version), at most ``per_kind`` each."""

    def __init__(self, per_kind: int = 12) -> None:
        self.per_kind = per_kind
        self.frames: dict[tuple[int, int], list[bytes]] = collections.defaultdict(list)
        self.seen: collections.Counter = collections.Counter()

    def add(self, frame: bytes) -> None:
        key, version = struct.unpack_from(">hh", frame, 4)
        kind = (key, version)
        self.seen[kind] += 1
        kept = self.frames[kind]
        if len(kept) < self.per_kind:
            kept.append(_defused(frame))
        elif self.seen[kind] % 7 == 0:   # keep some later ones too (a group's later heartbeats...)
            kept[self.seen[kind] % self.per_kind] = _defused(frame)

    def all(self) -> list[bytes]:
        return [f for kind in sorted(self.frames) for f in self.frames[kind]]

    def kinds(self) -> list[tuple[int, int]]:
        return sorted(self.frames)


def _defused(frame: bytes) -> bytes:
    """The frame, with a CreateTopics turned into validate_only: mutated topic names must not fork
    one writer process each on a two-core test machine (``topics.max_partitions`` bounds the rest)."""
    key, version = struct.unpack_from(">hh", frame, 4)
    if key != 19 or version < 1:
        return frame
    _header, offset = frames.parse_request_header(memoryview(frame)[4:])
    req = dataclasses.replace(messages.decode_request(key, version, frame[4:], offset), validate_only=True)
    buf = io.BytesIO()
    entity_writer(type(req))(buf, req)
    body = frame[4:4 + offset] + buf.getvalue()
    return struct.pack(">i", len(body)) + body


def record_real_clients(bootstrap: str, topic: str, timeout: float = 60.0) -> None:
    """Every kind of request the three Python clients send in ordinary use, through ``bootstrap``
    (which records them). ``topic`` (2 partitions) must exist."""
    for client in (_confluent, _kafka_python, _aiokafka):
        started = time.monotonic()
        client(bootstrap, topic, timeout)
        print(f"recorded {client.__name__.strip('_')} in {time.monotonic() - started:.1f} s")


def _confluent(b: str, topic: str, timeout: float) -> None:
    import confluent_kafka as ck
    from confluent_kafka import admin as ka

    a = ka.AdminClient({"bootstrap.servers": b})
    tmp = f"fz-ck-{uuid.uuid4().hex[:6]}"
    for f in a.create_topics([ka.NewTopic(tmp, 1, 1)], operation_timeout=30).values():
        f.result(timeout)
    res = ka.ConfigResource(ka.ResourceType.TOPIC, topic)
    a.describe_configs([res])[res].result(timeout)
    a.list_topics(timeout=timeout)
    fs = a.list_offsets({ck.TopicPartition(topic, 0): ka.OffsetSpec.latest(),
                         ck.TopicPartition(topic, 1): ka.OffsetSpec.earliest()})
    for f in fs.values():
        f.result(timeout)

    p = ck.Producer({"bootstrap.servers": b, "enable.idempotence": True, "acks": "all",
                     "compression.type": "zstd", "linger.ms": 5})
    for i in range(40):
        p.produce(topic, key=b"k%d" % i, value=b"v" * 50, partition=i % 2)
    assert p.flush(timeout) == 0

    group = f"fz-ck-g-{uuid.uuid4().hex[:6]}"
    c = ck.Consumer({"bootstrap.servers": b, "group.id": group, "auto.offset.reset": "earliest",
                     "enable.auto.commit": False, "isolation.level": "read_committed",
                     "session.timeout.ms": 6000})
    c.subscribe([topic])
    got = 0
    deadline = time.monotonic() + timeout
    while got < 40 and time.monotonic() < deadline:
        m = c.poll(0.2)
        if m is not None and not m.error():
            got += 1
    c.commit(asynchronous=False)
    c.committed([ck.TopicPartition(topic, 0), ck.TopicPartition(topic, 1)], timeout=timeout)

    t = ck.Producer({"bootstrap.servers": b, "transactional.id": f"fz-ck-tx-{uuid.uuid4().hex[:6]}",
                     "linger.ms": 5})
    t.init_transactions(timeout)
    t.begin_transaction()
    t.produce(topic, value=b"in a transaction", partition=0)
    t.send_offsets_to_transaction(c.position(c.assignment()), c.consumer_group_metadata(), timeout)
    t.commit_transaction(timeout)
    t.begin_transaction()
    t.produce(topic, value=b"aborted", partition=1)
    t.abort_transaction(timeout)
    c.close()

    a.list_consumer_groups().result(timeout)
    for f in a.describe_consumer_groups([group]).values():
        f.result(timeout)
    for f in a.delete_consumer_groups([group]).values():
        f.result(timeout)
    try:
        a.describe_cluster().result(timeout)
    except Exception:
        pass      # a librdkafka without DescribeCluster
    for f in a.delete_topics([tmp], operation_timeout=30).values():
        f.result(timeout)


def _kafka_python(b: str, topic: str, timeout: float) -> None:
    import kafka
    from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient, NewTopic

    a = KafkaAdminClient(bootstrap_servers=b, request_timeout_ms=int(timeout * 1000))
    tmp = f"fz-kp-{uuid.uuid4().hex[:6]}"
    a.create_topics([NewTopic(tmp, 1, 1)])
    a.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])
    try:
        a.describe_cluster()
    except Exception:
        pass

    p = kafka.KafkaProducer(bootstrap_servers=b, acks="all", enable_idempotence=True, linger_ms=5)
    for i in range(20):
        p.send(topic, key=b"k%d" % i, value=b"x" * 30, partition=i % 2)
    p.flush(timeout)
    p.close()

    group = f"fz-kp-g-{uuid.uuid4().hex[:6]}"
    c = kafka.KafkaConsumer(bootstrap_servers=b, group_id=group, auto_offset_reset="earliest",
                            enable_auto_commit=False, isolation_level="read_committed")
    # Metadata before the subscription: kafka-python 3.0 that joins before it knows the topic
    # assigns nothing, rejoins at once, and then sometimes never fetches (its own race; every
    # answer of ours was right, recorded through the proxy).
    c.topics()
    c.subscribe([topic])
    got = 0
    deadline = time.monotonic() + timeout
    while got < 20 and time.monotonic() < deadline:
        for recs in c.poll(200).values():
            got += len(recs)
    while True:
        # kafka-python may still be rejoining (see above): it says to poll and retry.
        try:
            c.commit()
            break
        except kafka.errors.RebalanceInProgressError:
            if time.monotonic() > deadline:
                raise
            c.poll(200)

    t = kafka.KafkaProducer(bootstrap_servers=b, transactional_id=f"fz-kp-tx-{uuid.uuid4().hex[:6]}",
                            linger_ms=5)
    t.init_transactions()
    t.begin_transaction()
    t.send(topic, value=b"in a transaction", partition=1)
    offsets = {tp: kafka.OffsetAndMetadata(c.position(tp), "", -1) for tp in c.assignment()}
    t.send_offsets_to_transaction(offsets, c.group_metadata())
    t.commit_transaction()
    t.close()
    c.close()

    txn_id = t.config["transactional_id"]
    tps = [kafka.TopicPartition(topic, 0), kafka.TopicPartition(topic, 1)]
    for call in (lambda: a.list_groups(), lambda: a.describe_groups([group]),
                 lambda: a.list_group_offsets({group: None}),
                 lambda: a.delete_group_offsets(group, [tps[0]]),
                 lambda: a.describe_producers(tps), lambda: a.list_transactions(),
                 lambda: a.describe_transactions([txn_id]), lambda: a.find_hanging_transactions(),
                 lambda: a.delete_groups([group]), lambda: a.delete_topics([tmp])):
        try:
            call()
        except kafka.errors.KafkaError:
            pass    # an answer with an error code is still a recorded request
    a.close()


def _aiokafka(b: str, topic: str, timeout: float) -> None:
    import aiokafka

    async def go() -> None:
        p = aiokafka.AIOKafkaProducer(bootstrap_servers=b, acks="all")
        await p.start()
        try:
            for i in range(10):
                await p.send_and_wait(topic, b"a" * 20, partition=i % 2)
        finally:
            await p.stop()
        c = aiokafka.AIOKafkaConsumer(topic, bootstrap_servers=b, group_id=f"fz-aio-{uuid.uuid4().hex[:6]}",
                                      auto_offset_reset="earliest", enable_auto_commit=False)
        await c.start()
        try:
            got = 0
            deadline = time.monotonic() + timeout
            while got < 10 and time.monotonic() < deadline:
                for recs in (await c.getmany(timeout_ms=200)).values():
                    got += len(recs)
            await c.commit()
        finally:
            await c.stop()

    asyncio.run(go())


# ---------------------------------------------------------------------------------------------
# Mutation
# ---------------------------------------------------------------------------------------------

@dataclass
class Case:
    kind: str
    data: bytes                 # what is sent after the first ApiVersions
    framed: bool                # the bytes are whole frames: the second ApiVersions can follow
    api_key: int                # as the (first) mutated frame's header says, -1 if none


_SPECIAL_32 = (0x7FFFFFFF, -1, -2, -(2**31), 0x40000000, 65536, 0)
_SPECIAL_16 = (0x7FFF, -1, -2, -(2**15), 0)


class Mutator:
    """Hostile cases from recorded frames, reproducible from ``seed``."""

    KINDS = ("flip", "flip", "truncate", "cut", "length", "length", "varint", "key", "version",
             "trailing", "garbage_after", "size", "noise", "double", "pipeline", "hangup")

    def __init__(self, corpus: list[bytes], seed: int) -> None:
        self.corpus = corpus
        self.rng = random.Random(seed)
        load_handlers()
        self.served = api_ranges()

    def cases(self, n: int):
        for _ in range(n):
            yield self.case()

    def inflated(self, n: int):
        """Valid requests grown to 0.6-2 MiB (slow to make, send and serve: sent apart)."""
        for _ in range(n):
            yield self.case("inflate")

    def case(self, kind: str | None = None) -> Case:
        rng = self.rng
        kind = kind or rng.choice(self.KINDS)
        frame = bytearray(rng.choice(self.corpus))
        if kind == "inflate":
            # A valid request grown past what one ring record holds (an array repeated, a bytes
            # field enlarged): larger than the appliance's own channels, not than Kafka's limit.
            return Case(kind, _inflate(bytes(frame), rng), True, _key_of(frame))
        if kind == "double":
            first = self.case(rng.choice(("flip", "length", "varint", "key", "version", "trailing")))
            body = bytearray(first.data)
            if len(body) > 8:
                self._mutate_body(body, rng.choice(("flip", "length", "varint")))
            return Case("double", bytes(body), True, first.api_key)
        if kind == "hangup":
            # Valid and mutated requests, then the client goes away without reading: whatever the
            # broker was waiting for on their behalf is answered to nobody.
            frames_ = [bytes(rng.choice(self.corpus)) for _ in range(rng.randint(1, 4))]
            if rng.random() < 0.5:
                frames_.append(self.case(rng.choice(("flip", "length", "version"))).data)
            return Case("hangup", b"".join(frames_), False, -1)
        if kind == "pipeline":
            # Good frames around a bad one in one write: the good ones before it are answered.
            bad = self.case(rng.choice(("flip", "length", "varint", "key", "version")))
            good = [bytes(rng.choice(self.corpus)) for _ in range(rng.randint(0, 2))]
            return Case("pipeline", b"".join(good) + bad.data, True, bad.api_key)
        if kind == "cut":
            cut = rng.randrange(4, len(frame))
            return Case(kind, bytes(frame[:cut]), False, _key_of(frame))
        if kind == "size":
            value = rng.choice((0x7FFFFFFF, -1, -(2**31), 0, 3, 9, len(frame) + rng.randint(1, 100)))
            struct.pack_into(">i", frame, 0, value)
            return Case(kind, bytes(frame), False, _key_of(frame))
        if kind == "noise":
            body = rng.randbytes(rng.randint(0, 300))
            if rng.random() < 0.5:
                return Case(kind, struct.pack(">i", len(body)) + body, True, _key_of(b"\0\0\0\0" + body))
            return Case(kind, body, False, -1)
        if kind == "garbage_after":
            return Case(kind, bytes(frame) + rng.randbytes(rng.randint(1, 64)), False, _key_of(frame))
        if kind == "key":
            choices = [k for k in self.served if k != _key_of(frame)]
            new = rng.choice(choices) if rng.random() < 0.7 else rng.choice((-1, 99, 1000, 32767, -32768, 17, 36))
            struct.pack_into(">h", frame, 4, new)
            return Case(kind, bytes(frame), True, new)
        if kind == "version":
            key = _key_of(frame)
            lo, hi = self.served.get(key, (0, 0))
            new = rng.choice((lo - 1, hi + 1, rng.randint(lo, hi), -1, 32767, rng.randint(0, 20)))
            struct.pack_into(">h", frame, 6, new)
            return Case(kind, bytes(frame), True, key)
        if kind == "trailing":
            frame += rng.randbytes(rng.randint(1, 64))
            struct.pack_into(">i", frame, 0, len(frame) - 4)
            return Case(kind, bytes(frame), True, _key_of(frame))
        if kind == "truncate":
            cut = rng.randrange(4 + 8, len(frame)) if len(frame) > 12 else len(frame)
            frame = frame[:cut]
            struct.pack_into(">i", frame, 0, len(frame) - 4)
            return Case(kind, bytes(frame), True, _key_of(frame))
        self._mutate_body(frame, kind)
        return Case(kind, bytes(frame), True, _key_of(frame))

    def _mutate_body(self, frame: bytearray, kind: str) -> None:
        """flip / length / varint on the header and body (the size prefix is fixed up)."""
        rng = self.rng
        start = 4 if rng.random() < 0.2 else min(12, len(frame))
        if kind == "flip":
            for _ in range(rng.randint(1, 4)):
                if len(frame) > start:
                    frame[rng.randrange(start, len(frame))] = rng.randrange(256)
        elif kind == "length":
            pos = rng.randrange(start, max(start + 1, len(frame) - 1))
            if rng.random() < 0.6:
                raw = struct.pack(">i", rng.choice(_SPECIAL_32))
            else:
                raw = struct.pack(">h", rng.choice(_SPECIAL_16))
            frame[pos:pos + len(raw)] = raw
        elif kind == "varint":
            pos = rng.randrange(start, len(frame) + 1)
            bomb = b"\xff" * rng.randint(4, 12) + bytes([rng.randrange(128)])
            if rng.random() < 0.5:
                frame[pos:pos] = bomb
            else:
                frame[pos:pos + len(bomb)] = bomb
        struct.pack_into(">i", frame, 0, len(frame) - 4)


def _inflate(frame: bytes, rng: random.Random) -> bytes:
    key, version = struct.unpack_from(">hh", frame, 4)
    _header, offset = frames.parse_request_header(memoryview(frame)[4:])
    req = messages.decode_request(key, version, frame[4:], offset)
    target = rng.randint(600 << 10, 2 << 20)
    grown = _grow(req, rng, target) or req
    buf = io.BytesIO()
    entity_writer(type(grown))(buf, grown)
    body = frame[4:4 + offset] + buf.getvalue()
    return struct.pack(">i", len(body)) + body


def _grow(entity, rng: random.Random, target: int):
    """A copy of ``entity`` with one array repeated or one bytes field enlarged to about
    ``target`` bytes; None if it has neither."""
    fs = list(dataclasses.fields(entity))
    rng.shuffle(fs)
    for f in fs:
        value = getattr(entity, f.name)
        kind = f.metadata.get("kafka_type")
        if kind in ("bytes", "records") and value is not None:
            return dataclasses.replace(entity, **{f.name: rng.randbytes(target)})
        if isinstance(value, tuple) and value:
            if dataclasses.is_dataclass(value[0]) and rng.random() < 0.5:
                inner = _grow(value[0], rng, target)
                if inner is not None:
                    return dataclasses.replace(entity, **{f.name: (inner,) + value[1:]})
            return dataclasses.replace(entity, **{f.name: value * max(1, target // 40 // len(value))})
        if dataclasses.is_dataclass(value):
            inner = _grow(value, rng, target)
            if inner is not None:
                return dataclasses.replace(entity, **{f.name: inner})
    return None


def _key_of(frame: bytes | bytearray) -> int:
    return struct.unpack_from(">h", frame, 4)[0] if len(frame) >= 6 else -1


# ---------------------------------------------------------------------------------------------
# Sending
# ---------------------------------------------------------------------------------------------

@dataclass
class Outcome:
    cases: int = 0
    by_kind: collections.Counter = field(default_factory=collections.Counter)
    answered: int = 0           # the second ApiVersions was answered: the connection lived on
    closed: int = 0             # the broker closed the connection
    waited: collections.Counter = field(default_factory=collections.Counter)   # api key -> cases
    before_unanswered: list = field(default_factory=list)   # cases whose first request got no answer
    refused_connects: int = 0
    timeout: float = CASE_TIMEOUT_S

    def summary(self) -> str:
        return (f"{self.cases} cases ({dict(self.by_kind)}): {self.answered} answered and kept open, "
                f"{self.closed} closed, {sum(self.waited.values())} still waiting after "
                f"{self.timeout}s by api key {dict(self.waited)}")


async def _read_frame(reader: asyncio.StreamReader) -> bytes | None:
    try:
        head = await reader.readexactly(4)
        (size,) = struct.unpack(">i", head)
        return await reader.readexactly(size)
    except (asyncio.IncompleteReadError, ConnectionError):
        return None


async def _one(port: int, case: Case, out: Outcome, timeout: float) -> None:
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        out.refused_connects += 1
        return
    try:
        before = struct.pack(">i", len(API_VERSIONS_V0)) + API_VERSIONS_V0
        before = before[:8] + struct.pack(">i", BEFORE) + before[12:]
        data = before + case.data
        if case.framed:
            after = bytearray(before)
            struct.pack_into(">i", after, 8, AFTER)
            data += after
        writer.write(data)
        if case.kind == "hangup":
            await writer.drain()
            if out.cases % 2:
                writer.transport.abort()    # RST instead of FIN
            out.closed += 1
            return
        if not case.framed:
            writer.write_eof()          # the broker sees the end of the stream after the bytes
        first = await asyncio.wait_for(_read_frame(reader), timeout * 2)
        if first is None or struct.unpack_from(">i", first)[0] != BEFORE:
            out.before_unanswered.append(case)
            return
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                out.waited[case.api_key] += 1
                return
            try:
                got = await asyncio.wait_for(_read_frame(reader), left)
            except TimeoutError:
                out.waited[case.api_key] += 1
                return
            if got is None:
                out.closed += 1
                return
            if struct.unpack_from(">i", got)[0] == AFTER:
                out.answered += 1
                return
    except (TimeoutError, ConnectionError):
        out.before_unanswered.append(case)
    finally:
        writer.close()
        try:
            await writer.wait_closed()
        except (ConnectionError, OSError):
            pass


async def _run(port: int, cases, concurrency: int, timeout: float, out: Outcome) -> None:
    queue: asyncio.Queue = asyncio.Queue(maxsize=concurrency * 2)

    async def worker() -> None:
        while (case := await queue.get()) is not None:
            out.cases += 1
            out.by_kind[case.kind] += 1
            await _one(port, case, out, timeout)

    workers = [asyncio.create_task(worker()) for _ in range(concurrency)]
    for case in cases:
        await queue.put(case)
    for _ in workers:
        await queue.put(None)
    await asyncio.gather(*workers)


def run_cases(port: int, cases, concurrency: int = 24, timeout: float = CASE_TIMEOUT_S) -> Outcome:
    """Send every case on its own connection, ``concurrency`` at a time; a case's answers are
    waited for ``timeout`` seconds (the first ApiVersions' for twice that)."""
    out = Outcome(timeout=timeout)
    asyncio.run(_run(port, cases, concurrency, timeout, out))
    return out


def pipelined_api_versions(port: int, n: int) -> int:
    """n ApiVersions requests in one write on one connection; how many were answered in order."""
    async def go() -> int:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            frames_ = []
            for i in range(n):
                h = bytearray(API_VERSIONS_V0)
                struct.pack_into(">i", h, 4, i)
                frames_.append(struct.pack(">i", len(h)) + bytes(h))
            writer.write(b"".join(frames_))
            answered = 0
            for i in range(n):
                got = await asyncio.wait_for(_read_frame(reader), 30)
                if got is None or struct.unpack_from(">i", got)[0] != i:
                    break
                answered += 1
            return answered
        finally:
            writer.close()
    return asyncio.run(go())
