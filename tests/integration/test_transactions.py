"""Transactions end to end with real clients (KIP-98, KIP-890 part 1).

Every client's transactional producer (confluent-kafka, kafka-python, aiokafka) against the real
appliance, read back by read_committed and read_uncommitted consumers of the same and of another
client:

- commit, abort, empty transactions (abort and commit with no partition), transactions over
  8 partitions of 2 topics, with and without compression: read_committed sees every committed
  record once, in order, and none of the aborted ones; read_uncommitted sees both;
- zombie fencing: a second instance with the same transactional id fences the first, which gets
  the fatal error its client expects, and the first one's open transaction is aborted;
- a producer killed mid-transaction: aborted after its timeout, the LSO advances, read_committed
  consumers continue;
- kill -9 of the coordinator between PREPARE_COMMIT and the markers, of the whole appliance at the
  same point, and of a writer holding an open transaction: after restart committed transactions
  are fully visible, aborted ones never, nothing hangs;
- a transaction begun right after a commit: its AddPartitionsToTxn waits for the commit's markers
  instead of being answered CONCURRENT_TRANSACTIONS (counted in the metrics).

The raw-wire checks of single behaviours are in ``test_txn_wire.py`` (helpers in ``txn_wire.py``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid

import pytest

from appliance_harness import shared_appliance  # noqa: F401 (fixture)
from client_drivers import OTHER, driver, is_fenced, txn_producer
from raw_wire import RawClient

APPLIANCE_CONFIG = {"transactions": {"abort_timed_out_interval_ms": 200}}
CLIENTS = ("confluent", "kafka-python", "aiokafka")
CODEC_OF = {"confluent": "zstd", "kafka-python": "gzip", "aiokafka": "lz4"}


def iso(client: str, level: str) -> dict:
    return {"isolation.level": level} if client == "confluent" else {"isolation_level": level}


def uid(*parts) -> str:
    return "-".join(str(p) for p in parts) + "-" + uuid.uuid4().hex[:6]


def create(bootstrap: str, topics: dict[str, int]) -> None:
    driver("confluent").create_topics(bootstrap, {t: (n, {}) for t, n in topics.items()})


def run_txn(prod, tag: str, targets: list[tuple[str, int]], n: int) -> dict[tuple[str, int], list[bytes]]:
    """Send n records spread over ``targets`` inside the current transaction; returns
    (topic, partition) -> values in production order."""
    out: dict[tuple[str, int], list[bytes]] = {}
    for i in range(n):
        t, p = targets[i % len(targets)]
        v = f"{tag}-{i}".encode()
        prod.send(t, p, f"k{i}".encode(), v)
        out.setdefault((t, p), []).append(v)
    return out


def merge(into: dict, more: dict) -> None:
    for k, vs in more.items():
        into.setdefault(k, []).extend(vs)


def consume_values(client: str, bootstrap: str, topic: str, partitions: int, count: int,
                   level: str, quiet_s: float = 1.0) -> dict[int, list[bytes]]:
    """partition -> values, read by ``client`` from offset 0 with ``level``; reads ``count``
    records, then keeps polling ``quiet_s`` more to catch any extra one."""
    got = driver(client).consume(bootstrap, topic, {p: 0 for p in range(partitions)}, count,
                                 **iso(client, level))
    out: dict[int, list[bytes]] = {}
    offsets: dict[int, list[int]] = {}
    for g in got:
        out.setdefault(g.partition, []).append(g.value)
        offsets.setdefault(g.partition, []).append(g.offset)
    for p, offs in offsets.items():
        assert offs == sorted(offs) and len(set(offs)) == len(offs), f"partition {p}: offsets {offs}"
    return out


def expect_topic(expected: dict[tuple[str, int], list[bytes]], topic: str) -> dict[int, list[bytes]]:
    return {p: vs for (t, p), vs in expected.items() if t == topic and vs}


def list_offsets(bootstrap: str, topic: str, partition: int, isolation: int) -> int:
    """ListOffsets v5 latest (-1) with the isolation level (0 uncommitted: high watermark,
    1 committed: LSO)."""
    with RawClient(bootstrap) as c:
        r = c.request(2, 5, {"replica_id": -1, "isolation_level": isolation,
                          "topics": [{"name": topic, "partitions": [
                              {"partition_index": partition, "current_leader_epoch": -1,
                               "timestamp": -1}]}]})
    part = r.topics[0].partitions[0]
    if part.error_code != 0:      # e.g. NOT_LEADER_OR_FOLLOWER while a writer restarts
        raise ValueError(f"ListOffsets {topic}-{partition}: {part}")
    return part.offset


def lso_and_hw(bootstrap: str, topic: str, partition: int) -> tuple[int, int]:
    return list_offsets(bootstrap, topic, partition, 1), list_offsets(bootstrap, topic, partition, 0)


# ------------------------------------------------------------------------------------------------
# Commit, abort, empty transactions, 8 partitions of 2 topics, compression
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("compressed", [False, True], ids=["none", "compressed"])
def test_commit_abort_and_empty_over_8_partitions_of_2_topics(shared_appliance, client,
                                                                         compressed):
    b = shared_appliance.bootstrap
    codec = CODEC_OF[client] if compressed else "none"
    ta, tb = uid("txa", client, codec), uid("txb", client, codec)
    create(b, {ta: 4, tb: 4})
    targets = [(t, p) for t in (ta, tb) for p in range(4)]
    committed: dict = {}
    everything: dict = {}

    prod = txn_producer(client, b, uid("tid", client), codec=codec)
    try:
        prod.init()
        prod.begin()                                   # 1: commit over all 8 partitions
        sent = run_txn(prod, "c1", targets, 400)
        prod.flush()
        prod.commit()
        merge(committed, sent), merge(everything, sent)

        prod.begin()                                   # 2: abort after the data is on disk
        sent = run_txn(prod, "a2", targets, 300)
        prod.flush()
        prod.abort()
        merge(everything, sent)

        prod.begin()                                   # 3: empty abort and empty commit
        prod.abort()
        prod.begin()
        prod.commit()

        prod.begin()                                   # 4: abort on half the partitions only
        sent = run_txn(prod, "a4", targets[::2], 50)
        prod.flush()
        prod.abort()
        merge(everything, sent)

        prod.begin()                                   # 5: commit last, so a leaked abort shows
        sent = run_txn(prod, "c5", targets, 200)
        prod.commit()                                  # commit flushes by itself
        merge(committed, sent), merge(everything, sent)
    finally:
        prod.close()

    for topic in (ta, tb):
        want_rc, want_ru = expect_topic(committed, topic), expect_topic(everything, topic)
        for reader in (client, OTHER[client]):
            got = consume_values(reader, b, topic, 4, sum(map(len, want_rc.values())), "read_committed")
            assert got == want_rc, f"read_committed by {reader}: {_diff(got, want_rc)}"
        got = consume_values(client, b, topic, 4, sum(map(len, want_ru.values())), "read_uncommitted")
        assert got == want_ru, f"read_uncommitted: {_diff(got, want_ru)}"
        for p in range(4):                             # no transaction left open anywhere
            lso, hw = lso_and_hw(b, topic, p)
            assert lso == hw, (topic, p, lso, hw)


def _diff(got: dict, want: dict) -> str:
    out = []
    for p in sorted(set(got) | set(want)):
        g, w = got.get(p, []), want.get(p, [])
        if g != w:
            extra = [v for v in g if v not in set(w)]
            missing = [v for v in w if v not in set(g)]
            out.append(f"p{p}: got {len(g)} want {len(w)}, extra {extra[:3]}, missing {missing[:3]}")
    return "; ".join(out)


# ------------------------------------------------------------------------------------------------
# Zombie fencing
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("client", CLIENTS)
def test_second_instance_fences_the_first_and_aborts_its_transaction(shared_appliance, client):
    b = shared_appliance.bootstrap
    topic, tid = uid("zombie", client), uid("zid", client)
    create(b, {topic: 2})
    first = txn_producer(client, b, tid)
    second = None
    try:
        first.init()
        first.begin()
        run_txn(first, "zombie", [(topic, 0), (topic, 1)], 20)
        first.flush()                                  # its records are in the log, uncommitted

        second = txn_producer(client, b, tid)
        second.init()                                  # fences the first, aborts its transaction
        second.begin()
        sent = run_txn(second, "new", [(topic, 0), (topic, 1)], 20)
        second.commit()

        with pytest.raises(Exception) as ei:
            # The zombie may get through send (buffered) but never through commit.
            first.send(topic, 0, b"k", b"zombie-late")
            first.commit()
        assert is_fenced(client, ei.value), f"{type(ei.value).__name__}: {ei.value!r}"
    finally:
        first.close()
        if second is not None:
            second.close()

    want = expect_topic(sent, topic)
    got = consume_values(OTHER[client], b, topic, 2, 20, "read_committed")
    assert got == want, _diff(got, want)
    for p in range(2):
        lso, hw = lso_and_hw(b, topic, p)
        assert lso == hw


# ------------------------------------------------------------------------------------------------
# A producer killed mid-transaction
# ------------------------------------------------------------------------------------------------

_ZOMBIE_SCRIPT = textwrap.dedent("""
    import sys, time
    from confluent_kafka import Producer
    bootstrap, tid, topic = sys.argv[1:4]
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": tid, "linger.ms": 1,
                  "transaction.timeout.ms": 3000, "message.timeout.ms": 3000})
    p.init_transactions(30)
    p.begin_transaction()
    for i in range(50):
        p.produce(topic, value=b"killed-%d" % i, partition=i % 2)
    assert p.flush(30) == 0
    print("flushed", flush=True)
    time.sleep(3600)
""")


def test_producer_killed_mid_transaction_is_aborted_after_its_timeout(shared_appliance):
    b = shared_appliance.bootstrap
    topic = uid("killed")
    create(b, {topic: 2})
    zombie = subprocess.Popen([sys.executable, "-c", _ZOMBIE_SCRIPT, b, uid("killed-tid"), topic],
                              stdout=subprocess.PIPE, text=True)
    with zombie:                      # waits for it and closes its pipe
        try:
            assert zombie.stdout.readline().strip() == "flushed"
        finally:
            zombie.kill()
    killed_at = time.monotonic()
    # The open transaction pins the LSO at its first offset (0) on both partitions.
    assert lso_and_hw(b, topic, 0) == (0, 25)

    # Another producer commits after it: read_committed sees nothing until the abort (KIP-98:
    # offset order is kept).
    prod = txn_producer("kafka-python", b, uid("after-tid"))
    try:
        prod.init()
        prod.begin()
        sent = run_txn(prod, "after", [(topic, 0), (topic, 1)], 10)
        prod.commit()
    finally:
        prod.close()
    lso, hw = lso_and_hw(b, topic, 0)
    if time.monotonic() - killed_at < 2.5:            # before the 3 s timeout could fire
        assert lso == 0 and hw == 25 + 5 + 1, (lso, hw)

    # Aborted within timeout + interval (+ slack): the LSO reaches the high watermark.
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if all(lso == hw for lso, hw in (lso_and_hw(b, topic, p) for p in range(2))):
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"LSO did not advance: {[lso_and_hw(b, topic, p) for p in range(2)]}")
    assert time.monotonic() - killed_at < 3 + 0.2 + 10

    want = expect_topic(sent, topic)
    for reader in CLIENTS:
        got = consume_values(reader, b, topic, 2, 10, "read_committed")
        assert got == want, f"{reader}: {_diff(got, want)}"


# ------------------------------------------------------------------------------------------------
# kill -9 at the worst moments
# ------------------------------------------------------------------------------------------------

def _pids(appliance, role: str, topic: str | None = None) -> list[int]:
    return [w["pid"] for w in appliance.workers(role, topic)]


def _commit_in_thread(prod) -> threading.Thread:
    err: list = []

    def go():
        try:
            prod.commit()
        except BaseException as e:  # noqa: BLE001 - reported by the caller
            err.append(e)
    t = threading.Thread(target=go, daemon=True)
    t.err = err
    t.start()
    return t


def _describe_state(bootstrap: str, tid: str) -> str:
    with RawClient(bootstrap) as c:
        r = c.request(65, 0, {"transactional_ids": [tid]})
    st = r.transaction_states[0]
    return st.transaction_state if st.error_code == 0 else f"error {st.error_code}"


def _wait_state(appliance, tid: str, states: tuple[str, ...], timeout: float = 30.0) -> str:
    return appliance.wait_for(lambda: (s := _describe_state(appliance.bootstrap, tid)) in states and s,
                              timeout, f"transaction {tid} in {states}")


@pytest.mark.parametrize("kill", ["coordinator", "everything"])
def test_kill9_between_prepare_commit_and_markers(appliance_factory, kill):
    a = appliance_factory(transactions={"abort_timed_out_interval_ms": 200})
    b = a.bootstrap
    topic, tid = uid("prep"), uid("prep-tid")
    create(b, {topic: 2})
    prod = txn_producer("confluent", b, tid)
    try:
        prod.init()
        prod.begin()
        sent = run_txn(prod, "prep", [(topic, 0), (topic, 1)], 40)
        prod.flush()
        writers = _pids(a, "writer", topic)
        assert len(writers) == 2
        for pid in writers:                            # markers cannot be acknowledged
            os.kill(pid, signal.SIGSTOP)
        try:
            t = _commit_in_thread(prod)
            # EndTxn is answered once PREPARE_COMMIT (KIP-98's commit point) is durable, markers
            # pending.
            _wait_state(a, tid, ("PrepareCommit",))
            t.join(30)
            assert not t.is_alive() and not t.err, t.err
            if kill == "coordinator":
                co = _pids(a, "coordinator")[0]
                os.kill(co, signal.SIGKILL)
                a.wait_for(lambda: _pids(a, "coordinator") and _pids(a, "coordinator")[0] != co,
                           30, "coordinator restart")
        finally:
            for pid in writers:
                os.kill(pid, signal.SIGCONT)
        if kill == "everything":
            a.kill9_all()
            a.start()
        # The restarted coordinator finds PREPARE_COMMIT without COMPLETE_COMMIT and finishes it.
        _wait_state(a, tid, ("CompleteCommit",))
    finally:
        prod.close()
    want = expect_topic(sent, topic)
    for reader in CLIENTS:
        got = consume_values(reader, b, topic, 2, 40, "read_committed")
        assert got == want, f"{reader}: {_diff(got, want)}"
    for p in range(2):
        lso, hw = lso_and_hw(b, topic, p)
        # 20 records and a COMMIT marker; a second one when the marker sent before the kill was
        # still queued for the stopped writer and the new coordinator resent it (as in Kafka).
        assert lso == hw and hw in (21, 22), (p, lso, hw)


@pytest.mark.parametrize("outcome", ["commit", "abort"])
def test_kill9_writer_holding_an_open_transaction(appliance_factory, outcome):
    a = appliance_factory(transactions={"abort_timed_out_interval_ms": 200})
    b = a.bootstrap
    topic, tid = uid("wkill"), uid("wkill-tid")
    create(b, {topic: 2})
    committed_before: dict = {}
    prod = txn_producer("confluent", b, tid)
    try:
        prod.init()
        prod.begin()
        merge(committed_before, run_txn(prod, "before", [(topic, 0), (topic, 1)], 20))
        prod.commit()
        prod.begin()
        sent = run_txn(prod, "open", [(topic, 0), (topic, 1)], 40)
        prod.flush()
        assert lso_and_hw(b, topic, 0) == (11, 31)
        victim = a.writer(topic, 0)["pid"]
        os.kill(victim, signal.SIGKILL)
        a.wait_for(lambda: a.writer(topic, 0)["pid"] not in (victim, 0), 30, "writer restart")
        # The restarted writer rebuilt the open transaction from its log: the LSO still pins it.
        a.wait_for(lambda: lso_and_hw(b, topic, 0) == (11, 31), 30, "LSO after writer restart")
        if outcome == "commit":
            prod.commit()
        else:
            prod.abort()
    finally:
        prod.close()

    want = expect_topic(committed_before, topic)
    if outcome == "commit":
        want = {p: want[p] + vs for p, vs in expect_topic(sent, topic).items()}
    n = sum(map(len, want.values()))
    for reader in CLIENTS:
        got = consume_values(reader, b, topic, 2, n, "read_committed")
        assert got == want, f"{reader}: {_diff(got, want)}"
    before = [lso_and_hw(b, topic, p) for p in range(2)]
    assert all(lso == hw == 32 for lso, hw in before), before

    # A full kill -9 and restart keeps the LSO and what read_committed returns.
    a.kill9_all()
    a.start()
    assert [lso_and_hw(b, topic, p) for p in range(2)] == before
    got = consume_values("kafka-python", b, topic, 2, n, "read_committed")
    assert got == want, _diff(got, want)


def test_marker_queued_for_a_restarting_writer_is_appended_once(appliance_factory):
    """A marker posted while its writer was dead waits in the ring for the next generation. The
    coordinator used to resend every marker of a writer whose generation changed, so the new
    writer took both and appended two markers (seen in CI as a high watermark one too far in the
    kill9_writer_holding_an_open_transaction test above, when the commit raced the writer's
    restart). Only a marker a dead writer took needs resending. The supervisor is stopped so the
    writer stays dead while the marker is posted."""
    a = appliance_factory()
    b = a.bootstrap
    topic, tid = uid("requeue"), uid("requeue-tid")
    create(b, {topic: 1})
    prod = txn_producer("confluent", b, tid)
    try:
        prod.init()
        prod.begin()
        sent = run_txn(prod, "requeue", [(topic, 0)], 10)
        prod.flush()
        victim = a.writer(topic, 0)["pid"]
        os.kill(a.proc.pid, signal.SIGSTOP)          # no respawn until SIGCONT
        try:
            os.kill(victim, signal.SIGKILL)
            t = _commit_in_thread(prod)
            _wait_state(a, tid, ("PrepareCommit",))  # the marker is in the dead writer's ring
            t.join(30)
            assert not t.is_alive() and not t.err, t.err
            # Posted while the writer is dead: it waits in the ring for the next generation.
            w = a.writer_endpoint(topic, 0)
            a.wait_for(lambda: a.ring_pending("co", w), 10, "the marker in the dead writer's ring")
        finally:
            os.kill(a.proc.pid, signal.SIGCONT)
        _wait_state(a, tid, ("CompleteCommit",))
    finally:
        prod.close()
    got = consume_values("confluent", b, topic, 1, 10, "read_committed")
    assert got == expect_topic(sent, topic)
    # 10 records and one COMMIT marker.
    assert lso_and_hw(b, topic, 0) == (11, 11)


def test_add_partitions_right_after_a_commit_waits_for_its_markers_not_concurrent_transactions(
        appliance_factory):
    # Regression: librdkafka begins its next transaction right after EndTxn's answer, while the
    # markers of the one it committed are still being written; its AddPartitionsToTxn was
    # answered CONCURRENT_TRANSACTIONS and retried 20 ms later. Now the coordinator answers it
    # once the markers are written (appliance.txn.service).
    from test_operating import create_topics, metrics_app, scrape, val
    from confluent_kafka.admin import NewTopic
    from confluent_kafka import Producer

    app = metrics_app(appliance_factory)
    create_topics(app, NewTopic("quick", 8))
    p = Producer({"bootstrap.servers": app.bootstrap, "transactional.id": uid("quick"),
                  "linger.ms": 0})
    p.init_transactions(30)
    for i in range(30):
        p.begin_transaction()
        for part in range(8):
            p.produce("quick", value=b"%d" % i, partition=part)
        p.commit_transaction(30)
    errors = "kafka_network_requestmetrics_errors_total"
    m = app.wait_for(lambda: (m := scrape(app.metrics_port)) and
                     (val(m, errors, request="EndTxn", error="NONE") or 0) >= 30 and m,
                     what="the 30 commits in the metrics")
    assert val(m, errors, request="AddPartitionsToTxn", error="NONE") >= 30
    assert not val(m, errors, request="AddPartitionsToTxn", error="CONCURRENT_TRANSACTIONS")
