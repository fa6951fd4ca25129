"""Client telemetry (KIP-714): the subscriptions handed to clients and the metrics they push.

Runs in each frontend (``appliance.api.get_telemetry_subscriptions`` and ``push_telemetry``
call it; the frontend's tick expires and publishes it) and, for ``decode_snapshot``, in the
metrics server. Owns, for the clients that talk to this frontend, each client instance's
subscription, its last request times, whether it said it was terminating, and the series of its
last pushes (bounded: ``[telemetry] max_series`` per frontend, the oldest instances dropped past
``max_clients``). Sans-IO: no socket, no file; the frontend writes ``snapshot()`` to the runtime
dir (``client_telemetry.<frontend>.msgpack``) and the metrics server exports every frontend's.

Which process owns what: a client may push through any frontend (its connections are accepted by
whichever frontend the kernel picks), so nothing here needs another frontend's state. The
subscription id is Kafka's deterministic one (CRC32C of the subscribed metrics and the push
interval, XORed with the hash of the client instance id, ClientMetricsManager), so every frontend
computes the same id for the same client and accepts its push; only the "too early" rule is per
frontend, as it is per broker in Kafka (a client that moves to another frontend may push there
once without waiting, as it may move to another broker).
"""

from __future__ import annotations

import base64
import gzip
import re
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field

import crc32c
import msgspec

from appliance.errors import ErrorCode
from appliance.metrics import client_metrics_config

# KIP-714: the compression types the broker accepts, in order of preference (Kafka's
# ClientMetricsManager.SUPPORTED_COMPRESSION_TYPES: zstd, lz4, gzip, snappy).
NONE, GZIP, SNAPPY, LZ4, ZSTD = 0, 1, 2, 3, 4
ACCEPTED_COMPRESSION = (ZSTD, LZ4, GZIP, SNAPPY)
ALL_METRICS = "*"                 # Kafka's ClientMetricsConfigs.ALL_SUBSCRIBED_METRICS
# Kafka's client-metrics cache expiry floor (ClientMetricsManager: max(cacheExpiryMs, 3 x push
# interval)); series of a client that stopped pushing go when its instance expires.
EXPIRY_FLOOR_MS = 60_000
EXPIRY_INTERVALS = 3
# The labels the broker adds to every series (KIP-714's broker-added resource attributes).
BROKER_LABELS = ("client_instance_id", "client_id", "client_software_name",
                 "client_software_version", "principal")
_NAME_BAD = re.compile(r"[^a-zA-Z0-9_:]")
_LABEL_BAD = re.compile(r"[^a-zA-Z0-9_]")


@dataclass(frozen=True)
class ClientMeta:
    """What the broker knows of a client from its connection (KIP-714's client selectors)."""

    client_id: str
    software_name: str
    software_version: str
    principal: str
    source_address: str = ""
    source_port: str = ""


@dataclass
class Instance:
    """Kafka's ClientMetricsInstance, in this frontend."""

    instance_id: uuid.UUID
    meta: ClientMeta
    subscription_id: int
    metrics: tuple[str, ...]
    interval_ms: int
    last_get_ms: int = 0
    last_push_ms: int = 0
    terminating: bool = False
    last_error: int = 0
    touched_ms: int = 0
    # (prometheus name, kind, sorted label items) -> value
    series: dict = field(default_factory=dict)


def subscription_id(metrics: tuple[str, ...], interval_ms: int, instance_id: uuid.UUID) -> int:
    """Kafka's computeSubscriptionId: CRC32C of the metrics set's Java ``toString()`` plus the
    interval, XOR the Java hash of the Uuid; the same in every frontend for the same client."""
    text = "[" + ", ".join(metrics) + "]" + str(interval_ms)
    crc = crc32c.crc32c(text.encode())
    hi, lo = instance_id.int >> 64, instance_id.int & (2**64 - 1)
    x = hi ^ lo
    java_hash = (x >> 32) ^ (x & 0xFFFFFFFF)        # Uuid.hashCode: (int)(h >> 32) ^ (int) h
    sid = (crc ^ java_hash) & 0xFFFFFFFF
    return sid - (1 << 32) if sid >= 1 << 31 else sid


def kafka_uuid(u: uuid.UUID) -> str:
    """Kafka's Uuid.toString (URL-safe base64, no padding): what the clients' clientInstanceId()
    and Kafka's tools print."""
    return base64.urlsafe_b64encode(u.bytes).decode().rstrip("=")


def decompress(codec: int, data: bytes, max_bytes: int) -> bytes:
    """The OTLP payload as the client compressed it; ValueError when it does not decompress or
    inflates past ``max_bytes`` (TELEMETRY_TOO_LARGE in Kafka's 4.x broker)."""
    if codec == NONE:
        out = data
    elif codec == GZIP:
        out = gzip.decompress(data)
    elif codec == ZSTD:
        import zstandard
        out = zstandard.ZstdDecompressor().decompressobj().decompress(data)
    elif codec == LZ4:
        import cramjam
        out = bytes(cramjam.lz4.decompress(data))
    elif codec == SNAPPY:
        import cramjam
        try:
            out = bytes(cramjam.snappy.decompress_raw(data))
        except Exception:     # xerial framing, as Kafka's snappy batches
            out = bytes(cramjam.snappy.decompress(data))
    else:
        raise ValueError(f"compression type {codec}")
    if len(out) > max_bytes:
        raise OverflowError(len(out))
    return out


def _prom_name(name: str) -> str:
    n = _NAME_BAD.sub("_", name)
    return "_" + n if n[:1].isdigit() else n


def _label(key: str) -> str:
    k = _LABEL_BAD.sub("_", key)
    k = "_" + k if k[:1].isdigit() else k
    return "attr_" + k if k in BROKER_LABELS or k.startswith("__") else k


def _attr_value(v) -> str:
    kind = v.WhichOneof("value")
    return "" if kind is None else str(getattr(v, kind))


def decode_metrics(payload: bytes) -> list[tuple[str, str, tuple, float]]:
    """(name, kind, labels, value) of every gauge and sum data point of an OTLP MetricsData
    (histograms and summaries are not exported). ValueError when it does not parse."""
    from google.protobuf.message import DecodeError
    from opentelemetry.proto.metrics.v1.metrics_pb2 import MetricsData
    try:
        data = MetricsData.FromString(payload)
    except DecodeError as e:
        raise ValueError(str(e)) from None
    out = []
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                kind = m.WhichOneof("data")
                if kind == "gauge":
                    points, ptype = m.gauge.data_points, "gauge"
                elif kind == "sum":
                    points = m.sum.data_points
                    ptype = "counter" if m.sum.is_monotonic else "gauge"
                else:
                    continue
                name = _prom_name(m.name)
                for p in points:
                    value = p.as_double if p.WhichOneof("value") == "as_double" else p.as_int
                    labels = tuple(sorted((_label(a.key), _attr_value(a.value))
                                          for a in p.attributes))
                    out.append((name, ptype, labels, float(value)))
    return out


class ClientTelemetry:
    """The client instances of one frontend. ``settings`` is the ``[telemetry]`` section (read
    again on every request: a reload applies to the next GetTelemetrySubscriptions, whose new
    subscription id makes the client's next push UNKNOWN_SUBSCRIPTION_ID, as in Kafka).
    ``client_metrics`` returns the CLIENT_METRICS resources of the catalog (name -> configs):
    when there is any, they are the subscriptions, matched per client, and ``[telemetry]``'s
    metrics and interval are not used (Kafka has only the resources; the section is the
    appliance's broker-wide default for when none is defined). A changed resource reaches each
    client at its next request, with a new subscription id, as in Kafka."""

    def __init__(self, settings, client_metrics=lambda: {}) -> None:
        self.settings = settings
        self.client_metrics = client_metrics
        self.instances: OrderedDict[uuid.UUID, Instance] = OrderedDict()
        self.dirty = False
        self.dropped_series = 0
        self._parsed: tuple[object, list] = (None, [])

    # -- subscriptions ----------------------------------------------------------------------
    def _subscription(self, iid: uuid.UUID, meta: ClientMeta) -> tuple[tuple[str, ...], int]:
        resources = self.client_metrics()
        if resources:
            if self._parsed[0] is not resources:
                self._parsed = (resources, client_metrics_config.subscriptions(resources))
            return client_metrics_config.combine(self._parsed[1], {
                "client_instance_id": kafka_uuid(iid), "client_id": meta.client_id,
                "client_software_name": meta.software_name,
                "client_software_version": meta.software_version,
                "client_source_address": meta.source_address,
                "client_source_port": meta.source_port})
        s = self.settings
        metrics = tuple(sorted(set(s.metrics)))
        if ALL_METRICS in metrics or "" in metrics:
            metrics = (ALL_METRICS,)
        return metrics, s.interval_ms

    def _instance(self, iid: uuid.UUID, meta: ClientMeta, now_ms: int) -> Instance:
        metrics, interval = self._subscription(iid, meta)
        inst = self.instances.get(iid)
        if inst is None or inst.metrics != metrics or inst.interval_ms != interval:
            fresh = Instance(iid, meta, subscription_id(metrics, interval, iid), metrics,
                             interval)
            if inst is not None:        # the subscription changed: keep its clock and series
                fresh.last_get_ms, fresh.last_push_ms = inst.last_get_ms, inst.last_push_ms
                fresh.terminating, fresh.series = inst.terminating, inst.series
            inst = self.instances[iid] = fresh
        self.instances.move_to_end(iid)
        inst.touched_ms = now_ms
        while len(self.instances) > self.settings.max_clients:     # Kafka's LRU cache
            _, gone = self.instances.popitem(last=False)
            if gone.series:
                self.dirty = True
        return inst

    def get_subscriptions(self, iid: uuid.UUID | None, meta: ClientMeta, now_ms: int) -> dict:
        """GetTelemetrySubscriptions: the response's fields (Kafka's
        processGetTelemetrySubscriptionRequest)."""
        if iid is None or iid.int == 0:
            iid = uuid.uuid4()
            while iid in self.instances:
                iid = uuid.uuid4()
        inst = self._instance(iid, meta, now_ms)
        since = now_ms - max(inst.last_get_ms, inst.last_push_ms)
        if inst.last_get_ms and since < inst.interval_ms and inst.last_error not in (
                ErrorCode.unknown_subscription_id, ErrorCode.unsupported_compression_type):
            return dict(error_code=ErrorCode.throttling_quota_exceeded, client_instance_id=iid,
                        subscription_id=0, push_interval=0, telemetry_max_bytes=0,
                        accepted_compression_types=(), requested_metrics=())
        inst.last_get_ms = now_ms
        inst.last_error = 0
        return dict(error_code=ErrorCode.none, client_instance_id=iid,
                    subscription_id=inst.subscription_id,
                    accepted_compression_types=ACCEPTED_COMPRESSION,
                    push_interval=inst.interval_ms,
                    telemetry_max_bytes=self.settings.max_bytes,
                    # Prometheus wants cumulative counters: ask for cumulative sums (KIP-714
                    # leaves the temporality to the broker).
                    delta_temporality=False,
                    requested_metrics=inst.metrics)

    def push(self, iid: uuid.UUID | None, sub_id: int, terminating: bool, codec: int,
             payload: bytes, meta: ClientMeta, now_ms: int) -> int:
        """PushTelemetry: the error code (Kafka's processPushTelemetryRequest and its checks,
        in its order)."""
        if iid is None or iid.int == 0 or iid.int == (1 << 128) - 1 or iid.int == 1:
            return ErrorCode.invalid_request           # Uuid.RESERVED
        inst = self._instance(iid, meta, now_ms)
        err = self._validate(inst, sub_id, terminating, codec, payload, now_ms)
        inst.terminating = terminating          # Kafka's finally: whatever the outcome
        if err:
            inst.last_error = err
            return err
        if payload:
            try:
                points = decode_metrics(decompress(codec, payload, self.settings.max_bytes))
            except OverflowError:
                inst.last_error = ErrorCode.telemetry_too_large
                return inst.last_error
            except Exception:
                inst.last_error = ErrorCode.invalid_record
                return inst.last_error
            self._store(inst, points)
        inst.last_error = 0
        return ErrorCode.none

    def _validate(self, inst: Instance, sub_id, terminating, codec, payload, now_ms) -> int:
        if inst.terminating:
            return ErrorCode.invalid_request
        can = inst.last_get_ms > inst.last_push_ms or now_ms - inst.last_push_ms >= inst.interval_ms
        if can:
            inst.last_push_ms = now_ms
        elif not terminating:
            return ErrorCode.throttling_quota_exceeded
        if sub_id != inst.subscription_id:
            return ErrorCode.unknown_subscription_id
        if codec not in ACCEPTED_COMPRESSION and codec != NONE:
            return ErrorCode.unsupported_compression_type
        if len(payload) > self.settings.max_bytes:
            return ErrorCode.telemetry_too_large
        return ErrorCode.none

    def _store(self, inst: Instance, points) -> None:
        m = inst.meta
        base = (("client_instance_id", kafka_uuid(inst.instance_id)), ("client_id", m.client_id),
                ("client_software_name", m.software_name),
                ("client_software_version", m.software_version), ("principal", m.principal))
        room = self.settings.max_series - sum(len(i.series) for i in self.instances.values()
                                              if i is not inst)
        series = {}
        for name, kind, labels, value in points:
            if len(series) >= room:
                self.dropped_series += 1
                continue
            series[(name, kind, base + labels)] = value
        inst.series = series
        self.dirty = True

    # -- time and publication ------------------------------------------------------------------
    def expire(self, now_ms: int) -> None:
        """Forget the instances that have not been heard from for three push intervals (at
        least a minute): their series leave the next scrape."""
        for iid in [i for i, inst in self.instances.items()
                    if now_ms - inst.touched_ms > max(EXPIRY_FLOOR_MS,
                                                      EXPIRY_INTERVALS * inst.interval_ms)]:
            if self.instances.pop(iid).series:
                self.dirty = True

    def snapshot(self) -> bytes:
        """What the metrics server exports: every series of the live instances."""
        self.dirty = False
        rows = [(name, kind, list(labels), value, inst.last_push_ms)
                for inst in self.instances.values()
                for (name, kind, labels), value in inst.series.items()]
        return msgspec.msgpack.encode({"series": rows, "dropped": self.dropped_series})


def decode_snapshot(data: bytes) -> dict:
    return msgspec.msgpack.decode(data)


SNAPSHOT_PREFIX = "client_telemetry."
