"""Per-topic flush policy across a power cut (issue 35): ``[log.flush] policy`` stays "os" (no
fsync), one topic asks for an fdatasync per batch with Kafka's ``flush.messages=1``. Its writer is
killed -9 right after an acknowledged produce, then the power is cut (lazyfs,
tests/integration/lazyfs.py: what was not synced is gone): every record it acknowledged is there
after the restart. Were the topic's configs not honoured, nothing would have been synced and the
partition would come back empty."""

import os
import signal

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from power_cut_workload import PARTITIONS, read_values
from test_power_cut import durable_data_dir, power_cut

pytestmark = pytest.mark.timeout(600)


def test_flush_messages_one_keeps_acknowledged_records_across_a_writer_kill_and_a_power_cut(
        appliance_factory, lazy_mount):
    app = appliance_factory(data_dir=durable_data_dir(lazy_mount))      # [log.flush] policy os
    try:
        admin = AdminClient({"bootstrap.servers": app.bootstrap})
        admin.create_topics([NewTopic("synced", PARTITIONS, 1, config={"flush.messages": "1"})],
                            request_timeout=30)["synced"].result(30)
        acked = {}
        p = Producer({"bootstrap.servers": app.bootstrap, "acks": "all", "enable.idempotence": True,
                      "linger.ms": 0})
        for i in range(30):
            p.produce("synced", value=f"v{i}".encode(), partition=i % PARTITIONS,
                      on_delivery=lambda err, m: err or acked.__setitem__(
                          m.value().decode(), (m.partition(), m.offset())))
            p.poll(0)
        assert p.flush(30) == 0 and len(acked) == 30
        w = app.writer("synced", 0)
        os.kill(w["pid"], signal.SIGKILL)            # right after the acknowledged produce
        power_cut(app, lazy_mount)
        got = {v: (part, off) for part, rows in read_values(app.bootstrap, "synced", "read_uncommitted").items()
               for off, v in rows}
        assert got == acked
    finally:
        app.terminate()
