"""Produce throughput of the appliance against a do-nothing broker, in one run.

Not a test; run by hand (``make bench``) in the user's shell:

    .venv/bin/python loadtests/bench_produce.py [--seconds 10] [--record-sizes 100,1024]
        [--acks -1] [--flush-policy os] [--partitions 1] [--configs plain]
        [--authorizer off,super,acl] [--rounds 1]

It starts both brokers itself:

* the appliance: ``appliance run --listen 127.0.0.1:<free port> --data-dir <tmp> --config <tmp toml>``
  in its own process group (the toml sets ``log.flush.policy`` from ``--flush-policy``); it is
  ready once it answers a Metadata request; at the end the group gets SIGTERM, then SIGKILL;
* the sink: ``loadtests/sink.py``, which acks every batch without storing it. The sink's rate is
  what the same client reaches when the broker costs nothing, so appliance/sink is the fraction of
  the client's ceiling that the appliance delivers.

The brokers run one after the other (sink, then appliance), never together: on a small machine
one's idle processes would take CPU from the other's measurement. On each, for every record size
and every selected producer config (``PRODUCER_CONFIGS``: one entry = one column group of the
table), it creates a fresh topic (AdminClient.create_topics), warms a new producer up (connection,
metadata, producer id, one delivered record), then produces as fast as one Python thread can for
``--seconds``. Only records whose delivery report (acks) arrived inside
the window count; what is still queued at the end is purged. MB = 10**6 bytes of record values.

``--authorizer`` measures the appliance once per authorizer setting (``AUTHORIZER_MODES``: off;
on with the producer a super user; on with the producer allowed by ACLs), each its own appliance
run, one after the other in the same run; ``--rounds`` repeats them (interleaved) and keeps each
cell's best, to see through a noisy machine.

Prints a markdown table: per record size a row per appliance setting, one for the sink, one for
appliance/sink and one per authorizer setting for its ratio to the authorizer off.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Iterator

import confluent_kafka
from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


# ---------------------------------------------------------------------------------------------
# What is measured
# ---------------------------------------------------------------------------------------------

# Settings every measurement shares: enough lingering and batching that the run measures throughput
# (full 1 MiB batches), not request round trips. batch.num.messages is raised so that batch.size,
# not the message count, closes a batch of small records; message.max.bytes (librdkafka's cap on a
# whole request) leaves room for a full batch plus framing. acks comes from --acks.
BASE_SETTINGS: dict[str, Any] = {
    "linger.ms": 5,
    "batch.size": 1048576,
    "batch.num.messages": 1000000,
    "message.max.bytes": 2097152,
    "queue.buffering.max.messages": 2000000,
    "queue.buffering.max.kbytes": 131072,
    "compression.type": "none",
}


@dataclass(frozen=True)
class ProducerConfig:
    """One column group: extra producer settings on top of BASE_SETTINGS."""

    name: str
    settings: dict[str, Any] = field(default_factory=dict)
    # Transactional columns: commit (and begin the next transaction) this often while producing.
    commit_every_s: float | None = None


# One entry = one column group. Run a subset with --configs.
PRODUCER_CONFIGS: dict[str, ProducerConfig] = {
    c.name: c for c in (
        ProducerConfig("plain", {"enable.idempotence": False}),
        ProducerConfig("idempotent", {"enable.idempotence": True}),
        ProducerConfig("transactional", {"transactional.id": "bench-{run}"}, commit_every_s=0.1),
        # Compressed batches: the broker inflates each one to check its records (never recompresses).
        ProducerConfig("zstd", {"enable.idempotence": False, "compression.type": "zstd"}),
        ProducerConfig("lz4", {"enable.idempotence": False, "compression.type": "lz4"}),
    )
}
DEFAULT_CONFIGS = ["plain"]

# The appliance's [authorizer] for each --authorizer mode (one appliance run each). Every client
# here is User:ANONYMOUS (PLAINTEXT). "acl": the benchmark's topics and transactional ids
# ("bench-" prefixed) get an ALLOW All ACL for it, created through CreateAcls once the appliance
# is up (allow_everyone_if_no_acl_found lets it do that; the topics' decisions then come from
# their ACLs, not from that default).
AUTHORIZER_MODES: dict[str, str] = {
    "off": "",
    "super": '[authorizer]\nenable = true\nsuper_users = ["User:ANONYMOUS"]\n',
    "acl": "[authorizer]\nenable = true\nallow_everyone_if_no_acl_found = true\n",
}
AUTHORIZER_LABELS = {"off": "appliance", "super": "appliance, authorizer: super user",
                     "acl": "appliance, authorizer: ACL"}


def grant_bench_acls(bootstrap: str) -> None:
    """The "acl" mode's ACLs: ALLOW All on the bench- topics and transactional ids."""
    from confluent_kafka.admin import (AclBinding, AclOperation, AclPermissionType,
                                       ResourcePatternType, ResourceType)
    admin = AdminClient(_quiet(bootstrap))
    acls = [AclBinding(rt, "bench-", ResourcePatternType.PREFIXED, "User:ANONYMOUS", "*",
                       AclOperation.ALL, AclPermissionType.ALLOW)
            for rt in (ResourceType.TOPIC, ResourceType.TRANSACTIONAL_ID)]
    for fut in admin.create_acls(acls, request_timeout=60).values():
        fut.result(timeout=90)


class MeasureError(Exception):
    """This cell of the table could not be measured (the others still are)."""


@dataclass
class Rate:
    records: int
    seconds: float
    record_size: int
    errors: int = 0
    first_error: str = ""
    cpu_s: float | None = None      # CPU seconds the broker's processes used in the window

    @property
    def cpu_us_per_record(self) -> float | None:
        return self.cpu_s / self.records * 1e6 if self.cpu_s is not None and self.records else None

    @property
    def records_per_s(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else 0.0

    @property
    def mb_per_s(self) -> float:
        return self.records_per_s * self.record_size / 1e6


# ---------------------------------------------------------------------------------------------
# The two brokers
# ---------------------------------------------------------------------------------------------

def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _quiet(bootstrap: str) -> dict[str, Any]:
    # librdkafka logs every refused connection while we poll for readiness; keep the output a table.
    return {"bootstrap.servers": bootstrap, "log_level": 0, "log.connection.close": False}


def wait_metadata(bootstrap: str, proc: subprocess.Popen, timeout: float, what: str,
                  log_path: str | None = None) -> None:
    """Block until the broker at ``bootstrap`` answers a Metadata request, or fail loudly."""
    host, port = bootstrap.rsplit(":", 1)
    deadline = time.monotonic() + timeout
    admin = None
    last = ""
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited with status {proc.returncode} before it was ready"
                             + _log_tail(log_path))
        try:
            with socket.create_connection((host, int(port)), timeout=1):
                pass
        except OSError as e:
            last = str(e)
            time.sleep(0.1)
            continue
        if admin is None:
            admin = AdminClient(_quiet(bootstrap))
        try:
            admin.list_topics(timeout=min(5.0, max(0.1, deadline - time.monotonic())))
            return
        except KafkaException as e:
            last = str(e)
    raise SystemExit(f"{what} did not answer a Metadata request within {timeout:.0f} s ({last})"
                     + _log_tail(log_path))


def _log_tail(path: str | None, lines: int = 40) -> str:
    if not path or not os.path.exists(path):
        return ""
    with open(path, errors="replace") as f:
        tail = f.readlines()[-lines:]
    return f"\n--- last lines of {path} ---\n" + "".join(tail)


def stop_group(proc: subprocess.Popen, grace: float) -> None:
    """SIGTERM the group leader, wait ``grace`` seconds, then SIGKILL the whole process group.

    Only the leader gets SIGTERM: the appliance's supervisor drains its workers itself, in order.
    """
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            print(f"pid {proc.pid} did not stop in {grace:.0f} s: SIGKILL", file=sys.stderr)
    # Kill stragglers of the group even if the leader has exited (orphaned workers).
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(5)


def appliance_command() -> list[str]:
    script = os.path.join(os.path.dirname(sys.executable), "appliance")
    if os.path.exists(script):
        return [script]
    return [sys.executable, "-m", "appliance.cli"]


@contextlib.contextmanager
def appliance(workdir: str, flush_policy: str, partitions: int,
              ready_timeout: float, extra_toml: str = "",
              pids: list[int] | None = None) -> Iterator[tuple[str, str]]:
    """Run the appliance for the block; yields (bootstrap, log path). ``extra_toml``: more
    config sections, appended to the file; ``pids`` gets the supervisor's pid (its process
    group's id)."""
    port = free_port()
    data_dir = os.path.join(workdir, "data")
    conf = os.path.join(workdir, "appliance.toml")
    log_path = os.path.join(workdir, "appliance.log")
    with open(conf, "w") as f:
        f.write("# written by loadtests/bench_produce.py\n"
                "[log.flush]\n"
                f'policy = "{flush_policy}"\n'
                "[topics]\n"
                "auto_create = true\n"
                f"default_partitions = {partitions}\n"
                "[supervisor]\n"
                "shutdown_timeout_ms = 10000\n" + extra_toml)
    cmd = appliance_command() + ["run", "--listen", f"127.0.0.1:{port}", "--data-dir", data_dir,
                                 "--config", conf]
    env = {k: v for k, v in os.environ.items() if not k.startswith("APPLIANCE_")}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                cwd=workdir, env=env, start_new_session=True)
    bootstrap = f"127.0.0.1:{port}"
    try:
        wait_metadata(bootstrap, proc, ready_timeout, "the appliance", log_path)
        if pids is not None:
            pids.append(proc.pid)
        yield bootstrap, log_path
    finally:
        stop_group(proc, grace=15)
        if proc.returncode not in (0, -signal.SIGTERM, None):
            print(f"the appliance exited with status {proc.returncode}" + _log_tail(log_path, 15),
                  file=sys.stderr)


@contextlib.contextmanager
def sink(partitions: int, workdir: str) -> Iterator[str]:
    """Run loadtests/sink.py for the block; yields its bootstrap address."""
    log_path = os.path.join(workdir, "sink.log")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "sink.py"), "--listen", "127.0.0.1:0",
             "--partitions", str(partitions)],
            stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().decode().strip()  # "listening on HOST:PORT"
        if not line.startswith("listening on "):
            proc.wait(5)
            raise SystemExit(f"the sink did not start: {line!r}" + _log_tail(log_path))
        bootstrap = line.removeprefix("listening on ")
        wait_metadata(bootstrap, proc, 30, "the sink", log_path)
        yield bootstrap
    finally:
        stop_group(proc, grace=5)


# ---------------------------------------------------------------------------------------------
# One measurement
# ---------------------------------------------------------------------------------------------

def create_topic(bootstrap: str, name: str, partitions: int) -> str | None:
    """CreateTopics through the AdminClient; returns None, or the error it failed with.

    A failure is not fatal: the appliance's temporary config has auto-creation on with
    ``--partitions`` partitions, so the producer's first Metadata request creates the topic; the
    failure is shown under the table so that it gets fixed rather than forgotten.
    """
    admin = AdminClient(_quiet(bootstrap))
    try:
        for fut in admin.create_topics([NewTopic(name, partitions, 1)],
                                       operation_timeout=30, request_timeout=60).values():
            fut.result(timeout=90)
    except KafkaException as e:
        return str(e.args[0] if e.args else e)
    return None


def producer_settings(bootstrap: str, acks: int, cfg: ProducerConfig, run: str) -> dict[str, Any]:
    out = {"bootstrap.servers": bootstrap, "acks": acks, **BASE_SETTINGS}
    for k, v in cfg.settings.items():
        out[k] = v.format(run=run) if isinstance(v, str) else v
    return out


def group_cpu_seconds(pgid: int) -> float:
    """User + system CPU seconds of every live process in the process group (the appliance's
    supervisor and workers): unlike throughput, it hardly moves when other work shares the CPUs."""
    import psutil
    total = 0.0
    for p in psutil.process_iter():
        try:
            if os.getpgid(p.pid) == pgid:
                t = p.cpu_times()
                total += t.user + t.system
        except (psutil.Error, ProcessLookupError, PermissionError):
            continue
    return total


def measure(bootstrap: str, topic: str, size: int, seconds: float, acks: int,
            cfg: ProducerConfig, pgid: int | None = None) -> Rate:
    """Produce ``size``-byte records to ``topic`` for ``seconds``; count deliveries in the window."""
    delivered = 0
    errors = 0
    first_error = ""

    def on_delivery(err: Any, msg: Any) -> None:
        nonlocal delivered, errors, first_error
        if err is None:
            delivered += 1
        else:
            errors += 1
            if not first_error:
                first_error = str(err)

    fatal: list[str] = []

    def on_error(err: Any) -> None:
        # A fatal error (e.g. the broker lacks InitProducerId) ends this producer: stop measuring.
        if err.fatal():
            fatal.append(err.str())

    settings = producer_settings(bootstrap, acks, cfg, uuid.uuid4().hex[:8])
    p = Producer({**settings, "on_delivery": on_delivery, "error_cb": on_error})
    transactional = cfg.commit_every_s is not None
    if transactional:
        try:
            p.init_transactions(30)
            p.begin_transaction()
        except KafkaException as e:
            raise MeasureError(f"init_transactions failed: {e}") from None
    # Warm-up: connection, metadata, (producer id), one record acknowledged.
    p.produce(topic, b"w" * size)
    try:
        p.flush(30)
    except (KafkaException, SystemError) as e:
        # A fatal error (e.g. no InitProducerId) is raised out of flush(); confluent-kafka then
        # fails our callbacks with SystemError, the KafkaException being its __cause__.
        fatal.append(str(e.__cause__ or e))
    if fatal or delivered != 1:
        raise MeasureError("the warm-up record was not delivered: "
                           f"{fatal[0] if fatal else first_error or 'timeout'}")
    delivered = 0
    value = os.urandom(size)
    produce, poll = p.produce, p.poll
    clock = time.monotonic
    cpu0 = group_cpu_seconds(pgid) if pgid else None
    t0 = clock()
    end = t0 + seconds
    next_commit = t0 + cfg.commit_every_s if transactional else float("inf")
    now = t0
    try:
        while now < end:
            for _ in range(512):
                try:
                    produce(topic, value)
                except BufferError:  # queue full: wait for some deliveries
                    poll(0.001)
            poll(0)
            now = clock()
            if now >= next_commit:
                p.commit_transaction(30)
                p.begin_transaction()
                next_commit = clock() + cfg.commit_every_s  # type: ignore[operator]
            if fatal:
                raise MeasureError(f"fatal producer error: {fatal[0]}")
        poll(0)  # run the callbacks of every ack that has arrived by now
    except (KafkaException, SystemError) as e:
        raise MeasureError(f"producer failed: {e.__cause__ or e}") from None
    elapsed = clock() - t0
    cpu = group_cpu_seconds(pgid) - cpu0 if pgid and cpu0 is not None else None
    rate = Rate(delivered, elapsed, size, errors, first_error, cpu)
    # Drop what is still queued; its delivery reports (purge errors) no longer count.
    if transactional:
        with contextlib.suppress(KafkaException):
            p.abort_transaction(30)
    else:
        p.purge(in_queue=True, in_flight=False)
        p.flush(30)
    return rate


# ---------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------

def markdown_table(sizes: list[int], configs: list[ProducerConfig],
                   results: dict[tuple[str, int, str], Rate],
                   modes: list[str] | None = None) -> str:
    modes = modes or ["off"]
    appliances = [AUTHORIZER_LABELS[m] for m in modes]
    head = ["record size", "broker"]
    for c in configs:
        head += [f"{c.name} MB/s", f"{c.name} records/s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def ratio_row(size: int, label: str, num: str, den: str) -> str:
        row = [f"{size} B", label]
        for c in configs:
            a = results.get((num, size, c.name))
            s = results.get((den, size, c.name))
            ratio = f"{a.records_per_s / s.records_per_s:.2f}" if a and s and s.records_per_s else "-"
            row += [ratio, ratio]
        return "| " + " | ".join(row) + " |"

    for size in sizes:
        for target in (*appliances, "sink"):
            row = [f"{size} B", target]
            for c in configs:
                r = results.get((target, size, c.name))
                row += [f"{r.mb_per_s:.1f}", f"{r.records_per_s:,.0f}"] if r else ["-", "-"]
            lines.append("| " + " | ".join(row) + " |")
        lines.append(ratio_row(size, f"{appliances[0]} / sink", appliances[0], "sink"))
        if "off" in modes:
            for m in modes:
                if m != "off":
                    lines.append(ratio_row(size, f"{AUTHORIZER_LABELS[m]} / authorizer off",
                                           AUTHORIZER_LABELS[m], AUTHORIZER_LABELS["off"]))
    return "\n".join(lines)


def cpu_table(sizes: list[int], configs: list[ProducerConfig],
              cpu: dict[tuple[str, int, str], Rate], modes: list[str]) -> str:
    head = ["record size", "appliance"] + [f"{c.name} CPU us/record" for c in configs]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for size in sizes:
        for m in modes:
            row = [f"{size} B", AUTHORIZER_LABELS[m]]
            for c in configs:
                r = cpu.get((AUTHORIZER_LABELS[m], size, c.name))
                row.append(f"{r.cpu_us_per_record:.3f}" if r else "-")
            lines.append("| " + " | ".join(row) + " |")
        if "off" in modes:
            for m in modes:
                if m == "off":
                    continue
                row = [f"{size} B", f"{AUTHORIZER_LABELS[m]} / authorizer off"]
                for c in configs:
                    a = cpu.get((AUTHORIZER_LABELS[m], size, c.name))
                    b = cpu.get((AUTHORIZER_LABELS["off"], size, c.name))
                    row.append(f"{a.cpu_us_per_record / b.cpu_us_per_record:.2f}" if a and b else "-")
                lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def parse_sizes(text: str) -> list[int]:
    sizes = [int(x) for x in text.replace(" ", "").split(",") if x]
    if not sizes or any(s < 1 for s in sizes):
        raise argparse.ArgumentTypeError("record sizes must be positive integers")
    return sizes


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Produce throughput: the appliance vs a do-nothing sink.")
    ap.add_argument("--seconds", type=float, default=10.0, help="length of each measurement")
    ap.add_argument("--record-sizes", "--records-size", dest="sizes", type=parse_sizes,
                    default=[100, 1024], help="comma-separated record value sizes in bytes")
    ap.add_argument("--acks", type=int, choices=(-1, 0, 1), default=-1, help="producer acks (-1 = all)")
    ap.add_argument("--flush-policy", choices=("batch", "interval", "os"), default="os",
                    help="the appliance's log.flush.policy")
    ap.add_argument("--partitions", type=int, default=1, help="partitions of each benchmark topic")
    ap.add_argument("--configs", default=",".join(DEFAULT_CONFIGS),
                    help=f"producer configs (column groups) to run, of: {', '.join(PRODUCER_CONFIGS)}")
    ap.add_argument("--work-dir", default=None,
                    help="parent of the appliance's temporary data dir (default: the system temp "
                         "dir); put it on the disk you want to measure")
    ap.add_argument("--only", choices=("both", "appliance", "sink"), default="both",
                    help="measure only one broker (the ratio is then missing)")
    ap.add_argument("--authorizer", default="off",
                    help=f"appliance authorizer settings to measure, of: {', '.join(AUTHORIZER_MODES)} "
                         "(one appliance run each; ratios to 'off' printed)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="measure every appliance setting this many times, interleaved; keep the best")
    ap.add_argument("--ready-timeout", type=float, default=60.0,
                    help="seconds to wait for the appliance to answer Metadata")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory (logs, data)")
    args = ap.parse_args(argv)

    try:
        configs = [PRODUCER_CONFIGS[n] for n in args.configs.split(",") if n]
    except KeyError as e:
        ap.error(f"unknown producer config {e}; known: {', '.join(PRODUCER_CONFIGS)}")
    modes = [m for m in args.authorizer.split(",") if m]
    if not modes or any(m not in AUTHORIZER_MODES for m in modes):
        ap.error(f"--authorizer takes modes of: {', '.join(AUTHORIZER_MODES)}")
    workdir = tempfile.mkdtemp(prefix="appliance-bench-", dir=args.work_dir)
    appliance_runs = [m for _ in range(max(args.rounds, 1)) for m in modes]
    targets = (["sink"] if args.only != "appliance" else []) + \
        (appliance_runs if args.only != "sink" else [])
    results: dict[tuple[str, int, str], Rate] = {}
    cpu_results: dict[tuple[str, int, str], Rate] = {}     # the least CPU per record of each cell
    warnings: list[str] = []
    failures: list[str] = []
    run = uuid.uuid4().hex[:6]
    try:
        # One broker at a time (the sink first): on a small machine the idle processes of one
        # would take CPU from the other's measurement.
        for n, target in enumerate(targets):
            if target == "sink":
                broker = sink(args.partitions, workdir)
            else:
                run_dir = os.path.join(workdir, f"appliance-{n}-{target}")
                os.makedirs(run_dir)
                group: list[int] = []
                broker = appliance(run_dir, args.flush_policy, args.partitions, args.ready_timeout,
                                   AUTHORIZER_MODES[target], group)
            with broker as started:
                bootstrap = started if target == "sink" else started[0]
                pgid = None if target == "sink" else group[0]
                if target == "acl":
                    grant_bench_acls(bootstrap)
                label = "sink" if target == "sink" else AUTHORIZER_LABELS[target]
                for size in args.sizes:
                    for cfg in configs:
                        topic = f"bench-{run}-{n}-{cfg.name}-{size}"
                        err = create_topic(bootstrap, topic, args.partitions)
                        if err:
                            warnings.append(f"CreateTopics of {topic} on the {label} failed ({err}); "
                                            "the topic was auto-created by the producer's Metadata request")
                            print(f"WARNING: {warnings[-1]}", file=sys.stderr, flush=True)
                        try:
                            r = measure(bootstrap, topic, size, args.seconds, args.acks, cfg, pgid)
                        except MeasureError as e:
                            failures.append(f"{label}, {cfg.name}, {size} B: {e}")
                            print(f"FAILED: {failures[-1]}", file=sys.stderr, flush=True)
                            continue
                        best = results.get((label, size, cfg.name))
                        if best is None or r.records_per_s > best.records_per_s:
                            results[(label, size, cfg.name)] = r
                        cpu_best = cpu_results.get((label, size, cfg.name))
                        if r.cpu_us_per_record is not None and (
                                cpu_best is None or r.cpu_us_per_record < cpu_best.cpu_us_per_record):
                            cpu_results[(label, size, cfg.name)] = r
                        note = f", {r.errors} delivery errors (first: {r.first_error})" if r.errors else ""
                        print(f"  {label:33} {cfg.name:13} {size:6} B: {r.records_per_s:12,.0f} records/s "
                              f"{r.mb_per_s:8.1f} MB/s{note}", file=sys.stderr, flush=True)
    finally:
        if args.keep:
            print(f"kept {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)

    shown = {"acks": args.acks, **BASE_SETTINGS}
    print("\n## Produce throughput: appliance vs sink\n")
    print(f"- {args.seconds:g} s per measurement, {args.partitions} partition(s), one producer "
          f"(one Python thread), appliance log.flush.policy = {args.flush_policy}")
    print(f"- producer settings: {', '.join(f'{k}={v}' for k, v in shown.items())}")
    for c in configs:
        if c.settings or c.commit_every_s:
            extra = ", ".join(f"{k}={v}" for k, v in c.settings.items())
            if c.commit_every_s:
                extra += f", commit every {c.commit_every_s * 1000:g} ms"
            print(f"- {c.name}: {extra}")
    print(f"- confluent-kafka {confluent_kafka.__version__} "
          f"(librdkafka {confluent_kafka.libversion()[0]}), Python "
          f"{platform.python_version()}, {os.cpu_count()} CPUs, data dir under "
          f"{args.work_dir or tempfile.gettempdir()}")
    print("- MB = 10^6 bytes of record values; only acknowledged records count\n")
    if modes != ["off"]:
        print(f"- appliance settings measured: {', '.join(AUTHORIZER_LABELS[m] for m in modes)}; "
              f"{max(args.rounds, 1)} round(s), the best of each kept\n")
    print(markdown_table(args.sizes, configs, results, modes))
    if len(modes) > 1 or args.rounds > 1:
        print("\nThe appliance's CPU (all its processes, user + system) per acknowledged record, "
              "the least of the rounds:\n")
        print(cpu_table(args.sizes, configs, cpu_results, modes))
    pairs = [(a, b) for a, b in (("idempotent", "plain"), ("transactional", "idempotent"))
             if any(c.name == a for c in configs) and any(c.name == b for c in configs)]
    if pairs:
        # Our yardstick: transactional produce within 10 % of idempotent, same broker.
        print("\n| record size | " + " | ".join(f"appliance {a} / {b}" for a, b in pairs) + " |")
        print("|---|" + "---|" * len(pairs))
        for size in args.sizes:
            cells = []
            for a, b in pairs:
                first = AUTHORIZER_LABELS[modes[0]]
                ra, rb = results.get((first, size, a)), results.get((first, size, b))
                cells.append(f"{ra.records_per_s / rb.records_per_s:.2f}"
                             if ra and rb and rb.records_per_s else "-")
            print(f"| {size} B | " + " | ".join(cells) + " |")
    for w in warnings:
        print(f"\nWARNING: {w}")
    for f in failures:
        print(f"\nFAILED: {f}")
    errors = sum(r.errors for r in results.values())
    for (target, size, name), r in results.items():
        if r.errors:
            print(f"\nERRORS: {target}, {name}, {size} B: {r.errors} deliveries failed "
                  f"(first: {r.first_error})")
    return 1 if errors or failures else 0


if __name__ == "__main__":
    sys.exit(main())
