"""Every Python client over SASL_SSL with SCRAM-SHA-512 against one appliance with the
authorizer on: produce, transactions (commit and abort), a consumer group reading read_committed
and committing offsets, and, with the appliance's own client, KIP-939's prepared transactions
(2PC) and five Produce requests in flight on one TLS connection. The clients log in as ``app``,
no super user: what they do is allowed by ACLs (``APP_ACLS``, made by the admin over SASL_SSL),
and a user without ACLs is refused."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from appliance_harness import Appliance
from client_drivers import txn_producer
from security_setup import (ADMIN, ADMIN_PASSWORD, aiokafka_config, appliance_client_config,
                            confluent_config, grant, kafka_python_config, secure_appliance)

APP, APP_PASSWORD = "app", "app-secret"
NOBODY, NOBODY_PASSWORD = "nobody", "nobody-secret"
# (resource type, name, pattern, operation) allowed to User:app: what its tests need, no more.
APP_ACLS = [("TOPIC", "sasl-ssl-", "PREFIXED", "ALL"),
            ("GROUP", "group-", "PREFIXED", "READ"),
            ("TRANSACTIONAL_ID", "tx-sasl-ssl-", "PREFIXED", "WRITE"),
            ("TRANSACTIONAL_ID", "twopc", "LITERAL", "WRITE"),
            ("TRANSACTIONAL_ID", "twopc", "LITERAL", "TWO_PHASE_COMMIT")]

N = 10
TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    d = tmp_path_factory.mktemp("secure-clients")
    made = []

    def factory(data_dir=None, start=True, **config):
        a = Appliance(data_dir=data_dir, log_path=str(d / "appliance.log"), config=config)
        made.append(a)
        return a.start() if start else a
    s = secure_appliance(factory, d, protocols=("SASL_SSL",),
                         users={ADMIN: ADMIN_PASSWORD, APP: APP_PASSWORD, NOBODY: NOBODY_PASSWORD},
                         groups={"initial_rebalance_delay_ms": 0},
                         transactions={"two_phase_commit_enable": True},
                         authorizer={"enable": True, "super_users": [f"User:{ADMIN}"]},
                         # A writer stopped on purpose is not replaced meanwhile.
                         supervisor={"heartbeat_timeout_ms": 60000})
    grant(s, APP, APP_ACLS)
    yield s
    for a in made:
        a.terminate()


def _txn_extra(client: str, s) -> dict:
    if client == "confluent":
        c = confluent_config(s, "SASL_SSL", APP, APP_PASSWORD)
        c.pop("bootstrap.servers")
        return c
    c = kafka_python_config(s, "SASL_SSL", APP, APP_PASSWORD) if client == "kafka-python" else aiokafka_config(s, "SASL_SSL", APP, APP_PASSWORD)
    c.pop("bootstrap_servers")
    return c


def _transactions(client: str, s, topic: str) -> None:
    """Commit N records in one transaction, abort N in another."""
    p = txn_producer(client, s.bootstrap("SASL_SSL"), f"tx-{topic}", **_txn_extra(client, s))
    try:
        p.init()
        p.begin()
        for i in range(N):
            p.send(topic, 0, None, f"committed-{i}".encode())
        p.flush()
        p.commit()
        p.begin()
        for i in range(N):
            p.send(topic, 0, None, f"aborted-{i}".encode())
        p.flush()
        p.abort()
    finally:
        p.close()


def _consume_confluent(s, topic: str, group: str, want: int) -> list[bytes]:
    import confluent_kafka as ck
    c = ck.Consumer(confluent_config(s, "SASL_SSL", APP, APP_PASSWORD, **{
        "group.id": group, "auto.offset.reset": "earliest", "isolation.level": "read_committed",
        "enable.auto.commit": False}))
    c.subscribe([topic])
    got = []
    deadline = time.monotonic() + TIMEOUT_S
    while len(got) < want and time.monotonic() < deadline:
        m = c.poll(1.0)
        if m is not None and not m.error():
            got.append(m.value())
    c.commit(asynchronous=False)
    c.close()
    return got


def _consume_kafka_python(s, topic: str, group: str, want: int) -> list[bytes]:
    import kafka
    c = kafka.KafkaConsumer(topic, group_id=group, auto_offset_reset="earliest",
                            isolation_level="read_committed", enable_auto_commit=False,
                            **kafka_python_config(s, "SASL_SSL", APP, APP_PASSWORD))
    got = []
    deadline = time.monotonic() + TIMEOUT_S
    while len(got) < want and time.monotonic() < deadline:
        for records in c.poll(1000).values():
            got.extend(r.value for r in records)
    c.commit()
    c.close()
    return got


def _consume_aiokafka(s, topic: str, group: str, want: int) -> list[bytes]:
    import aiokafka

    async def run():
        c = aiokafka.AIOKafkaConsumer(topic, group_id=group, auto_offset_reset="earliest",
                                      isolation_level="read_committed", enable_auto_commit=False,
                                      **aiokafka_config(s, "SASL_SSL", APP, APP_PASSWORD))
        await c.start()
        got = []
        try:
            deadline = time.monotonic() + TIMEOUT_S
            while len(got) < want and time.monotonic() < deadline:
                for records in (await c.getmany(timeout_ms=1000)).values():
                    got.extend(r.value for r in records)
            await c.commit()
        finally:
            await c.stop()
        return got
    return asyncio.run(run())


CONSUMERS = {"confluent": _consume_confluent, "kafka-python": _consume_kafka_python,
             "aiokafka": _consume_aiokafka}


@pytest.mark.parametrize("client", ["confluent", "kafka-python", "aiokafka"])
def test_transactions_and_groups_over_sasl_ssl(secured, client):
    topic = f"sasl-ssl-{client}"
    _transactions(client, secured, topic)
    consume = CONSUMERS[client]
    got = consume(secured, topic, f"group-{client}", N)
    assert got == [f"committed-{i}".encode() for i in range(N)]
    # The group's committed offset (past the abort marker) holds: a new member of the group
    # resumes there and sees the next committed transaction only.
    _transactions(client, secured, topic)
    again = consume(secured, topic, f"group-{client}", N)
    assert again == [f"committed-{i}".encode() for i in range(N)]


def test_the_appliance_client_with_two_phase_commit_over_sasl_ssl(secured):
    from appliance.client import Consumer, Producer
    topic = "sasl-ssl-appliance-2pc"
    conf = appliance_client_config(secured, "SASL_SSL", APP, APP_PASSWORD)
    p = Producer(conf, transactional_id="twopc", enable_two_phase_commit=True)
    try:
        p.init_transactions(keep_prepared_txn=True)
        p.begin_transaction()
        for i in range(N):
            p.send(topic, f"prepared-{i}".encode(), partition=0)
        state = p.prepare_transaction()
    finally:
        p.close()
    # A new incarnation (as after a crash) completes what the database recorded.
    p = Producer(conf, transactional_id="twopc", enable_two_phase_commit=True)
    try:
        p.init_transactions(keep_prepared_txn=True)
        p.complete_transaction(state)
    finally:
        p.close()
    c = Consumer(appliance_client_config(secured, "SASL_SSL", APP, APP_PASSWORD, mechanism="PLAIN"))
    try:
        c.assign([(topic, 0)])
        c.seek_to_beginning()
        got = []
        deadline = time.monotonic() + TIMEOUT_S
        while len(got) < N and time.monotonic() < deadline:
            got.extend(r.value for r in c.poll(1000))
    finally:
        c.close()
    assert got == [f"prepared-{i}".encode() for i in range(N)]


def test_the_appliance_client_keeps_five_produce_requests_in_flight_over_sasl_ssl(secured):
    from appliance.client import Consumer, Producer
    topic = "sasl-ssl-pipelined"
    conf = appliance_client_config(secured, "SASL_SSL")
    p = Producer(conf, enable_idempotence=True, acks="all", linger_ms=0, batch_size=1024,
                 request_timeout_ms=60000)
    try:
        p.send(topic, b"first", partition=0)
        p.flush()                                   # the topic and its writer exist now
        writer = secured.app.writer(topic, 0)["pid"]
        # The stopped writer holds every acks=all answer: the requests pile up in flight.
        os.kill(writer, signal.SIGSTOP)
        try:
            for i in range(40):
                p.send(topic, f"{i:04d}".encode() * 200, partition=0)
            (conn,) = [c for c in p.cluster.conns.values() if c.in_flight]
            assert conn.in_flight == 5 and conn.security.protocol == "SASL_SSL"
        finally:
            os.kill(writer, signal.SIGCONT)
        p.flush()
    finally:
        p.close()
    c = Consumer(conf)
    try:
        c.assign([(topic, 0)])
        c.seek_to_beginning()
        got = []
        deadline = time.monotonic() + TIMEOUT_S
        while len(got) < 41 and time.monotonic() < deadline:
            got.extend(r.value for r in c.poll(1000))
    finally:
        c.close()
    # Every record once, in the order sent (the sequence numbers kept the requests in order).
    assert got == [b"first"] + [f"{i:04d}".encode() * 200 for i in range(40)]


def test_the_appliance_client_refuses_a_wrong_password(secured):
    from appliance.client import KafkaError, Producer
    with pytest.raises(KafkaError) as e:
        p = Producer(appliance_client_config(secured, "SASL_SSL", APP, password="wrong"),
                     max_block_ms=5000)
        try:
            p.send("never", b"x")
            p.flush()
        finally:
            p.close()
    assert "SASL_AUTHENTICATION_FAILED" in str(e.value) or "invalid credentials" in str(e.value)


def test_a_user_without_acls_is_refused_over_sasl_ssl(secured):
    """Authenticated is not authorized: ``nobody`` logs in but may neither write nor read."""
    import confluent_kafka as ck
    got = []
    p = ck.Producer(confluent_config(secured, "SASL_SSL", NOBODY, NOBODY_PASSWORD,
                                     **{"message.timeout.ms": 10000}))
    p.produce("sasl-ssl-confluent", b"v", on_delivery=lambda err, msg: got.append(err))
    p.flush(20)
    assert got and got[0] is not None
    assert got[0].code() == ck.KafkaError.TOPIC_AUTHORIZATION_FAILED
    c = ck.Consumer(confluent_config(secured, "SASL_SSL", NOBODY, NOBODY_PASSWORD, **{
        "group.id": "group-nobody", "auto.offset.reset": "earliest"}))
    try:
        c.subscribe(["sasl-ssl-confluent"])
        deadline = time.monotonic() + TIMEOUT_S
        err = None
        while err is None and time.monotonic() < deadline:
            m = c.poll(1.0)
            if m is not None and m.error():
                err = m.error()
    finally:
        c.close()
    assert err is not None and err.code() in (ck.KafkaError.GROUP_AUTHORIZATION_FAILED,
                                              ck.KafkaError.TOPIC_AUTHORIZATION_FAILED), err
