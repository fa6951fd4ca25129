"""Log compaction: the cleaner's throughput, and produce throughput while it runs, in one run.

Not a test; run by hand in the user's shell:

    .venv/bin/python loadtests/bench_compaction.py [--clean-mb 200] [--keys 20000]
        [--value-sizes 100,1024] [--seconds 10] [--rounds 2] [--work-dir DIR] [--keep]

1. **Cleaning throughput** (MB of log per CPU-second of the cleaner, i.e. per core): for each
   value size, a partition directory is filled with ``--clean-mb`` MB of keyed records (keys drawn
   from ``--keys``, 500 records a batch, 8 MiB segments), then one cleaning round runs in this
   process with the code and settings the cleaner process uses (``appliance.log.cleaner``:
   key map, rewrite of every segment, the writer's swap), timed with the process CPU clock and
   the wall clock.
2. **Produce while cleaning**: the appliance (as ``bench_produce.py`` starts it) with one
   compacted topic (``cleanup.policy=compact``, ``segment.bytes`` 8 MiB,
   ``min.cleanable.dirty.ratio`` 0, so that every rolled segment makes the cleaner work), a
   librdkafka producer writing keyed records as fast as one Python thread can for ``--seconds``;
   once with ``[log.cleaner] enable = true`` and once with ``false``, alternating, ``--rounds``
   times each. Printed: records/s of each, their ratio, and the bytes the cleaner read in the
   window (from its metrics table) to show that it was at work.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from confluent_kafka import Producer  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

from bench_produce import BASE_SETTINGS  # noqa: E402
from brokers import _quiet, appliance  # noqa: E402

SEGMENT = 8 << 20


def fill(directory: str, mb: int, keys: int, value_size: int) -> int:
    """A partition directory of ``mb`` MB of keyed records; returns its bytes."""
    from appliance.log.partition_log import LogSettings, PartitionLog
    from appliance.protocol.records import Record, build_batch
    s = LogSettings(segment_bytes=SEGMENT, retention_ms=-1, cleanup_policy="compact")
    now = int(time.time() * 1000)
    log = PartitionLog.open(directory, s, now)
    rnd = random.Random(1)
    value = os.urandom(value_size)
    while log.size_in_bytes() < mb * 1_000_000:
        recs = [Record(b"key-%08d" % rnd.randrange(keys), value, (), now) for _ in range(500)]
        log.append(bytearray(build_batch(recs, base_timestamp=now)), now)
    log._roll(now)
    size = log.size_in_bytes()
    log.close()
    return size


def clean_once(directory: str) -> tuple[float, float, object]:
    from appliance.log.cleaner.clean import Cleaner
    from appliance.log.cleaner.offset_map import OffsetMap
    from appliance.log.cleaner.plan import cleanable, sealed_segments
    from appliance.log.partition_log import LogSettings, PartitionLog
    from appliance.config import Config
    s = LogSettings(segment_bytes=SEGMENT, retention_ms=-1, cleanup_policy="compact",
                    min_cleanable_ratio=0.0)
    now = int(time.time() * 1000)
    log = PartitionLog.open(directory, s, now)
    segs = sealed_segments(directory, log.active_segment_base)
    c = cleanable(segs, log_start=log.log_start_offset, log_end=log.log_end_offset,
                  last_stable=log.log_end_offset, active_base=log.active_segment_base,
                  checkpoint=None, min_compaction_lag_ms=0, max_compaction_lag_ms=2**63 - 1,
                  now_ms=now)

    def swap(groups, checkpoint) -> bool:
        log.replace_segments([(g.base, [(x.base, x.ino, x.size) for x in g.old]) for g in groups],
                             checkpoint, 0)
        return True
    cleaner = Cleaner(directory, s, OffsetMap(Config().log.cleaner.dedupe_buffer_size))
    cpu, wall = time.process_time(), time.monotonic()
    stats = cleaner.clean(segs, c, hw=log.log_end_offset, producers={}, swap=swap, now_ms=now)
    cpu, wall = time.process_time() - cpu, time.monotonic() - wall
    log.close()
    return cpu, wall, stats


def cleaner_bytes_read(data_dir: str) -> int:
    from appliance.metrics.collector import Collector
    from appliance.runtime import run_dir_of
    c = Collector(run_dir_of(data_dir))
    try:
        for fam in c.families():
            if fam.name == "appliance_log_cleaner_bytes_read":
                return int(sum(s.value for s in fam.samples if s.name.endswith("_total")))
        return 0
    finally:
        c.close()


def produce_keyed(bootstrap: str, topic: str, seconds: float, value_size: int, keys: int) -> float:
    delivered = [0]

    def cb(err, msg):
        if err is None:
            delivered[0] += 1
    p = Producer({**_quiet(bootstrap), **BASE_SETTINGS, "acks": -1, "on_delivery": cb})
    p.produce(topic, key=b"warm", value=b"w")
    p.flush(30)
    delivered[0] = 0
    value = os.urandom(value_size)
    keyset = [b"key-%08d" % i for i in range(keys)]
    t0 = time.monotonic()
    end = t0 + seconds
    i = 0
    while time.monotonic() < end:
        for _ in range(512):
            try:
                p.produce(topic, key=keyset[i % keys], value=value)
            except BufferError:
                p.poll(0.001)
            i += 7
        p.poll(0)
    p.poll(0)
    rate = delivered[0] / (time.monotonic() - t0)
    p.purge(in_queue=True, in_flight=False)
    p.flush(30)
    return rate


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clean-mb", type=int, default=200)
    ap.add_argument("--keys", type=int, default=20000)
    ap.add_argument("--value-sizes", default="100,1024")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--work-dir", default=None)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--skip-produce", action="store_true", help="only the cleaning throughput")
    args = ap.parse_args(argv)
    sizes = [int(x) for x in args.value_sizes.split(",") if x]
    work = tempfile.mkdtemp(prefix="bench-compaction-", dir=args.work_dir)
    ok = True
    try:
        print(f"cleaning {args.clean_mb} MB of records (keys from {args.keys:,}, 500 a batch, "
              f"8 MiB segments) in one round, in this process\n")
        print("| value size | log MB | records kept | CPU s | wall s | MB/s per core | MB/s wall |")
        print("|---|---|---|---|---|---|---|")
        for size in sizes:
            d = os.path.join(work, f"clean-{size}")
            total = fill(d, args.clean_mb, args.keys, size)
            cpu, wall, st = clean_once(d)
            print(f"| {size} B | {total / 1e6:.0f} | {st.messages_written:,} of {st.messages_read:,} "
                  f"| {cpu:.1f} | {wall:.1f} | {total / 1e6 / cpu:.1f} | {total / 1e6 / wall:.1f} |")
            shutil.rmtree(d)
        if args.skip_produce:
            return 0
        print(f"\nproduce while cleaning: {args.seconds:g} s a measurement, keyed records (keys from "
              f"{args.keys:,}), acks=-1, alternating, {args.rounds} rounds\n")
        print("| value size | cleaner | records/s (each round) | median | cleaner MB read in the window |")
        print("|---|---|---|---|---|")
        for size in sizes:
            rates = {True: [], False: []}
            read = {True: [], False: []}
            for r in range(args.rounds):
                for on in (True, False):
                    w = os.path.join(work, f"run-{size}-{r}-{on}")
                    os.makedirs(w)
                    extra = ("[log.cleaner]\n"
                             f"enable = {'true' if on else 'false'}\nbackoff_ms = 100\n")
                    with appliance(w, "os", 1, 60.0, extra) as (bootstrap, *_):
                        admin = AdminClient(_quiet(bootstrap))
                        admin.create_topics([NewTopic("c", 1, 1, config={
                            "cleanup.policy": "compact", "segment.bytes": str(SEGMENT),
                            "min.cleanable.dirty.ratio": "0"})])["c"].result(60)
                        before = cleaner_bytes_read(os.path.join(w, "data"))
                        rates[on].append(produce_keyed(bootstrap, "c", args.seconds, size, args.keys))
                        read[on].append(cleaner_bytes_read(os.path.join(w, "data")) - before)
                    if not args.keep:
                        shutil.rmtree(w)
            for on in (True, False):
                print(f"| {size} B | {'on' if on else 'off'} | "
                      f"{', '.join(f'{x:,.0f}' for x in rates[on])} | {statistics.median(rates[on]):,.0f} | "
                      f"{', '.join(f'{b / 1e6:.0f}' for b in read[on])} |")
            ratio = statistics.median(rates[True]) / statistics.median(rates[False])
            print(f"| {size} B | on / off | | **{ratio:.2f}** | |")
            ok = ok and all(rates[True]) and all(rates[False])
    finally:
        if args.keep:
            print(f"\nkept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
