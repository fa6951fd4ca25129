"""The log cleaner on a full data disk (a small tmpfs): a copy the cleaner cannot write stops
its round, is removed, and no process dies or restarts; with room again the partition is cleaned
and reads as Kafka's cleaner leaves it."""

from __future__ import annotations

import os
import re
import time

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from small_filesystems import MiB, disk_full, fill as fill_rest, small_tmpfs
from test_compaction import COMPACTED, TIMEOUT_S, cleaned, create_topic, pdir, uid

from appliance.log.files import CLEANED_SUFFIX

BAD_LOG_LINES = re.compile(r"killed by signal|restarting in|Traceback|crash-looping|worker crashed|"
                           r"not cleaned again")


def _latest(bootstrap: str, topic: str, end: int) -> dict[bytes, bytes]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "reader", "enable.auto.commit": False,
                  "fetch.wait.max.ms": 100})
    got: dict[bytes, bytes] = {}
    last = -1
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        deadline = time.monotonic() + TIMEOUT_S
        while last < end - 1:
            assert time.monotonic() < deadline, f"read up to {last}, want {end - 1}"
            for m in c.consume(1000, 0.5):
                assert m.error() is None, m.error()
                got[m.key()] = m.value()
                last = m.offset()
    finally:
        c.close()
    return got


@pytest.fixture
def small_fs(tmp_path):
    """A 40 MiB tmpfs for the data dir (mounted before, and unmounted after, the appliance)."""
    with small_tmpfs(str(tmp_path), 40 * MiB) as mnt:
        yield mnt


def test_cleaner_on_a_full_disk_stops_removes_its_copy_and_cleans_once_there_is_room(
        small_fs, appliance_factory):
    a = appliance_factory(
        data_dir=os.path.join(small_fs, "data"),
        server={"frontends": 1, "fetchers": 1, "disk_reserve_bytes": 1 * MiB},
        log={"cleaner": {"enable": False, "backoff_ms": 100}})
    t = uid("full")
    create_topic(a.bootstrap, t, **{**COMPACTED, "segment.bytes": str(64 * 1024)})
    p = Producer({"bootstrap.servers": a.bootstrap, "linger.ms": 5, "batch.size": 16384})
    want: dict[bytes, bytes] = {}
    errors: list = []
    for i in range(300):
        key, value = b"k%d" % (i % 10), b"%d-" % i + b"v" * 4000
        p.produce(t, key=key, value=value, on_delivery=lambda err, msg: err and errors.append(err))
        want[key] = value
    assert p.flush(60) == 0 and not errors
    end = 300
    a.wait_for(lambda: a.partition_state(t).high_watermark == end, timeout=TIMEOUT_S,
               what="the high watermark on the state page")
    pids = {w["name"]: w["pid"] for w in a.workers()}
    assert fill_rest(small_fs) > 0 and disk_full(small_fs)

    a.reload(log={"cleaner": {"enable": True, "backoff_ms": 100}})
    a.wait_for(lambda: "cleaning stopped, file system full" in a.log_text(), timeout=TIMEOUT_S,
               what="the cleaner to meet the full disk")
    # The copy goes (the writer removes it when the cleaner says so), and nothing restarted.
    a.wait_for(lambda: not [n for n in os.listdir(pdir(a, t)) if n.endswith(CLEANED_SUFFIX)],
               timeout=TIMEOUT_S, what="the partial copy to be removed")
    assert {w["name"]: w["pid"] for w in a.workers()} == pids
    assert not BAD_LOG_LINES.search(a.log_text())
    assert _latest(a.bootstrap, t, end) == want          # reads go on, the log unchanged

    os.unlink(os.path.join(small_fs, "filler"))
    st = a.wait_for(lambda: cleaned(a, t), timeout=TIMEOUT_S, what="cleaning with room again")
    assert st.active_base_offset > 0
    assert _latest(a.bootstrap, t, end) == want
    assert {w["name"]: w["pid"] for w in a.workers()} == pids
    assert not BAD_LOG_LINES.search(a.log_text())
    text = a.log_text()
    assert text.count("cleaning stopped, file system full") == 1 and "cleaning works again" in text
