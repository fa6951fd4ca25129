"""The client drivers: the real Python Kafka clients (confluent-kafka, kafka-python, aiokafka) and
the appliance's own (``appliance.client``), each driven through its public API, for the
integration tests. Runs in the pytest process (the clients' own threads and event loops are
theirs, not ours). Owns:

- one ``Driver`` per real client with the same small surface (create/delete topics, produce and
  return each record's (partition, offset), consume by assignment from given offsets,
  ListOffsets, DescribeConfigs, topic metadata), every call through THAT client's public API,
  normalised into ``Got`` / plain tuples so that tests compare clients with each other and with
  what was produced (the records: client_records.py); ``driver(name)``, ``CLIENTS``, ``OTHER``;
- the transactional producers of the same three clients behind one surface: ``txn_producer(
  client, bootstrap, transactional_id, **opts)`` (confluent-kafka: ``init_transactions``,
  ``begin_transaction``, ``produce``, ``flush``, ``commit_transaction``, ``abort_transaction``;
  kafka-python: the same names on ``KafkaProducer``; aiokafka: the same on ``AIOKafkaProducer``,
  run on one private event loop), and ``is_fenced(client, exc)``: whether an exception is the
  fatal "you were fenced" error that client raises once a newer instance took over its id;
- the appliance's own client reading a topic back: ``uid`` (unique names), ``create`` (topics),
  ``settle`` (no transaction open), ``read_all`` (every record of a partition set, up to the end
  offset of an isolation level), ``values_of``.

Consumers assign partitions and seek (consumer groups have their own tests, each member a process:
programs/group_member.py); confluent-kafka insists on a group.id even for assign(), it never joins.
What the broker itself stores is raw_wire.py's (``raw_batches``, ``stored_batches``).
"""

from __future__ import annotations

import asyncio
import functools
import time
import uuid

from appliance.client import Consumer
from client_records import CREATE_TIME, LOG_APPEND_TIME, Caps, Got, Rec

# ListOffsets specs; an int is a timestamp. MAX_TIMESTAMP (KIP-734) only through admin APIs.
EARLIEST, LATEST, MAX_TIMESTAMP = "earliest", "latest", "max_timestamp"
TIMEOUT_S = 60.0


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
    """The topic of one parametrized case (the same name every run: the shared appliance is the
    module's own)."""
    return "-".join(str(p) for p in parts).replace("_", "-")


# ------------------------------------------------------------------------------------------------
# Transactional producers
# ------------------------------------------------------------------------------------------------

class _ConfluentTxn:
    def __init__(self, bootstrap: str, tid: str, codec: str = "none", timeout_ms: int = 60000, **extra):
        import confluent_kafka
        self.ck = confluent_kafka
        conf = {"bootstrap.servers": bootstrap, "transactional.id": tid, "compression.type": codec,
                "linger.ms": 5, "transaction.timeout.ms": timeout_ms,
                "message.timeout.ms": min(timeout_ms, 60000)}
        conf.update(extra)
        self.p = confluent_kafka.Producer(conf)
        self.errors: list = []

    def init(self):
        self.p.init_transactions(TIMEOUT_S)

    def begin(self):
        self.p.begin_transaction()

    def send(self, topic, partition, key, value):
        def done(err, msg):
            if err is not None:
                self.errors.append(err)
        while True:
            try:
                self.p.produce(topic, value=value, key=key, partition=partition, on_delivery=done)
                return
            except BufferError:
                self.p.poll(0.1)

    def flush(self):
        assert self.p.flush(TIMEOUT_S) == 0
        assert not self.errors, self.errors

    def commit(self):
        self.p.commit_transaction(TIMEOUT_S)

    def abort(self):
        self.p.abort_transaction(TIMEOUT_S)

    def close(self):
        self.p.purge()
        self.p.flush(1)


class _KafkaPythonTxn:
    def __init__(self, bootstrap: str, tid: str, codec: str = "none", timeout_ms: int = 60000, **extra):
        import kafka
        self.p = kafka.KafkaProducer(bootstrap_servers=bootstrap, transactional_id=tid,
                                     compression_type=None if codec == "none" else codec,
                                     linger_ms=5, transaction_timeout_ms=timeout_ms,
                                     request_timeout_ms=int(TIMEOUT_S * 1000), **extra)
        self.futures: list = []

    def init(self):
        self.p.init_transactions()

    def begin(self):
        self.p.begin_transaction()

    def send(self, topic, partition, key, value):
        self.futures.append(self.p.send(topic, key=key, value=value, partition=partition))

    def flush(self):
        self.p.flush(TIMEOUT_S)
        for f in self.futures:
            f.get(TIMEOUT_S)
        self.futures.clear()

    def commit(self):
        self.p.commit_transaction()

    def abort(self):
        self.p.abort_transaction()

    def close(self):
        self.p.close(timeout=5)


class _AiokafkaTxn:
    def __init__(self, bootstrap: str, tid: str, codec: str = "none", timeout_ms: int = 60000, **extra):
        import aiokafka
        self.loop = asyncio.new_event_loop()
        self.ak = aiokafka

        async def make():
            return aiokafka.AIOKafkaProducer(
                bootstrap_servers=bootstrap, transactional_id=tid,
                compression_type=None if codec == "none" else codec, linger_ms=5,
                transaction_timeout_ms=timeout_ms, request_timeout_ms=int(TIMEOUT_S * 1000), **extra)
        self.p = self._run(make())
        self.futures: list = []
        self.started = False

    def _run(self, coro):
        return self.loop.run_until_complete(asyncio.wait_for(coro, TIMEOUT_S * 2))

    def init(self):
        # aiokafka initialises transactions (InitProducerId) inside start().
        self._run(self.p.start())
        self.started = True

    def begin(self):
        self._run(self.p.begin_transaction())

    def send(self, topic, partition, key, value):
        self.futures.append(self._run(self.p.send(topic, key=key, value=value, partition=partition)))

    def flush(self):
        self._run(self.p.flush())
        for f in self.futures:
            self._run(f)
        self.futures.clear()

    def commit(self):
        self._run(self.p.commit_transaction())

    def abort(self):
        self._run(self.p.abort_transaction())

    def close(self):
        try:
            if self.started:
                self._run(self.p.stop())
        finally:
            self.loop.close()


PRODUCERS = {"confluent": _ConfluentTxn, "kafka-python": _KafkaPythonTxn, "aiokafka": _AiokafkaTxn}


def txn_producer(client: str, bootstrap: str, transactional_id: str, **opts):
    """A transactional producer of ``client`` (one of CLIENTS): ``init() / begin() / send(topic,
    partition, key, value) / flush() / commit() / abort() / close()``, each a call of that
    client's public transactional API."""
    return PRODUCERS[client](bootstrap, transactional_id, **opts)


def is_fenced(client: str, exc: BaseException) -> bool:
    """The error each client raises once a newer producer with its transactional id fenced it:
    librdkafka a fatal KafkaError (_FENCED, PRODUCER_FENCED or INVALID_PRODUCER_EPOCH, KIP-588),
    kafka-python ProducerFencedError / InvalidProducerEpochError, aiokafka ProducerFenced."""
    if client == "confluent":
        import confluent_kafka
        if not isinstance(exc, confluent_kafka.KafkaException):
            return False
        err = exc.args[0]
        return err.fatal() and err.code() in (confluent_kafka.KafkaError._FENCED,
                                             confluent_kafka.KafkaError.PRODUCER_FENCED,
                                             confluent_kafka.KafkaError.INVALID_PRODUCER_EPOCH)
    name = type(exc).__name__
    return "Fenced" in name or "InvalidProducerEpoch" in name


# ------------------------------------------------------------------------------------------------
# The appliance's own client: topics read back
# ------------------------------------------------------------------------------------------------

def uid(*parts) -> str:
    """A name of its own for a topic, group or transactional id: the parts and 6 random hex digits."""
    return "-".join(str(p) for p in parts) + "-" + uuid.uuid4().hex[:6]


def create(bootstrap: str, topics: dict[str, int]) -> None:
    """Create ``topics`` (name -> partitions) through confluent-kafka's AdminClient."""
    driver("confluent").create_topics(bootstrap, {t: (n, {}) for t, n in topics.items()})


def settle(bootstrap: str, topic: str, partitions: int) -> None:
    """Wait until no transaction is open on the partitions (LSO == high watermark). EndTxn is
    answered once the outcome is logged; the markers follow, so a transaction just committed may
    still pin the LSO for a moment."""
    tps = [(topic, p) for p in range(partitions)]
    with Consumer(bootstrap_servers=bootstrap) as rc, \
            Consumer(bootstrap_servers=bootstrap, isolation_level="read_uncommitted") as ru:
        deadline = time.monotonic() + TIMEOUT_S
        while rc.end_offsets(tps) != ru.end_offsets(tps):
            assert time.monotonic() < deadline, f"{topic}: a transaction stays open"
            time.sleep(0.05)


def read_all(bootstrap: str, topic: str, partitions: int, level: str = "read_committed", *,
             settled: bool = True, **config) -> dict[int, list]:
    """partition -> every record our consumer returns from offset 0 up to the end offset of its
    isolation level (high watermark, or the LSO for read_committed). Stops on positions, not on
    a count, so an extra record cannot hide. ``settled``: first wait until no transaction is
    open (pass False where a test expects one to stay open)."""
    if settled:
        settle(bootstrap, topic, partitions)
    c = Consumer(bootstrap_servers=bootstrap, isolation_level=level, **config)
    try:
        tps = [(topic, p) for p in range(partitions)]
        c.assign(tps)
        c.seek_to_beginning()
        end = c.end_offsets(tps)
        out: dict[int, list] = {p: [] for p in range(partitions)}
        deadline = time.monotonic() + TIMEOUT_S
        while any(c.position(tp) < end[tp] for tp in tps):
            assert time.monotonic() < deadline, f"positions {[c.position(tp) for tp in tps]} < {end}"
            for r in c.poll(500):
                out[r.partition].append(r)
        for p, recs in out.items():
            offs = [r.offset for r in recs]
            assert offs == sorted(set(offs)), f"partition {p}: offsets {offs}"
        return out
    finally:
        c.close()


def values_of(by_partition: dict[int, list]) -> dict[int, list[bytes]]:
    return {p: [r.value for r in recs] for p, recs in by_partition.items() if recs}
