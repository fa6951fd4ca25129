"""The chaos suite's share-queue workload and its checker (issue 36, KIP-932): a work queue on a
share group, run beside the transactional workload under the same faults (``chaos.py
--share-consumers N``).

Used by ``loadtests/chaos.py`` in its process; owns the workload's topic (``chaos-share``), its
group and the consumer processes:

* producers (threads): idempotent confluent-kafka producers, acks=all, each value unique, sent to
  a seeded partition; a delivery report's (partition, offset) makes the value *acknowledged*;
* share consumers: ``chaos_share_member.py`` processes (one per slot, restarted when they die),
  explicit mode, every record ACCEPTed and committed; each prints what a poll returned (``D``)
  and whether the broker confirmed the accept (``A``) or not (``F``: an error or no answer, so
  applied or not). The workload kills one of them -9 every ``kill_interval`` (seeded), often with
  records acquired and not yet acknowledged: their locks expire and they go to another member.

After the run (``drain``): the producers stop, no more kills, and the consumers go on until every
acknowledged value has a confirmed accept, or nothing new is delivered for three lock durations.

The checker (``check``), Kafka's promise for share groups (KIP-932):

    lost              an acknowledged value never confirmed ACCEPTed whose ACCEPT was never even
                      sent (never delivered, or only to consumers killed before their commit):
                      an acknowledged record must reach a consumer again until it is accepted; a
                      value whose ACCEPT was sent but not confirmed (the consumer killed during the
                      commit, or an error) counts as "accept-unknown" when it never comes back;
    accepted-twice    one offset ACCEPTed with confirmation twice (after a confirmed ACCEPT the
                      record is never delivered again, so no second accept can succeed);
    stuck             after the drain, a share partition whose lag (DescribeShareGroupOffsets v1,
                      KIP-1226: records neither acknowledged nor archived) is not 0: what the
                      accept-unknown values are is settled by it (an applied accept is done);
    garbage           a value delivered that no producer sent;
    offset-mismatch   a value delivered at another offset than its delivery report said.

Not anomalies, counted: ``redelivered`` (delivery count above 1: a lock that expired or a member
that died), ``accept-unknown`` (accepts without confirmation, whose value never came back).
The group's lock duration is 3 s (``[groups] share_min_record_lock_duration_ms`` lowered to 1 s
for it) and its delivery count limit 10, so that a record redelivered after kills is not archived.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
MEMBER = os.path.join(HERE, "chaos_share_member.py")
SHARE_TOPIC = "chaos-share"
SHARE_GROUP = "chaos-share-group"
LOCK_MS = 3000
DELIVERY_LIMIT = 10
# The appliance settings the workload needs (merged into chaos.appliance_config's [groups]).
GROUP_SETTINGS = {"share_min_record_lock_duration_ms": 1000, "share_record_lock_duration_ms": LOCK_MS,
                  "share_delivery_count_limit": DELIVERY_LIMIT, "share_auto_offset_reset": "earliest",
                  "share_heartbeat_interval_ms": 500, "share_session_timeout_ms": 6000}


class ShareWorkload:
    def __init__(self, bootstrap: str, partitions: int, producers: int, consumers: int,
                 rng: random.Random, t0: float, kill_interval: tuple[float, float] = (3.0, 8.0),
                 say=print) -> None:
        self.bootstrap, self.partitions = bootstrap, partitions
        self.n_producers, self.n_consumers = producers, consumers
        self.rng, self.t0, self.kill_interval, self.say = rng, t0, kill_interval, say
        self.stop_producing = threading.Event()
        self.stop_killing = threading.Event()
        self.stop_consuming = threading.Event()
        self.lock = threading.Lock()
        self.sent: dict[str, tuple[int, int]] = {}          # value -> (partition, offset) acked
        self.send_errors = 0
        self.delivered: dict[str, list[tuple[int, int, int, str]]] = {}   # value -> (p, o, count, who)
        self.accepted: dict[tuple[int, int], list[str]] = {}             # (p, o) -> consumers, confirmed
        self.accepted_values: set[str] = set()
        self.unconfirmed: set[str] = set()
        self.kills = 0
        self.restarts = 0
        self.lags: dict[int, int | None] | None = None     # partition -> lag after the drain
        self.last_delivery = time.monotonic()
        self.threads: list[threading.Thread] = []
        self.procs: dict[int, subprocess.Popen] = {}

    # -- set-up -----------------------------------------------------------------------------------
    def create(self) -> None:
        """The topic, and the group's configs (earliest; the lock and delivery limit above)."""
        from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        for f in admin.create_topics([NewTopic(SHARE_TOPIC, self.partitions, 1)]).values():
            f.result(60)
        res = ConfigResource("group", SHARE_GROUP, set_config={
            "share.auto.offset.reset": "earliest", "share.record.lock.duration.ms": str(LOCK_MS),
            "share.delivery.count.limit": str(DELIVERY_LIMIT)})
        for f in admin.alter_configs([res]).values():
            f.result(60)

    def start(self) -> None:
        for i in range(self.n_producers):
            self.threads.append(threading.Thread(target=self._produce, args=(i, self.rng.randrange(1 << 31)),
                                                 name=f"share-p{i}", daemon=True))
        for slot in range(self.n_consumers):
            self.threads.append(threading.Thread(target=self._consume, args=(slot,),
                                                 name=f"share-c{slot}", daemon=True))
        self.threads.append(threading.Thread(target=self._killer, args=(self.rng.randrange(1 << 31),),
                                             name="share-killer", daemon=True))
        for t in self.threads:
            t.start()

    # -- producers --------------------------------------------------------------------------------
    def _produce(self, index: int, seed: int) -> None:
        from confluent_kafka import Producer
        rng = random.Random(seed)
        p = Producer({"bootstrap.servers": self.bootstrap, "enable.idempotence": True, "acks": "all",
                      "linger.ms": 5, "message.timeout.ms": 120000, "log_level": 0})

        def report(err, msg) -> None:
            with self.lock:
                if err is None:
                    self.sent[msg.value().decode()] = (msg.partition(), msg.offset())
                else:
                    self.send_errors += 1
        n = 0
        while not self.stop_producing.is_set():
            try:
                p.produce(SHARE_TOPIC, value=f"s{index}-{n}".encode(),
                          partition=rng.randrange(self.partitions), on_delivery=report)
                n += 1
            except BufferError:
                pass
            p.poll(0.02)             # the producer's pace: about 50 values a second each
        p.flush(150)

    # -- consumers --------------------------------------------------------------------------------
    def _consume(self, slot: int) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("APPLIANCE_")}
        while not self.stop_consuming.is_set():
            proc = subprocess.Popen([sys.executable, MEMBER, self.bootstrap, SHARE_GROUP, SHARE_TOPIC],
                                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
            with self.lock:
                self.procs[slot] = proc
            if self.stop_consuming.is_set():      # kill_consumers may have looked before it
                proc.kill()
            who = f"c{slot}.{proc.pid}"
            for line in proc.stdout:
                kind, _, rest = line.partition(" ")
                if kind not in ("D", "T", "A", "F"):
                    continue
                p, o, count, value = rest.split(maxsplit=3)
                p, o, count, value = int(p), int(o), int(count), value.strip()
                with self.lock:
                    if kind == "D":
                        self.delivered.setdefault(value, []).append((p, o, count, who))
                        self.last_delivery = time.monotonic()
                    elif kind == "A":
                        self.accepted.setdefault((p, o), []).append(who)
                        self.accepted_values.add(value)
                    else:                 # T (sent, outcome not known yet) or F (failed or unknown)
                        self.unconfirmed.add(value)
            proc.wait()
            if not self.stop_consuming.is_set():
                with self.lock:
                    self.restarts += 1

    def _killer(self, seed: int) -> None:
        rng = random.Random(seed)
        while not self.stop_killing.wait(rng.uniform(*self.kill_interval)):
            with self.lock:
                live = [(s, p) for s, p in self.procs.items() if p.poll() is None]
            if not live:
                continue
            slot, proc = live[rng.randrange(len(live))]
            try:
                proc.send_signal(signal.SIGKILL)
            except ProcessLookupError:
                continue
            with self.lock:
                self.kills += 1
            self.say(f"[{time.monotonic() - self.t0:7.1f}s] kill -9 share consumer {slot} (pid {proc.pid})")

    # -- the end ----------------------------------------------------------------------------------
    def drain(self, timeout: float = 180.0) -> bool:
        """Producers stopped and flushed, no more kills; the consumers run on until every
        acknowledged value was accepted with confirmation, or nothing was delivered for three
        lock durations. True when every acknowledged value was accepted with confirmation."""
        self.stop_producing.set()
        self.stop_killing.set()
        for t in self.threads:
            if t.name.startswith("share-p") or t.name == "share-killer":
                t.join(180)
        deadline = time.monotonic() + timeout
        quiet_s = 3 * LOCK_MS / 1000 + 2
        while time.monotonic() < deadline:
            with self.lock:
                left = [v for v in self.sent if v not in self.accepted_values]
                idle = time.monotonic() - self.last_delivery
            if not left or idle > quiet_s:
                break
            time.sleep(0.5)
        try:
            from appliance.client.admin import AdminClient
            with AdminClient(self.bootstrap) as admin:
                self.lags = {p: lag for (t, p), (_, lag) in admin.share_offsets(SHARE_GROUP).items()
                             if t == SHARE_TOPIC}
        except Exception as e:        # told; check() then counts every partition as stuck
            self.say(f"share workload: DescribeShareGroupOffsets failed: {e!r}")
        self.kill_consumers()
        for t in self.threads:
            t.join(30)
        with self.lock:
            return all(v in self.unconfirmed for v in left)

    def kill_consumers(self) -> None:
        """The end of the consumers (no restart): kill -9 of every one."""
        self.stop_producing.set()
        self.stop_killing.set()
        self.stop_consuming.set()
        with self.lock:
            procs = list(self.procs.values())
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)

    def check(self) -> dict:
        """The anomaly classes above: {class: [examples]}, and counts that are not anomalies."""
        with self.lock:
            sent, delivered = dict(self.sent), dict(self.delivered)
            accepted, accepted_values = dict(self.accepted), set(self.accepted_values)
            unconfirmed = set(self.unconfirmed)
        anomalies: dict[str, list] = {"lost": [], "accepted-twice": [], "stuck": [], "garbage": [],
                                      "offset-mismatch": []}
        if self.lags is None:
            anomalies["stuck"].append({"lags": "unknown (DescribeShareGroupOffsets failed)"})
        else:
            for p in sorted({p for p, _ in sent.values()}):
                if self.lags.get(p, -1) != 0:
                    anomalies["stuck"].append({"partition": p, "lag": self.lags.get(p)})
        unknown = []
        for value, at in sent.items():
            if value in accepted_values:
                continue
            if value in unconfirmed:
                unknown.append(value)         # its accept may have been applied without an answer
            else:
                anomalies["lost"].append({"value": value, "at": at, "deliveries": delivered.get(value, [])})
        for (p, o), who in accepted.items():
            if len(who) > 1:
                anomalies["accepted-twice"].append({"partition": p, "offset": o, "by": who})
        for value, ds in delivered.items():
            if value not in sent:
                # A value whose delivery report was lost with a kill-all may be in the log: garbage
                # only if it does not look like one of ours.
                if not value.startswith("s"):
                    anomalies["garbage"].append({"value": value, "deliveries": ds})
                continue
            if any((p, o) != sent[value] for p, o, _, _ in ds):
                anomalies["offset-mismatch"].append({"value": value, "sent": sent[value], "deliveries": ds})
        stats = {"acknowledged": len(sent), "send errors": self.send_errors,
                 "accepted": len(accepted_values & set(sent)),
                 "deliveries": sum(len(d) for d in delivered.values()),
                 "redelivered": sum(1 for d in delivered.values() if any(c > 1 for _, _, c, _ in d)),
                 "accept-unknown": len(unknown), "consumer kills": self.kills,
                 "consumer restarts": self.restarts}
        return {"anomalies": anomalies, "stats": stats}
