"""A Jepsen-style fault suite for the appliance: the Kafka queue workload under faults, checked.

Not a unit test; a tool (``tests/integration/test_chaos.py`` runs it short, with a fixed seed):

    .venv/bin/python loadtests/chaos.py [--transactions 1000] [--duration 0] [--seed N]
        [--faults all] [--fault-interval 2,6] [--disk loop|tmpfs|none] ...

It starts the appliance itself (``appliance run`` in its own process group, data dir on a small
ext4 loop device by default, so that disk-full episodes are possible), creates the topic, then
runs at once:

* the workload (``chaos_clients.py``): transactional producers (confluent-kafka and the
  appliance's own client) committing or aborting at random, read_committed consumers in a
  group, and consume-transform-produce clients (KIP-447), every send, ack, outcome and poll
  recorded in one history; with ``--share-consumers N`` also the share-queue workload
  (``chaos_share.py``, KIP-932: share consumers killed -9 in turn, every value accepted once);
* the nemesis (``chaos_nemesis.py``): kill -9 and SIGSTOP/SIGCONT of every role, kill -9 of the
  whole process group with a restart on the same data dir, disk-full episodes, power cuts (the
  data dir on lazyfs, ``--disk lazyfs``: every write not yet synced is dropped) and bit flips in
  sealed segments (``chaos_storage.py``); printed as they happen (the fault schedule).

What a power cut may lose is the flush policy's promise: with ``--disk lazyfs`` the appliance runs
``[log.flush] policy`` ``--flush-policy`` (``batch`` by default; ``interval``, ``os``) and the
history gets one ``power-cut`` entry per cut (its time, the policy, each partition's recovered log
end), which the checker applies (``queue_power_cuts.py``: under ``batch`` and ``interval`` nothing
acknowledged may be lost, so every class holds unchanged; under ``os`` what a cut took is moved
aside and what survived must be a gapless prefix). A bit flip's batch is given up: the checker is told its
offsets (a ``damage`` entry of the history), counts none of its values lost, and reports any
read of it after the damage (``corrupt-read``); the final reader, stopped at such a batch (the
partition answers KAFKA_STORAGE_ERROR there), is moved past it (a ``reset`` of the history).

The run ends when ``--transactions`` transactions have ended (commit or abort) and every
enabled fault has come up ``--fault-cycles`` times, or after ``--duration`` seconds. Then the
faults are healed, the clients stopped, a fresh consumer reads every partition to its end, the
appliance is stopped with SIGTERM (it must exit 0), and the checker (``queue_checker.py``)
prints the count of each anomaly class. The exit status is 0 only with zero anomalies, a
complete final read, no exit of the appliance that no fault caused, no worker death other than
the faults' (kill -9, or the supervisor's SIGKILL of a paused worker) and no traceback in the
appliance's log.

The seed decides the fault schedule (kinds, targets, timings) and the clients' choices (values,
partitions, commit or abort); the interleaving with real processes is not reproducible, so a
seed reruns the same plan, not the same history. ``--history FILE`` saves the history (JSON
lines); ``--check-history FILE`` checks a saved one and prints the counts.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, ROOT)

import chaos_share  # noqa: E402
import queue_checker  # noqa: E402
from chaos_nemesis import (FAULT_KINDS, ROLES, Appliance, Nemesis, NemesisOptions, SmallDisk,  # noqa: E402
                           become_subreaper)
from chaos_storage import LazyDisk  # noqa: E402

MiB = 1 << 20
TOPIC = "chaos"
KNOWN_CLIENT_HANG = "send_offsets_to_transaction("


def parse_faults(text: str) -> list[str]:
    """``all``, ``none``, or a comma list of kinds and groups: ``kill`` (every kill-<role>),
    ``pause``, a role name (its kill and pause), or a kind (``kill-writer``, ``kill-all``,
    ``disk-full``)."""
    if text == "none":
        return []
    out: list[str] = []
    for item in text.split(","):
        item = item.strip()
        if item == "all":
            picked = list(FAULT_KINDS)
        elif item in ("kill", "pause"):
            picked = [f"{item}-{r}" for r in ROLES]
        elif item in ROLES:
            picked = [f"kill-{item}", f"pause-{item}"]
        elif item in FAULT_KINDS:
            picked = [item]
        else:
            raise argparse.ArgumentTypeError(f"unknown fault {item!r} (kinds: {', '.join(FAULT_KINDS)})")
        out.extend(k for k in picked if k not in out)
    return out


def parse_range(text: str) -> tuple[float, float]:
    lo, _, hi = text.partition(",")
    lo_f, hi_f = float(lo), float(hi or lo)
    if not 0 <= lo_f <= hi_f:
        raise argparse.ArgumentTypeError(f"bad range {text!r}: want MIN,MAX with 0 <= MIN <= MAX")
    return lo_f, hi_f


def parse_pair(text: str) -> tuple[float, float]:
    a, _, b = text.partition(",")
    try:
        pair = (float(a), float(b))
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad pair {text!r}: want A,B seconds") from None
    if min(pair) <= 0:
        raise argparse.ArgumentTypeError(f"bad pair {text!r}: both must be > 0")
    return pair


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--transactions", type=int, default=1000,
                    help="transactions (committed or aborted) to run; 0: until --duration (default 1000)")
    ap.add_argument("--duration", type=float, default=0,
                    help="stop after this many seconds even if transactions are left; 0: no limit")
    ap.add_argument("--seed", type=int, default=None, help="seed of the plan (default: random, printed)")
    ap.add_argument("--faults", type=parse_faults, default=parse_faults("all"),
                    help="all, none, or a comma list of: kill, pause, a role (frontend, writer, fetcher, "
                         "coordinator, supervisor), a kind (kill-writer, pause-coordinator, kill-all, "
                         "disk-full, power-cut, bit-flip) (default all: those the --disk allows)")
    ap.add_argument("--fault-interval", type=parse_range, default=(2.0, 6.0), metavar="MIN,MAX",
                    help="seconds between faults, uniform (default 2,6)")
    ap.add_argument("--calm", type=parse_pair, default=None, metavar="FAULTY,CALM",
                    help="Jepsen's calm windows: after FAULTY seconds of faults, every fault healed and "
                         "none for CALM seconds (default: none)")
    ap.add_argument("--fault-cycles", type=int, default=0,
                    help="keep running until every enabled fault came up this many times (default 0)")
    ap.add_argument("--pause", type=parse_range, default=(0.3, 7.0), metavar="MIN,MAX",
                    help="SIGSTOP length, seconds (default 0.3,7: past the 5 s heartbeat timeout "
                         "the supervisor kills the paused worker)")
    ap.add_argument("--disk", choices=("loop", "tmpfs", "lazyfs", "none"),
                    default="loop" if os.geteuid() == 0 else "none",
                    help="file system of the data dir: a small ext4 loop device (default as root), a "
                         "small tmpfs, lazyfs (power cuts; no disk-full faults), or the work dir's "
                         "(then no disk-full faults)")
    ap.add_argument("--disk-mb", type=int, default=256, help="size of that file system (default 256)")
    ap.add_argument("--flush-policy", choices=("batch", "interval", "os"), default="batch",
                    help="[log.flush] policy with --disk lazyfs; the checker holds power cuts to its "
                         "promise (queue_power_cuts.py; default batch)")
    ap.add_argument("--flush-interval-ms", type=int, default=200, help="[log.flush] interval_ms (interval)")
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--segment-bytes", type=int, default=256 * 1024,
                    help="the appliance's log.segment_bytes (default 256 KiB: rolls under the faults, "
                         "sealed segments for the bit flips)")
    ap.add_argument("--partitions-per-writer", type=int, default=1,
                    help="the appliance's topics.partitions_per_writer (writer hosts)")
    ap.add_argument("--producers", type=int, default=3, help="confluent-kafka transactional producers")
    ap.add_argument("--own-producers", type=int, default=1,
                    help="transactional producers of the appliance's own client")
    ap.add_argument("--consumers", type=int, default=2, help="read_committed consumers in one group")
    ap.add_argument("--txn-clients", type=int, default=2,
                    help="consume-transform-produce clients (group consumer + transactional producer)")
    ap.add_argument("--group-protocol", choices=("classic", "consumer"), default="classic",
                    help="group.protocol of the group consumers (the read_committed consumers and the "
                         "consume-transform-produce clients): classic (eager, roundrobin) or consumer "
                         "(KIP-848, the broker's assignor; heartbeat 500 ms, session 6 s, as classic's)")
    ap.add_argument("--java", action="store_true",
                    help="add Kafka's Java clients (chaos_java.py): transactional producers on kafka-clients "
                         "3.9.1 and 4.3.0, a subscribed and an assigned read_committed consumer")
    ap.add_argument("--share-consumers", type=int, default=0,
                    help="the share-queue workload beside it (chaos_share.py, KIP-932): this many share "
                         "consumer processes on the topic chaos-share, killed -9 in turn (default 0: none)")
    ap.add_argument("--share-producers", type=int, default=1, help="its idempotent producers")
    ap.add_argument("--share-kill-interval", type=parse_range, default=(3.0, 8.0), metavar="MIN,MAX",
                    help="seconds between kills of a share consumer (default 3,8)")
    ap.add_argument("--abort-probability", type=float, default=0.2)
    ap.add_argument("--max-sends", type=int, default=4, help="most values one transaction sends")
    ap.add_argument("--final-read-timeout", type=float, default=180.0)
    ap.add_argument("--work-dir", default=None, help="parent of the run's temporary dir")
    ap.add_argument("--keep", action="store_true", help="keep the run's dir (appliance.log, history)")
    ap.add_argument("--history", default=None, help="write the history here (JSON lines)")
    ap.add_argument("--check-history", default=None, metavar="FILE",
                    help="only check a saved history and print the counts")
    return ap


def appliance_config(disk: bool, per_writer: int = 1, flush_policy: str | None = None,
                     segment_bytes: int = 256 * 1024) -> dict:
    """The appliance's settings for a chaos run: defaults, except what makes faults show sooner
    (heartbeat, transaction timeouts) and what a small disk needs (small index files, a small
    disk reserve), and small segments, so that rolls happen under the faults (and sealed
    segments exist for the bit flips). Power cuts run the flush policy ``batch``."""
    flush = {"log": {"flush": {"policy": flush_policy}}} if flush_policy else {}
    return {**flush,
        "server": {"frontends": 2, "fetchers": 1,
                   "disk_reserve_bytes": 4 * MiB if disk else 0},
        "log": {"segment_bytes": segment_bytes, "segment_index_bytes": 65536,
                "retention_check_interval_ms": 5000, **flush.get("log", {})},
        "supervisor": {"heartbeat_timeout_ms": 5000, "shutdown_timeout_ms": 20000},
        # A transaction no coordinator knows (an os power cut) is aborted by its writer after
        # twice the max timeout (appliance.log.hanging): 60 s here, checked every 5 s.
        "transactions": {"abort_timed_out_interval_ms": 1000, "max_timeout_ms": 30000},
        # KIP-848 members get the classic members' heartbeat and session timeout (chaos_clients).
        "groups": {"initial_rebalance_delay_ms": 0, "consumer_heartbeat_interval_ms": 500,
                   "consumer_session_timeout_ms": 6000},
        "topics": {"partitions_per_writer": per_writer},
    }


def create_topic(bootstrap: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.create_topics([NewTopic(TOPIC, partitions, 1)]).values():
        f.result(60)


def describe_group_types(bootstrap: str) -> dict[str, str]:
    """The workload groups' types as ListGroups v5 gives them (CLASSIC, CONSUMER): a run with
    ``--group-protocol consumer`` shows its groups converted to the KIP-848 protocol."""
    from confluent_kafka.admin import AdminClient
    admin = AdminClient({"bootstrap.servers": bootstrap})     # kept until the answer (else _DESTROY)
    try:
        listed = admin.list_consumer_groups(request_timeout=30).result(60)
    except Exception as e:      # told, never the run's verdict: the checker's counts are
        return {"(ListGroups failed)": repr(e)}
    return {g.group_id: g.type.name for g in listed.valid if g.group_id.startswith("chaos-")
            and not g.group_id.startswith("chaos-final-")}


def log_findings(log_path: str, hanging_allowed: bool = False) -> dict[str, list[str]]:
    """Worker deaths the faults did not cause, and tracebacks, from the appliance's log.

    Ours: killed by signal 9 (a kill fault, or the supervisor's SIGKILL of a paused worker), or
    the orphans' clean exit after kill -9 of the supervisor. Anything else is a finding. So is a
    hanging transaction a writer aborted (``appliance.log.hanging``), unless the flush policy is
    ``os``, whose power cuts may leave one."""
    deaths, stops, tracebacks, hanging = [], [], [], []
    with open(log_path, errors="replace") as f:
        lines = f.read().splitlines()
    for i, line in enumerate(lines):
        m = re.search(r"(\S+) \(pid gen \d+\) (killed by signal (\d+)|exited with status (-?\d+))", line)
        if m and m.group(3) != "9":
            deaths.append(line.strip())
        elif "stopping the appliance" in line:       # a crash loop or a boot error
            stops.append(line.strip())
        if "hanging (no coordinator knows it" in line and not hanging_allowed:
            hanging.append(line.strip())
        if "Traceback (most recent call last)" in line:
            # The log line before it names the worker; the traceback ends at the next record.
            end = next((j for j in range(i + 1, len(lines)) if re.match(r"\d{4}-\d\d-\d\d ", lines[j])),
                       len(lines))
            tracebacks.append("\n".join(lines[max(0, i - 1):min(end, i + 40)]))
    return {"unexpected worker deaths": deaths, "appliance stops": stops, "tracebacks": tracebacks,
            "hanging transactions aborted": hanging}


def print_history_check(path: str) -> int:
    with open(path) as f:
        history = [json.loads(line) for line in f if line.strip()]
    res = queue_checker.check(history)
    print(f"history {path}: {len(history)} operations")
    print(queue_checker.summary(res))
    return 0 if res.valid else 1


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.check_history:
        return print_history_check(args.check_history)
    from chaos_clients import (Budget, CkConsumer, CkProducer, CkTxnClient, OwnProducer, Recorder, Shared,
                               final_reads, start_txn_group)

    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 31)
    print(f"chaos: seed {seed}", flush=True)
    faults = list(args.faults)
    if args.disk in ("none", "lazyfs") and "disk-full" in faults:
        faults.remove("disk-full")
        print(f"chaos: no small disk (--disk {args.disk}): disk-full faults left out", flush=True)
    if args.disk != "lazyfs" and "power-cut" in faults:
        faults.remove("power-cut")
        print(f"chaos: the data dir is not on lazyfs (--disk {args.disk}): power-cut faults left out", flush=True)
    print(f"chaos: faults {', '.join(faults) or 'none'}; every {args.fault_interval[0]:g}-"
          f"{args.fault_interval[1]:g}s", flush=True)

    become_subreaper()
    # SIGTERM (a timeout, a CI job cancelled) ends the run through the clean-up below: the
    # appliance killed, the small disk unmounted, the runtime dir removed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    workdir = tempfile.mkdtemp(prefix="chaos-", dir=args.work_dir)
    disk = LazyDisk(workdir) if args.disk == "lazyfs" else \
        SmallDisk(workdir, args.disk, args.disk_mb) if args.disk != "none" else None
    app = None
    share = None
    ok = False
    t0 = time.monotonic()
    try:
        if disk is not None:
            disk.mount()
        lazy = isinstance(disk, LazyDisk)
        data_dir = disk.make_data_dir() if lazy else os.path.join(disk.mnt if disk else workdir, "data")
        config = appliance_config(disk is not None and not lazy, args.partitions_per_writer,
                                  args.flush_policy if lazy else None, args.segment_bytes)
        if args.share_consumers:
            config["groups"].update(chaos_share.GROUP_SETTINGS)
        if lazy and args.flush_policy == "interval":
            config["log"]["flush"]["interval_ms"] = args.flush_interval_ms
        app = Appliance(workdir, data_dir, config)
        app.start()
        create_topic(app.bootstrap, args.partitions)
        start_txn_group(app.bootstrap, TOPIC, args.partitions)
        if args.share_consumers:
            share = chaos_share.ShareWorkload(app.bootstrap, args.partitions, args.share_producers,
                                              args.share_consumers, random.Random(seed ^ 0x5ba4e),
                                              time.monotonic(), args.share_kill_interval,
                                              lambda s: print(f"chaos: {s}", flush=True))
            share.create()
        print(f"chaos: appliance at {app.bootstrap}, data dir {data_dir} "
              f"({args.disk}{f' {args.disk_mb} MiB' if disk and not lazy else ''}"
              f"{f', flush policy {args.flush_policy}' if lazy else ''}), work dir {workdir}", flush=True)

        t0 = time.monotonic()
        rng = random.Random(seed)
        recorder = Recorder(t0)
        more_faults = []        # the nemesis, once made: keep the workload going for its cycles
        budget = Budget(args.transactions or None,
                        lambda: bool(more_faults) and more_faults[0].cycles < args.fault_cycles)
        stop = threading.Event()
        shared = Shared(app.bootstrap, TOPIC, args.partitions, recorder, budget, stop,
                        args.abort_probability, args.max_sends, seed, args.group_protocol)
        clients = []
        for kind, n, cls in (("p", args.producers, CkProducer), ("o", args.own_producers, OwnProducer),
                             ("c", args.consumers, CkConsumer), ("t", args.txn_clients, CkTxnClient)):
            clients.extend(cls(shared, f"{kind}{i}", len(clients)) for i in range(n))
        if args.java:
            from chaos_java import java_clients
            clients.extend(java_clients(shared, workdir, len(clients)))
        nemesis = Nemesis(app, disk, NemesisOptions(kinds=faults, interval=args.fault_interval, pause=args.pause,
                                                    topic=TOPIC, partitions=args.partitions,
                                                    ready=lambda: budget.outcomes["ok"] > 0, calm=args.calm),
                          random.Random(rng.randrange(1 << 31)), t0)
        if faults:
            more_faults.append(nemesis)
        for c in clients:
            c.start()
        if share is not None:
            share.t0 = t0
            share.start()
        if faults:
            nemesis.start()
        txn_clients = [c for c in clients if not isinstance(c, CkConsumer) and getattr(c, "mode", "") != "consumer"]
        last_report = time.monotonic()
        while True:
            time.sleep(0.2)
            elapsed = time.monotonic() - t0
            if args.duration and elapsed >= args.duration:
                print(f"chaos: --duration {args.duration:g}s reached", flush=True)
                break
            if args.transactions and not any(c.is_alive() for c in txn_clients):
                break
            if nemesis.error is not None:
                print(f"chaos: the nemesis failed: {nemesis.error!r}; ending the run", flush=True)
                break
            if time.monotonic() - last_report >= 10:
                last_report = time.monotonic()
                print(f"chaos: [{elapsed:7.1f}s] transactions {budget.outcomes} "
                      f"operations {len(recorder.ops)}", flush=True)
        # Heal, stop the workload, read everything, stop the appliance.
        nemesis.stop_event.set()
        if nemesis.is_alive():
            nemesis.join(120)
        nemesis.heal()
        share_res = None
        if share is not None:
            print("chaos: share workload: draining (no more kills)", flush=True)
            share_complete = share.drain()
            share_res = share.check()
            share_res["complete"] = share_complete
        group_types = describe_group_types(app.bootstrap)    # while the members are in
        print(f"chaos: group protocol {args.group_protocol}; groups "
              f"{', '.join(f'{g} {t}' for g, t in sorted(group_types.items())) or 'none listed'}", flush=True)
        stop.set()
        deadline = time.monotonic() + 120        # one wait for all (hung clients add none)
        for c in clients:
            c.join(max(0.0, deadline - time.monotonic()))
        stuck = []
        frames = sys._current_frames()
        for c in clients:
            if not c.is_alive():
                continue
            stack = "".join(traceback.format_stack(frames[c.ident])[-6:]) if c.ident in frames else ""
            print(f"chaos: client {c.name} did not stop; its stack:\n{stack}", flush=True)
            if stack and KNOWN_CLIENT_HANG in stack.strip().splitlines()[-1]:
                # librdkafka's own bug (confluentinc/librdkafka#5456, open: the coordinator
                # request's timeout is never checked, so the call blocks past its timeout when
                # the group coordinator was unavailable once, as during a restart). The operation
                # never completed: nothing of it is in the history, and its transaction, never
                # asked to commit, is aborted by the transaction timeout.
                shared.known_hangs.append(c.name)
            else:
                stuck.append(c.name)
        errors = {c.name: repr(c.error) for c in clients if c.error is not None}
        run_s = time.monotonic() - t0
        print(f"chaos: workload stopped after {run_s:.1f}s; final reads", flush=True)
        complete = final_reads(app.bootstrap, TOPIC, args.partitions, recorder, args.final_read_timeout,
                               lambda s: print(f"chaos: {s}", flush=True), damaged=nemesis.damaged)
        if args.disk == "lazyfs" and args.flush_policy == "os":     # the log as it is (queue_power_cuts)
            complete = final_reads(app.bootstrap, TOPIC, args.partitions, recorder, args.final_read_timeout,
                                   lambda s: print(f"chaos: {s}", flush=True), damaged=nemesis.damaged,
                                   isolation="read_uncommitted") and complete
        stop_code = app.stop()
        findings = log_findings(app.log_path, hanging_allowed=args.disk == "lazyfs" and args.flush_policy == "os")
        recorder.ops.extend(nemesis.history_entries(args.flush_policy))   # damage, power cuts

        res = queue_checker.check(recorder.ops)
        if args.history:
            with open(args.history, "w") as f:
                for op in recorder.ops:
                    f.write(json.dumps(op) + "\n")
        ok = report(args, seed, faults, nemesis, budget, shared, res, run_s, complete, stop_code,
                    findings, stuck, errors, app, share_res)
        return 0 if ok else 1
    finally:
        if not ok and not args.keep:
            # A failed run keeps its appliance log beside the history (or the work dir's
            # parent), so that a rare anomaly can be read after the work dir is gone.
            kept = (args.history or workdir) + ".appliance.log"
            with contextlib.suppress(OSError):
                shutil.copyfile(os.path.join(workdir, "appliance.log"), kept)
                print(f"chaos: appliance log kept at {kept}")
        if share is not None:
            share.kill_consumers()
        if app is not None and app.proc is not None:
            app.kill_all()                  # the group, also orphans of a dead supervisor
            shutil.rmtree(app.run_dir, ignore_errors=True)   # left by kill -9 (not appliance-<pid>)
        if disk is not None:
            disk.unmount()
        if args.keep:
            print(f"chaos: kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


def report(args, seed, faults, nemesis, budget, shared, res, run_s, complete, stop_code, findings,
           stuck, errors, app, share_res=None) -> bool:
    print("\n== fault schedule ==")
    for ev in nemesis.events:
        print("  " + ev.line())
    counts = nemesis.counts()
    print("\n== faults injected ==")
    print("  " + (", ".join(f"{k} {counts.get(k, 0)}" for k in faults) or "none"))
    print("\n== workload ==")
    print(f"  transactions {budget.finished}: committed {budget.outcomes['ok']}, aborted {budget.outcomes['fail']}, "
          f"unknown outcome {budget.outcomes['info']}; {run_s:.1f}s")
    print("  history: " + ", ".join(f"{k} {v}" for k, v in res.stats.items()))
    if shared.known_hangs:
        print(f"  clients hung in librdkafka's send_offsets_to_transaction past its timeout "
              f"(confluentinc/librdkafka#5456; not counted as a problem): {shared.known_hangs}")
    if shared.client_errors:
        top = sorted(shared.client_errors.items(), key=lambda kv: -kv[1])[:12]
        print("  client errors (retried or outcome recorded): " + ", ".join(f"{k} x{v}" for k, v in top))
    print("\n== anomalies ==")
    print(queue_checker.summary(res))
    for kind, cases in res.cases.items():
        for case in cases[:3]:
            print(f"  e.g. {kind}: {json.dumps(case, default=str)[:600]}")
    problems = []
    if share_res is not None:
        print("\n== share-queue workload ==")
        print("  " + ", ".join(f"{k} {v}" for k, v in share_res["stats"].items()))
        print("  anomalies: " + ", ".join(f"{k} {len(v)}" for k, v in share_res["anomalies"].items()))
        for kind, cases in share_res["anomalies"].items():
            for case in cases[:3]:
                print(f"  e.g. {kind}: {json.dumps(case, default=str)[:600]}")
        if any(share_res["anomalies"].values()):
            problems.append("share-queue anomalies found")
        if not share_res["complete"]:
            problems.append("the share consumers did not accept every acknowledged value")
        if not share_res["stats"]["accepted"]:
            problems.append("the share workload accepted nothing")
    if nemesis.error is not None:
        problems.append(f"the nemesis failed (the appliance could not be brought back?): {nemesis.error!r}")
    if not res.valid:
        problems.append("anomalies found")
    if not complete:
        problems.append("the final reads did not reach every partition's end")
    if stop_code != 0:
        problems.append(f"the appliance's SIGTERM stop ended with {stop_code}")
    if nemesis.findings.unexpected_exits:
        problems.append("appliance exits no fault caused: " + "; ".join(nemesis.findings.unexpected_exits))
    for what, lines in findings.items():
        if lines:
            problems.append(f"{what} in the appliance log ({len(lines)}): " + " | ".join(lines[:5]))
    for tb in findings["tracebacks"][:3]:
        print("\n== traceback in the appliance log ==\n" + tb)
    if stuck:
        problems.append(f"clients that did not stop: {stuck}")
    if errors:
        problems.append(f"clients that crashed: {errors}")
    print("\n== result ==")
    print(f"  seed {seed}; command: loadtests/chaos.py {' '.join(sys.argv[1:])}")
    print(f"  appliance starts {app.starts}; log {app.log_path}")
    for p in problems:
        print(f"  PROBLEM: {p}")
    print("  " + ("PASS: zero anomalies" if not problems else "FAIL"), flush=True)
    return not problems


if __name__ == "__main__":
    sys.exit(main())
