"""Transaction version 2: a producer's next transaction must not join the previous one on a
partition whose marker has not been written yet.

Under TV2 EndTxn answers (with epoch + 1) once PREPARE_COMMIT is logged; the markers follow. A
client (the Java client, ours) starts its next transaction at once, so its first Produce can
reach a partition writer before that partition's marker. The writer must then verify the batch
with the coordinator (which answers CONCURRENT_TRANSACTIONS until the previous transaction is
complete; the writer asks again for up to 100 ms, then answers a retriable error) instead of
appending it to the open transaction, whose marker would commit it with the
previous transaction: a record of a transaction that was never committed, visible to
read_committed. The overtaking is forced by stopping the writer (SIGSTOP) until both the marker
and the Produce wait in its rings. Found by the client tests (``test_client.py``) under load.
"""

from __future__ import annotations

import os
import signal

from raw_wire import NONE, READ_COMMITTED, RawClient, create_topic, fetch
from txn_wire import Txn, describe


def test_next_transaction_does_not_join_the_previous_one_ahead_of_its_marker(appliance):
    a = appliance
    with RawClient(a.bootstrap) as raw, RawClient(a.bootstrap) as raw2:
        create_topic(raw, "overtake", 2)
        t = Txn(raw, "overtake-tid")
        assert t.send("overtake", 0, [b"t1-p0"], version=12).error_code == NONE
        assert t.send("overtake", 1, [b"t1-p1"], version=12).error_code == NONE
        writer = a.writer("overtake", 1)["pid"]
        os.kill(writer, signal.SIGSTOP)
        try:
            r = t.end(True, version=5)
            assert r.error_code == NONE
            a.wait_for(lambda: describe(raw, "overtake-tid").transaction_state == "PrepareCommit",
                       10, "the commit to wait for the stopped writer's marker")
            batch = t.batch("overtake", 1, [b"t2-p1"], epoch=r.producer_epoch, seq=0)
            raw2.correlation += 1
            corr = raw2.correlation
            raw2.send_frame(raw2.header(0, 12, corr) + raw2.encode(0, 12, {
                "transactional_id": "overtake-tid", "acks": -1, "timeout_ms": 10000,
                "topic_data": [{"name": "overtake", "partition_data": [{"index": 1, "records": batch}]}]}))
            # Both wait in the stopped writer's rings: the marker (from the coordinator) and the
            # Produce (from whichever frontend serves raw2).
            w = a.writer_endpoint("overtake", 1)
            a.wait_for(lambda: a.ring_pending("co", w), 10, "the marker in the writer's ring")
            a.wait_for(lambda: any(a.ring_pending(fe["name"], w) for fe in a.workers("frontend")),
                       10, "the Produce in the writer's ring")
        finally:
            os.kill(writer, signal.SIGCONT)
        answer = raw2.read_response(0, 12, corr).responses[0].partition_responses[0]
        t.raw = raw
        if answer.error_code == NONE:
            # Appended after all: the writer asked again until the first transaction was complete
            # (KIP-890 part 2's retried add), so the batch opened the next transaction, which the
            # coordinator knows; it is not part of the committed one.
            d = describe(raw, "overtake-tid")
            assert d.transaction_state == "Ongoing" and ("overtake", 1) in d.partitions, d
        else:
            a.wait_for(lambda: describe(raw, "overtake-tid").transaction_state == "CompleteCommit",
                       30, "the first transaction to complete")
        f = fetch(raw, "overtake", 1, isolation=READ_COMMITTED)
        visible = [v for b in f.batches if not b.control for v in b.values]
        assert visible == [b"t1-p1"], f.batches
