"""Produce and end-to-end latency at a fixed rate: the appliance, and Tansu beside it.

Not a test; run by hand in the user's shell:

    .venv/bin/python loadtests/bench_latency.py [--partitions 1,64] [--seconds 10]
        [--record-size 100] [--rate-fraction 0.5] [--linger-ms 1] [--peer tansu]
        [--partitions-per-writer 1,16]

For each broker (the do-nothing sink of ``bench_produce.py`` first, the floor; the appliance as
``bench_produce.py`` starts it, once for each ``--partitions-per-writer`` value of its
``topics.partitions_per_writer``; then Tansu with ``--peer tansu``; one after the other, never
together) and each partition count, on a fresh topic:

1. the maximum: ``bench_produce.measure`` (the same librdkafka loop, acks=all, with this run's
   ``linger.ms``) for 3 s;
2. a fixed rate of ``--rate-fraction`` of that maximum (half by default) for ``--seconds``:
   one confluent-kafka producer (acks=all, ``linger.ms`` = ``--linger-ms``) paced in 1 ms
   ticks, each value starting with the wall clock in nanoseconds; one confluent-kafka consumer
   in another process (read_uncommitted, assigned every partition at its end) that subtracts
   that clock from its own when the record reaches it.

Produce latency is librdkafka's own measure of each delivery report (``Message.latency()``:
from ``produce()`` to the acknowledgement); end-to-end latency is from ``produce()`` to the
consumer's ``consume()`` returning the record. The first second of each run is left out
(connections, metadata). Prints p50, p99 and p99.9 in milliseconds, and the rate reached.

The sink acknowledges every batch at once and keeps nothing, so its row has no end-to-end
latency: its produce latency is what this client, this machine and this rate cost with a broker
that does no work, the floor under every other row (``--no-sink`` leaves it out).
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import os
import struct
import sys
import tempfile
import time
import uuid

from confluent_kafka import Consumer, Producer, TopicPartition

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_produce import ProducerConfig, measure  # noqa: E402
from brokers import appliance, create_topic, sink, wait_metadata  # noqa: E402
from peers import TANSU_HINT, tansu, tansu_binary  # noqa: E402

STAMP = struct.Struct(">q")
WARM_UP_S = 1.0


def percentiles(values: list[float]) -> tuple[float, float, float]:
    if not values:
        return (float("nan"),) * 3
    values = sorted(values)

    def at(q: float) -> float:
        return values[min(len(values) - 1, int(q * len(values)))]
    return at(0.50), at(0.99), at(0.999)


def _ms(p: tuple[float, float, float], sep: str = " / ") -> str:
    """p50, p99, p99.9 in ms; n/a for a run without them (the sink has no end to end)."""
    return "n/a" if math.isnan(p[0]) else sep.join(f"{x:.2f}" for x in p)


def consume(bootstrap: str, topic: str, partitions: int, until_ns: int, start_ns: int,
            ready, out) -> None:
    """The consumer process: end-to-end latencies (ms) of records produced after ``start_ns``."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"lat-{uuid.uuid4().hex[:6]}",
                  "enable.auto.commit": False, "fetch.wait.max.ms": 100,
                  "fetch.error.backoff.ms": 10})
    parts = []
    for p in range(partitions):
        _, high = c.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
        parts.append(TopicPartition(topic, p, high))
    c.assign(parts)
    c.consume(1, 0.5)      # connections up before the producer starts
    ready.set()
    lat: list[float] = []
    while time.time_ns() < until_ns:
        # poll() returns with the first record there is; then what else is there, without
        # waiting (consume(n, timeout) would wait for n records or the timeout, adding up to the
        # whole timeout to every latency).
        first = c.poll(0.1)
        if first is None:
            continue
        now = time.time_ns()
        for m in [first, *c.consume(10000, 0)]:
            if m.error() is None:
                sent = STAMP.unpack_from(m.value())[0]
                if sent >= start_ns:
                    lat.append((now - sent) / 1e6)
    c.close()
    out.send(lat)


def fixed_rate(bootstrap: str, topic: str, partitions: int, rate: float, seconds: float,
               size: int, linger_ms: float, consumer: bool = True) -> dict:
    """The fixed-rate run; ``consumer=False`` (the sink, which keeps nothing to read): produce
    latency only."""
    produce_lat: list[float] = []
    errors = 0
    start_ns = time.time_ns() + int(2e9)               # after the consumer is assigned
    measured_from = start_ns + int(WARM_UP_S * 1e9)
    end_ns = start_ns + int((WARM_UP_S + seconds) * 1e9)
    proc = None
    if consumer:
        ready = multiprocessing.get_context("fork").Event()
        recv, send = multiprocessing.get_context("fork").Pipe(duplex=False)
        proc = multiprocessing.get_context("fork").Process(
            target=consume, args=(bootstrap, topic, partitions, end_ns + int(2e9), measured_from,
                                  ready, send))
        proc.start()
        if not ready.wait(60):
            raise SystemExit("the consumer did not start")

    def on_delivery(err, msg) -> None:
        nonlocal errors
        if err is not None:
            errors += 1
        elif STAMP.unpack_from(msg.value())[0] >= measured_from:
            produce_lat.append(msg.latency() * 1000)

    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": linger_ms,
                  "enable.idempotence": False, "on_delivery": on_delivery})
    pad = b"x" * max(0, size - STAMP.size)
    while time.time_ns() < start_ns:
        p.poll(0.01)
    sent = 0
    t0 = time.monotonic()
    while True:
        now_ns = time.time_ns()
        if now_ns >= end_ns:
            break
        due = int((time.monotonic() - t0) * rate)
        while sent < due:
            try:
                p.produce(topic, STAMP.pack(time.time_ns()) + pad)
            except BufferError:         # the broker is behind the rate: the latencies show it
                p.poll(0.001)
                continue
            sent += 1
        p.poll(0)
        time.sleep(0.001)
    achieved = sent / (time.monotonic() - t0)
    p.flush(30)
    lat: list[float] = []
    if proc is not None:
        lat = recv.recv()
        proc.join(30)
    measured = seconds * rate
    return {"rate": rate, "achieved": achieved, "produce": percentiles(produce_lat), "e2e": percentiles(lat),
            "acked": len(produce_lat), "consumed": len(lat) if proc is not None else None,
            "errors": errors, "expected": measured}


def run_broker(name: str, bootstrap: str, counts: list[int], args, consumer: bool = True) -> list[tuple]:
    rows = []
    for n in counts:
        topic = f"lat-{n}-{uuid.uuid4().hex[:6]}"
        create_topic(bootstrap, topic, n)
        # The maximum with the same producer settings as the fixed-rate run (linger.ms).
        same = ProducerConfig("latency", {"enable.idempotence": False, "linger.ms": args.linger_ms})
        peak = measure(bootstrap, topic, args.record_size, 3.0, -1, same)
        peak_rate = peak.records / peak.seconds
        r = fixed_rate(bootstrap, topic, n, peak_rate * args.rate_fraction, args.seconds,
                       args.record_size, args.linger_ms, consumer)
        rows.append((name, n, peak_rate, r))
        print(f"{name}, {n} partitions: max {peak_rate:,.0f}/s, at {r['rate']:,.0f}/s: produce "
              f"p50/p99/p99.9 {_ms(r['produce'], '/')} ms, end to end {_ms(r['e2e'], '/')} ms",
              flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--partitions", default="1,64")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--record-size", type=int, default=100)
    ap.add_argument("--rate-fraction", type=float, default=0.5,
                    help="the fixed rate as a fraction of the measured maximum")
    ap.add_argument("--linger-ms", type=float, default=1.0, help="the producer's linger.ms")
    ap.add_argument("--peer", choices=("none", "tansu"), default="none")
    ap.add_argument("--no-sink", action="store_true",
                    help="leave out the do-nothing sink's row (the floor: produce latency only)")
    ap.add_argument("--partitions-per-writer", default="1",
                    help="the appliance's topics.partitions_per_writer, comma-separated: one "
                         "appliance run each")
    args = ap.parse_args(argv)
    if args.record_size < STAMP.size:
        raise SystemExit(f"--record-size must be at least {STAMP.size}")
    counts = [int(x) for x in args.partitions.split(",")]
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-latency-") as work:
        if not args.no_sink:
            os.makedirs(os.path.join(work, "sink"))
            with sink(max(counts), os.path.join(work, "sink")) as bootstrap:
                rows += run_broker("sink (floor)", bootstrap, counts, args, consumer=False)
        for per in [int(x) for x in args.partitions_per_writer.split(",")]:
            name = "appliance" if per == 1 else f"appliance, {per} per writer"
            with appliance(os.path.join(work, f"appliance-{per}"), "os", 1, 60,
                           per_writer=per) as (bootstrap, *_):
                rows += run_broker(name, bootstrap, counts, args)
        if args.peer == "tansu":
            if tansu_binary() is None:
                print(f"Tansu skipped: {TANSU_HINT}", file=sys.stderr)
            else:
                os.makedirs(os.path.join(work, "tansu"))
                with tansu(os.path.join(work, "tansu"),
                           lambda b, p, log: wait_metadata(b, p, 60, "tansu", log)) as (bootstrap, _):
                    rows += run_broker("tansu", bootstrap, counts, args)
    print(f"\n## Latency at {args.rate_fraction:g} of the measured maximum, {args.record_size} B, "
          f"acks=all, linger.ms={args.linger_ms:g}, {args.seconds:g} s per run, "
          f"{os.cpu_count()} CPUs\n")
    print("| broker | partitions | max records/s | fixed rate (reached) | produce p50 / p99 / p99.9 (ms) "
          "| end to end p50 / p99 / p99.9 (ms) | acked / consumed / errors |")
    print("|---|---|---|---|---|---|---|")
    for name, n, peak_rate, r in rows:
        consumed = "-" if r["consumed"] is None else f"{r['consumed']:,}"
        print(f"| {name} | {n} | {peak_rate:,.0f} | {r['rate']:,.0f} ({r['achieved']:,.0f}) | "
              f"{_ms(r['produce'])} | {_ms(r['e2e'])} | {r['acked']:,} / {consumed} / {r['errors']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
