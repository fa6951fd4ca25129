"""Transactional producers of the three real clients behind one small surface, for
``test_transactions.py``.

``txn_producer(client, bootstrap, transactional_id, **opts)`` returns an object with
``init() / begin() / send(topic, partition, key, value) / flush() / commit() / abort() / close()``,
each a call of THAT client's public transactional API (confluent-kafka: ``init_transactions``,
``begin_transaction``, ``produce``, ``flush``, ``commit_transaction``, ``abort_transaction``;
kafka-python: the same names on ``KafkaProducer``; aiokafka: the same on ``AIOKafkaProducer``, run
on one private event loop). ``is_fenced(client, exc)`` tells whether an exception is the fatal
"you were fenced" error that client raises when a newer instance took over its transactional id.

Consumers come from ``clients.py`` (``driver(name).consume(..., isolation_level=...)``).
"""

from __future__ import annotations

import asyncio

TIMEOUT_S = 60.0


class _Confluent:
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


class _KafkaPython:
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


class _Aiokafka:
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


PRODUCERS = {"confluent": _Confluent, "kafka-python": _KafkaPython, "aiokafka": _Aiokafka}


def txn_producer(client: str, bootstrap: str, transactional_id: str, **opts):
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
