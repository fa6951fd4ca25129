"""Transaction version 2 (KIP-890 part 2) at the wire: what a Java 4.x client does once the broker
finalizes ``transaction.version=2``.

- ApiVersions v3+ advertises the feature (supported 0-2, finalized at the configured level),
  Produce up to 12 and TxnOffsetCommit up to 5; with ``transactions.transaction_version = 1`` the
  finalized level is 1 (Java clients then stay on the KIP-98 protocol).
- A TV2 transaction: no AddPartitionsToTxn and no AddOffsetsToTxn - Produce v12 and TxnOffsetCommit
  v5 add their partitions themselves; EndTxn v5 returns epoch + 1 and the markers carry it;
  a later Produce with the old epoch is fenced; the next transaction with the new epoch works;
  the committed offsets and records are visible, the aborted ones never.
- The next transaction's first Produce v12 that meets the previous one's markers still on their
  way is asked again by the partition writer (Kafka's ReplicaManager retries CONCURRENT_TRANSACTIONS
  for such an add every 20 ms, up to 100 ms): appended once the markers are written, and
  answered CONCURRENT_TRANSACTIONS (retriable; passed on as it is to these clients, as Kafka
  does) only when the window is over.
"""

from __future__ import annotations

import contextlib
import threading

from appliance.protocol.records import build_batch
from appliance_harness import stopped
from raw_wire import (CONCURRENT_TRANSACTIONS, INVALID_PRODUCER_EPOCH, NONE, NOT_ENOUGH_REPLICAS,
                      READ_COMMITTED, RawClient, create_topic, end_offsets, fetch, produce,
                      records_of)
from txn_wire import Txn

PRODUCER_FENCED = 90


def features(raw) -> tuple[dict, dict, dict]:
    r = raw.request(18, 4, {"client_software_name": "test", "client_software_version": "1"})
    assert r.error_code == NONE
    keys = {k.api_key: (k.min_version, k.max_version) for k in r.api_keys}
    supported = {f.name: (f.min_version, f.max_version) for f in r.supported_features}
    finalized = {f.name: f.max_version_level for f in r.finalized_features}
    return keys, supported, finalized


def test_transaction_version_feature_is_advertised(appliance_factory, tmp_path):
    a = appliance_factory()
    with RawClient(a.bootstrap) as raw:
        keys, supported, finalized = features(raw)
    assert supported["transaction.version"] == (0, 2)
    assert finalized["transaction.version"] == 2
    assert keys[0][1] >= 12 and keys[28][1] >= 5 and keys[26][1] >= 5
    b = appliance_factory(data_dir=str(tmp_path / "tv1"), transactions={"transaction_version": 1})
    with RawClient(b.bootstrap) as raw:
        _, supported, finalized = features(raw)
    assert supported["transaction.version"] == (0, 2)
    assert finalized["transaction.version"] == 1


def txn_offset_commit(raw, t: Txn, group, topic, partition, offset, *, version=5, epoch=None):
    r = raw.request(28, version, {"transactional_id": t.txn_id, "group_id": group,
                                  "producer_id": t.pid,
                                  "producer_epoch": t.epoch if epoch is None else epoch,
                                  "generation_id": -1, "member_id": "", "group_instance_id": None,
                                  "topics": [{"name": topic, "partitions": [
                                      {"partition_index": partition, "committed_offset": offset,
                                       "committed_leader_epoch": -1, "committed_metadata": ""}]}]})
    return r.topics[0].partitions[0].error_code


def committed(raw, group, topic, partition) -> int:
    r = raw.request(9, 7, {"group_id": group, "topics": [{"name": topic, "partition_indexes": [partition]}],
                           "require_stable": True})
    p = r.topics[0].partitions[0]
    assert p.error_code == NONE, p
    return p.committed_offset


def test_tv2_transaction_adds_partitions_implicitly_and_bumps_the_epoch(appliance):
    with RawClient(appliance.bootstrap) as raw:
        create_topic(raw, "tv2", 2)
        create_topic(raw, "tv2-in", 1)
        t = Txn(raw, "tv2-producer")
        epoch0 = t.epoch

        # Transaction 1: Produce v12 and TxnOffsetCommit v5 without any Add*ToTxn, then commit.
        assert t.must_send("tv2", 0, [b"c1", b"c2"], version=12) == 0
        assert t.must_send("tv2", 1, [b"c3"], version=12) == 0
        assert txn_offset_commit(raw, t, "tv2-group", "tv2-in", 0, 42) == NONE
        d = t.describe()
        assert d.transaction_state == "Ongoing"
        assert sorted(p for p in d.partitions if p[0] == "tv2") == [("tv2", 0), ("tv2", 1)]
        r = t.end(True, version=5)
        assert r.error_code == NONE
        assert (r.producer_id, r.producer_epoch) == (t.pid, epoch0 + 1)      # KIP-890: epoch + 1
        t.wait_state("CompleteCommit")
        # The COMMIT markers carry the bumped epoch.
        f = fetch(raw, "tv2", 0, isolation=READ_COMMITTED)
        marker = [b for b in f.batches if b.control]
        assert marker and marker[-1].producer_epoch == epoch0 + 1, f.batches
        assert [v for b in f.batches if not b.control for v in b.values] == [b"c1", b"c2"]
        assert committed(raw, "tv2-group", "tv2-in", 0) == 42

        # A late batch of the finished transaction, with the old epoch, is fenced (KIP-890).
        late = produce(raw, "tv2", 0, build_batch(records_of([b"late"]), producer_id=t.pid,
                                                  producer_epoch=epoch0, base_sequence=2,
                                                  transactional=True),
                       txn_id=t.txn_id, version=12)
        assert late.error_code in (INVALID_PRODUCER_EPOCH, PRODUCER_FENCED), late
        assert txn_offset_commit(raw, t, "tv2-group", "tv2-in", 0, 99, epoch=epoch0) in (
            INVALID_PRODUCER_EPOCH, PRODUCER_FENCED)

        # Transaction 2 with the new epoch (sequences restart at 0): aborted, never visible.
        t.epoch = r.producer_epoch
        t.seq.clear()
        t.must_send("tv2", 0, [b"a1"], version=12)
        assert txn_offset_commit(raw, t, "tv2-group", "tv2-in", 0, 77) == NONE
        r = t.end(False, version=5)
        assert r.error_code == NONE and r.producer_epoch == epoch0 + 2
        t.wait_state("CompleteAbort")
        f = fetch(raw, "tv2", 0, isolation=READ_COMMITTED)
        aborted = {pid for pid, _ in (f.aborted or [])}
        data = [(b.producer_id, v) for b in f.batches if not b.control for v in b.values]
        assert [v for pid, v in data if pid not in aborted or v != b"a1"] == [b"c1", b"c2"]
        assert t.pid in aborted
        assert committed(raw, "tv2-group", "tv2-in", 0) == 42


@contextlib.contextmanager
def committed_with_marker_held(app, raw, topic):
    """A TV2 producer whose first transaction (partition 0) was committed while the writer of
    partition 0 is stopped: EndTxn answered, the COMMIT marker held for the block. Yields the
    producer with the bumped epoch, ready for its next transaction."""
    create_topic(raw, topic, 2)
    t = Txn(raw, f"{topic}-producer")
    t.must_send(topic, 0, [b"first"], version=12)
    with stopped(app.writer(topic, 0)["pid"]):
        r = t.end(True, version=5)
        assert r.error_code == NONE, r
        assert t.describe().transaction_state == "PrepareCommit"
        t.epoch, t.seq = r.producer_epoch, {}
        yield t


def test_tv2_produce_during_the_previous_commits_markers_is_retried_not_refused(appliance_factory):
    """Regression (before: a retriable error at once, then the client's backoff): the writer of
    partition 1 asks again while the window lasts (here long enough to outlast the held marker)
    and appends the batch to the new transaction once the marker is written."""
    app = appliance_factory(transactions={"add_partitions_retry_backoff_max_ms": 60000})
    answers = []
    with RawClient(app.bootstrap) as raw:
        with committed_with_marker_held(app, raw, "tv2r") as t:

            def next_transactions_first_batch():
                with RawClient(app.bootstrap, timeout=60) as other:
                    nxt = Txn(other, t.txn_id, pid=t.pid, epoch=t.epoch)
                    answers.append(nxt.send("tv2r", 1, [b"second"], version=12, timeout_ms=50000))

            sender = threading.Thread(target=next_transactions_first_batch)
            sender.start()
            sender.join(1.0)
            # still waiting while the marker is held (before, the writer answered in milliseconds)
            assert answers == [] and sender.is_alive()
            assert end_offsets(raw, "tv2r", 1) == (0, 0)
        # the writer of partition 0 runs again: the marker lands, the retried add succeeds
        sender.join(60)
        assert not sender.is_alive()
        assert answers[0].error_code == NONE, answers[0]
        d = t.describe()
        assert d.transaction_state == "Ongoing" and ("tv2r", 1) in d.partitions, d
        r = t.end(True, version=5)
        assert r.error_code == NONE, r
        t.wait_state("CompleteCommit")
        assert fetch(raw, "tv2r", 0, isolation=READ_COMMITTED).values() == [b"first"]
        assert fetch(raw, "tv2r", 1, isolation=READ_COMMITTED).values() == [b"second"]


def test_tv2_produce_whose_previous_markers_stay_held_gets_concurrent_transactions(appliance_factory):
    """The window is bounded (100 ms by default): with the marker held longer, the batch is
    answered the retriable CONCURRENT_TRANSACTIONS (Kafka's ReplicaManager turns it into
    NOT_ENOUGH_REPLICAS only for clients before transaction version 2), and nothing is appended."""
    app = appliance_factory()
    with RawClient(app.bootstrap) as raw:
        with committed_with_marker_held(app, raw, "tv2h") as t:
            p = t.send("tv2h", 1, [b"second"], version=12)
            assert p.error_code == CONCURRENT_TRANSACTIONS, p
            p = t.send("tv2h", 1, [b"second"], version=11)          # before transaction version 2
            assert p.error_code == NOT_ENOUGH_REPLICAS, p
            assert end_offsets(raw, "tv2h", 1) == (0, 0)
        t.wait_state("CompleteCommit")
        assert t.must_send("tv2h", 1, [b"second"], version=12) == 0
