"""Share-group consumption against classic consumers, side by side in one run (issue 36's
benchmark): N records of 100 bytes (values unique), then per round

- classic 1p: one classic consumer (its own group, earliest) reads the 1-partition topic;
- share 1x1p: one confluent-kafka ShareConsumer (implicit acknowledgement: each record accepted
  on the next poll) reads it;
- classic 8p: one classic consumer reads the same N records from an 8-partition topic;
- share 8x1p: 8 ShareConsumers, each its own process, read the 1-partition topic together
  (the issue's goal: at least 0.7x classic 8p).

records/s from the first record received to the last (the 8 share consumers: from the first
record any of them got to the last any of them got); for the share runs also the records
delivered more than once (0 expected: no lock expires in a run this short).

    .venv/bin/python loadtests/bench_share.py [N] [ROUNDS] [PRODUCER_BATCH_BYTES] [MAX_RECORD_LOCKS] [CLASSIC_QUEUE_BACKOFF_MS] [SHARE_MAX_POLL_RECORDS]

Starts the appliance through the integration tests' harness (tests/integration/appliance_harness.py)
with ``groups.share_auto_offset_reset = "earliest"``. Not here: the redelivery delay after a
kill -9 (tests/integration/test_share_groups.py measures that it happens, after the lock).
"""
import multiprocessing as mp
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "integration"))


def _share_member(bootstrap, group, topic, total, counter, first, last, out_path, stop,
                  max_poll_records=None):
    from confluent_kafka import ShareConsumer
    conf = {"bootstrap.servers": bootstrap, "group.id": group}
    if max_poll_records:
        conf["max.poll.records"] = max_poll_records      # librdkafka's ShareFetch MaxRecords
    s = ShareConsumer(conf)
    s.subscribe([topic])
    seen = []
    while not stop.is_set():
        msgs = s.poll(0.5) or []
        got = [m.value() for m in msgs if not m.error()]
        if not got:
            continue
        now = time.time()
        with counter.get_lock():
            if first.value == 0:
                first.value = now
            counter.value += len(got)
            if counter.value >= total:
                last.value = now
                stop.set()
        seen += got
    # librdkafka 2.16's implicit mode acknowledges a poll's records at the next poll, and its
    # close acknowledges nothing (its final ShareAcknowledge carries no batches): without this
    # poll the last batch would be released at close and delivered again to the members still
    # polling (at-least-once; what last session's "500 records delivered twice" was). What this
    # poll returns is not recorded: it is released at close.
    s.poll(0.5)
    s.close()
    with open(out_path, "wb") as f:
        f.write(b"\n".join(seen))


def share_run(bootstrap, group, topic, n, members, work, max_poll_records=None):
    ctx = mp.get_context("spawn")
    counter, first, last = ctx.Value("q", 0), ctx.Value("d", 0.0), ctx.Value("d", 0.0)
    stop = ctx.Event()
    paths = [os.path.join(work, f"{group}-{i}") for i in range(members)]
    procs = [ctx.Process(target=_share_member,
                         args=(bootstrap, group, topic, n, counter, first, last, p, stop,
                               max_poll_records))
             for p in paths]
    for p in procs:
        p.start()
    stop.wait(600)
    for p in procs:
        p.join(60)
    values = []
    for path in paths:
        with open(path, "rb") as f:
            values += [v for v in f.read().split(b"\n") if v]
    dupes = len(values) - len(set(values))
    return n / max(last.value - first.value, 1e-9), dupes, len(set(values))


def classic_run(bootstrap, group, topic, n, queue_backoff_ms=None):
    from confluent_kafka import Consumer
    conf = {"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest"}
    if queue_backoff_ms is not None:
        conf["fetch.queue.backoff.ms"] = queue_backoff_ms
    c = Consumer(conf)
    c.subscribe([topic])
    got, t0 = 0, None
    while got < n:
        for m in c.consume(500, 1.0):
            if not m.error():
                t0 = t0 or time.time()
                got += 1
    rate = n / (time.time() - t0)
    c.close()
    return rate


def fill(bootstrap, n, batch_bytes):
    """Topics q1 (1 partition) and q8 (8 partitions), each given the same ``n`` records of 100
    bytes (unique values) by one producer of ``batch.size`` ``batch_bytes``."""
    from client_drivers import driver
    from confluent_kafka import Producer
    driver("confluent").create_topics(bootstrap, {"q1": (1, {}), "q8": (8, {})})
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "batch.size": batch_bytes})
    for i in range(n):
        v = f"r{i:09d}".encode() + b"x" * 90
        for topic, part in (("q1", 0), ("q8", i % 8)):
            while True:
                try:
                    p.produce(topic, value=v, partition=part)
                    break
                except BufferError:          # the producer's queue is full: let it send
                    p.poll(0.1)
    p.flush(120)


def main() -> None:
    from appliance_harness import Appliance
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    # The producer's batch.size (librdkafka's default 1,000,000: ~7,600 records of this size a
    # batch). Share groups acquire whole batches and hold at most 2,000 records in flight per
    # share partition (Kafka's group.share.partition.max.record.locks), so batches larger than
    # that are read by one member at a time.
    batch_bytes = int(sys.argv[3]) if len(sys.argv) > 3 else 1000000
    # [groups] share_partition_max_record_locks (100-10,000; the appliance's default 2,000)
    locks = int(sys.argv[4]) if len(sys.argv) > 4 else 2000
    # The classic consumers' fetch.queue.backoff.ms (librdkafka's default 1,000 when absent):
    # a classic consumer reading 8 partitions fills its queued.min.messages (100,000) with one
    # Fetch and then waits this long before it fetches again ("Fetch backoff for 1000ms: Local:
    # Queue full" in its fetch debug), the client's wait, not the broker's.
    backoff = int(sys.argv[5]) if len(sys.argv) > 5 else None
    # The share consumers' max.poll.records (librdkafka's default 500), which is the MaxRecords
    # of each ShareFetch: the broker's and the clients' costs are mostly per ShareFetch.
    mpr = int(sys.argv[6]) if len(sys.argv) > 6 else None
    work = tempfile.mkdtemp(prefix="bench-share-")
    a = Appliance(data_dir=os.path.join(work, "data"), log_path=os.path.join(work, "appliance.log"),
                  config={"groups": {"share_auto_offset_reset": "earliest",
                                     "share_partition_max_record_locks": locks}},
                  args=[], env={})
    a.start()
    b = a.bootstrap
    try:
        fill(b, n, batch_bytes)
        for rnd in range(rounds):
            c1 = classic_run(b, f"c1-{rnd}", "q1", n, backoff)
            s1, d1, u1 = share_run(b, f"s1-{rnd}", "q1", n, 1, work, mpr)
            c8 = classic_run(b, f"c8-{rnd}", "q8", n, backoff)
            s8, d8, u8 = share_run(b, f"s8-{rnd}", "q1", n, 8, work, mpr)
            print(f"round {rnd}: classic 1p {c1:.0f} rec/s, share 1x1p {s1:.0f} rec/s "
                  f"({s1 / c1:.2f}x, {d1} twice, {u1} distinct); classic 8p {c8:.0f} rec/s, "
                  f"share 8x1p {s8:.0f} rec/s ({s8 / c8:.2f}x, {d8} twice, {u8} distinct); "
                  f"producer batch.size {batch_bytes}, max record locks {locks}, classic "
                  f"fetch.queue.backoff.ms {backoff if backoff is not None else 'default'}, share "
                  f"max.poll.records {mpr or 'default'}; load {os.getloadavg()[0]:.1f}", flush=True)
    finally:
        a.terminate()


if __name__ == "__main__":
    main()
