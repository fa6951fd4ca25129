"""The appliance's metrics: their names, and the helpers their owners update them with.

Owns nothing at run time. Every process publishes its own values the way the rest of the design
publishes state: counters, gauges and histogram buckets in its metrics table
(``shm.metrics.MetricsTable``, ``metrics.<endpoint>`` in the runtime directory, one writer each);
the partition writers' offsets in their state pages; the coordinator's per-group offsets in a
snapshot file it replaces once a second (``COORDINATOR_SNAPSHOT``). One process reads the union
and serves Prometheus' text format (``appliance.metrics.collector``, served by the metrics worker,
``workers/metrics_server.py``, and printed by ``appliance metrics``).

Names follow the usual JMX-to-Prometheus mapping of Kafka's MBean names (the domain and the
``type``, ``name`` keys lower-cased and joined with ``_``; ``...PerSec`` meters become
``_total`` counters; other MBean keys become labels), so dashboards built for a Kafka broker find
the same series here; the consumer-group lag has kafka-exporter's names, and what only the
appliance has starts with ``appliance_``.

A series in a table is keyed ``name|label=value|...``; a histogram has one series per bucket
(``name:b<i>``, not cumulative) and one for the sum (``name:sum``), all integers (durations in
microseconds). The collector sums the series of every table that have the same key: the
writers' per-partition counters become per-topic ones, the frontends' counters the broker's.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass
from typing import Iterable

COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"

# The coordinator's per-group snapshot, in the runtime directory (tables are ``metrics.<endpoint>``,
# shm.topology.Topology.metrics_path).
COORDINATOR_SNAPSHOT = "coordinator-metrics.msgpack"


@dataclass(frozen=True)
class Metric:
    name: str                  # the Prometheus family name (counters without ``_total``)
    kind: str                  # COUNTER | GAUGE | HISTOGRAM
    help: str
    labels: tuple[str, ...] = ()
    scale: float = 1.0         # exported value = stored integer * scale
    bounds: tuple[float, ...] = ()    # histogram bucket upper bounds, in exported units


# Request latency buckets (ms), and log flush latency buckets (ms).
TOTAL_TIME_MS_BOUNDS = (1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000)
FLUSH_MS_BOUNDS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000, 5000)

_TP = ("topic", "partition")

CATALOG: dict[str, Metric] = {m.name: m for m in [
    # -- broker topic metrics (kafka.server:type=BrokerTopicMetrics,name=...,topic=T) ------------
    Metric("kafka_server_brokertopicmetrics_messagesin", COUNTER,
           "Records appended to the topic's partitions (MessagesInPerSec)", ("topic",)),
    Metric("kafka_server_brokertopicmetrics_bytesin", COUNTER,
           "Bytes of record batches appended (BytesInPerSec)", ("topic",)),
    Metric("kafka_server_brokertopicmetrics_bytesout", COUNTER,
           "Bytes of record batches returned by Fetch (BytesOutPerSec)", ("topic",)),
    Metric("kafka_server_brokertopicmetrics_failedproducerequests", COUNTER,
           "Partitions of Produce requests that failed unexpectedly, Kafka's expected errors left out "
           "(FailedProduceRequestsPerSec)",
           ("topic",)),
    Metric("kafka_server_brokertopicmetrics_failedfetchrequests", COUNTER,
           "Partitions of Fetch requests that failed unexpectedly, Kafka's expected errors left out "
           "(FailedFetchRequestsPerSec)",
           ("topic",)),
    # -- request metrics (kafka.network:type=RequestMetrics,name=...,request=R) ------------------
    Metric("kafka_network_requestmetrics_requests", COUNTER,
           "Requests answered, by API (RequestsPerSec)", ("request",)),
    Metric("kafka_network_requestmetrics_errors", COUNTER,
           "Error codes in answers, by API and error, NONE included (ErrorsPerSec)",
           ("request", "error")),
    Metric("kafka_network_requestmetrics_totaltimems", HISTOGRAM,
           "Time from a request's arrival to its answer, in ms (TotalTimeMs)", ("request",),
           scale=1e-3, bounds=TOTAL_TIME_MS_BOUNDS),
    Metric("kafka_server_socket_server_metrics_connection_count", GAUGE,
           "Open client connections (socket-server-metrics connection-count)", ("listener",)),
    # -- fetch sessions (kafka.server:type=FetchSessionCache,name=...), KIP-227 -------------------
    Metric("kafka_server_fetchsessioncache_numincrementalfetchsessions", GAUGE,
           "Incremental fetch sessions cached, over all frontends (NumIncrementalFetchSessions)"),
    Metric("kafka_server_fetchsessioncache_numincrementalfetchpartitionscached", GAUGE,
           "Partitions in the cached fetch sessions (NumIncrementalFetchPartitionsCached)"),
    Metric("kafka_server_fetchsessioncache_incrementalfetchsessionevictions", COUNTER,
           "Fetch sessions evicted for new ones (IncrementalFetchSessionEvictionsPerSec)"),
    # -- logs (kafka.log:type=Log,name=...,topic=T,partition=P) ----------------------------------
    Metric("kafka_log_log_logendoffset", GAUGE, "Log end offset (= high watermark)", _TP),
    Metric("kafka_log_log_logstartoffset", GAUGE, "Log start offset", _TP),
    Metric("kafka_log_log_size", GAUGE, "Bytes of the partition's segments", _TP),
    Metric("kafka_log_log_numlogsegments", GAUGE, "Segments of the partition", _TP),
    Metric("kafka_log_log_laststableoffset", GAUGE,
           "Last stable offset (KIP-98): read_committed consumers read below it", _TP),
    Metric("kafka_cluster_partition_laststableoffsetlag", GAUGE,
           "High watermark minus the last stable offset (LastStableOffsetLag)", _TP),
    Metric("kafka_log_logflushstats_logflushrateandtimems", HISTOGRAM,
           "fdatasync of partition segments by the flush policy, in ms (LogFlushRateAndTimeMs)",
           scale=1e-3, bounds=FLUSH_MS_BOUNDS),
    Metric("kafka_server_replicamanager_produceridcount", GAUGE,
           "Producer ids with state on the partitions (ProducerIdCount)"),
    # -- the log cleaner (kafka.log:type=LogCleaner / LogCleanerManager), one series per cleaner
    # process (label cleaner: its index); Kafka's broker-wide value is the max over them ------------
    Metric("kafka_log_logcleaner_cleaner_recopy_percent", GAUGE,
           "Bytes written over bytes read by the cleaner's last round, in percent", ("cleaner",),
           scale=0.01),
    Metric("kafka_log_logcleaner_max_clean_time_secs", GAUGE,
           "How long the cleaner's last round took, in seconds", ("cleaner",), scale=1e-6),
    Metric("kafka_log_logcleaner_max_buffer_utilization_percent", GAUGE,
           "How full the key map of the cleaner's last round was, in percent", ("cleaner",),
           scale=0.01),
    Metric("kafka_log_logcleaner_max_compaction_delay_secs", GAUGE,
           "How far past max.compaction.lag.ms the oldest dirty record of the cleaner's "
           "partitions is, in seconds (the cleaner's lag behind its deadline)", ("cleaner",),
           scale=1e-3),
    Metric("kafka_log_logcleanermanager_max_dirty_percent", GAUGE,
           "The dirtiest of the cleaner's compacted partitions: not yet cleaned bytes over its "
           "log, in percent, when it last looked", ("cleaner",), scale=0.01),
    Metric("kafka_log_logcleanermanager_time_since_last_run_ms", GAUGE,
           "Time since the cleaner last looked for a partition to clean, in ms", ("cleaner",)),
    Metric("kafka_log_logcleanermanager_uncleanable_partitions_count", GAUGE,
           "Partitions the cleaner gave up on after an error (until it restarts)", ("cleaner",)),
    Metric("appliance_log_cleaner_bytes_read", COUNTER,
           "Bytes of segments the cleaner read (key map and rewrite)", ("cleaner",)),
    Metric("appliance_log_cleaner_bytes_written", COUNTER,
           "Bytes of cleaned segments the cleaner wrote", ("cleaner",)),
    Metric("appliance_log_cleaner_rounds", COUNTER,
           "Cleaning rounds completed (every group swapped in)", ("cleaner",)),
    # -- transaction coordinator -----------------------------------------------------------------
    Metric("kafka_coordinator_transaction_transactionstatemanager_activetransactionopentimemaxms",
           GAUGE, "How long the oldest open transaction has been open, in ms (KIP-939)"),
    Metric("kafka_coordinator_transaction_transactionstatemanager_transactions", GAUGE,
           "Transactional ids by the state of their transaction", ("state",)),
    Metric("kafka_coordinator_transaction_commits", COUNTER,
           "Transactions completed with a commit"),
    Metric("kafka_coordinator_transaction_aborts", COUNTER,
           "Transactions completed with an abort (client, timeout, fencing or admin)"),
    Metric("kafka_coordinator_transaction_timedout_aborts", COUNTER,
           "Transactions the coordinator aborted because they outlived their timeout"),
    # -- group coordinator (kafka.coordinator.group:type=GroupMetadataManager,name=...) ----------
    Metric("kafka_coordinator_group_groupmetadatamanager_numgroups", GAUGE, "Consumer groups"),
    Metric("kafka_coordinator_group_groupmetadatamanager_numgroupsstable", GAUGE,
           "Groups in state Stable"),
    Metric("kafka_coordinator_group_groupmetadatamanager_numgroupspreparingrebalance", GAUGE,
           "Groups in state PreparingRebalance"),
    Metric("kafka_coordinator_group_groupmetadatamanager_numgroupscompletingrebalance", GAUGE,
           "Groups in state CompletingRebalance"),
    Metric("kafka_coordinator_group_groupmetadatamanager_numgroupsempty", GAUGE,
           "Groups in state Empty"),
    Metric("kafka_coordinator_group_groupmetadatamanager_numgroupsdead", GAUGE,
           "Groups in state Dead"),
    Metric("kafka_coordinator_group_groupmetadatamanager_numoffsets", GAUGE,
           "Committed offsets held by the group coordinator"),
    # -- KIP-848 (kafka.server:type=group-coordinator-metrics) -----------------------------------
    Metric("kafka_server_group_coordinator_metrics_group_count", GAUGE,
           "Groups by protocol (classic, consumer, share)", ("protocol",)),
    Metric("kafka_server_group_coordinator_metrics_share_group_count", GAUGE,
           "Share groups (KIP-932) by state (empty, stable)", ("state",)),
    Metric("kafka_server_group_coordinator_metrics_consumer_group_count", GAUGE,
           "Consumer groups (KIP-848) by state (empty, assigning, reconciling, stable, dead)",
           ("state",)),
    Metric("kafka_server_group_coordinator_metrics_consumer_group_rebalance", COUNTER,
           "Consumer group (KIP-848) rebalances: new target assignments (group epoch bumps)"),
    # -- consumer groups (kafka-exporter's names, label group) ----------------------------------
    Metric("kafka_consumergroup_members", GAUGE, "Members of the group", ("group",)),
    Metric("kafka_consumergroup_current_offset", GAUGE, "The group's committed offset",
           ("group", "topic", "partition")),
    Metric("kafka_consumergroup_lag", GAUGE,
           "High watermark minus the group's committed offset", ("group", "topic", "partition")),
    # -- share partitions (KIP-932; kafka.server:type=SharePartitionMetrics, labels group,
    # topic, partition) and their lag (DescribeShareGroupOffsets v1's) ----------------------------
    Metric("kafka_server_sharepartitionmetrics_inflightmessagecount", GAUGE,
           "Records in flight (available or acquired) in the share partition's window",
           ("group", "topic", "partition")),
    Metric("appliance_share_partition_lag", GAUGE,
           "High watermark minus the share partition's start offset minus the records done "
           "above it (KIP-1226's lag)", ("group", "topic", "partition")),
    # -- the appliance's own ---------------------------------------------------------------------
    Metric("appliance_worker_up", GAUGE,
           "1 while the worker process runs and has published READY", ("role", "worker")),
    Metric("appliance_worker_heartbeat_age_seconds", GAUGE,
           "Time since the worker's last heartbeat", ("role", "worker")),
    Metric("appliance_worker_restarts", COUNTER,
           "Workers restarted by the supervisor after they died or hung", ("role",)),
    Metric("appliance_produce_ring_fill_ratio", GAUGE,
           "Fill of the fullest frontend -> writer produce ring of the writer process",
           ("worker",)),
    Metric("appliance_ring_fill_ratio", GAUGE,
           "Fill of the rings between frontends, fetchers, the coordinator and the supervisor",
           ("from", "to")),
    Metric("appliance_recovery_seconds", GAUGE,
           "Time the last start took to recover every partition log", scale=1e-6),
    Metric("appliance_log_recovery_bytes", GAUGE,
           "Bytes of segments the partition's last recovery checked or scanned", _TP),
    Metric("appliance_log_fetch_corrupt_batches", COUNTER,
           "Fetches of the partition refused with KAFKA_STORAGE_ERROR at a batch whose CRC fails "
           "(bit rot)", _TP),
    Metric("appliance_log_scrub_corrupt_batches", COUNTER,
           "Batches of sealed segments whose CRC failed, found by the background scrub", _TP),
    Metric("appliance_log_scrub_bytes", COUNTER,
           "Bytes of sealed segments the background scrub checked", ("cleaner",)),
    Metric("appliance_log_scrub_passes", COUNTER,
           "Passes of the background scrub over every partition it scrubs", ("cleaner",)),
    Metric("appliance_config_reloads", COUNTER,
           "SIGHUP reloads of the configuration file, by result", ("result",)),
]}


def key(name: str, labels: Iterable[tuple[str, object]] = ()) -> str:
    """A series' key in a metrics table: ``name|label=value|...``."""
    return name + "".join(f"|{k}={v}" for k, v in labels)


def parse_key(k: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    """(name, labels) of a table key (a histogram's name keeps its ``:b<i>``/``:sum`` part)."""
    name, *rest = k.split("|")
    return name, tuple(tuple(part.split("=", 1)) for part in rest)   # type: ignore[misc]


class Histogram:
    """The owner's side of one histogram series: ``observe_us`` is a bisect and two adds."""

    __slots__ = ("values", "bounds", "slots", "sum")

    def __init__(self, table, name: str, labels: Iterable[tuple[str, object]] = ()) -> None:
        m = CATALOG[name]
        labels = tuple(labels)
        self.values = table.values
        # Bounds in the stored unit (microseconds), compared with what is observed.
        self.bounds = [b / m.scale for b in m.bounds]
        self.slots = [table.slot(key(f"{name}:b{i}", labels)) for i in range(len(m.bounds) + 1)]
        self.sum = table.slot(key(f"{name}:sum", labels))

    def observe_us(self, us: int) -> None:
        v = self.values
        v[self.slots[bisect_left(self.bounds, us)]] += 1
        v[self.sum] += us
