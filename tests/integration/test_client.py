"""The appliance's own client (``appliance.client``) against the real appliance, and with the other
clients.

- idempotent produce + consume round trip, uncompressed and zstd, several batches per partition:
  every record back once, in order, byte for byte; the stored batches carry the producer id and
  consecutive sequences, and the codec asked for;
- transactions over 5 partitions of 2 topics with both transaction protocols (version 1: explicit
  AddPartitionsToTxn, one epoch; version 2: implicit adds, the epoch bumped by every EndTxn):
  committed records visible to our read_committed consumer, aborted ones never (flushed or only
  buffered), empty transactions harmless; read_uncommitted sees the flushed aborted ones;
- an open transaction pins read_committed at the LSO until it commits;
- a second instance fences the first; consumer offsets committed with a transaction;
- lost Produce answers (a proxy drops them and cuts the connection): retries with the same
  sequence leave every record exactly once, idempotent and transactional;
- interoperability: our transactions read by confluent-kafka and kafka-python read_committed
  consumers; their transactions read by ours.
"""

from __future__ import annotations

import pytest

from appliance.client import (Consumer, KafkaError, Producer, ProducerFencedError,
                              TransactionAbortableError)
from appliance_harness import shared_appliance, watch_shared_appliance  # noqa: F401 (fixtures)
from client_drivers import create, driver, read_all, txn_producer, uid, values_of
from fault_proxy import FaultyProxy, drop_some_produce
from group_wire import committed_offset
from raw_wire import stored_batches

APPLIANCE_CONFIG = {"transactions": {"abort_timed_out_interval_ms": 200}}
CODEC_ID = {"none": 0, "zstd": 4, "gzip": 1}


def records(n: int, tag: str) -> list[tuple[bytes | None, bytes | None, tuple]]:
    """(key, value, headers): null and empty keys and values, headers on some."""
    out = []
    for i in range(n):
        key = None if i % 5 == 0 else b"" if i % 11 == 0 else f"k{i % 17}".encode()
        value = None if i % 13 == 0 else b"" if i % 7 == 0 else f"{tag}-{i}-".encode() + b"x" * (i % 50)
        headers = () if i % 3 else (("h", f"{i}".encode()), ("null", None), ("h", b""))
        out.append((key, value, headers))
    return out


# ------------------------------------------------------------------------------------------------
# Idempotent round trip
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("codec", ["none", "zstd"])
def test_idempotent_produce_and_consume_round_trip(shared_appliance, codec):
    b = shared_appliance.bootstrap
    topic = uid("idem", codec)
    create(b, {topic: 3})
    recs = records(900, "r")
    with Producer(bootstrap_servers=b, compression_type=codec, batch_size=4096, linger_ms=5) as p:
        deliveries = []
        for i, (k, v, h) in enumerate(recs):
            part = i % 3 if k is None else None           # keyed records go by murmur2
            deliveries.append(p.send(topic, v, k, partition=part, headers=h, timestamp=1_700_000_000_000 + i))
        p.flush()
        pid = p.producer_id
        assert pid >= 0 and p.producer_epoch == 0
    expected: dict[int, list] = {}
    for d, (k, v, h) in zip(deliveries, recs):
        d.get()
        expected.setdefault(d.partition, []).append((d.offset, k, v, h, d.timestamp))
    for part, exp in expected.items():
        assert [e[0] for e in exp] == list(range(len(exp))), f"partition {part}: offsets"

    got = read_all(b, topic, 3)
    for part in range(3):
        assert [(r.offset, r.key, r.value, r.headers, r.timestamp) for r in got[part]] == \
            expected.get(part, [])

    # What the broker stored: our producer id, epoch 0, sequences consecutive from 0, the codec.
    for part in range(3):
        batches = stored_batches(b, topic, part)
        assert len(batches) > 1, "the test wants several batches per partition"
        seq = 0
        for h in batches:
            assert (h.producer_id, h.producer_epoch, h.base_sequence) == (pid, 0, seq)
            assert h.compression == CODEC_ID[codec] and not h.is_transactional
            seq += h.records_count
    # And a foreign consumer reads the same.
    total = sum(len(v) for v in expected.values())
    theirs = driver("confluent").consume(b, topic, {p: 0 for p in range(3)}, total)
    assert sorted((g.partition, g.offset, g.value) for g in theirs) == \
        sorted((p, e[0], e[2]) for p, exp in expected.items() for e in exp)


def test_acks_and_plain_producer(shared_appliance):
    b = shared_appliance.bootstrap
    topic = uid("acks")
    create(b, {topic: 1})
    for acks in (1, 0):
        with Producer(bootstrap_servers=b, acks=acks) as p:
            for i in range(10):
                p.send(topic, f"acks{acks}-{i}".encode(), partition=0)
            p.flush()
    # acks=0 has no answer to wait for: wait until the broker has appended the records.
    with Consumer(bootstrap_servers=b, isolation_level="read_uncommitted") as c:
        shared_appliance.wait_for(lambda: c.end_offsets([(topic, 0)])[(topic, 0)] == 20, 30,
                                  "the acks=0 records")
    got = values_of(read_all(b, topic, 1))[0]
    assert got == [f"acks1-{i}".encode() for i in range(10)] + [f"acks0-{i}".encode() for i in range(10)]
    assert all(h.producer_id == -1 for h in stored_batches(b, topic, 0))


# ------------------------------------------------------------------------------------------------
# Transactions, both protocols
# ------------------------------------------------------------------------------------------------

def send_txn(p: Producer, targets: list[tuple[str, int]], n: int, tag: str) -> dict:
    sent: dict = {}
    for i in range(n):
        t, part = targets[i % len(targets)]
        v = f"{tag}-{i}".encode()
        p.send(t, v, f"k{i}".encode(), partition=part)
        sent.setdefault((t, part), []).append(v)
    return sent


def merge(into: dict, more: dict) -> None:
    for k, vs in more.items():
        into.setdefault(k, []).extend(vs)


@pytest.mark.parametrize("tv", [1, 2])
def test_commit_visible_abort_invisible(shared_appliance, tv):
    b = shared_appliance.bootstrap
    ta, tb = uid("txa", tv), uid("txb", tv)
    create(b, {ta: 3, tb: 2})
    targets = [(ta, 0), (ta, 1), (ta, 2), (tb, 0), (tb, 1)]
    committed: dict = {}
    flushed: dict = {}
    p = Producer(bootstrap_servers=b, transactional_id=uid("tid"), transaction_version=tv,
                 compression_type="zstd" if tv == 2 else "none", linger_ms=60000, batch_size=1 << 20)
    try:
        p.init_transactions()
        assert p.transaction_version == tv
        epoch0 = p.producer_epoch

        p.begin_transaction()                                  # 1: committed
        sent = send_txn(p, targets, 300, "c1")
        p.commit_transaction()
        merge(committed, sent), merge(flushed, sent)

        p.begin_transaction()                                  # 2: flushed, then aborted
        sent = send_txn(p, targets, 200, "a2")
        p.flush()
        p.abort_transaction()
        merge(flushed, sent)

        p.begin_transaction()                                  # 3: aborted while only buffered
        never = [p.send(ta, b"never", partition=0) for _ in range(5)]
        p.abort_transaction()
        for d in never:
            with pytest.raises(TransactionAbortableError):
                d.get()

        p.begin_transaction()                                  # 4: empty commit
        p.commit_transaction()

        p.begin_transaction()                                  # 5: committed
        sent = send_txn(p, targets, 100, "c5")
        p.commit_transaction()
        merge(committed, sent), merge(flushed, sent)
        # Version 2 bumps the epoch at each EndTxn (transactions 1, 2, 5; 3 and 4 sent nothing,
        # so no EndTxn); version 1 keeps it.
        assert p.producer_epoch == (epoch0 + 3 if tv == 2 else epoch0)
    finally:
        p.close()

    for topic, parts in ((ta, 3), (tb, 2)):
        want = {part: committed[(topic, part)] for part in range(parts)}
        assert values_of(read_all(b, topic, parts)) == want
        want = {part: flushed[(topic, part)] for part in range(parts)}
        assert values_of(read_all(b, topic, parts, "read_uncommitted")) == want
        for part in range(parts):
            for h in stored_batches(b, topic, part):
                assert h.is_transactional
                if tv == 1:
                    assert h.producer_epoch == epoch0


def test_open_transaction_pins_read_committed_until_commit(shared_appliance):
    b = shared_appliance.bootstrap
    topic = uid("pin")
    create(b, {topic: 1})
    p = Producer(bootstrap_servers=b, transactional_id=uid("pin-tid"))
    c = Consumer(bootstrap_servers=b)
    try:
        p.init_transactions()
        p.begin_transaction()
        for i in range(3):
            p.send(topic, b"before-%d" % i, partition=0)
        p.commit_transaction()
        p.begin_transaction()
        for i in range(5):
            p.send(topic, b"open-%d" % i, partition=0)
        p.flush()
        c.assign([(topic, 0)])
        c.seek_to_beginning()
        assert c.end_offsets([(topic, 0)]) == {(topic, 0): 4}       # 3 records + marker
        got = []
        while c.position((topic, 0)) < 4:
            got += c.poll(500)
        assert [r.value for r in got] == [b"before-0", b"before-1", b"before-2"]
        assert c.poll(300) == []                                     # the open txn is withheld
        p.commit_transaction()
        while c.position((topic, 0)) < 10:
            got += c.poll(500)
        assert [r.value for r in got][3:] == [b"open-%d" % i for i in range(5)]
    finally:
        p.close()
        c.close()


def test_second_instance_fences_the_first(shared_appliance):
    b = shared_appliance.bootstrap
    topic, tid = uid("fence"), uid("fence-tid")
    create(b, {topic: 1})
    first = Producer(bootstrap_servers=b, transactional_id=tid)
    second = Producer(bootstrap_servers=b, transactional_id=tid)
    try:
        first.init_transactions()
        first.begin_transaction()
        first.send(topic, b"zombie-1", partition=0)
        first.flush()
        second.init_transactions()             # aborts the first one's transaction
        first.send(topic, b"zombie-2", partition=0)
        with pytest.raises(ProducerFencedError):
            first.commit_transaction()
        with pytest.raises(ProducerFencedError):
            first.begin_transaction()           # fatal: stays fenced
        second.begin_transaction()
        second.send(topic, b"alive", partition=0)
        second.commit_transaction()
    finally:
        first.close()
        second.close()
    assert values_of(read_all(b, topic, 1)) == {0: [b"alive"]}


@pytest.mark.parametrize("tv", [1, 2])
def test_offsets_committed_with_the_transaction(shared_appliance, tv):
    b = shared_appliance.bootstrap
    topic, source, group = uid("out"), uid("in"), uid("group")
    create(b, {topic: 1, source: 1})
    p = Producer(bootstrap_servers=b, transactional_id=uid("off-tid"), transaction_version=tv)
    try:
        p.init_transactions()
        p.begin_transaction()
        p.send(topic, b"c", partition=0)
        p.send_offsets_to_transaction({(source, 0): 42}, group)
        p.commit_transaction()
        assert committed_offset(b, group, source, 0) == 42
        p.begin_transaction()
        p.send(topic, b"a", partition=0)
        p.send_offsets_to_transaction({(source, 0): 99}, group)
        p.abort_transaction()
        assert committed_offset(b, group, source, 0) == 42
    finally:
        p.close()
    assert values_of(read_all(b, topic, 1)) == {0: [b"c"]}


def test_illegal_calls_are_refused_without_changing_state(shared_appliance):
    b = shared_appliance.bootstrap
    topic = uid("illegal")
    create(b, {topic: 1})
    with Producer(bootstrap_servers=b, transactional_id=uid("ill-tid")) as p:
        with pytest.raises(KafkaError):
            p.begin_transaction()                # before init_transactions
        p.init_transactions()
        with pytest.raises(KafkaError):
            p.send(topic, b"x", partition=0)     # outside a transaction
        with pytest.raises(KafkaError) as e:
            p.prepare_transaction()              # 2PC not enabled: INVALID_TXN_STATE
        assert e.value.code == 48
        with pytest.raises(KafkaError):
            p.send(topic, b"x", partition=5)     # no such partition
        p.begin_transaction()
        p.send(topic, b"ok", partition=0)
        p.commit_transaction()
    assert values_of(read_all(b, topic, 1)) == {0: [b"ok"]}


# ------------------------------------------------------------------------------------------------
# Lost answers: retries keep their sequence numbers
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("transactional", [False, True], ids=["idempotent", "transactional"])
def test_lost_produce_answers_are_retried_without_duplicates(appliance_factory, transactional):
    app = appliance_factory(start=False)
    proxy = FaultyProxy(app.port, drop_some_produce(0.08, seed=11, delay=0.02))
    app.config.setdefault("server", {})["advertised_listener"] = proxy.bootstrap
    app.start()
    try:
        b = proxy.bootstrap
        topic = uid("lossy")
        create(app.bootstrap, {topic: 3})
        sent: dict[int, list[bytes]] = {}
        p = Producer(bootstrap_servers=b, batch_size=2048, linger_ms=2, request_timeout_ms=10000,
                     retry_backoff_ms=20,
                     **({"transactional_id": uid("lossy-tid")} if transactional else {}))
        try:
            if transactional:
                p.init_transactions()
            for t in range(4):
                if transactional:
                    p.begin_transaction()
                for i in range(600):
                    v = f"v-{t}-{i}-".encode() + b"y" * 40
                    p.send(topic, v, partition=i % 3)
                    sent.setdefault(i % 3, []).append(v)
                if transactional:
                    p.commit_transaction()
                else:
                    p.flush()
        finally:
            p.close()
        assert proxy.dropped > 0, "the proxy lost no answer: the test proved nothing"
        assert values_of(read_all(app.bootstrap, topic, 3)) == sent
    finally:
        proxy.close()


# ------------------------------------------------------------------------------------------------
# Interoperability
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("client", ["confluent", "kafka-python"])
@pytest.mark.parametrize("tv", [1, 2])
def test_our_transactions_read_by_other_clients(shared_appliance, client, tv):
    b = shared_appliance.bootstrap
    topic = uid("ours", client, tv)
    create(b, {topic: 2})
    targets = [(topic, 0), (topic, 1)]
    committed: dict = {}
    p = Producer(bootstrap_servers=b, transactional_id=uid("ours-tid"), transaction_version=tv,
                 compression_type="zstd")
    try:
        p.init_transactions()
        p.begin_transaction()
        merge(committed, send_txn(p, targets, 200, "c1"))
        p.commit_transaction()
        p.begin_transaction()                 # aborted between two committed ones: a leak would
        send_txn(p, targets, 150, "a2")       # land among the first `count` records read
        p.flush()
        p.abort_transaction()
        p.begin_transaction()
        merge(committed, send_txn(p, targets, 100, "c3"))
        p.commit_transaction()
    finally:
        p.close()
    level = {"isolation.level": "read_committed"} if client == "confluent" else \
        {"isolation_level": "read_committed"}
    count = sum(len(v) for v in committed.values())
    got = driver(client).consume(b, topic, {0: 0, 1: 0}, count, **level)
    by_part: dict = {}
    for g in got:
        by_part.setdefault((topic, g.partition), []).append(g.value)
    assert by_part == committed


@pytest.mark.parametrize("client", ["confluent", "kafka-python"])
def test_their_transactions_read_by_ours(shared_appliance, client):
    b = shared_appliance.bootstrap
    topic = uid("theirs", client)
    create(b, {topic: 2})
    prod = txn_producer(client, b, uid("theirs-tid"), codec="zstd" if client == "confluent" else "gzip")
    committed: dict[int, list[bytes]] = {}
    everything: dict[int, list[bytes]] = {}
    try:
        prod.init()
        for n, (tag, commit) in enumerate((("c1", True), ("a2", False), ("c3", True))):
            prod.begin()
            for i in range(120):
                v = f"{tag}-{i}".encode()
                prod.send(topic, i % 2, f"k{i}".encode(), v)
                everything.setdefault(i % 2, []).append(v)
                if commit:
                    committed.setdefault(i % 2, []).append(v)
            prod.flush()
            prod.commit() if commit else prod.abort()
    finally:
        prod.close()
    assert values_of(read_all(b, topic, 2)) == committed
    assert values_of(read_all(b, topic, 2, "read_uncommitted")) == everything
