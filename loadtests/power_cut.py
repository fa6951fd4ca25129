"""What each ``[log.flush] policy`` loses at a power cut, measured on lazyfs (issue 34).

    .venv/bin/python loadtests/power_cut.py --policy interval --interval-ms 200 --cuts 10
    .venv/bin/python loadtests/power_cut.py --policy os --cuts 10

The data dir is on tests/integration/lazyfs.py (a FUSE file system that forgets what was not
synced). Each round: an idempotent producer with acks=1 and one with acks=all write to their
topics at a steady rate, at a random moment the appliance group is killed -9, the file system is
killed with what it held unsynced, mounted again, the appliance restarted; the same producers
keep going (their retries after the restart are the producer-state check). Then, per acks
setting: acknowledged records lost (count), the worst loss in milliseconds of acks (the cut's
time minus the ack time of the oldest acknowledged record lost), and the consistency of what
survived: per partition the recovered log is a prefix of what was acknowledged (no gap inside
it), every batch's CRC checked by the consumer (check.crcs), and whether a producer was left
answering OUT_OF_ORDER_SEQUENCE (it must be accepted or a duplicate after the restart).
Prints one JSON line per round and a summary.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))

from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

from appliance_harness import Appliance  # noqa: E402
from lazyfs import LazyMount, available  # noqa: E402

PARTITIONS = 2
ACKS = {"acks1": "1", "acksall": "all"}


class Stream:
    """One producer writing ``topic`` at ``rate`` records/s; values carry a per-partition count."""

    def __init__(self, bootstrap: str, topic: str, acks: str, rate: int):
        self.topic, self.rate = topic, rate
        self.acked: dict[int, list[tuple[int, str, float]]] = {p: [] for p in range(PARTITIONS)}
        self.out_of_order = 0
        self.errors = 0
        self.lost: set[str] = set()
        self.stop = threading.Event()
        self.p = Producer({"bootstrap.servers": bootstrap, "acks": acks,
                           "enable.idempotence": acks == "all", "linger.ms": 1,
                           "message.timeout.ms": 120000, "reconnect.backoff.max.ms": 200})
        self.t = threading.Thread(target=self._run, daemon=True)

    def _cb(self, err, msg):
        if err is not None:
            self.errors += 1
            if "OUT_OF_ORDER" in str(err):
                self.out_of_order += 1
            return
        self.acked[msg.partition()].append((msg.offset(), msg.value().decode(), time.monotonic()))

    def _run(self):
        n = 0
        start = time.monotonic()
        while not self.stop.is_set():
            due = start + n / self.rate
            now = time.monotonic()
            if now < due:
                self.p.poll(min(due - now, 0.01))
                continue
            try:
                self.p.produce(self.topic, value=f"{n}".encode(), partition=n % PARTITIONS,
                               on_delivery=self._cb)
                n += 1
            except BufferError:
                self.p.poll(0.01)
            self.p.poll(0)
        self.p.flush(120)

    def count(self) -> int:
        return sum(len(v) for v in self.acked.values())


def read_log(bootstrap: str, topic: str) -> dict[int, list[tuple[int, str]]]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "pc-read", "check.crcs": True,
                  "enable.auto.commit": False, "enable.partition.eof": True})
    out: dict[int, list[tuple[int, str]]] = {p: [] for p in range(PARTITIONS)}
    ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(PARTITIONS)}
    c.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    done = {p for p, e in ends.items() if e == 0}
    deadline = time.monotonic() + 60
    crc_errors = 0
    while len(done) < PARTITIONS and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is None:
            continue
        if m.error():
            if m.error().code() == -191:
                done.add(m.partition())
            else:
                crc_errors += 1
            continue
        out[m.partition()].append((m.offset(), m.value().decode()))
        if m.offset() + 1 >= ends[m.partition()]:
            done.add(m.partition())
    c.close()
    out["crc_errors"] = crc_errors  # type: ignore[index]
    return out


def judge(stream: Stream, log: dict, cut_at: float, killed_at: float, ready_at: float) -> dict:
    """This cut's loss: the records acknowledged before the appliance was dead (``killed_at``:
    an ack can leave in the moment between the cut's start and the group's death) and missing
    now, less those an earlier cut took (``stream.lost``); the loss in ms counts from the cut. A
    gap: an acknowledged record missing while a later one of its partition survived."""
    lost, worst_ms, gaps, since_start = 0, 0.0, [], None
    for part in range(PARTITIONS):
        at = dict(log[part])
        have = set(at.values())
        acked = [a for a in stream.acked[part] if a[2] <= killed_at and a[1] not in stream.lost]
        missing = [a for a in acked if a[1] not in have]
        lost += len(missing)
        if missing:
            oldest = min(a[2] for a in missing)
            if (cut_at - oldest) * 1000 > worst_ms:
                worst_ms = (cut_at - oldest) * 1000
                since_start = (oldest - ready_at) * 1000
        present = [a[1] in have for a in acked]
        if False in present and True in present[present.index(False):]:
            first = present.index(False)
            later = acked[first + present[first:].index(True)]
            gaps.append({"partition": part, "missing": acked[first][:2],
                         "acked_ms_before_cut": round((cut_at - acked[first][2]) * 1000, 1),
                         "later_present": later[:2], "now_at_its_offset": at.get(acked[first][0])})
        stream.lost.update(a[1] for a in missing)
        offs = sorted(at)
        if offs and offs != list(range(offs[0], offs[0] + len(offs))):
            gaps.append({"partition": part, "offsets_not_contiguous": True})
    return {"lost": lost, "worst_loss_ms": round(max(worst_ms, 0.0), 1), "gaps": gaps,
            "worst_acked_ms_after_start": None if since_start is None else round(since_start, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--policy", choices=("os", "interval", "batch"), required=True)
    ap.add_argument("--interval-ms", type=int, default=1000)
    ap.add_argument("--cuts", type=int, default=5)
    ap.add_argument("--rate", type=int, default=500, help="records/s of each producer")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    why = available()
    if why:
        sys.exit(why)
    rng = random.Random(args.seed)
    work = tempfile.mkdtemp(prefix="power-cut-")
    mount = LazyMount(os.path.join(work, "backing"), os.path.join(work, "mnt"))
    mount.mount()
    data = os.path.join(mount.mountpoint, "data")
    os.mkdir(data)
    fd = os.open(mount.mountpoint, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    flush = {"policy": args.policy, "interval_ms": args.interval_ms}
    app = Appliance(data_dir=data, log_path=os.path.join(work, "appliance.log"),
                    config={"log": {"flush": flush}})
    rounds = []
    try:
        app.start(timeout=120)
        admin = AdminClient({"bootstrap.servers": app.bootstrap})
        for f in admin.create_topics([NewTopic(t, PARTITIONS, 1) for t in ACKS]).values():
            f.result(30)
        streams = {t: Stream(app.bootstrap, t, acks, args.rate) for t, acks in ACKS.items()}
        for s in streams.values():
            s.t.start()
        ready_at = time.monotonic()
        for i in range(args.cuts):
            before = {t: s.count() for t, s in streams.items()}
            time.sleep(rng.uniform(1.0, 4.0))      # the random moment of the cut
            cut_at = time.monotonic()
            app.kill9_all()
            killed_at = time.monotonic()
            mount.cut()
            mount.mount()
            app.start(timeout=120)
            new_ready = time.monotonic()
            # The same producers resume: wait until each has new acks (not stuck).
            resumed = {}
            t0 = time.monotonic()
            for t, s in streams.items():
                n = s.count()
                while s.count() <= n and time.monotonic() - t0 < 60:
                    time.sleep(0.05)
                resumed[t] = s.count() > n
            row = {"round": i, "policy": args.policy, "interval_ms": args.interval_ms}
            for t, s in streams.items():
                log = read_log(app.bootstrap, t)
                row[t] = {**judge(s, log, cut_at, killed_at, ready_at), "crc_errors": log["crc_errors"],
                          "resumed": resumed[t], "out_of_order": s.out_of_order,
                          "acked_since_last_cut": s.count() - before[t]}
            ready_at = new_ready
            rounds.append(row)
            print(json.dumps(row), flush=True)
        for s in streams.values():
            s.stop.set()
            s.t.join(150)
    finally:
        app.kill9_all()
        mount.cut()
    summary = {"policy": args.policy, "interval_ms": args.interval_ms, "cuts": len(rounds),
               "rate_per_producer": args.rate}
    for t in ACKS:
        summary[t] = {"lost_total": sum(r[t]["lost"] for r in rounds),
                      "worst_lost_in_a_cut": max((r[t]["lost"] for r in rounds), default=0),
                      "worst_loss_ms": max((r[t]["worst_loss_ms"] for r in rounds), default=0),
                      "gaps": sum(len(r[t]["gaps"]) for r in rounds),
                      "crc_errors": sum(r[t]["crc_errors"] for r in rounds),
                      "never_resumed": sum(not r[t]["resumed"] for r in rounds),
                      "out_of_order": max((r[t]["out_of_order"] for r in rounds), default=0)}
    print("SUMMARY " + json.dumps(summary))


if __name__ == "__main__":
    main()
