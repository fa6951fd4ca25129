"""Rebalances under load (issue 33): consumers joining one by one up to N, then leaving one by one,
while a producer writes at a fixed rate; the KIP-848 consumer protocol against the classic one
(cooperative-sticky and eager), in one run.

Not a test; run by hand in the user's shell:

    .venv/bin/python loadtests/bench_rebalance.py [--partitions 64] [--consumers 8]
        [--rate 2000] [--heartbeat-ms 1000] [--protocols consumer,cooperative,eager]
        [--client confluent|java] [--process-ms 0] [--events]

One appliance (``appliance run`` in its own process group, a temporary data dir, ``[groups]
initial_rebalance_delay_ms = 0`` and ``consumer_heartbeat_interval_ms`` = ``--heartbeat-ms``),
one topic per protocol. The consumers are confluent-kafka consumers in threads of this process
(each its own librdkafka instance), committing synchronously after every batch they process; the
classic ones get ``heartbeat.interval.ms`` = ``--heartbeat-ms`` too. For every join and every leave
it measures:

- settle: from the join (subscribe) or the leave (close) to the moment every partition is owned by
  exactly one consumer and the shares are balanced (within one);
- the longest gap in consumption of any partition whose owner is the same before and after the
  event (a pause the protocol imposed on a consumer that had nothing to give up), between the
  event and one second after it settled; the producer writes every partition every
  ``partitions / rate`` seconds, so that is the floor;
- records read twice over the run (by record offset).

``--process-ms N``: each member spends N ms on every batch it gets before its commit and its next
poll (a sleep standing for an application's work): a classic member serves its rebalance only in
its poll, so the eager protocol's stop-the-world join waits for the slowest member's batch.

Prints a markdown table: per protocol, the worst and median settle times of the joins and of the
leaves, the longest gap, and the duplicates.

``--client java``: the members are Kafka's Java client 4.3.0 instead (``tests/java/RebalanceMember.java``,
one JVM each, compiled at the start against the jars of the test extra's wheel), the same
protocols (KIP-848 with the broker's assignor; classic CooperativeStickyAssignor and
RangeAssignor), so that a pause the client imposes is told apart from one the broker does:
librdkafka pauses every assigned partition during an incremental rebalance until the
application serves its callback.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ports import free_port  # noqa: E402

APPLIANCE = os.path.join(os.path.dirname(sys.executable), "appliance")


class Member(threading.Thread):
    def __init__(self, boot: str, group: str, topic: str, protocol: str, hb_ms: int,
                 log: "Log", process_ms: int = 0) -> None:
        super().__init__(daemon=True)
        self.process_s = process_ms / 1000
        conf = {"bootstrap.servers": boot, "group.id": group, "enable.auto.commit": False,
                "auto.offset.reset": "earliest"}
        if protocol == "consumer":
            conf["group.protocol"] = "consumer"
        else:
            conf.update({"heartbeat.interval.ms": hb_ms, "session.timeout.ms": 10 * hb_ms,
                         "partition.assignment.strategy":
                         "cooperative-sticky" if protocol == "cooperative" else "range"})
        self.c = Consumer(conf)
        self.topic = topic
        self.log = log
        self.owned: set[int] = set()
        self.stop_flag = False
        self.closed = threading.Event()

    def run(self) -> None:
        def assign(_c, ps):
            self.owned.update(p.partition for p in ps)

        def revoke(_c, ps):
            self.owned.difference_update(p.partition for p in ps)

        self.c.subscribe([self.topic], on_assign=assign, on_revoke=revoke, on_lost=revoke)
        while not self.stop_flag:
            msgs = [m for m in self.c.consume(500, 0.05) if m.error() is None]
            now = time.monotonic()
            for m in msgs:
                self.log.add(m.partition(), m.offset(), now)
            if msgs:
                if self.process_s:
                    time.sleep(self.process_s)      # the application's work on the batch
                try:
                    self.c.commit(asynchronous=False)
                except KafkaException:
                    pass
        self.c.close()
        self.owned = set()
        self.closed.set()


class JavaMember:
    """A ``java RebalanceMember`` process with the ``Member`` interface: ``owned`` follows its
    listener's lines, its records go to the ``Log`` (stamped when read), ``stop_flag = True``
    closes it."""

    def __init__(self, boot: str, group: str, topic: str, protocol: str, hb_ms: int,
                 log: "Log", classpath: str, process_ms: int = 0) -> None:
        self.args = ["java", "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-cp",
                     classpath, "RebalanceMember", boot, group, topic, protocol, str(hb_ms),
                     str(process_ms)]
        self.log = log
        self.owned: set[int] = set()
        self.closed = threading.Event()
        self.subscribed = threading.Event()
        self.subscribed_at = 0.0
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        """Starts the JVM and returns once it has subscribed (``subscribed_at``: the join's
        moment, as a confluent-kafka member's is its subscribe; the JVM's start is not timed)."""
        self.proc = subprocess.Popen(self.args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True)
        threading.Thread(target=self._read, daemon=True).start()
        if not self.subscribed.wait(120):
            raise SystemExit("a Java member did not subscribe within 120 s")

    def _read(self) -> None:
        for line in self.proc.stdout:
            kind, _, rest = line.rstrip("\n").partition(" ")
            if kind == "M":
                now = time.monotonic()
                for item in rest.split():
                    p, _, off = item.partition(":")
                    self.log.add(int(p), int(off), now)
            elif kind in ("A", "R", "L"):
                ps = {int(x) for x in rest.split(",") if x}
                if kind == "A":
                    self.owned.update(ps)
                else:
                    self.owned.difference_update(ps)
            elif kind == "S":
                self.subscribed_at = time.monotonic()
                self.subscribed.set()
            elif kind == "CLOSED":
                break
        self.owned = set()
        self.closed.set()

    @property
    def stop_flag(self) -> bool:
        return self.closed.is_set()

    @stop_flag.setter
    def stop_flag(self, value: bool) -> None:
        if value and self.proc is not None and self.proc.stdin is not None:
            try:
                self.proc.stdin.write("stop\n")
                self.proc.stdin.close()
            except OSError:
                pass


def java_classpath(work: str) -> str:
    """RebalanceMember.java compiled against kafka-clients 4.3.0's jars; its class path."""
    from chaos_java import ROOT, compile_client
    return compile_client(work, "4.3.0", os.path.join(ROOT, "tests", "java", "RebalanceMember.java"))


class Log:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.times: dict[int, list[float]] = {}
        self.seen: set[tuple[int, int]] = set()
        self.dups = 0

    def add(self, p: int, off: int, t: float) -> None:
        with self.lock:
            if (p, off) in self.seen:
                self.dups += 1
            else:
                self.seen.add((p, off))
            self.times.setdefault(p, []).append(t)

    def longest_gap(self, parts: set[int], t0: float, t1: float) -> float:
        worst = 0.0
        with self.lock:
            for p in parts:
                ts = [t for t in self.times.get(p, ()) if t0 <= t <= t1]
                edges = [t0] + ts + [t1]
                worst = max([worst] + [b - a for a, b in zip(edges, edges[1:])])
        return worst


def owners(members: list[Member]) -> dict[int, int] | None:
    """partition -> member index, when every partition has exactly one owner."""
    out: dict[int, int] = {}
    for i, m in enumerate(members):
        for p in list(m.owned):
            if p in out:
                return None
            out[p] = i
    return out


def settle(members: list[Member], n: int, t0: float, timeout: float = 120) -> tuple[float, dict]:
    while time.monotonic() - t0 < timeout:
        o = owners(members)
        if o is not None and len(o) == n:
            sizes = [len(m.owned) for m in members]
            if max(sizes) - min(sizes) <= 1:
                return time.monotonic() - t0, o
        time.sleep(0.01)
    raise SystemExit(f"no settled assignment within {timeout} s")


def run_protocol(boot: str, protocol: str, args) -> dict:
    topic = f"rebalance-{protocol}-{os.getpid()}"
    a = AdminClient({"bootstrap.servers": boot})
    a.create_topics([NewTopic(topic, args.partitions, 1)])[topic].result()
    log = Log()
    stop = threading.Event()

    def produce():
        p = Producer({"bootstrap.servers": boot, "linger.ms": 5})
        i = 0
        period = 1.0 / args.rate
        nxt = time.monotonic()
        while not stop.is_set():
            p.produce(topic, value=b"x", partition=i % args.partitions)
            i += 1
            nxt += period
            delay = nxt - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            p.poll(0)
        p.flush(30)

    threading.Thread(target=produce, daemon=True).start()
    members: list[Member] = []
    joins, leaves, gaps = [], [], []
    before: dict[int, int] = {}
    for k in range(args.consumers):
        if args.classpath:
            m = JavaMember(boot, f"g-{topic}", topic, protocol, args.heartbeat_ms, log,
                           args.classpath, args.process_ms)
        else:
            m = Member(boot, f"g-{topic}", topic, protocol, args.heartbeat_ms, log,
                       args.process_ms)
        t0 = time.monotonic()
        members.append(m)
        m.start()
        t0 = getattr(m, "subscribed_at", t0)
        took, after = settle(members, args.partitions, t0)
        joins.append(took)
        time.sleep(1.0)
        kept = {p for p, i in after.items() if before.get(p) == i}
        if kept:
            gaps.append(log.longest_gap(kept, t0, t0 + took + 1.0))
        if args.events:
            print(f"  {protocol} join {k + 1}: settled in {took:.2f} s, longest pause of a kept "
                  f"partition {gaps[-1] if kept else 0:.2f} s", file=sys.stderr, flush=True)
        before = after
    while len(members) > 1:
        m = members[0]
        t0 = time.monotonic()
        m.stop_flag = True
        m.closed.wait(60)
        members = members[1:]
        took, after = settle(members, args.partitions, t0)
        leaves.append(took)
        time.sleep(1.0)
        old = {p: i - 1 for p, i in before.items() if i > 0}
        kept = {p for p, i in after.items() if old.get(p) == i}
        if kept:
            gaps.append(log.longest_gap(kept, t0, t0 + took + 1.0))
        if args.events:
            print(f"  {protocol} leave ({len(members)} left): settled in {took:.2f} s, longest "
                  f"pause of a kept partition {gaps[-1] if kept else 0:.2f} s", file=sys.stderr,
                  flush=True)
        before = after
    stop.set()
    members[0].stop_flag = True
    members[0].closed.wait(60)
    return {"joins": joins, "leaves": leaves, "gap": max(gaps) if gaps else 0.0,
            "dups": log.dups}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--partitions", type=int, default=64)
    ap.add_argument("--consumers", type=int, default=8)
    ap.add_argument("--rate", type=int, default=2000, help="records/s over all partitions")
    ap.add_argument("--heartbeat-ms", type=int, default=1000)
    ap.add_argument("--protocols", default="consumer,cooperative,eager")
    ap.add_argument("--work-dir", default=None)
    ap.add_argument("--process-ms", type=int, default=0,
                    help="each member's time on every batch before its commit and next poll")
    ap.add_argument("--events", action="store_true",
                    help="print each join's and leave's figures to stderr as they come")
    ap.add_argument("--client", choices=("confluent", "java"), default="confluent",
                    help="the members: confluent-kafka (librdkafka) or Kafka's Java client 4.3.0")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="bench-rebalance-", dir=args.work_dir)
    args.classpath = java_classpath(work) if args.client == "java" else None
    port = free_port()
    conf = os.path.join(work, "appliance.toml")
    with open(conf, "w") as f:
        f.write(f"[groups]\ninitial_rebalance_delay_ms = 0\n"
                f"consumer_heartbeat_interval_ms = {args.heartbeat_ms}\n"
                f"min_session_timeout_ms = {min(6000, 10 * args.heartbeat_ms)}\n")
    proc = subprocess.Popen([APPLIANCE, "run", "--listen", f"127.0.0.1:{port}", "--data-dir",
                             os.path.join(work, "data"), "--config", conf],
                            stdout=open(os.path.join(work, "appliance.log"), "ab"),
                            stderr=subprocess.STDOUT, start_new_session=True)
    boot = f"127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                AdminClient({"bootstrap.servers": boot}).list_topics(timeout=2)
                break
            except KafkaException:
                if time.monotonic() > deadline:
                    raise SystemExit("the appliance did not start")
        print(f"{args.partitions} partitions, up to {args.consumers} consumers, {args.rate} "
              f"records/s, heartbeat interval {args.heartbeat_ms} ms, {args.process_ms} ms per "
              f"batch, client "
              f"{'kafka-clients 4.3.0' if args.classpath else 'confluent-kafka'}\n")
        print("| protocol | join settle max / median (s) | leave settle max / median (s) | "
              "longest pause of a partition that kept its owner (s) | records read twice |")
        print("|---|---|---|---|---|")
        for protocol in args.protocols.split(","):
            r = run_protocol(boot, protocol, args)
            name = {"consumer": "KIP-848 consumer (uniform)",
                    "cooperative": "classic cooperative-sticky",
                    "eager": "classic eager (range)"}[protocol]
            print(f"| {name} | {max(r['joins']):.2f} / {statistics.median(r['joins']):.2f} | "
                  f"{max(r['leaves']):.2f} / {statistics.median(r['leaves']):.2f} | "
                  f"{r['gap']:.2f} | {r['dups']} |", flush=True)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(60)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
