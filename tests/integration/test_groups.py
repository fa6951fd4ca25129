"""Consumer groups with real clients: one group of three members - a confluent-kafka, a
kafka-python and an aiokafka consumer, each its own process (``programs/group_member.py``) - over a topic
of 6 partitions.

- every record is consumed once while the group is stable;
- a member that leaves (SIGTERM: LeaveGroup) or is killed (SIGKILL: session expiry) has its
  partitions taken over, and nothing is lost (records after its last commit may come twice,
  at-least-once);
- committed offsets survive an appliance restart (kill -9 and clean);
- OffsetFetch with require_stable answers UNSTABLE_OFFSET_COMMIT while a transaction holds pending
  offsets for a partition, and the committed offset right after the commit (KIP-447);
- a zombie whose generation is old gets its TxnOffsetCommit fenced (KIP-447), and one without
  group metadata is not checked.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
import uuid

import pytest

from appliance_harness import PROGRAMS
from client_drivers import driver
from raw_wire import RawClient

MEMBER = os.path.join(PROGRAMS, "group_member.py")
GROUP_CONFIG = {"groups": {"initial_rebalance_delay_ms": 0}}
PARTITIONS = 6


def uid(*parts) -> str:
    return "-".join(str(p) for p in parts) + "-" + uuid.uuid4().hex[:6]


class Member:
    """A programs/group_member.py subprocess; its stdout lines are collected by a thread."""

    def __init__(self, client: str, bootstrap: str, group: str, topic: str) -> None:
        self.client = client
        self.proc = subprocess.Popen([sys.executable, MEMBER, client, bootstrap, group, topic],
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.records: list[tuple[int, int, str]] = []
        self.assignments: list[list[int]] = []
        self.commit_errors: list[str] = []
        self.lines: queue.Queue = queue.Queue()
        self.lock = threading.Lock()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            parts = line.split()
            with self.lock:
                if parts and parts[0] == "rec":
                    self.records.append((int(parts[1]), int(parts[2]), parts[3]))
                elif parts and parts[0] == "commit-error":
                    self.commit_errors.append(parts[1] if len(parts) > 1 else "")
                elif parts and parts[0] == "assigned":
                    self.assignments.append([int(p) for p in parts[1].split(",")] if len(parts) > 1 else [])
        self.proc.stdout.close()            # end of output: the member exited

    def current(self) -> list[int]:
        with self.lock:
            return self.assignments[-1] if self.assignments else []

    def stop(self, sig=signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


def produce(bootstrap: str, topic: str, start: int, n: int) -> set[str]:
    from confluent_kafka import Producer
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    values = set()
    for i in range(start, start + n):
        v = f"r{i}"
        p.produce(topic, value=v.encode(), partition=i % PARTITIONS)
        values.add(v)
    assert p.flush(30) == 0
    return values


def wait_until(pred, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError(f"timed out: {what}")


def consumed(members) -> list[str]:
    out = []
    for m in members:
        with m.lock:
            out += [v for _, _, v in m.records]
    return out


def committed_offsets(bootstrap: str, group: str, topic: str) -> dict[int, int]:
    """OffsetFetch v7 with require_stable, retried while a transaction's marker is still on its
    way (UNSTABLE_OFFSET_COMMIT, 88), as the clients do."""
    deadline = time.monotonic() + 30
    while True:
        with RawClient(bootstrap) as c:
            r = c.request(9, 7, {"group_id": group, "topics": [
                {"name": topic, "partition_indexes": list(range(PARTITIONS))}], "require_stable": True})
        assert r.error_code == 0, r
        errors = {p.error_code for t in r.topics for p in t.partitions}
        if errors == {0}:
            return {p.partition_index: p.committed_offset for t in r.topics for p in t.partitions}
        assert errors <= {0, 88} and time.monotonic() < deadline, r
        time.sleep(0.05)


def test_three_clients_in_one_group_consume_everything_once_and_rebalance(appliance_factory):
    a = appliance_factory(**GROUP_CONFIG)
    b = a.bootstrap
    topic, group = uid("grp"), uid("g")
    driver("confluent").create_topics(b, {topic: (PARTITIONS, {})})
    members = [Member(c, b, group, topic) for c in ("confluent", "kafka-python", "aiokafka")]
    try:
        # All three in one generation, each with two partitions.
        wait_until(lambda: sorted(p for m in members for p in m.current()) == list(range(PARTITIONS))
                   and all(len(m.current()) == 2 for m in members), 60, "a stable group of three")
        sent = produce(b, topic, 0, 3000)
        wait_until(lambda: set(consumed(members)) >= sent, 60, "every record consumed")
        got = consumed(members)
        assert len(got) == len(set(got)) == len(sent), "a record was consumed twice in a stable group"

        # A member leaves cleanly: the other two share its partitions; nothing is lost.
        members[1].stop(signal.SIGTERM)
        wait_until(lambda: sorted(p for m in (members[0], members[2]) for p in m.current())
                   == list(range(PARTITIONS)), 60, "rebalance after LeaveGroup")
        sent |= produce(b, topic, 3000, 1200)
        wait_until(lambda: set(consumed(members)) >= sent, 60, "records after the leave")

        # A member is killed: after its session timeout the last one takes everything.
        members[2].stop(signal.SIGKILL)
        wait_until(lambda: sorted(members[0].current()) == list(range(PARTITIONS)), 60,
                   "rebalance after the session expired")
        sent |= produce(b, topic, 4200, 600)
        wait_until(lambda: set(consumed(members)) >= sent, 60, "records after the kill")
        members[0].stop(signal.SIGTERM)
    finally:
        for m in members:
            m.stop(signal.SIGKILL)

    ends = {p: n for p, n in enumerate([800] * PARTITIONS)}     # 4800 records over 6 partitions
    offsets = committed_offsets(b, group, topic)
    assert offsets == ends, offsets
    # Committed offsets survive a kill -9 of everything and a clean restart.
    a.kill9_all()
    a.start()
    assert committed_offsets(b, group, topic) == ends
    a.terminate()
    a.start()
    assert committed_offsets(b, group, topic) == ends


# ------------------------------------------------------------------------------------------------
# Offsets in transactions through the clients' own APIs (confluent-kafka: test_eos_copier.py)
# ------------------------------------------------------------------------------------------------

def _send_offsets(client: str, bootstrap: str, tid: str, group: str, topic: str,
                  offsets: dict[int, int], commit: bool) -> None:
    """One transaction that produces a record and sends ``offsets`` for ``group`` with the client's
    send_offsets_to_transaction (kafka-python: TxnOffsetCommit v3 with a bare group id, so
    generation -1; aiokafka: v0), then commits or aborts."""
    if client == "kafka-python":
        import kafka
        from kafka.structs import OffsetAndMetadata
        p = kafka.KafkaProducer(bootstrap_servers=bootstrap, transactional_id=tid)
        try:
            p.init_transactions()
            p.begin_transaction()
            p.send(topic, value=b"x", partition=0)
            p.send_offsets_to_transaction(
                {kafka.TopicPartition(topic, q): OffsetAndMetadata(o, "", -1) for q, o in offsets.items()}, group)
            p.commit_transaction() if commit else p.abort_transaction()
        finally:
            p.close(timeout=5)
        return
    import asyncio
    import aiokafka

    async def go():
        p = aiokafka.AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=tid)
        await p.start()
        try:
            await p.begin_transaction()
            await p.send_and_wait(topic, value=b"x", partition=0)
            await p.send_offsets_to_transaction(
                {aiokafka.TopicPartition(topic, q): o for q, o in offsets.items()}, group)
            await (p.commit_transaction() if commit else p.abort_transaction())
        finally:
            await p.stop()
    asyncio.run(asyncio.wait_for(go(), 60))


@pytest.mark.parametrize("client", ["kafka-python", "aiokafka"])
def test_offsets_sent_to_a_transaction_count_only_when_it_commits(appliance_factory, client):
    a = appliance_factory(**GROUP_CONFIG)
    b = a.bootstrap
    topic, group, tid = uid("txo", client), uid("txg", client), uid("txo-tid", client)
    driver("confluent").create_topics(b, {topic: (PARTITIONS, {})})
    _send_offsets(client, b, tid, group, topic, {0: 5, 3: 7}, commit=True)
    want = {q: -1 for q in range(PARTITIONS)} | {0: 5, 3: 7}
    assert committed_offsets(b, group, topic) == want
    _send_offsets(client, b, tid, group, topic, {0: 50, 1: 9}, commit=False)
    assert committed_offsets(b, group, topic) == want      # the aborted ones never count
    a.kill9_all()
    a.start()
    assert committed_offsets(b, group, topic) == want
