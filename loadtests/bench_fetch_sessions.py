"""What KIP-227 fetch sessions save a tail-following consumer of many partitions: Kafka's Java
consumer against the appliance with sessions and without (``[server]
max_incremental_fetch_session_cache_slots = 0``), one after the other in one run.

Not a test. For each variant: an appliance, a topic of ``--partitions`` partitions with one
record each, ``--consumers`` Java consumers (kafka-clients 4.3.0, ``tests/java/CatchUpConsumer.java``,
the client's defaults) that read it to the end and then follow its tail; for ``--seconds`` a
producer writes ``--rate`` records/s round the partitions (0: the consumers only poll). Printed:
the appliance's CPU (user + system of all its processes) and the consumers' over that time, in
cores, and every tail record delivered (else the run fails).

    .venv/bin/python loadtests/bench_fetch_sessions.py [--partitions 1024] [--consumers 1]
        [--seconds 20] [--rate 2000]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import psutil  # noqa: E402
from bench_consume import cpu_seconds  # noqa: E402
from brokers import appliance_process, create_topic  # noqa: E402
from confluent_kafka import Producer  # noqa: E402

VARIANTS = {"sessions": "", "sessionless": "[server]\nmax_incremental_fetch_session_cache_slots = 0\n"}


def run(variant: str, args, workdir: str, classpath: str) -> dict:
    with appliance_process(os.path.join(workdir, variant), "os", 1, 60.0, VARIANTS[variant]) as st:
        bootstrap, proc = st[0], st[-1]
        topic = "tail"
        err = create_topic(bootstrap, topic, args.partitions)
        if err:
            raise RuntimeError(f"create topic: {err}")
        p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "log_level": 3})
        for i in range(args.partitions):
            p.produce(topic, b"x" * 100, partition=i)
        p.flush(60)
        n = min(args.consumers, args.partitions)
        consumers = [subprocess.Popen(["java", "-Xmx1g", "-cp", classpath, "CatchUpConsumer", bootstrap,
                                       topic, str(args.partitions), str(i), str(n), "read_uncommitted"],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                     for i in range(n)]
        try:
            for c in consumers:
                assert c.stdout.readline().strip() == "READY"
            for c in consumers:
                c.stdin.write("go\n")
                c.stdin.flush()
            for c in consumers:
                line = c.stdout.readline().split()
                assert line[:1] == ["DONE"], line
            time.sleep(2)                 # let the JVMs settle after the catch-up (not measured)
            jvms = [psutil.Process(c.pid) for c in consumers]
            app0, cl0 = cpu_seconds(proc.pid), sum(sum(j.cpu_times()[:2]) for j in jvms)
            t0 = time.monotonic()
            sent = 0
            while (now := time.monotonic()) < t0 + args.seconds:
                due = int((now - t0) * args.rate)
                while sent < due:
                    p.produce(topic, b"y" * 100, partition=sent % args.partitions)
                    sent += 1
                p.poll(0)
                time.sleep(0.005)
            p.flush(60)
            dt = time.monotonic() - t0
            app1, cl1 = cpu_seconds(proc.pid), sum(sum(j.cpu_times()[:2]) for j in jvms)
            deadline = time.monotonic() + 60
            tails = [0] * n
            for i, c in enumerate(consumers):
                # Wait until this consumer has every tail record of its partitions (or the
                # deadline), then stop it.
                mine = sum(1 for k in range(sent) if (k % args.partitions) % n == i)
                while tails[i] < mine and time.monotonic() < deadline:
                    line = c.stdout.readline().split()
                    if line[:1] == ["TAILED"]:
                        tails[i] = int(line[1])
                c.stdin.close()
                c.wait(60)
            if sum(tails) != sent:
                raise RuntimeError(f"{variant}: {sum(tails):,} tail records read of {sent:,}")
            return {"appliance": (app1 - app0) / dt, "consumers": (cl1 - cl0) / dt, "sent": sent}
        finally:
            for c in consumers:
                if c.poll() is None:
                    c.kill()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--partitions", type=int, default=1024)
    ap.add_argument("--consumers", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--rate", type=int, default=2000, help="tail records/s (0: idle consumers)")
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args()
    from chaos_java import ROOT, compile_client
    workdir = tempfile.mkdtemp(prefix="bench-fetch-sessions-")
    classpath = compile_client(workdir, "4.3.0", os.path.join(ROOT, "tests", "java", "CatchUpConsumer.java"))
    results: dict[str, list[dict]] = {}
    for r in range(args.rounds):
        for variant in VARIANTS:
            got = run(variant, args, os.path.join(workdir, f"r{r}"), classpath)
            results.setdefault(variant, []).append(got)
            print(f"bench: {variant}: appliance {got['appliance']:.3f} cores, consumers "
                  f"{got['consumers']:.3f} cores, {got['sent']:,} tail records", flush=True)
    print(f"\n## Fetch sessions: {args.consumers} Java consumer(s) following {args.partitions:,} "
          f"partitions, {args.rate:,} records/s for {args.seconds:g} s (best of {args.rounds}); "
          f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())} at the end\n")
    print("| variant | appliance cores | consumers' cores |")
    print("|---|---|---|")
    best = {v: min(rs, key=lambda g: g["appliance"]) for v, rs in results.items()}
    for v, g in best.items():
        print(f"| {v} | {g['appliance']:.3f} | {g['consumers']:.3f} |")
    print(f"| sessions / sessionless | {best['sessions']['appliance'] / best['sessionless']['appliance']:.2f} | "
          f"{best['sessions']['consumers'] / max(best['sessionless']['consumers'], 1e-9):.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
