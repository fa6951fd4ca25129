"""What partitions cost: memory, creation, produce rate and recovery at many partitions.

Not a test; run by hand in the user's shell:

    .venv/bin/python loadtests/bench_partitions.py [--partitions 1,64,256,1024]
        [--produce-ring-bytes 4194304] [--seconds 5] [--record-size 100] [--records 100]
        [--partitions-per-writer 1]

One appliance (``appliance run`` in its own process group, a temporary data dir) serves the whole
run. For every count in ``--partitions`` it creates a topic of that many partitions
(CreateTopics, timed: the answer comes once every new writer is READY; the topic is deleted after
its measurement, except the largest, so the default topics.max_partitions holds), then measures the
produce rate of the same librdkafka producer loop as ``bench_produce.py`` (acks=all, plain,
keyless records spread over the partitions by librdkafka's sticky partitioner) and prints it as a
ratio to the one-partition rate, so the largest count whose aggregate rate stays within 10 % of
one partition's is read off the table. It then writes ``--records`` records to every partition of
the largest topic and reports the writers' memory (PSS, psutil) and the runtime dir's (the rings:
every partition's are memory from its creation), kills the whole process group with SIGKILL,
starts the appliance again on the same data dir and reports the time from the start to the first
Metadata answer (the supervisor opens the listeners to clients only once every writer has
recovered), and checks that every partition's high watermark came back.

Every partition takes ``shm.produce_ring_bytes`` per frontend in rings: the appliance refuses a
CreateTopics that the machine's memory cannot hold (8 MiB rings: about 800 partitions on 23 GiB),
so the default here is the smallest ring that 1 MiB messages allow.

``--partitions-per-writer K`` sets the appliance's ``topics.partitions_per_writer``: K partitions
per writer process (explicit writer hosts; without it the process budget decides,
``workers/writer_process.py``); the memory line then counts each process
once and says what that comes to per partition.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import tempfile
import time

import psutil
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from appliance.runtime import read_processes, run_dir_of

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_produce import PRODUCER_CONFIGS, MeasureError, measure  # noqa: E402
from brokers import appliance_process, delete_topic  # noqa: E402


def _mib(n: float) -> str:
    return f"{n / 2**20:,.0f} MiB"


def create(bootstrap: str, name: str, partitions: int) -> float:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    start = time.monotonic()
    (fut,) = admin.create_topics([NewTopic(name, partitions, 1)], request_timeout=900).values()
    fut.result(timeout=900)
    return time.monotonic() - start


def fill(bootstrap: str, topic: str, partitions: int, records: int, size: int) -> float:
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 20})
    start = time.monotonic()
    for i in range(partitions * records):
        while True:
            try:
                p.produce(topic, b"x" * size, partition=i % partitions)
                break
            except BufferError:
                p.poll(0.01)
    if p.flush(600):
        raise SystemExit("records still unacknowledged after 600 s")
    return time.monotonic() - start


def high_watermarks(bootstrap: str, topic: str, partitions: int) -> int:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-partitions"})
    try:
        return sum(c.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1]
                   for p in range(partitions))
    finally:
        c.close()


def writers_memory(run_dir: str) -> tuple[int, int]:
    """(the writer processes' PSS summed, bytes in the runtime dir). A writer process serves several
    partitions and is counted once."""
    rows = read_processes(run_dir)["workers"]
    pss = 0
    for pid in {w["pid"] for w in rows if w["role"] == "writer" and w["pid"]}:
        pss += psutil.Process(pid).memory_full_info().pss
    used = sum(os.path.getsize(os.path.join(run_dir, n)) for n in os.listdir(run_dir))
    return pss, used


def wait_group_gone(pgid: int, timeout: float = 300) -> None:
    """Until no process of the group is left: every worker holds the data dir's lock until it is
    gone, and a thousand processes take the kernel a while to tear down."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = 0
        for p in psutil.process_iter(["pid"]):
            try:
                left += os.getpgid(p.info["pid"]) == pgid
            except (ProcessLookupError, PermissionError):
                continue
        if not left:
            return
        time.sleep(0.2)
    raise SystemExit(f"processes of group {pgid} still alive after {timeout:.0f} s")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--partitions", default="1,64,256,1024",
                    help="comma-separated partition counts, one topic each")
    ap.add_argument("--produce-ring-bytes", type=int, default=4 << 20,
                    help="the appliance's shm.produce_ring_bytes")
    ap.add_argument("--seconds", type=float, default=5.0, help="length of each rate measurement")
    ap.add_argument("--record-size", type=int, default=100)
    ap.add_argument("--records", type=int, default=100,
                    help="records written to every partition of the largest topic before the kill")
    ap.add_argument("--partitions-per-writer", type=int, default=1,
                    help="the appliance's topics.partitions_per_writer")
    ap.add_argument("--work-dir", default=None, help="parent of the temporary data dir")
    args = ap.parse_args(argv)
    counts = sorted({int(x) for x in args.partitions.split(",")})
    work = tempfile.mkdtemp(prefix="bench-partitions-", dir=args.work_dir)
    extra = f"[shm]\nproduce_ring_bytes = {args.produce_ring_bytes}\n"
    per = args.partitions_per_writer
    plain = PRODUCER_CONFIGS["plain"]
    rows = []
    try:
        with appliance_process(work, "os", 1, 900, extra, per_writer=per) as (bootstrap, log_path, _, _, proc):
            base = None
            for n in counts:
                topic = f"p{n}"
                took = create(bootstrap, topic, n)
                try:
                    rate = measure(bootstrap, topic, args.record_size, args.seconds, -1, plain)
                    per_s = rate.records / rate.seconds
                except MeasureError as e:
                    per_s = float("nan")
                    print(f"{n} partitions: {e}", file=sys.stderr)
                base = base or per_s
                rows.append((n, took, per_s, per_s / base))
                print(f"{n} partitions: created in {took:.1f} s, {per_s:,.0f} records/s", flush=True)
                if n != counts[-1]:
                    delete_topic(bootstrap, topic, timeout=300)  # only the largest stays (topics.max_partitions)
            largest = f"p{counts[-1]}"
            filled = fill(bootstrap, largest, counts[-1], args.records, args.record_size)
            expected = high_watermarks(bootstrap, largest, counts[-1])
            pss, shm = writers_memory(run_dir_of(os.path.join(work, "data")))
            total = counts[-1]
            meminfo = psutil.virtual_memory()
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(60)
            wait_group_gone(proc.pid)
        start = time.monotonic()
        with appliance_process(work, "os", 1, 900, extra, per_writer=per) as (bootstrap, log_path, _, _, proc):
            ready = time.monotonic() - start
            back = high_watermarks(bootstrap, largest, counts[-1])
    finally:
        shutil.rmtree(work, ignore_errors=True)

    print(f"\n## Partitions: {', '.join(map(str, counts))} "
          f"(shm.produce_ring_bytes = {args.produce_ring_bytes}, topics.partitions_per_writer = "
          f"{args.partitions_per_writer}, {os.cpu_count()} CPUs, "
          f"{_mib(meminfo.total)} of memory)\n")
    print("| partitions | CreateTopics (s) | records/s of " f"{args.record_size} B, acks=all "
          "| ratio to 1 partition | within 10 % |")
    print("|---|---|---|---|---|")
    for n, took, per_s, ratio in rows:
        print(f"| {n} | {took:.1f} | {per_s:,.0f} | {ratio:.2f} | {'yes' if ratio >= 0.9 else 'no'} |")
    print(f"\n- {total} partitions: writers' PSS {_mib(pss)} ({pss / total / 2**20:.2f} MiB "
          f"a partition), runtime dir (rings) {_mib(shm)} ({shm / total / 2**20:.1f} MiB each); "
          f"{_mib(meminfo.available)} of memory still available")
    print(f"- {args.records} records of {args.record_size} B to each of the {counts[-1]} partitions "
          f"of the largest topic in {filled:.1f} s")
    print(f"- kill -9 of the whole process group (then waiting until all its processes are gone), "
          f"then start to the first Metadata answer: "
          f"{ready:.1f} s; high watermarks {back} after, {expected} before"
          f"{'' if back == expected else '  ** LOST RECORDS **'}")
    return 0 if back == expected else 1


if __name__ == "__main__":
    sys.exit(main())
