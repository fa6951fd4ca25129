"""Ten thousand partitions on one box (issue 32): creation, memory, idle CPU, one record each,
Metadata, a kill -9 of a writer process and of the whole group, restart to ready.

Not a test; run by hand in the user's shell:

    .venv/bin/python loadtests/bench_scale.py [--layout 100x100] [--layout 1x10000]
        [--idle-seconds 10] [--work-dir /tmp]

One appliance per layout (``appliance run`` in its own process group, a temporary data dir, the
default configuration but ``topics.auto_create = false``). For each layout (topics x partitions
each) it measures, in order:

1. CreateTopics of every topic (one request of all of them), timed to the answer (every new
   partition READY in its writer process);
2. the memory: the PSS of every process of the appliance (psutil) plus the bytes of its runtime
   dir (tmpfs: rings, pages, metrics tables), and per partition;
3. idle CPU: the CPU time of every process over ``--idle-seconds`` with no client, as a share of
   one core;
4. Metadata for all topics: the time of one request (a confluent-kafka ``list_topics``);
5. one record produced to every partition (acks=all), then every partition's high watermark
   read back (ListOffsets);
6. kill -9 of one writer process: the time until every partition it carried is READY again in
   its successor (its state pages), and produce accepted there;
7. kill -9 of the whole process group, then a start on the same data dir: the time until
   Metadata answers every partition and a produce to every partition is acknowledged; every
   record read back.

Prints a markdown table per layout.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import psutil
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ports import free_port  # noqa: E402

from appliance.runtime import PARTITION_PAGE_FIELDS, READY, read_processes, run_dir_of  # noqa: E402
from shm.statepage import StatePage  # noqa: E402

APPLIANCE = os.path.join(os.path.dirname(sys.executable), "appliance")


def start(work: str, port: int) -> tuple[subprocess.Popen, float]:
    conf = os.path.join(work, "appliance.toml")
    with open(conf, "w") as f:
        f.write("[topics]\nauto_create = false\n[supervisor]\nshutdown_timeout_ms = 60000\n")
    t0 = time.monotonic()
    proc = subprocess.Popen([APPLIANCE, "run", "--listen", f"127.0.0.1:{port}", "--data-dir",
                             os.path.join(work, "data"), "--config", conf],
                            stdout=open(os.path.join(work, "appliance.log"), "ab"),
                            stderr=subprocess.STDOUT, start_new_session=True)
    return proc, t0


def wait_metadata(boot: str, proc: subprocess.Popen, partitions: int, timeout: float = 600) -> None:
    a = AdminClient({"bootstrap.servers": boot})
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the appliance exited {proc.returncode}")
        try:
            md = a.list_topics(timeout=5)
            if sum(len(t.partitions) for t in md.topics.values()) >= partitions:
                return
        except KafkaException:
            pass
        time.sleep(0.05)
    raise SystemExit("Metadata never showed every partition")


def group_procs(pgid: int) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(p.pid) == pgid:
                out.append(p)
        except (ProcessLookupError, PermissionError):
            continue
    return out


def memory(pgid: int, run_dir: str) -> tuple[int, int]:
    pss = 0
    for p in group_procs(pgid):
        try:
            pss += p.memory_full_info().pss
        except psutil.Error:
            pass
    shm = 0
    for name in os.listdir(run_dir):
        try:
            shm += os.stat(os.path.join(run_dir, name)).st_blocks * 512
        except FileNotFoundError:
            pass
    return pss, shm


def cpu_seconds(procs: list[psutil.Process]) -> float:
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def produce_everywhere(boot: str, names: list[str], per_topic: int, tag: bytes) -> float:
    p = Producer({"bootstrap.servers": boot, "acks": "all", "linger.ms": 20,
                  "queue.buffering.max.messages": 2_000_000})
    t0 = time.monotonic()
    failed = []
    for t in names:
        for q in range(per_topic):
            while True:
                try:
                    p.produce(t, tag, partition=q,
                              on_delivery=lambda err, msg: failed.append(err) if err else None)
                    break
                except BufferError:
                    p.poll(0.01)
    if p.flush(600):
        raise SystemExit("records still unacknowledged after 600 s")
    if failed:
        raise SystemExit(f"{len(failed)} records failed, e.g. {failed[0]}")
    return time.monotonic() - t0


def high_watermarks(boot: str, names: list[str], per_topic: int) -> int:
    c = Consumer({"bootstrap.servers": boot, "group.id": "bench-scale"})
    try:
        return sum(c.get_watermark_offsets(TopicPartition(t, q), timeout=60, cached=False)[1]
                   for t in names for q in range(per_topic))
    finally:
        c.close()


def run_layout(topics: int, per_topic: int, idle_s: float, work_parent: str | None,
               keep: bool = False) -> list[str]:
    work = tempfile.mkdtemp(prefix="bench-scale-", dir=work_parent)
    port = free_port()
    boot = f"127.0.0.1:{port}"
    total = topics * per_topic
    names = [f"t{i}" for i in range(topics)]
    rows = []
    try:
        proc, t0 = start(work, port)
        wait_metadata(boot, proc, 0)
        run_dir = run_dir_of(os.path.join(work, "data"))
        admin = AdminClient({"bootstrap.servers": boot, "socket.timeout.ms": 300000})
        t0 = time.monotonic()
        for f in admin.create_topics([NewTopic(n, per_topic, 1) for n in names],
                                     request_timeout=900).values():
            f.result(900)
        created = time.monotonic() - t0
        writers = [w for w in read_processes(run_dir)["workers"] if w["role"] == "writer"]
        rows.append(f"| CreateTopics of {topics} x {per_topic} | {created:.1f} s | "
                    f"{len(writers)} writer processes |")
        pss, shm = memory(proc.pid, run_dir)
        rows.append(f"| memory: PSS + runtime tmpfs | {(pss + shm) / 2**20:,.0f} MiB | "
                    f"PSS {pss / 2**20:,.0f} MiB, tmpfs {shm / 2**20:,.0f} MiB, "
                    f"{(pss + shm) / total / 2**20:.3f} MiB a partition |")
        procs = group_procs(proc.pid)
        c0, w0 = cpu_seconds(procs), time.monotonic()
        time.sleep(idle_s)                       # the measurement: nothing else happens
        idle = (cpu_seconds(procs) - c0) / (time.monotonic() - w0)
        rows.append(f"| idle CPU over {idle_s:.0f} s | {idle * 100:.1f} % of a core | |")
        t0 = time.monotonic()
        md = admin.list_topics(timeout=60)
        took = time.monotonic() - t0
        rows.append(f"| Metadata, all topics | {took * 1000:.0f} ms | "
                    f"{sum(len(t.partitions) for t in md.topics.values())} partitions |")
        took = produce_everywhere(boot, names, per_topic, b"one")
        hw = high_watermarks(boot, names, per_topic)
        rows.append(f"| one record to every partition, acks=all | {took:.1f} s | "
                    f"high watermarks sum {hw} of {total} |")
        # kill -9 of one writer process: its partitions back.
        victim = max(writers, key=lambda w: len(w["partitions"]))
        carried = victim["partitions"]
        pages = _pages(run_dir, boot, carried)
        gen = pages[0].read().generation
        t0 = time.monotonic()
        os.kill(victim["pid"], signal.SIGKILL)
        while not all(pg.read().generation > gen and pg.read().status == READY for pg in pages):
            time.sleep(0.02)
        back = time.monotonic() - t0
        for pg in pages:
            pg.close()
        rows.append(f"| kill -9 of one writer process ({len(carried)} partitions) to all of them "
                    f"READY again | {back:.1f} s | |")
        # kill -9 of the whole group, then a start.
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(60)
        proc, t0 = start(work, port)
        wait_metadata(boot, proc, total)
        took = produce_everywhere(boot, names, per_topic, b"two")
        ready = time.monotonic() - t0
        hw = high_watermarks(boot, names, per_topic)
        rows.append(f"| kill -9 of the group, start to Metadata of every partition and a produce "
                    f"acknowledged to each | {ready:.1f} s | the produce {took:.1f} s of it; high "
                    f"watermarks sum {hw} of {2 * total} (nothing lost) |")
        # A clean stop: every partition sealed and synced inside shutdown_timeout_ms (30 s),
        # or the supervisor SIGKILLs what is left and says so in the log.
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(300)
        took = time.monotonic() - t0
        with open(os.path.join(work, "appliance.log"), errors="replace") as f:
            late = sum("did not stop in time" in line for line in f)
        rows.append(f"| clean stop (SIGTERM) to exit | {took:.1f} s | exit {code}, {late} workers "
                    f"SIGKILLed for overrunning shutdown_timeout_ms |")
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, UnboundLocalError):
            pass
        if keep:
            print(f"kept {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    return rows


def _pages(run_dir: str, boot: str, carried: list) -> list[StatePage]:
    """The state pages of the partitions (topic, index) a writer process carried."""
    from appliance.catalog.view import PUBLISHED_FILE, read_published
    from appliance.runtime import writer_name
    from shm.topology import Topology
    cat = read_published(os.path.join(run_dir, PUBLISHED_FILE))
    topo = Topology(run_dir)
    return [StatePage.open(topo.page_path(writer_name(cat.topics[t].topic_id, p)),
                           PARTITION_PAGE_FIELDS, readonly=True) for t, p in carried]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layout", action="append", default=None,
                    help="TOPICSxPARTITIONS, repeatable (default: 100x100 and 1x10000)")
    ap.add_argument("--idle-seconds", type=float, default=10.0)
    ap.add_argument("--work-dir", default=None)
    ap.add_argument("--keep", action="store_true", help="keep the data dir and the log")
    args = ap.parse_args(argv)
    for layout in args.layout or ["100x100", "1x10000"]:
        topics, per = (int(x) for x in layout.split("x"))
        rows = run_layout(topics, per, args.idle_seconds, args.work_dir, args.keep)
        print(f"\n## {topics} topic(s) of {per} partitions ({os.cpu_count()} CPUs, "
              f"{psutil.virtual_memory().total / 2**30:.0f} GiB, default configuration)\n")
        print("| what | measured | |")
        print("|---|---|---|")
        for r in rows:
            print(r)
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
