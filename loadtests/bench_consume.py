"""Consume benchmark: read_committed against read_uncommitted over the same transactional data.

Not a test. Starts its own appliance (like bench_produce.py), fills a topic with transactional
batches (a commit every ``--commit-ms``, one transaction in ``--abort-every`` aborted so that the
aborted-transaction index and the client's filter have work), then reads the whole topic by
assignment with one confluent-kafka consumer per isolation level, alternating, ``--rounds`` times,
and prints records/s and MB/s of each and their ratio (read_committed / read_uncommitted).

    .venv/bin/python loadtests/bench_consume.py [--records 1000000] [--record-size 100]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from bench_produce import appliance as start_appliance  # noqa: E402
from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402


def fill(bootstrap: str, topic: str, records: int, size: int, commit_ms: int, abort_every: int) -> tuple[int, int]:
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": "bench-consume",
                  "linger.ms": 5, "batch.size": 1048576, "queue.buffering.max.messages": 2000000})
    p.init_transactions(30)
    value = b"v" * size
    committed = aborted = 0
    n = 0
    txn = 0
    while n < records:
        p.begin_transaction()
        t0 = time.monotonic()
        count = 0
        while n < records and time.monotonic() - t0 < commit_ms / 1000:
            try:
                p.produce(topic, value=value)
            except BufferError:
                p.poll(0.01)
                continue
            n += 1
            count += 1
            if count % 1000 == 0:
                p.poll(0)
        txn += 1
        if abort_every and txn % abort_every == 0:
            # abort_transaction purges what is still queued in the client; flush first so that
            # every aborted record is in the log and the read_uncommitted count is exact.
            p.flush(30)
            p.abort_transaction(30)
            aborted += count
        else:
            p.commit_transaction(30)
            committed += count
    p.flush(30)
    return committed, aborted


def consume_all(bootstrap: str, topic: str, isolation: str, expect: int) -> tuple[float, int, int]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{isolation}-{time.time_ns()}",
                  "enable.auto.commit": False, "isolation.level": isolation,
                  "fetch.max.bytes": 52428800, "max.partition.fetch.bytes": 10485760,
                  "queued.max.messages.kbytes": 262144})
    c.assign([TopicPartition(topic, 0, 0)])
    got = 0
    nbytes = 0
    t0 = time.perf_counter()
    idle = 0
    while got < expect and idle < 20:
        msgs = c.consume(10000, 0.25)
        if not msgs:
            idle += 1
            continue
        idle = 0
        for m in msgs:
            if m.error() is None:
                got += 1
                nbytes += len(m.value() or b"")
    dt = time.perf_counter() - t0
    c.close()
    return dt, got, nbytes


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--record-size", type=int, default=100)
    ap.add_argument("--commit-ms", type=int, default=20)
    ap.add_argument("--abort-every", type=int, default=5, help="abort one transaction in N (0: never)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--work-dir", default=None)
    args = ap.parse_args()
    workdir = tempfile.mkdtemp(prefix="bench-consume-", dir=args.work_dir)
    with start_appliance(workdir, "os", 1, 60.0) as (bootstrap, _log, *_):
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic("bench-consume", 1, 1)])["bench-consume"].result(30)
        committed, aborted = fill(bootstrap, "bench-consume", args.records, args.record_size,
                                  args.commit_ms, args.abort_every)
        rows: dict[str, list[tuple[float, float]]] = {"read_uncommitted": [], "read_committed": []}
        expect = {"read_uncommitted": committed + aborted, "read_committed": committed}
        for _ in range(args.rounds):
            for iso in rows:
                dt, got, nbytes = consume_all(bootstrap, "bench-consume", iso, expect[iso])
                if got != expect[iso]:
                    print(f"{iso}: read {got} records, expected {expect[iso]}", file=sys.stderr)
                    return 1
                rows[iso].append((got / dt, nbytes / dt / 1e6))
    best = {iso: max(r) for iso, r in rows.items()}
    print("\n## Consume throughput: read_committed vs read_uncommitted\n")
    print(f"- {args.records:,} records of {args.record_size} B written in transactions committed every "
          f"{args.commit_ms} ms, one in {args.abort_every} aborted ({committed:,} committed, "
          f"{aborted:,} aborted); one partition; best of {args.rounds} rounds; flush policy os")
    print("- read_uncommitted returns every record; read_committed drops the aborted ones "
          "(the rate counts records delivered to the application)\n")
    print("| isolation | records/s | MB/s |")
    print("|---|---|---|")
    for iso, (rps, mbps) in best.items():
        print(f"| {iso} | {rps:,.0f} | {mbps:.1f} |")
    r = best["read_committed"][0] / best["read_uncommitted"][0]
    print(f"| read_committed / read_uncommitted | {r:.2f} | "
          f"{best['read_committed'][1] / best['read_uncommitted'][1]:.2f} |")
    return 0

if __name__ == "__main__":
    sys.exit(main())
