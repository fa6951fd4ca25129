"""The topic catalog's model: which topics exist, their ids, partition counts and config
overrides, and the dynamic broker configs (Kafka's KIP-226: the cluster-wide default and this
node's), kept apart from the static ``[log]`` settings of the TOML file, as Kafka keeps them apart
from server.properties; and the house's names for topics (Kafka's internal topics, the topic-name
rules, topic ids).

Owns nothing: immutable snapshots (``Catalog``) that the supervisor commits and publishes
(``appliance.supervisor.catalog_store``, ``appliance.catalog.view``) and every process reads.
"""

from __future__ import annotations

import base64
import re
import uuid

import msgspec

from appliance.errors import ErrorCode, KafkaError
from appliance.config import LogConfig
from appliance.topic_config import LogSettings, dynamic_log_defaults

__all__ = ["TopicInfo", "Catalog", "OFFSETS_TOPIC", "TRANSACTION_STATE_TOPIC", "INTERNAL_TOPICS",
           "MAX_TOPIC_NAME", "check_topic_name", "new_topic_id", "uuid_to_kafka_str",
           "kafka_str_to_uuid", "partition_metadata"]

_LEGAL = re.compile(r"^[a-zA-Z0-9._-]+$")
MAX_TOPIC_NAME = 249
# Kafka's internal topics. __consumer_offsets: its partitions are what the transaction coordinator
# adds to transactions for TxnOffsetCommit, and its markers the coordinator applies to its own
# group log; neither is a log of partitions here (the coordinator keeps both, __coordinator/).
OFFSETS_TOPIC = "__consumer_offsets"
TRANSACTION_STATE_TOPIC = "__transaction_state"
INTERNAL_TOPICS = frozenset({OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC})


class TopicInfo(msgspec.Struct, frozen=True):
    name: str
    topic_id: bytes          # 16 bytes
    partitions: int
    configs: dict[str, str] = {}


class Catalog:
    """An immutable snapshot: topics by name and by id, the dynamic broker configs (Kafka names:
    ``broker_default`` for the cluster-wide default resource, ``broker_node`` for this node's),
    and the version it was published as."""

    __slots__ = ("version", "topics", "broker_default", "broker_node", "group_configs",
                 "client_metrics", "_by_id",
                 "_overrides", "_settings")

    def __init__(self, version: int = 0, topics: dict[str, TopicInfo] | None = None,
                 broker_default: dict[str, str] | None = None,
                 broker_node: dict[str, str] | None = None,
                 group_configs: dict[str, dict[str, str]] | None = None,
                 client_metrics: dict[str, dict[str, str]] | None = None) -> None:
        self.version = version
        self.topics: dict[str, TopicInfo] = topics or {}
        self.broker_default: dict[str, str] = broker_default or {}
        self.broker_node: dict[str, str] = broker_node or {}
        # KIP-848 group configs set on GROUP resources (appliance.group_config): group -> configs
        self.group_configs: dict[str, dict[str, str]] = group_configs or {}
        # KIP-714 CLIENT_METRICS resources (appliance.metrics.client_metrics_config): the
        # telemetry subscriptions, name -> configs (metrics, interval.ms, match)
        self.client_metrics: dict[str, dict[str, str]] = client_metrics or {}
        self._by_id: dict[bytes, TopicInfo] = {t.topic_id: t for t in self.topics.values()}
        self._overrides: dict[str, dict[str, str]] = {}
        self._settings: dict[str, tuple[LogConfig, LogSettings]] = {}

    def by_id(self, topic_id: bytes) -> TopicInfo | None:
        return self._by_id.get(topic_id)

    def overrides(self, topic: TopicInfo) -> dict[str, str]:
        """The topic configs that differ from the static ``[log]`` settings: the dynamic broker
        defaults (cluster-wide, then this node's) under their topic names, then the topic's own
        (Kafka's precedence). Cached per snapshot: produce looks it up per batch."""
        got = self._overrides.get(topic.name)
        if got is None:
            got = {**dynamic_log_defaults(self), **topic.configs}
            self._overrides[topic.name] = got
        return got

    def settings(self, topic: TopicInfo, log_cfg: LogConfig) -> LogSettings:
        """The topic's effective ``LogSettings``: ``[log]`` (``log_cfg``, the running
        configuration's) under ``overrides(topic)``. What every process asks (the writer, its
        cleaner, the fetchers, produce's checks), computed once per snapshot, topic and
        configuration (a reload brings a new ``log_cfg``)."""
        got = self._settings.get(topic.name)
        if got is None or got[0] is not log_cfg:
            got = self._settings[topic.name] = (log_cfg, LogSettings.from_config(log_cfg, self.overrides(topic)))
        return got[1]

    def partition_count(self) -> int:
        return sum(t.partitions for t in self.topics.values())


def uuid_to_kafka_str(topic_id: bytes) -> str:
    """Kafka's Uuid.toString(): URL-safe base64 without padding."""
    return base64.urlsafe_b64encode(topic_id).decode().rstrip("=")


def kafka_str_to_uuid(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def new_topic_id() -> bytes:
    # Kafka never hands out the zero id nor ids whose string form starts with '-'.
    while True:
        b = uuid.uuid4().bytes
        if uuid_to_kafka_str(b)[0] != "-":
            return b


def check_topic_name(name: str) -> None:
    """Kafka's Topic.validate rules; INVALID_TOPIC_EXCEPTION otherwise."""
    if not name:
        raise KafkaError(ErrorCode.invalid_topic_exception, "Topic name is illegal, it can't be empty")
    if name in (".", ".."):
        raise KafkaError(ErrorCode.invalid_topic_exception, "Topic name cannot be \".\" or \"..\"")
    if len(name) > MAX_TOPIC_NAME:
        raise KafkaError(ErrorCode.invalid_topic_exception,
                         f"Topic name is illegal, it can't be longer than {MAX_TOPIC_NAME} characters")
    if not _LEGAL.match(name):
        raise KafkaError(ErrorCode.invalid_topic_exception,
                         f"Topic name \"{name}\" is illegal, it contains a character other than "
                         "ASCII alphanumerics, '.', '_' and '-'")


def partition_metadata(topic_id: bytes) -> bytes:
    """Kafka's ``partition.metadata`` of a partition of topic ``topic_id``: ``version: 0`` /
    ``topic_id: <base64url id>``, so that a directory can be matched to its topic."""
    return f"version: 0\ntopic_id: {uuid_to_kafka_str(topic_id)}\n".encode()
