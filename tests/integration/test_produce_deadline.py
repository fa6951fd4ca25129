"""Produce answers each partition on the request's own deadline (``timeout_ms``), as Kafka's
delayed produce does: a partition whose writer has not acknowledged by then gets
REQUEST_TIMED_OUT, the others their offsets, in the same response.

Regression: one paused partition writer held the acknowledgements of the healthy partitions of
the same request until the writer was replaced or the client gave up.
"""

import os
import signal

from appliance.protocol.records import Record, build_batch
from raw_wire import RawClient

REQUEST_TIMED_OUT = 7


def test_a_stopped_writer_times_out_only_its_own_partition(appliance_factory):
    # The writer stays stopped: the supervisor would replace it only after a minute.
    app = appliance_factory(supervisor={"heartbeat_timeout_ms": 60000})
    # The socket's 20 s timeout fails the test if the answer waits for the writer (60 s).
    with RawClient(app.bootstrap, timeout=20) as raw:
        r = raw.request(19, 7, {"topics": [{"name": "t", "num_partitions": 2, "replication_factor": 1,
                                            "assignments": [], "configs": []}], "timeout_ms": 10000})
        assert r.topics[0].error_code == 0
        victim = app.writer("t", 1)["pid"]
        os.kill(victim, signal.SIGSTOP)
        try:
            batch = build_batch([Record(key=b"k", value=b"v")])
            r = raw.request(0, 9, {"transactional_id": None, "acks": -1, "timeout_ms": 1500,
                                   "topic_data": [{"name": "t", "partition_data": [
                                       {"index": 0, "records": batch}, {"index": 1, "records": batch}]}]})
            parts = {p.index: p for p in r.responses[0].partition_responses}
            assert parts[0].error_code == 0 and parts[0].base_offset == 0
            assert parts[1].error_code == REQUEST_TIMED_OUT
        finally:
            os.kill(victim, signal.SIGCONT)
        # The writer, resumed, takes the batch it had been sent (as a Kafka leader may append a
        # request that timed out): the partition keeps working.
        app.wait_for(lambda: app.high_watermark("t", 1) == 1, what="the resumed writer's append")
        r = raw.request(0, 9, {"transactional_id": None, "acks": -1, "timeout_ms": 10000,
                               "topic_data": [{"name": "t", "partition_data": [
                                   {"index": 1, "records": build_batch([Record(key=None, value=b"x")])}]}]})
        assert r.responses[0].partition_responses[0].error_code == 0
    assert app.writer("t", 1)["pid"] == victim
