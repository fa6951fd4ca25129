"""Locust load test: Kafka producers against the appliance (confluent-kafka).

Runs inside Locust (gevent), on the load generator, not in the appliance:

    .venv/bin/locust -f loadtests/locustfile.py --host 127.0.0.1:9092
    .venv/bin/locust -f loadtests/locustfile.py --headless -u 4 -r 4 -t 10s --host 127.0.0.1:9092

``--host`` is the bootstrap address (``HOST:PORT``; a ``kafka://`` prefix is allowed). Every
Locust user is one confluent-kafka producer. Each delivery report becomes one Locust request event:

    request_type "produce", name = the topic, response_time = ms from produce() to the delivery
    report, response_length = record value bytes, exception = the delivery error if any.

Settings, from the environment (defaults in brackets):

    KAFKA_TOPIC                topic to produce to [locust]; created on first use by the
                               appliance's auto-creation (topics.auto_create, on by default),
                               with topics.default_partitions partitions
    KAFKA_RECORD_SIZE          record value size in bytes [100]
    KAFKA_ACKS                 producer acks: -1/all, 0 or 1 [-1]
    KAFKA_LINGER_MS            producer linger.ms [5]
    KAFKA_WAIT_MS              pause of each user between two produce() calls, ms [0 = none,
                               as fast as the user can; every user still yields to the others]
    KAFKA_DELIVERY_TIMEOUT_MS  delivery.timeout.ms: a record not acknowledged by then is reported
                               as a failure [10000]
    KAFKA_STOP_TIMEOUT_MS      at the end, how long a user waits for its outstanding deliveries;
                               what is left is purged and reported as failures [5000]

gevent and librdkafka: produce() and poll(0) never block, but poll(t > 0) and flush() block in C
and would freeze every greenlet of the process. So nothing here blocks in C: each user runs a
small poll greenlet (poll(0), then gevent.sleep) that fires the delivery callbacks, and the tasks
yield with gevent.sleep whenever librdkafka's queue is full. If no broker answers, the producer's
error callback reports _ALL_BROKERS_DOWN as a failure at once, and every undelivered record is a
failure when it times out or is purged at the end, so Locust exits non-zero.
"""

from __future__ import annotations

import os
import time
from typing import Any

import gevent
from confluent_kafka import KafkaError, Producer
from locust import User, constant, task


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip().lower()
    if not raw:
        return default
    if name == "KAFKA_ACKS" and raw == "all":
        return -1
    return int(raw)


TOPIC = os.environ.get("KAFKA_TOPIC", "locust")
RECORD_SIZE = _env_int("KAFKA_RECORD_SIZE", 100)
ACKS = _env_int("KAFKA_ACKS", -1)
LINGER_MS = _env_int("KAFKA_LINGER_MS", 5)
WAIT_MS = _env_int("KAFKA_WAIT_MS", 0)
DELIVERY_TIMEOUT_MS = _env_int("KAFKA_DELIVERY_TIMEOUT_MS", 10000)
STOP_TIMEOUT_MS = _env_int("KAFKA_STOP_TIMEOUT_MS", 5000)

POLL_INTERVAL_S = 0.001   # how often the poll greenlet fires delivery callbacks
# Errors of the error callback that mean "nothing works", reported as failures. Others
# (a single disconnect, which librdkafka retries on its own) are not.
_FATAL_CODES = {KafkaError._ALL_BROKERS_DOWN, KafkaError._AUTHENTICATION, KafkaError._FATAL}


def bootstrap_of(host: str | None) -> str:
    if not host:
        raise ValueError("give the bootstrap address with --host HOST:PORT")
    for prefix in ("kafka://", "tcp://", "http://"):
        if host.startswith(prefix):
            host = host[len(prefix):]
    return host.rstrip("/")


class KafkaProducerUser(User):
    """One confluent-kafka producer; every task call produces one record."""

    wait_time = constant(WAIT_MS / 1000)

    def on_start(self) -> None:
        self.value = os.urandom(RECORD_SIZE)
        self.stopping = False
        self.producer = Producer({
            "bootstrap.servers": bootstrap_of(self.host),
            "acks": ACKS,
            "linger.ms": LINGER_MS,
            "delivery.timeout.ms": DELIVERY_TIMEOUT_MS,
            "client.id": f"locust-{id(self):x}",
            "error_cb": self._on_error,
        })
        self.poller = gevent.spawn(self._poll_loop)

    def _poll_loop(self) -> None:
        poll = self.producer.poll
        while not self.stopping:
            poll(0)
            gevent.sleep(POLL_INTERVAL_S)

    def _on_error(self, err: KafkaError) -> None:
        if err.code() in _FATAL_CODES or err.fatal():
            self.environment.events.request.fire(
                request_type="produce", name=TOPIC, response_time=0, response_length=0,
                exception=RuntimeError(f"producer error: {err.str()}"), context={})

    def _report(self, started: float):
        fire = self.environment.events.request.fire

        def on_delivery(err: Any, msg: Any) -> None:
            fire(request_type="produce", name=TOPIC,
                 response_time=(time.perf_counter() - started) * 1000.0,
                 response_length=RECORD_SIZE,
                 exception=RuntimeError(f"delivery failed: {err.str()}") if err is not None else None,
                 context={})
        return on_delivery

    @task
    def produce(self) -> None:
        while True:
            try:
                self.producer.produce(TOPIC, self.value, on_delivery=self._report(time.perf_counter()))
                return
            except BufferError:
                # librdkafka's queue is full: let the poll greenlet drain delivery reports.
                gevent.sleep(0.005)

    def on_stop(self) -> None:
        # Collect the outstanding delivery reports without blocking in C (no flush()).
        deadline = time.monotonic() + STOP_TIMEOUT_MS / 1000
        while len(self.producer) > 0 and time.monotonic() < deadline:
            gevent.sleep(0.01)
        self.stopping = True
        self.poller.join(timeout=1)
        if len(self.producer) > 0:
            # Drop the rest: their delivery reports (_PURGE_QUEUE / _PURGE_INFLIGHT) count as
            # failures, so a run against a dead broker cannot look clean.
            self.producer.purge(in_queue=True, in_flight=True, blocking=False)
            self.producer.poll(0)

