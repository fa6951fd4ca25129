"""Where the CPU goes per record: share consumers on one partition against one classic consumer
on eight, side by side in one run (issue 36's throughput goal, measured by process).

N records of 100 bytes (16 KiB producer batches) go to a 1-partition and an 8-partition topic;
then MEMBERS confluent-kafka ShareConsumers (each its own process, implicit acknowledgement)
read the 1-partition topic together, and one classic consumer (its own group, earliest,
``fetch.queue.backoff.ms`` 10) reads the 8-partition one. For each, from its first record to 95 %
of N: records/s, the machine's busy cores (/proc/stat), and per process (every appliance process
and every client) its cores and its CPU microseconds per record (psutil).

    .venv/bin/python loadtests/bench_share_cost.py [N] [MEMBERS] [MAX_RECORD_LOCKS] [SHARE_MAX_POLL_RECORDS]

Starts the appliance through the integration tests' harness, as ``bench_share.py`` does.
"""
import multiprocessing as mp
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "integration"))


def _member(bootstrap, group, topic, counter, stop, max_poll_records):
    from confluent_kafka import ShareConsumer
    conf = {"bootstrap.servers": bootstrap, "group.id": group}
    if max_poll_records:
        conf["max.poll.records"] = max_poll_records
    s = ShareConsumer(conf)
    s.subscribe([topic])
    while not stop.is_set():
        got = sum(1 for m in s.poll(0.5) or [] if not m.error())
        if got:
            with counter.get_lock():
                counter.value += got
    s.close()


def _cpu(procs):
    out = {}
    for name, p in procs.items():
        try:
            t = p.cpu_times()
            out[name] = t.user + t.system
        except Exception:                       # noqa: BLE001 (a process that ended)
            pass
    return out


def _busy():
    import psutil
    t = psutil.cpu_times()
    return t.user + t.system + t.irq + t.softirq


def _report(label, got, dt, c0, c1, b0, b1):
    print(f"{label}: {got / dt:,.0f} rec/s over {dt:.2f} s; machine {(b1 - b0) / dt:.2f} cores busy")
    rows = {}
    for name in c1:
        if name in c0:
            rows[name] = c1[name] - c0[name]
    clients = sum(v for k, v in rows.items() if k.startswith("client"))
    broker = sum(v for k, v in rows.items() if not k.startswith("client"))
    for name in sorted(rows):
        if rows[name] / dt > 0.01:
            print(f"    {name}: {rows[name] / dt:.2f} cores, {rows[name] / got * 1e6:.2f} us/record")
    print(f"    appliance {broker / got * 1e6:.2f} us/record, clients {clients / got * 1e6:.2f} "
          f"us/record")
    return got / dt, broker / got * 1e6, clients / got * 1e6


def _appliance_processes():
    import psutil
    procs = {}
    for p in psutil.process_iter(["cmdline"]):
        line = " ".join(p.info["cmdline"] or [])
        if line.startswith("appliance: "):
            procs[line[len("appliance: "):].split("  ")[0].strip()] = p
    return procs


def main() -> None:
    import psutil
    from appliance_harness import Appliance
    from bench_share import fill
    from confluent_kafka import Consumer
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1500000
    members = int(sys.argv[2]) if len(sys.argv) > 2 else 8
    locks = int(sys.argv[3]) if len(sys.argv) > 3 else 2000
    mpr = int(sys.argv[4]) if len(sys.argv) > 4 else None
    work = tempfile.mkdtemp(prefix="bench-share-cost-")
    a = Appliance(data_dir=os.path.join(work, "data"), log_path=os.path.join(work, "appliance.log"),
                  config={"groups": {"share_auto_offset_reset": "earliest",
                                     "share_partition_max_record_locks": locks}},
                  args=[], env={})
    a.start()
    b = a.bootstrap
    try:
        fill(b, n, 16384)
        broker = _appliance_processes()

        ctx = mp.get_context("spawn")
        counter, stop = ctx.Value("q", 0), ctx.Event()
        ps = [ctx.Process(target=_member, args=(b, "share", "q1", counter, stop, mpr))
              for _ in range(members)]
        for q in ps:
            q.start()
        procs = dict(broker, **{f"client {i}": psutil.Process(q.pid) for i, q in enumerate(ps)})
        while counter.value == 0:
            time.sleep(0.001)           # a measurement window, not an event wait: polled
        c0, b0, t0, g0 = _cpu(procs), _busy(), time.time(), counter.value
        while counter.value < n * 0.95:
            time.sleep(0.001)
        c1, b1, t1, g1 = _cpu(procs), _busy(), time.time(), counter.value
        stop.set()
        for q in ps:
            q.join(60)
        share = _report(f"share {members}x1p (max record locks {locks}, max.poll.records "
                        f"{mpr or 'default'})", g1 - g0, t1 - t0, c0, c1, b0, b1)

        c = Consumer({"bootstrap.servers": b, "group.id": "classic", "auto.offset.reset": "earliest",
                      "fetch.queue.backoff.ms": 10})
        c.subscribe(["q8"])
        procs = dict(broker, client=psutil.Process())
        got = 0
        while got == 0:
            got += sum(1 for m in c.consume(500, 1.0) if not m.error())
        c0, b0, t0, g0 = _cpu(procs), _busy(), time.time(), got
        while got < n * 0.95:
            got += sum(1 for m in c.consume(500, 1.0) if not m.error())
        c1, b1, t1 = _cpu(procs), _busy(), time.time()
        c.close()
        classic = _report("classic 8p (fetch.queue.backoff.ms 10)", got - g0, t1 - t0, c0, c1, b0, b1)
        print(f"share / classic: {share[0] / classic[0]:.2f}x records/s; appliance us/record "
              f"{share[1] / classic[1]:.1f}x, clients us/record {share[2] / classic[2]:.1f}x")
    finally:
        a.terminate()


if __name__ == "__main__":
    main()
