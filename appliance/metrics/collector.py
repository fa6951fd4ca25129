"""The union of what every process publishes, as Prometheus metric families.

Runs in the metrics worker (``workers/metrics_server.py``, for each scrape) and in
``appliance metrics`` (once). Owns nothing but its cache of read-only maps; it reads, never
writes, and never waits for a worker: the supervisor's process table (``processes.json``), every
process's metrics table, the partition writers' state pages, the heartbeat table, the published
catalog, the coordinator's group snapshot, and the ring headers (one ``pread`` each). A worker
that is dead or restarting only makes its series stale or absent; a scrape never blocks on it.
"""

from __future__ import annotations

import logging
import os
import time
from collections import defaultdict
from typing import Iterator

import msgspec
from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily,
                                    HistogramMetricFamily, Metric as Family)
from prometheus_client.registry import CollectorRegistry
from prometheus_client.utils import floatToGoString

from appliance.catalog.view import PUBLISHED_FILE, read_published
from appliance.runtime import (COORDINATOR_PAGE_FIELDS, FRONTEND_PAGE_FIELDS, HEARTBEAT_FILE,
                               PARTITION_PAGE_FIELDS, READY, SUPERVISOR, WORKER_PAGE_FIELDS,
                               WRITER_PROCESS_PAGE_FIELDS, pid_alive, read_processes, role_title,
                               writer_name)
from shm.heartbeat import HeartbeatTable
from shm.metrics import MetricsTable
from shm.ring import ring_fill
from shm.statepage import StalePage, StatePage
from shm.topology import Topology

from appliance.quota.rates import USAGE_PREFIX as QUOTA_USAGE_PREFIX
from appliance.quota.rates import decode_snapshot as decode_quota_snapshot

from .client_telemetry import SNAPSHOT_PREFIX, decode_snapshot
from . import CATALOG, COORDINATOR_SNAPSHOT, COUNTER, HISTOGRAM, parse_key

log = logging.getLogger("appliance.metrics")

QUOTA_FAMILIES = {
    "Produce": ("kafka_server_produce_byte_rate", "Bytes produced per second, per quota entity"),
    "Fetch": ("kafka_server_fetch_byte_rate", "Bytes fetched per second, per quota entity"),
    "Request": ("kafka_server_request_request_time",
                "Frontend time per quota entity, in percent of one frontend"),
}


class NotRunning(Exception):
    """No appliance runs on this runtime directory (the message says what was found)."""


class Collector:
    """A prometheus_client collector over one runtime directory."""

    def __init__(self, run_dir: str) -> None:
        self.run_dir = run_dir
        self.topo = Topology(run_dir)
        self._tables: dict[str, MetricsTable] = {}
        self._pages: dict[str, StatePage] = {}
        self._hb: HeartbeatTable | None = None

    # -- prometheus_client's collector protocol ---------------------------------------------------
    def collect(self) -> Iterator[Family]:
        return iter(self.families())

    def registry(self) -> CollectorRegistry:
        reg = CollectorRegistry(auto_describe=False)
        reg.register(self)
        return reg

    # -- reading ----------------------------------------------------------------------------------
    def processes(self) -> dict:
        try:
            procs = read_processes(self.run_dir)
        except FileNotFoundError:
            raise NotRunning(f"no appliance runtime directory at {self.run_dir}") from None
        if not pid_alive(procs.get("supervisor", 0)):
            raise NotRunning(f"the appliance that made {self.run_dir} (pid "
                             f"{procs.get('supervisor')}) is not running")
        return procs

    def _table(self, name: str) -> MetricsTable | None:
        t = self._tables.get(name)
        if t is None:
            try:
                t = self._tables[name] = MetricsTable.open(
                    self.topo.metrics_path(name), readonly=True)
            except (FileNotFoundError, ValueError):
                return None
        return t

    def _page(self, name: str, fields) -> StatePage | None:
        p = self._pages.get(name)
        if p is None:
            try:
                p = self._pages[name] = StatePage.open(self.topo.page_path(name), fields,
                                                       readonly=True)
            except (FileNotFoundError, ValueError):
                return None
        return p

    def _forget_missing(self, live: set[str]) -> None:
        for cache in (self._tables, self._pages):
            for name in [n for n in cache if n not in live]:
                cache.pop(name).close()

    def close(self) -> None:
        self._forget_missing(set())
        if self._hb is not None:
            self._hb.close()
            self._hb = None

    # -- the families -----------------------------------------------------------------------------
    def families(self) -> list[Family]:
        procs = self.processes()
        workers = procs.get("workers", [])
        live = {SUPERVISOR} | {w["name"] for w in workers}
        acc: dict[str, dict[tuple[str, ...], float]] = defaultdict(lambda: defaultdict(float))
        hist: dict[str, dict[tuple[str, ...], list]] = defaultdict(dict)
        try:
            catalog = read_published(self.topo.file_path(PUBLISHED_FILE))
        except (OSError, ValueError):
            catalog = None
        # Each partition has a metrics table of its own, beside its writer process's; theirs are
        # opened for the scrape and closed after it (ten thousand partitions would hold twenty
        # thousand descriptors in the metrics worker: every mapping holds one).
        carried = self._carried(workers, catalog)
        self._forget_missing(live)
        for name in [SUPERVISOR] + [w["name"] for w in workers]:
            t = self._table(name)
            if t is not None:
                self._add_table(t, acc, hist)
        for name in carried:
            try:
                with MetricsTable.open(self.topo.metrics_path(name), readonly=True) as t:
                    self._add_table(t, acc, hist)
            except (FileNotFoundError, ValueError):
                pass
        partitions = self._partitions(carried, acc)
        self._workers(workers, acc)
        self._rings(workers, acc)
        self._groups(partitions, acc)
        return self._build(acc, hist) + self._client_telemetry(workers) + self._client_quotas(workers)

    def _add_table(self, t: MetricsTable, acc, hist) -> None:
        for k, v in t.items():
            name, labels = parse_key(k)
            base, sep, part = name.partition(":")
            m = CATALOG.get(base)
            if m is None:
                continue
            given = dict(labels)
            values = tuple(given.get(label, "") for label in m.labels)
            if m.kind == HISTOGRAM and sep:
                h = hist[base].get(values)
                if h is None:
                    h = hist[base][values] = [[0] * (len(m.bounds) + 1), 0]
                if part == "sum":
                    h[1] += v
                elif part.startswith("b") and part[1:].isdigit() and int(part[1:]) <= len(m.bounds):
                    h[0][int(part[1:])] += v
            elif m.kind != HISTOGRAM and not sep:
                acc[base][values] += v

    def _carried(self, workers, catalog) -> dict[str, tuple[str, int]]:
        """Every partition the writer processes carry: its writer name -> (topic, partition)."""
        out: dict[str, tuple[str, int]] = {}
        if catalog is None:
            return out
        for w in workers:
            if w["role"] != "writer":
                continue
            for topic, partition in w.get("partitions", ()):
                t = catalog.topics.get(topic)
                if t is not None:               # not deleted meanwhile
                    out[writer_name(t.topic_id, partition)] = (topic, partition)
        return out

    def _partitions(self, carried, acc) -> dict[str, tuple[str, int, object]]:
        """Offsets from each partition's state page; returns writer name -> (topic, partition,
        state)."""
        out: dict[str, tuple[str, int, object]] = {}
        for name, (topic, partition) in carried.items():
            try:
                with StatePage.open(self.topo.page_path(name), PARTITION_PAGE_FIELDS,
                                    readonly=True) as page:
                    st = page.read()
            except (FileNotFoundError, ValueError, StalePage):
                continue
            out[name] = (topic, partition, st)
            if st.generation == 0:
                continue                    # never published
            tp = (topic, str(partition))
            acc["kafka_log_log_logendoffset"][tp] = st.high_watermark
            acc["kafka_log_log_logstartoffset"][tp] = st.log_start_offset
            acc["kafka_log_log_laststableoffset"][tp] = st.last_stable_offset
            acc["kafka_cluster_partition_laststableoffsetlag"][tp] = \
                st.high_watermark - st.last_stable_offset
        return out

    def _workers(self, workers, acc) -> None:
        if self._hb is None:
            try:
                self._hb = HeartbeatTable.open(os.path.join(self.run_dir, HEARTBEAT_FILE),
                                               readonly=True)
            except (FileNotFoundError, ValueError):
                pass
        now = time.monotonic_ns()
        for w in workers:
            role = w["role"]
            title = role_title(role, w.get("index", 0))
            fields = (WRITER_PROCESS_PAGE_FIELDS if role == "writer" else
                      COORDINATOR_PAGE_FIELDS if role == "coordinator" else
                      FRONTEND_PAGE_FIELDS if role == "frontend" else WORKER_PAGE_FIELDS)
            up = 0
            page = self._page(w["name"], fields)
            if w.get("pid") and page is not None:
                try:
                    st = page.read()
                    up = int(st.status == READY and st.generation == w.get("generation")
                             and st.pid == w["pid"])
                except StalePage:
                    pass
            acc["appliance_worker_up"][(role, title)] = up
            slot = w.get("slot")
            if up and self._hb is not None and slot is not None:
                last = self._hb.last(slot)
                if last:
                    acc["appliance_worker_heartbeat_age_seconds"][(role, title)] = \
                        max(0.0, (now - last) / 1e9)

    def _rings(self, workers, acc) -> None:
        try:
            names = os.listdir(self.run_dir)
        except FileNotFoundError:
            return
        produce = acc["appliance_produce_ring_fill_ratio"]
        titles = {w["name"]: role_title("writer", w.get("index", 0))
                  for w in workers if w["role"] == "writer"}
        other = acc["appliance_ring_fill_ratio"]
        for name in names:
            if not name.startswith("ring."):
                continue
            src, _, dst = name[5:].partition("-")
            to_writer, from_writer = dst.startswith("wp"), src.startswith("wp")
            if from_writer or (to_writer and not src.startswith("fe")):
                continue          # acks and markers: small
            try:
                used, capacity = ring_fill(os.path.join(self.run_dir, name))
            except (OSError, ValueError):
                continue
            ratio = used / capacity if capacity else 0.0
            if to_writer:
                w = titles.get(dst)
                if w is not None:
                    produce[(w,)] = max(produce.get((w,), 0.0), ratio)
            else:
                other[(src, dst)] = ratio

    def _groups(self, partitions, acc) -> None:
        try:
            with open(self.topo.file_path(COORDINATOR_SNAPSHOT), "rb") as f:
                snap = msgspec.msgpack.decode(f.read())
        except (OSError, msgspec.DecodeError):
            return
        hw = {(p[0], p[1]): p[2].high_watermark for p in partitions.values()
              if p[2].generation}
        for group, _state, members in snap.get("groups", ()):
            acc["kafka_consumergroup_members"][(group,)] = members
        for group, topic, partition, offset in snap.get("offsets", ()):
            labels = (group, topic, str(partition))
            acc["kafka_consumergroup_current_offset"][labels] = offset
            end = hw.get((topic, partition))
            if end is not None:
                acc["kafka_consumergroup_lag"][labels] = max(0, end - offset)
        for group, topic, partition, inflight, lag in snap.get("share", ()):
            labels = (group, topic, str(partition))
            acc["kafka_server_sharepartitionmetrics_inflightmessagecount"][labels] = inflight
            if lag >= 0:
                acc["appliance_share_partition_lag"][labels] = lag

    def _client_telemetry(self, workers) -> list[Family]:
        """KIP-714: the series clients pushed, from each live frontend's snapshot
        (``appliance.metrics.client_telemetry``); a client seen by two frontends keeps the
        series of its latest push."""
        best: dict[tuple, tuple[int, str, float]] = {}
        for w in workers:
            try:
                with open(self.topo.file_path(SNAPSHOT_PREFIX + w["name"] + ".msgpack"),
                          "rb") as f:
                    snap = decode_snapshot(f.read())
            except (OSError, msgspec.DecodeError):
                continue
            for name, kind, labels, value, pushed in snap.get("series", ()):
                if kind == "counter" and name.endswith("_total"):
                    name = name[:-6]        # the exposition adds it back
                key = (name, tuple(map(tuple, labels)))
                if key not in best or best[key][0] < pushed:
                    best[key] = (pushed, kind, value)
        fams: dict[str, Family] = {}
        for (name, labels), (_, kind, value) in sorted(best.items()):
            fam = fams.get(name)
            if fam is None:
                fam = fams[name] = Family(name, "client metric pushed by KIP-714 telemetry",
                                          "counter" if kind == "counter" else "gauge")
            fam.add_sample(name + ("_total" if kind == "counter" else ""), dict(labels), value)
        return list(fams.values())

    def _client_quotas(self, workers) -> list[Family]:
        """Client quotas (KIP-13, KIP-124): per quota entity (Kafka's user and client-id tags),
        the rate each frontend measured, summed (Kafka's byte-rate and request-time), and the
        mean throttle time given over the window (throttle-time), from each live frontend's
        published usage (``workers/frontend/client_quotas.py``)."""
        rates: dict[tuple, float] = defaultdict(float)
        throttle: dict[tuple, list[float]] = defaultdict(lambda: [0.0, 0])
        for w in workers:
            if w.get("role") != "frontend":
                continue
            try:
                with open(self.topo.file_path(QUOTA_USAGE_PREFIX + w["name"] + ".msgpack"),
                          "rb") as f:
                    snap = decode_quota_snapshot(f.read())
            except (OSError, msgspec.DecodeError):
                continue
            for qtype, user, client_id, _samples, rate, t_sum, t_count, _bound in snap.get(
                    "sensors", ()):
                if qtype not in QUOTA_FAMILIES:
                    continue
                rates[(qtype, user, client_id)] += rate
                t = throttle[(qtype, user, client_id)]
                t[0] += t_sum
                t[1] += t_count
        out = []
        for qtype, (rate_name, rate_help) in QUOTA_FAMILIES.items():
            fam = GaugeMetricFamily(rate_name, rate_help, labels=["user", "client_id"])
            tfam = GaugeMetricFamily(f"kafka_server_{qtype.lower()}_throttle_time",
                                     "Mean throttle time given (ms) over the quota window",
                                     labels=["user", "client_id"])
            for (q, user, client_id), v in sorted(rates.items()):
                if q == qtype:
                    fam.add_metric([user, client_id], v)
                    t_sum, t_count = throttle[(q, user, client_id)]
                    tfam.add_metric([user, client_id], t_sum / t_count if t_count else 0.0)
            out += [fam, tfam]
        return out

    def _build(self, acc, hist) -> list[Family]:
        out: list[Family] = []
        for name, m in CATALOG.items():
            if m.kind == HISTOGRAM:
                fam = HistogramMetricFamily(name, m.help, labels=m.labels)
                for labels, (buckets, total_us) in sorted(hist.get(name, {}).items()):
                    cumulative, running = [], 0
                    for bound, n in zip((*m.bounds, float("inf")), buckets):
                        running += n
                        cumulative.append((floatToGoString(bound), running))
                    fam.add_metric(list(labels), cumulative, total_us * m.scale)
            else:
                cls = CounterMetricFamily if m.kind == COUNTER else GaugeMetricFamily
                fam = cls(name, m.help, labels=m.labels)
                for labels, v in sorted(acc.get(name, {}).items()):
                    fam.add_metric(list(labels), v * m.scale)
            out.append(fam)
        return out


def render(run_dir: str) -> bytes:
    """The text exposition of ``run_dir`` (``appliance metrics``)."""
    from prometheus_client import generate_latest
    c = Collector(run_dir)
    try:
        c.processes()                # NotRunning before anything else
        return generate_latest(c.registry())
    finally:
        c.close()
