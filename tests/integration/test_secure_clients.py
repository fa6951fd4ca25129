"""Every Python client over SASL_SSL with SCRAM-SHA-512 against one appliance: produce,
transactions (commit and abort), a consumer group reading read_committed and committing offsets,
and, with the appliance's own client, KIP-939's prepared transactions (2PC)."""

from __future__ import annotations

import asyncio
import time

import pytest

from harness import Appliance
from security import (aiokafka_config, appliance_client_config, confluent_config,
                      kafka_python_config, secure_appliance)
from txclients import txn_producer

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
                         groups={"initial_rebalance_delay_ms": 0},
                         transactions={"two_phase_commit_enable": True})
    yield s
    for a in made:
        a.terminate()


def _txn_extra(client: str, s) -> dict:
    if client == "confluent":
        c = confluent_config(s, "SASL_SSL")
        c.pop("bootstrap.servers")
        return c
    c = kafka_python_config(s, "SASL_SSL") if client == "kafka-python" else aiokafka_config(s, "SASL_SSL")
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
    c = ck.Consumer(confluent_config(s, "SASL_SSL", **{
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
                            **kafka_python_config(s, "SASL_SSL"))
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
                                      **aiokafka_config(s, "SASL_SSL"))
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
    conf = appliance_client_config(secured, "SASL_SSL")
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
    c = Consumer(appliance_client_config(secured, "SASL_SSL", mechanism="PLAIN"))
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


def test_the_appliance_client_refuses_a_wrong_password(secured):
    from appliance.client import KafkaError, Producer
    with pytest.raises(KafkaError) as e:
        p = Producer(appliance_client_config(secured, "SASL_SSL", password="wrong"),
                     max_block_ms=5000)
        try:
            p.send("never", b"x")
            p.flush()
        finally:
            p.close()
    assert "SASL_AUTHENTICATION_FAILED" in str(e.value) or "invalid credentials" in str(e.value)
