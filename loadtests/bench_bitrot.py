"""What the bit-rot defences cost (issue 34): the fetch path's CRC check and the background scrub.

Not a test. One appliance; the settings move between rounds by a SIGHUP reload (``[log.scrub]`` is
live), so that "with" and "without" run in the same process and the same run, alternating:

1. fill one partition with ``--records`` records of ``--record-size`` bytes (4 MiB segments);
2. the fetch check: read the whole partition with the appliance's own client counting whole
   batches (``poll_batches``: no object per record, so the broker bounds the rate and the check's
   share is as large as it gets), ``verify_fetches`` false then true, ``--rounds`` times. Every
   round reads more segments than a fetcher keeps open (8), so each read checks anew. Printed:
   MB/s, the fetchers' CPU seconds per GB served, and the ratio on/off;
3. the scrub: produce ``--produce-records`` records with the scrub off, then on at each rate of
   ``--scrub-rates`` (``bytes_per_second``; no pause between passes: it reads the sealed
   segments over and over), ``--rounds`` times. Printed: the produce rate each way and their
   ratio, the scrub's bytes and the cleaner's CPU seconds per GB scrubbed.

Medians of the rounds (a shared two-core machine: single rounds swing by 2x). Exits non-zero if
anything reported damage on the clean log.

    .venv/bin/python loadtests/bench_bitrot.py [--records 1000000] [--record-size 100]
        [--produce-records 300000] [--scrub-rates 8388608,1073741824] [--rounds 5]
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import signal
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import psutil  # noqa: E402
from brokers import appliance_process, create_topic  # noqa: E402
from confluent_kafka import Producer  # noqa: E402

from appliance.runtime import read_processes, run_dir_of  # noqa: E402
from shm.metrics import MetricsTable  # noqa: E402

TOPIC = "bitrot"
BASE_TOML = '[log]\nsegment_bytes = 4194304\n'


def scrub_toml(verify: bool, rate: int) -> str:
    return (f"[log.scrub]\nverify_fetches = {'true' if verify else 'false'}\n"
            f"bytes_per_second = {rate}\npass_interval_ms = 0\n")


class Bench:
    def __init__(self, workdir: str, bootstrap: str, log_path: str, proc) -> None:
        self.conf = os.path.join(workdir, "appliance.toml")
        self.data = os.path.join(workdir, "data")
        self.bootstrap, self.log_path, self.proc = bootstrap, log_path, proc
        with open(self.conf) as f:
            self.base = f.read().split("[log]\n")[0]

    def configure(self, verify: bool, rate: int) -> None:
        """Rewrite the file and SIGHUP; returns once the supervisor logged the reload and a
        moment more for every worker's next loop turn (they read the page each turn)."""
        with open(self.log_path) as f:
            done = f.read().count("reload done")
        with open(self.conf, "w") as f:
            f.write(self.base + BASE_TOML + scrub_toml(verify, rate))
        os.kill(self.proc.pid, signal.SIGHUP)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with open(self.log_path) as f:
                if f.read().count("reload done") > done:
                    time.sleep(0.5)
                    return
            time.sleep(0.05)
        raise SystemExit("the reload was not logged")

    def pids(self, role: str) -> list[int]:
        return [w["pid"] for w in read_processes(run_dir_of(self.data))["workers"]
                if w["role"] == role]

    def cpu(self, role: str) -> float:
        t = 0.0
        for pid in self.pids(role):
            c = psutil.Process(pid).cpu_times()
            t += c.user + c.system
        return t

    def scrubbed(self) -> int:
        n = 0
        for path in glob.glob(os.path.join(run_dir_of(self.data), "metrics.cl*")):
            with MetricsTable.open(path, readonly=True) as t:
                for k, v in t.items():
                    if k.startswith("appliance_log_scrub_bytes"):
                        n += v
        return n


def fill(bootstrap: str, records: int, size: int, topic: str = TOPIC) -> float:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "batch.size": 1048576,
                  "queue.buffering.max.messages": 2000000, "acks": "all", "log_level": 3})
    value = b"v" * size
    t0 = time.monotonic()
    for i in range(records):
        while True:
            try:
                p.produce(topic, value=value, partition=0)
                break
            except BufferError:
                p.poll(0.05)
    assert p.flush(120) == 0
    return records / (time.monotonic() - t0)


def read_all(bootstrap: str) -> tuple[float, int]:
    """(seconds, bytes) of reading the partition from 0 to its end, whole batches."""
    from appliance.client import Consumer as OwnConsumer
    c = OwnConsumer(bootstrap_servers=bootstrap, fetch_max_wait_ms=200, fetch_max_bytes=52428800,
                    max_partition_fetch_bytes=1048576)
    tp = (TOPIC, 0)
    c.assign([tp])
    end = c.end_offsets([tp])[tp]
    c.position(tp)
    nbytes = 0
    t0 = time.monotonic()
    while True:
        polled = c.poll_batches(200)
        for _tp, batches in polled:
            for buf, _h, _first in batches:
                nbytes += len(buf)
        if not polled and c.position(tp) >= end:
            break
    dt = time.monotonic() - t0
    c.close()
    return dt, nbytes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--record-size", type=int, default=100)
    ap.add_argument("--produce-records", type=int, default=300_000)
    ap.add_argument("--scrub-rates", default="8388608,1073741824",
                    help="[log.scrub] bytes_per_second values while the scrub is on")
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-bitrot-") as workdir:
        toml = BASE_TOML + scrub_toml(True, 0)
        with appliance_process(workdir, "os", 1, 120, extra_toml=toml) as (bootstrap, log_path, _b, _c, proc):
            err = create_topic(bootstrap, TOPIC, 1)
            if err:
                print(f"CreateTopics: {err}", file=sys.stderr)
            b = Bench(workdir, bootstrap, log_path, proc)
            rate = fill(bootstrap, a.records, a.record_size)
            print(f"filled {a.records} records of {a.record_size} B at {rate:,.0f} records/s")

            runs: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
            for _ in range(a.rounds):
                for verify in (False, True):
                    b.configure(verify, 0)
                    cpu0 = b.cpu("fetcher")
                    dt, nbytes = read_all(bootstrap)
                    cpu = b.cpu("fetcher") - cpu0
                    mbs, cpu_gb = nbytes / dt / 1e6, cpu / (nbytes / 1e9)
                    print(f"  fetch, verify_fetches={verify!s:5}: {mbs:7.1f} MB/s, fetcher "
                          f"{cpu_gb:6.2f} CPU s/GB served")
                    runs[verify].append((mbs, cpu_gb))
            med = {v: (statistics.median(r[0] for r in runs[v]), statistics.median(r[1] for r in runs[v]))
                   for v in runs}
            (off_mbs, off_cpu), (on_mbs, on_cpu) = med[False], med[True]
            print(f"fetch check (median of {a.rounds}): {on_mbs:.1f} / {off_mbs:.1f} MB/s = "
                  f"{on_mbs / off_mbs:.3f}; fetcher CPU per GB served {on_cpu:.2f} / {off_cpu:.2f} s "
                  f"(+{on_cpu - off_cpu:.2f} s/GB)")

            rates = [int(x) for x in a.scrub_rates.split(",")]
            prod: dict[int, list[float]] = {r: [] for r in [0] + rates}
            scrub_cpu = {r: 0.0 for r in rates}
            scrub_bytes = {r: 0 for r in rates}
            for _ in range(a.rounds):
                for r in [0] + rates:
                    b.configure(True, r)
                    cpu0, bytes0 = b.cpu("cleaner"), b.scrubbed()
                    t0 = time.monotonic()
                    got = fill(bootstrap, a.produce_records, a.record_size)
                    if r:
                        scrub_cpu[r] += b.cpu("cleaner") - cpu0
                        scrub_bytes[r] += b.scrubbed() - bytes0
                    print(f"  produce, scrub {r / 1048576:6.0f} MiB/s: {got:,.0f} records/s "
                          f"({time.monotonic() - t0:.1f} s)")
                    prod[r].append(got)
            off = statistics.median(prod[0])
            for r in rates:
                on = statistics.median(prod[r])
                gb = scrub_bytes[r] / 1e9
                print(f"scrub at {r / 1048576:.0f} MiB/s (median of {a.rounds}): produce "
                      f"{on:,.0f} / {off:,.0f} records/s = {on / off:.3f}; scrubbed {gb:.2f} GB "
                      f"with {scrub_cpu[r]:.2f} CPU s of the cleaner = "
                      f"{scrub_cpu[r] / gb if gb else float('nan'):.2f} CPU s/GB")
            with open(log_path) as f:
                bad = [ln for ln in f if re.search(r"scrub:|fails its CRC", ln)]
            if bad:
                raise SystemExit(f"the scrub or a fetch reported damage on a clean log: {bad[:3]}")


if __name__ == "__main__":
    main()
