"""Exactly-once consume-transform-produce under failures (KIP-98 + KIP-447), the scenario
of Kafka's own transactions system test.

Three copier processes (``programs/eos_copier.py``: confluent-kafka, read_committed group consumer +
transactional producer committing the consumed offsets in the same transaction) copy an input
topic of 20,000 records (50,000 with --soak) to an output topic while the test kills -9, at
random, copiers (restarted with the same transactional id, which fences the zombie), partition
writers of both topics and the coordinator. At the end the output read with read_committed equals the input exactly: no loss, no
duplicate, per-partition order kept.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
import uuid

import pytest

from appliance_harness import PROGRAMS
from client_drivers import driver

COPIER = os.path.join(PROGRAMS, "eos_copier.py")
PARTITIONS = 6
RECORDS, SOAK_RECORDS = 20_000, 50_000
CHAOS_S, SOAK_CHAOS_S = 45, 90
COPIERS = 3


def seed_input(bootstrap: str, topic: str, records: int) -> dict[int, list[bytes]]:
    from confluent_kafka import Producer
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 20})
    want: dict[int, list[bytes]] = {q: [] for q in range(PARTITIONS)}
    for i in range(records):
        v = f"v{i}".encode()
        while True:
            try:
                p.produce(topic, key=b"k%d" % i, value=v, partition=i % PARTITIONS)
                break
            except BufferError:
                p.poll(0.05)
        want[i % PARTITIONS].append(v)
    assert p.flush(60) == 0
    return want


def read_committed(bootstrap: str, topic: str, count: int, timeout: float) -> dict[int, list[bytes]]:
    from confluent_kafka import Consumer, TopicPartition
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"verify-{uuid.uuid4().hex}",
                  "isolation.level": "read_committed", "enable.auto.commit": False})
    c.assign([TopicPartition(topic, q, 0) for q in range(PARTITIONS)])
    got: dict[int, list[bytes]] = {q: [] for q in range(PARTITIONS)}
    n = 0
    deadline = time.monotonic() + timeout
    quiet_until = None
    try:
        while time.monotonic() < deadline:
            msgs = c.consume(5000, 0.5)
            for m in msgs:
                if m.error() is None:
                    got[m.partition()].append(m.value())
                    n += 1
            if n >= count:
                # Keep reading a moment: a duplicate would show up as extra records.
                quiet_until = quiet_until or time.monotonic() + 2.0
                if time.monotonic() > quiet_until:
                    break
    finally:
        c.close()
    return got


def output_end(bootstrap: str, topic: str) -> int:
    """Sum of the output partitions' high watermarks (records and markers)."""
    from raw_wire import RawClient
    try:
        with RawClient(bootstrap, timeout=5) as c:
            r = c.request(2, 5, {"replica_id": -1, "isolation_level": 0, "topics": [
                {"name": topic, "partitions": [{"partition_index": q, "current_leader_epoch": -1,
                                                "timestamp": -1} for q in range(PARTITIONS)]}]})
        return sum(p.offset for t in r.topics for p in t.partitions if p.error_code == 0)
    except (OSError, ConnectionError):
        return -1


class Copier:
    def __init__(self, slot: int, bootstrap: str, group: str, src: str, dst: str, logdir: str,
                 group_protocol: str = "classic") -> None:
        self.slot, self.args = slot, (bootstrap, group, src, dst, f"copier-{group}-{slot}")
        self.env = {**os.environ, "EOS_COPIER_GROUP_PROTOCOL": group_protocol}
        self.logdir = logdir
        self.starts = 0
        self.proc: subprocess.Popen | None = None
        self.start()

    def start(self, idle_exit: float = 0.0) -> None:
        self.starts += 1
        log = open(os.path.join(self.logdir, f"copier-{self.slot}-{self.starts}.log"), "w")
        self.proc = subprocess.Popen([sys.executable, COPIER, *self.args, str(idle_exit), "50", "0.05"],
                                     stdout=log, stderr=subprocess.STDOUT, env=self.env)
        log.close()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(30)


@pytest.mark.soak
@pytest.mark.parametrize("group_protocol", ["classic", "consumer"])
def test_exactly_once_copy_with_copiers_and_workers_killed_at_random(appliance_factory, tmp_path, request,
                                                                     group_protocol):
    soak = request.config.getoption("--soak")
    records, chaos_s = (SOAK_RECORDS, SOAK_CHAOS_S) if soak else (RECORDS, CHAOS_S)
    # KIP-848 (group.protocol=consumer): the broker's session timeout, as short as the classic
    # copiers' own, so that a killed copier's partitions move on within the run.
    a = appliance_factory(groups={"initial_rebalance_delay_ms": 0,
                                  "consumer_heartbeat_interval_ms": 500,
                                  "consumer_session_timeout_ms": 6000},
                          transactions={"abort_timed_out_interval_ms": 500})
    b = a.bootstrap
    tag = uuid.uuid4().hex[:6]
    src, dst, group = f"eos-in-{tag}", f"eos-out-{tag}", f"eos-{tag}"
    driver("confluent").create_topics(b, {src: (PARTITIONS, {}), dst: (PARTITIONS, {})})
    want = seed_input(b, src, records)

    rng = random.Random(int(os.environ.get("EOS_SEED", "447")))
    copiers = [Copier(i, b, group, src, dst, str(tmp_path), group_protocol) for i in range(COPIERS)]
    events = []
    kills: dict[str, list[float]] = {}
    try:
        # Chaos while the copy runs: every 1-2.5 s kill -9 one copier (restarted with its
        # transactional id) or one appliance worker (the supervisor restarts it); at most 45 s
        # (90 with --soak).
        chaos_end = time.monotonic() + chaos_s
        while time.monotonic() < chaos_end:
            # (1.5-3 s let a KIP-848 copy, which never stops the world for a rebalance, pass
            # half its records before the third fault in a CI run.)
            time.sleep(rng.uniform(1.0, 2.5))
            progress = output_end(b, dst)
            if progress >= records:
                break                  # data + markers: the copy may be complete
            what = rng.choice(["copier", "copier", "writer", "coordinator"])
            # The supervisor stops the appliance when one worker dies 5 times in 60 s (a crash
            # loop, by design): kill each worker at most 3 times a minute.
            recent = [t for t in kills.get(what, []) if time.monotonic() - t < 60]
            if what != "copier" and len(recent) >= 3:
                what = "copier"
            kills.setdefault(what, []).append(time.monotonic())
            if what == "copier":
                c = rng.choice(copiers)
                c.kill()
                c.start()
                events.append(f"copier {c.slot} at {progress}")
            elif what == "writer":
                topic = rng.choice([src, dst])
                ws = a.workers("writer", topic)
                if ws:
                    w = rng.choice(ws)
                    os.kill(w["pid"], signal.SIGKILL)
                    events.append(f"writer {w['name']} ({w['partitions']}) at {progress}")
            else:
                co = a.workers("coordinator")
                if co:
                    os.kill(co[0]["pid"], signal.SIGKILL)
                    events.append(f"coordinator at {progress}")
        # Let the copiers finish: restart any that died (a fenced zombie exits 3) with an idle exit.
        for c in copiers:
            if c.proc.poll() is not None:
                c.start(idle_exit=15.0)
        got = read_committed(b, dst, records, timeout=240)
    finally:
        for c in copiers:
            c.kill()

    problems = []
    for q in range(PARTITIONS):
        if got[q] != want[q]:
            dup = len(got[q]) - len(set(got[q]))
            missing = len(set(want[q]) - set(got[q]))
            problems.append(f"partition {q}: got {len(got[q])} want {len(want[q])}, "
                            f"{dup} duplicates, {missing} missing")
    assert not problems, f"events {events}: " + "; ".join(problems)
    # The failures hit a copy in progress, not an idle system.
    assert sum(1 for e in events if int(e.rsplit(" ", 1)[1]) < records // 2) >= 3, events
    assert any(e.startswith("copier") for e in events), events
