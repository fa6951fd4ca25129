"""What the client knows about the cluster: brokers, topics, leaders, coordinators; and the
connections to them.

Owns the connection per broker node (``BrokerConnection``), the metadata cache (topic ->
id, partition -> leader) and the coordinator cache (key -> node). Bootstrap: the first
``Metadata`` request goes to the first bootstrap address that answers; later requests to any
connected broker. Leaders are looked up from the cache and refreshed on demand: callers call
``invalidate(topic)`` after NOT_LEADER_OR_FOLLOWER / UNKNOWN_TOPIC_OR_PARTITION /
LEADER_NOT_AVAILABLE and ``forget_coordinator`` after NOT_COORDINATOR.

``Deadline`` is the retry loop every blocking call of the client uses: retriable errors are
retried with a backoff until the call's time budget is spent, then the last error is raised.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from appliance.client.connection import BrokerConnection
from appliance.client.security import Security
from appliance.client.errors import (ErrorCode, KafkaConnectionError, KafkaError,
                                     KafkaTimeoutError, error_code)

__all__ = ["Cluster", "Deadline", "TopicInfo", "parse_bootstrap", "COORDINATOR_GROUP",
           "COORDINATOR_TRANSACTION"]

METADATA, FIND_COORDINATOR = 3, 10
COORDINATOR_GROUP, COORDINATOR_TRANSACTION = 0, 1
# Topic-level metadata errors that go away by themselves (a topic being created or moved).
_TRANSIENT_TOPIC = frozenset({ErrorCode.leader_not_available, ErrorCode.unknown_topic_or_partition,
                              ErrorCode.not_leader_or_follower})


def parse_bootstrap(servers: str | Iterable[str]) -> list[tuple[str, int]]:
    """"h1:p1,h2:p2" (or a list of "h:p") -> [(host, port)]; a bare host means port 9092."""
    items = servers.split(",") if isinstance(servers, str) else list(servers)
    out = []
    for item in items:
        item = item.strip()
        if not item:
            continue
        host, sep, port = item.rpartition(":")
        if not sep:
            host, port = item, "9092"
        out.append((host.strip("[]") or "localhost", int(port)))
    if not out:
        raise ValueError("bootstrap_servers is empty")
    return out


class Deadline:
    """A time budget with exponential backoff between attempts.

    ``for attempt in Deadline(ms, backoff_ms): ...`` yields until the budget is spent, sleeping
    between attempts (backoff doubling up to ``max_backoff_ms``); ``expired`` says whether another
    attempt would start after the budget.
    """

    def __init__(self, budget_ms: float, backoff_ms: float = 100, max_backoff_ms: float = 1000) -> None:
        self.end = time.monotonic() + budget_ms / 1000.0
        self.backoff = backoff_ms / 1000.0
        self.max_backoff = max(max_backoff_ms, backoff_ms) / 1000.0
        self.attempts = 0

    @property
    def remaining_ms(self) -> float:
        return max(0.0, (self.end - time.monotonic()) * 1000.0)

    @property
    def expired(self) -> bool:
        return time.monotonic() >= self.end

    def __iter__(self):
        while True:
            yield self.attempts
            self.attempts += 1
            if self.expired:
                return
            pause = min(self.backoff * (2 ** min(self.attempts - 1, 10)), self.max_backoff,
                        max(0.0, self.end - time.monotonic()))
            time.sleep(pause)


@dataclass
class TopicInfo:
    name: str
    topic_id: uuid.UUID | None
    leaders: dict[int, int] = field(default_factory=dict)     # partition -> leader node id

    @property
    def partitions(self) -> int:
        return len(self.leaders)


class Cluster:
    """Connections and metadata for one client (producer or consumer)."""

    def __init__(self, bootstrap_servers: str | Iterable[str], *, client_id: str = "appliance-client",
                 request_timeout_ms: int = 30000, retry_backoff_ms: int = 100,
                 metadata_timeout_ms: int = 60000, allow_auto_create_topics: bool = True,
                 max_versions: Mapping[int, int] | None = None,
                 security: Security | None = None) -> None:
        self.bootstrap = parse_bootstrap(bootstrap_servers)
        self.security = security
        self.client_id = client_id
        self.request_timeout_ms = request_timeout_ms
        self.retry_backoff_ms = retry_backoff_ms
        self.metadata_timeout_ms = metadata_timeout_ms
        self.allow_auto_create_topics = allow_auto_create_topics
        self.max_versions = dict(max_versions or {})
        self.brokers: dict[int, tuple[str, int]] = {}
        self.conns: dict[int, BrokerConnection] = {}
        self._bootstrap_conn: BrokerConnection | None = None
        self.topics: dict[str, TopicInfo] = {}
        # The topics whose every partition has a leader: what send() looks up per record.
        self._usable: dict[str, TopicInfo] = {}
        self._last_errors: dict[str, ErrorCode] = {}      # topic -> error of the last Metadata
        self._coordinators: dict[tuple[int, str], int] = {}

    # -- connections ----------------------------------------------------------------------------
    def _open(self, host: str, port: int, node_id: int) -> BrokerConnection:
        return BrokerConnection(host, port, node_id=node_id, client_id=self.client_id,
                                request_timeout_ms=self.request_timeout_ms,
                                max_versions=self.max_versions, security=self.security)

    def any_connection(self) -> BrokerConnection:
        """A live connection to some broker: an open one, else the bootstrap addresses in turn."""
        for conn in self.conns.values():
            if conn.connected:
                return conn
        if self._bootstrap_conn is not None and self._bootstrap_conn.connected:
            return self._bootstrap_conn
        last: KafkaError | None = None
        for node_id, (host, port) in list(self.brokers.items()):
            try:
                return self.connection(node_id)
            except KafkaConnectionError as exc:
                last = exc
        for host, port in self.bootstrap:
            try:
                self._bootstrap_conn = self._open(host, port, -1)
                return self._bootstrap_conn
            except KafkaConnectionError as exc:
                last = exc
        raise last or KafkaConnectionError("no broker reachable")

    def connection(self, node_id: int) -> BrokerConnection:
        """The connection to broker ``node_id`` (opened, and reopened after a failure)."""
        conn = self.conns.get(node_id)
        if conn is not None and conn.connected:
            return conn
        if node_id not in self.brokers:
            self.refresh(())
        if node_id not in self.brokers:
            raise KafkaConnectionError(f"broker {node_id} is not in the cluster metadata")
        host, port = self.brokers[node_id]
        conn = self.conns[node_id] = self._open(host, port, node_id)
        return conn

    def close(self) -> None:
        for conn in self.conns.values():
            conn.close()
        self.conns.clear()
        if self._bootstrap_conn is not None:
            self._bootstrap_conn.close()
            self._bootstrap_conn = None

    # -- metadata -------------------------------------------------------------------------------
    def refresh(self, topics: Iterable[str] | None) -> None:
        """One Metadata request for ``topics`` (None: every topic; empty: brokers only)."""
        conn = self.any_connection()
        names = None if topics is None else sorted(set(topics))
        body = {"topics": None if names is None else [{"name": t, "topic_id": None} for t in names],
                "allow_auto_topic_creation": self.allow_auto_create_topics,
                "include_cluster_authorized_operations": False,
                "include_topic_authorized_operations": False}
        resp = conn.request(METADATA, body)
        self.brokers = {b.node_id: (b.host, b.port) for b in resp.brokers}
        for t in resp.topics:
            if t.error_code != ErrorCode.none or t.name is None:
                self.topics.pop(t.name, None)
                self._usable.pop(t.name, None)
                continue
            tid = getattr(t, "topic_id", None)
            if tid is not None and tid.int == 0:
                tid = None
            info = TopicInfo(t.name, tid)
            for p in t.partitions:
                info.leaders[p.partition_index] = p.leader_id if p.error_code == ErrorCode.none else -1
            self.topics[t.name] = info
            if info.leaders and all(v >= 0 for v in info.leaders.values()):
                self._usable[t.name] = info
            else:
                self._usable.pop(t.name, None)
        self._last_errors = {t.name: error_code(t.error_code) for t in resp.topics}

    def topic(self, name: str, *, timeout_ms: float | None = None) -> TopicInfo:
        """Metadata of one topic, waiting (within ``metadata_timeout_ms``) while it is being
        created or has a partition without a leader."""
        info = self._usable.get(name)
        if info is not None:
            return info
        last = ErrorCode.unknown_topic_or_partition
        for _ in Deadline(timeout_ms if timeout_ms is not None else self.metadata_timeout_ms,
                          self.retry_backoff_ms):
            try:
                self.refresh([name])
            except KafkaConnectionError:
                continue
            info = self._usable.get(name)
            if info is not None:
                return info
            last = self._last_errors.get(name, ErrorCode.leader_not_available)
            if last not in _TRANSIENT_TOPIC and last != ErrorCode.none:
                raise KafkaError(last, f"metadata of topic {name!r}")
        raise KafkaTimeoutError(f"metadata of topic {name!r} not available ({last.name})")

    def partitions_for(self, name: str) -> int:
        return self.topic(name).partitions

    def leader(self, name: str, partition: int) -> int:
        info = self.topic(name)
        if partition not in info.leaders:
            raise KafkaError(ErrorCode.unknown_topic_or_partition,
                             f"{name} has {info.partitions} partitions, not partition {partition}")
        return info.leaders[partition]

    def invalidate(self, name: str) -> None:
        """Forget a topic's leaders (after a leader or unknown-topic error)."""
        self.topics.pop(name, None)
        self._usable.pop(name, None)

    def topic_name(self, topic_id: uuid.UUID) -> str | None:
        for info in self.topics.values():
            if info.topic_id == topic_id:
                return info.name
        return None

    # -- coordinators -------------------------------------------------------------------------
    def coordinator(self, key: str, key_type: int, *, timeout_ms: float | None = None) -> BrokerConnection:
        """The connection to the coordinator of a group (key_type 0) or transactional id (1)."""
        node = self._coordinators.get((key_type, key))
        if node is not None:
            try:
                return self.connection(node)
            except KafkaConnectionError:
                self._coordinators.pop((key_type, key), None)
        last: KafkaError = KafkaTimeoutError(f"no coordinator for {key!r}")
        for _ in Deadline(timeout_ms if timeout_ms is not None else self.metadata_timeout_ms,
                          self.retry_backoff_ms):
            try:
                node, host, port = self._find_coordinator(key, key_type)
            except KafkaError as exc:
                if not exc.retriable:
                    raise
                last = exc
                continue
            self.brokers.setdefault(node, (host, port))
            self._coordinators[(key_type, key)] = node
            try:
                return self.connection(node)
            except KafkaConnectionError as exc:
                last = exc
        raise last

    def forget_coordinator(self, key: str, key_type: int) -> None:
        self._coordinators.pop((key_type, key), None)

    def _find_coordinator(self, key: str, key_type: int) -> tuple[int, str, int]:
        conn = self.any_connection()
        version = conn.version(FIND_COORDINATOR)
        resp = conn.request(FIND_COORDINATOR, {"key": key, "key_type": key_type,
                                               "coordinator_keys": [key]}, version=version)
        if version >= 4:
            c = resp.coordinators[0]
            err, node, host, port, msg = c.error_code, c.node_id, c.host, c.port, c.error_message
        else:
            err, node, host, port = resp.error_code, resp.node_id, resp.host, resp.port
            msg = getattr(resp, "error_message", None)
        if err != ErrorCode.none:
            raise KafkaError(err, msg or f"FindCoordinator({key!r})")
        return node, host, port

