"""The frontend's metrics: requests, their latency and error codes, and per-topic failures and
bytes out, counted into the frontend's metrics table (``shm.metrics``, ``appliance.metrics``).

Runs inside each frontend process (asyncio, single thread); owns the frontend's series in its
table. Each update is a dict lookup and one or two adds into shared memory: no lock, no system
call. Error codes are counted as Kafka's RequestMetrics counts ErrorsPerSec, from the answer's
error fields (NONE included): walked out of the response entity, or, for the APIs whose handlers
encode their answer themselves (Produce, Fetch), reported by the handler (``RequestContext.
errors``).
"""

from __future__ import annotations

import dataclasses
import time
import typing
from collections import Counter
from typing import Any

from appliance.errors import ErrorCode
from appliance.metrics import Histogram, key

TOTAL_TIME = "kafka_network_requestmetrics_totaltimems"
CONNECTION_COUNT = "kafka_server_socket_server_metrics_connection_count"


def error_name(code: int) -> str:
    try:
        return ErrorCode(code).name.upper()
    except ValueError:
        return str(code)


class FrontendMetrics:
    def __init__(self, table, listeners: typing.Iterable[str] = ("PLAINTEXT",)) -> None:
        self.table = table
        self.values = table.values
        self._requests: dict[str, tuple[int, Histogram]] = {}
        self._errors: dict[tuple[str, int], int] = {}
        self._topics: dict[tuple[str, str], int] = {}
        # Open connections per listener (Kafka's socket-server-metrics, listener=NAME).
        self._connections: dict[str, int] = {}
        self._session_slots: tuple[int, int, int] | None = None
        for name in listeners:
            # A restarted frontend starts with no connections.
            self.values[self._connection_slot(name)] = 0

    def _connection_slot(self, listener: str) -> int:
        slot = self._connections.get(listener)
        if slot is None:
            slot = self._connections[listener] = self.table.slot(
                key(CONNECTION_COUNT, [("listener", listener)]))
        return slot

    def connections(self, delta: int, listener: str = "PLAINTEXT") -> None:
        self.values[self._connection_slot(listener)] += delta

    def request(self, api: str, started_ns: int, errors: Counter | None) -> None:
        """One answered request of ``api``: its count, its time, its error codes."""
        r = self._requests.get(api)
        if r is None:
            r = self._requests[api] = (
                self.table.slot(key("kafka_network_requestmetrics_requests", [("request", api)])),
                Histogram(self.table, TOTAL_TIME, [("request", api)]))
        v = self.values
        v[r[0]] += 1
        r[1].observe_us((time.monotonic_ns() - started_ns) // 1000)
        if errors:
            for code, n in errors.items():
                slot = self._errors.get((api, code))
                if slot is None:
                    slot = self._errors[(api, code)] = self.table.slot(key(
                        "kafka_network_requestmetrics_errors",
                        [("request", api), ("error", error_name(code))]))
                v[slot] += n

    def fetch_sessions(self, sessions: int, partitions: int, evictions: int) -> None:
        """This frontend's fetch-session cache (KIP-227): two gauges and its evictions so far
        (the collector sums the frontends')."""
        slots = self._session_slots
        if slots is None:
            slots = self._session_slots = tuple(self.table.slot(key(name, [])) for name in (
                "kafka_server_fetchsessioncache_numincrementalfetchsessions",
                "kafka_server_fetchsessioncache_numincrementalfetchpartitionscached",
                "kafka_server_fetchsessioncache_incrementalfetchsessionevictions"))
        v = self.values
        v[slots[0]], v[slots[1]], v[slots[2]] = sessions, partitions, evictions

    def topic(self, metric: str, topic: str, n: int = 1) -> None:
        """Add ``n`` to a per-topic counter (``kafka_server_brokertopicmetrics_...``)."""
        slot = self._topics.get((metric, topic))
        if slot is None:
            slot = self._topics[(metric, topic)] = self.table.slot(key(metric, [("topic", topic)]))
        self.values[slot] += n


# -- error codes of a response entity (Kafka's AbstractResponse.errorCounts) -----------------------

_PLANS: dict[type, tuple[tuple[str, ...], tuple[str, ...]]] = {}
# The fields counted: ErrorCode everywhere, and AddPartitionsToTxn's PartitionErrorCode (its
# results carry no other; Kafka's AddPartitionsToTxnResponse.errorCounts counts them).
_ERROR_FIELDS = ("error_code", "partition_error_code")


def _plan(cls: type) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(error code fields, nested entity fields) of a kio entity class."""
    plan = _PLANS.get(cls)
    if plan is None:
        errors, nested = [], []
        try:
            hints = typing.get_type_hints(cls)
        except Exception:
            hints = {}
        for f in dataclasses.fields(cls):
            t = hints.get(f.name)
            if f.name in _ERROR_FIELDS:
                errors.append(f.name)
            elif t is not None and (dataclasses.is_dataclass(t) or any(
                    dataclasses.is_dataclass(a) for a in typing.get_args(t))):
                nested.append(f.name)
        plan = _PLANS[cls] = (tuple(errors), tuple(nested))
    return plan


def error_counts(entity: Any, out: Counter | None = None) -> Counter:
    """Every ``error_code`` in the entity and the entities it holds, counted by code."""
    out = Counter() if out is None else out
    if not dataclasses.is_dataclass(entity):
        return out
    errors, nested = _plan(type(entity))
    for name in errors:
        out[int(getattr(entity, name))] += 1
    for name in nested:
        v = getattr(entity, name)
        if isinstance(v, tuple):
            for item in v:
                error_counts(item, out)
        elif v is not None:
            error_counts(v, out)
    return out
