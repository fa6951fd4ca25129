"""The topic catalog: which topics exist, their ids, partition counts and config overrides, and
the dynamic broker configs (Kafka's KIP-226: the cluster-wide default and this node's), kept apart
from the static ``[log]`` settings of the TOML file, as Kafka keeps them apart from
server.properties.

Owned (read-write) by the supervisor alone. It is durable as ``<data_dir>/catalog.json`` (replaced
atomically: write, fsync, rename, fsync the directory), which is the commit point of CreateTopics
DeleteTopics, CreatePartitions and AlterConfigs. Each partition directory ``<data_dir>/<topic>-<partition>/`` also holds Kafka's
``partition.metadata`` file (``version: 0`` / ``topic_id: <base64url id>``) so that a directory can
be matched to its topic the way Kafka does.

Other processes read the catalog as published by the supervisor in the runtime directory
(``catalog.msgpack``, replaced atomically) and notice changes through the ``catalog_version`` field
of the supervisor's state page (``CatalogView``). Frontends ask the supervisor to change it with
``CreateTopicsRequest``, ``DeleteTopicsRequest``, ``CreatePartitionsRequest`` and
``AlterConfigsRequest`` (ring messages, defined here next to the catalog they change; the
supervisor serves them, ``appliance.supervisor.topic_admin``).

The names of the data directory's internal places are here too: ``COORDINATOR_DIR`` (the
coordinator worker's directory) and the internal topics (``OFFSETS_TOPIC``: Kafka's
``__consumer_offsets``, whose partitions the transaction coordinator adds to transactions and
whose markers the coordinator applies to its own group log).
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import uuid
from typing import Iterable

import msgspec

from .errors import ErrorCode, KafkaError
from .ipc import Message, Request
from appliance.durable import atomic_write
from .topic_config import dynamic_log_defaults

CATALOG_FILE = "catalog.json"
PUBLISHED_FILE = "catalog.msgpack"
_LEGAL = re.compile(r"^[a-zA-Z0-9._-]+$")
MAX_TOPIC_NAME = 249
OFFSETS_TOPIC = "__consumer_offsets"
TRANSACTION_STATE_TOPIC = "__transaction_state"
INTERNAL_TOPICS = frozenset({OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC})
PARTITION_METADATA_FILE = "partition.metadata"   # Kafka's: the topic id in each partition dir
COORDINATOR_DIR = "__coordinator"        # <data_dir>/__coordinator/, the coordinator worker's
GROUP_LOG_DIR = "group-log"              # __coordinator/group-log/: the group coordinator's store


class TopicInfo(msgspec.Struct, frozen=True):
    name: str
    topic_id: bytes          # 16 bytes
    partitions: int
    configs: dict[str, str] = {}


class Catalog:
    """An immutable snapshot: topics by name and by id, the dynamic broker configs (Kafka names:
    ``broker_default`` for the cluster-wide default resource, ``broker_node`` for this node's),
    and the version it was published as."""

    __slots__ = ("version", "topics", "broker_default", "broker_node", "_by_id", "_overrides")

    def __init__(self, version: int = 0, topics: dict[str, TopicInfo] | None = None,
                 broker_default: dict[str, str] | None = None,
                 broker_node: dict[str, str] | None = None) -> None:
        self.version = version
        self.topics: dict[str, TopicInfo] = topics or {}
        self.broker_default: dict[str, str] = broker_default or {}
        self.broker_node: dict[str, str] = broker_node or {}
        self._by_id: dict[bytes, TopicInfo] = {t.topic_id: t for t in self.topics.values()}
        self._overrides: dict[str, dict[str, str]] = {}

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

    def partition_count(self) -> int:
        return sum(t.partitions for t in self.topics.values())


# -- CreateTopics / DeleteTopics: frontend -> supervisor -> frontend -------------------------------

class NewTopic(msgspec.Struct, array_like=True, frozen=True):
    name: str
    num_partitions: int
    configs: dict[str, str] = {}


class TopicResult(msgspec.Struct, array_like=True, frozen=True):
    name: str
    error_code: int
    error_message: str | None = None
    topic_id: bytes = b""
    num_partitions: int = -1
    configs: dict[str, str] = {}


class TopicsResult(Message):
    """The answer to CreateTopics and DeleteTopics: one result per topic, in request order."""
    results: list[TopicResult]


class CreateTopicsRequest(Request):
    topics: list[NewTopic]
    validate_only: bool = False

    def error_reply(self, code: ErrorCode) -> TopicsResult:
        return TopicsResult([TopicResult(t.name, int(code)) for t in self.topics])


class DeleteTopicsRequest(Request):
    names: list[str]

    def error_reply(self, code: ErrorCode) -> TopicsResult:
        return TopicsResult([TopicResult(n, int(code)) for n in self.names])


class CreatePartitionsRequest(Request):
    """Grow topics to ``counts`` partitions each (name -> new total)."""
    counts: list[tuple[str, int]]
    validate_only: bool = False

    def error_reply(self, code: ErrorCode) -> TopicsResult:
        return TopicsResult([TopicResult(n, int(code)) for n, _ in self.counts])


# IncrementalAlterConfigs operations (Kafka's AlterConfigOp.OpType ids); the legacy AlterConfigs
# replaces a resource's whole set, which the request says with ``incremental=False`` (every op SET).
OP_SET, OP_DELETE, OP_APPEND, OP_SUBTRACT = 0, 1, 2, 3
RESOURCE_TOPIC, RESOURCE_BROKER = 2, 4


class ConfigChange(msgspec.Struct, array_like=True, frozen=True):
    resource_type: int
    resource_name: str
    ops: list[tuple[int, str, str | None]]     # (op, config name, value)


class ConfigResult(msgspec.Struct, array_like=True, frozen=True):
    error_code: int
    error_message: str | None = None


class AlterConfigsResult(Message):
    results: list[ConfigResult]


class AlterConfigsRequest(Request):
    """AlterConfigs and IncrementalAlterConfigs of topic and broker resources: validated and
    applied by the supervisor against the catalog it owns (all or nothing per resource)."""
    changes: list[ConfigChange]
    incremental: bool
    validate_only: bool = False

    def error_reply(self, code: ErrorCode) -> AlterConfigsResult:
        return AlterConfigsResult([ConfigResult(int(code))] * len(self.changes))


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


def partition_dir(data_dir: str, topic: str, partition: int) -> str:
    return os.path.join(data_dir, f"{topic}-{partition}")


class CatalogStore:
    """The supervisor's durable catalog. Single-threaded, supervisor process only."""

    def __init__(self, data_dir: str) -> None:
        self.data_dir = data_dir
        self.catalog = Catalog()

    def load(self) -> Catalog:
        path = os.path.join(self.data_dir, CATALOG_FILE)
        if os.path.exists(path):
            with open(path, "rb") as f:
                raw = json.load(f)
            topics = {
                name: TopicInfo(name=name, topic_id=kafka_str_to_uuid(t["id"]),
                                partitions=int(t["partitions"]), configs=dict(t.get("configs", {})))
                for name, t in raw.get("topics", {}).items()
            }
            broker = raw.get("broker_configs", {})
            self.catalog = Catalog(version=int(raw.get("version", 0)), topics=topics,
                                   broker_default=dict(broker.get("default", {})),
                                   broker_node=dict(broker.get("node", {})))
        self._sweep()
        return self.catalog

    def _sweep(self) -> None:
        """Finish what a crash interrupted: remove partition dirs that the catalog does not name
        (a CreateTopics that never committed, or a DeleteTopics that committed but did not finish)."""
        wanted = {f"{t.name}-{p}" for t in self.catalog.topics.values() for p in range(t.partitions)}
        for entry in os.listdir(self.data_dir):
            full = os.path.join(self.data_dir, entry)
            if not os.path.isdir(full) or entry.startswith("."):
                continue
            if entry.endswith("-delete") or (
                    os.path.exists(os.path.join(full, PARTITION_METADATA_FILE)) and entry not in wanted):
                shutil.rmtree(full, ignore_errors=True)

    def _save(self, catalog: Catalog) -> None:
        raw = {
            "version": catalog.version,
            "topics": {t.name: {"id": uuid_to_kafka_str(t.topic_id), "partitions": t.partitions,
                                "configs": t.configs} for t in catalog.topics.values()},
            "broker_configs": {"default": catalog.broker_default, "node": catalog.broker_node},
        }
        data = json.dumps(raw, indent=1, sort_keys=True).encode()
        path = os.path.join(self.data_dir, CATALOG_FILE)
        try:
            atomic_write(path, data)
        except OSError:
            # Failed before the rename (ENOSPC, EIO): the old catalog stands, nothing changed.
            # Failed after it (the directory's fsync): the new one is what a start would read,
            # so it is the committed one, durable or not, as for any unsynced write.
            try:
                with open(path, "rb") as f:
                    committed = f.read() == data
            except OSError:
                committed = False
            if not committed:
                raise
        self.catalog = catalog

    def _next(self, topics: dict[str, TopicInfo] | None = None, broker_default=None,
              broker_node=None) -> Catalog:
        c = self.catalog
        return Catalog(version=c.version + 1, topics=c.topics if topics is None else topics,
                       broker_default=c.broker_default if broker_default is None else broker_default,
                       broker_node=c.broker_node if broker_node is None else broker_node)

    def _make_dirs(self, t: TopicInfo, partitions: Iterable[int]) -> list[str]:
        """The partitions' directories with their partition.metadata; returns the directories."""
        made = []
        for p in partitions:
            d = partition_dir(self.data_dir, t.name, p)
            os.makedirs(d, exist_ok=True)
            made.append(d)
            atomic_write(os.path.join(d, PARTITION_METADATA_FILE),
                         f"version: 0\ntopic_id: {uuid_to_kafka_str(t.topic_id)}\n".encode())
        return made

    def add_topics(self, topics: Iterable[TopicInfo]) -> Catalog:
        """Create partition dirs, then commit the catalog (the commit point)."""
        new = dict(self.catalog.topics)
        made: list[str] = []
        try:
            for t in topics:
                made += self._make_dirs(t, range(t.partitions))
                new[t.name] = t
            self._save(self._next(new))
        except OSError:
            _remove_dirs(made)
            raise
        return self.catalog

    def grow_topics(self, counts: dict[str, int]) -> list[tuple[TopicInfo, range]]:
        """CreatePartitions: make the new partitions' dirs, then commit the new counts. Returns
        each grown topic with the range of its new partition numbers (Kafka numbers new
        partitions after the existing ones). A crash before the commit leaves dirs the sweep
        removes at the next load."""
        new = dict(self.catalog.topics)
        grown = []
        made: list[str] = []
        try:
            for name, count in counts.items():
                old = new[name]
                t = msgspec.structs.replace(old, partitions=count)
                made += self._make_dirs(t, range(old.partitions, count))
                new[name] = t
                grown.append((t, range(old.partitions, count)))
            self._save(self._next(new))
        except OSError:
            _remove_dirs(made)
            raise
        return grown

    def set_configs(self, topic_configs: dict[str, dict[str, str]],
                    broker_default: dict[str, str] | None = None,
                    broker_node: dict[str, str] | None = None) -> Catalog:
        """AlterConfigs: commit new override sets (whole sets: name -> configs; None = unchanged)."""
        new = dict(self.catalog.topics)
        for name, configs in topic_configs.items():
            new[name] = msgspec.structs.replace(new[name], configs=dict(configs))
        self._save(self._next(new, broker_default, broker_node))
        return self.catalog

    def remove_topics(self, names: Iterable[str]) -> list[TopicInfo]:
        """Commit the removal. The caller stops the writers, then calls delete_dirs; a crash in
        between is finished by the sweep at the next load."""
        new = dict(self.catalog.topics)
        removed = [new.pop(n) for n in names if n in new]
        self._save(self._next(new))
        return removed

    def delete_dirs(self, topic: TopicInfo) -> None:
        for p in range(topic.partitions):
            d = partition_dir(self.data_dir, topic.name, p)
            if os.path.isdir(d):
                gone = f"{d}.{topic.topic_id.hex()}-delete"
                os.replace(d, gone)
                shutil.rmtree(gone, ignore_errors=True)


def publish(catalog: Catalog, path: str) -> None:
    """Write the catalog for other processes (runtime dir, tmpfs: no fsync needed)."""
    atomic_write(path, msgspec.msgpack.encode(
        [catalog.version, [[t.name, t.topic_id, t.partitions, t.configs]
                           for t in catalog.topics.values()],
         catalog.broker_default, catalog.broker_node]), sync=False)


def read_published(path: str) -> Catalog:
    with open(path, "rb") as f:
        version, topics, broker_default, broker_node = msgspec.msgpack.decode(f.read())
    return Catalog(version=version, topics={
        n: TopicInfo(name=n, topic_id=i, partitions=p, configs=c) for n, i, p, c in topics},
        broker_default=broker_default, broker_node=broker_node)


class CatalogView:
    """A worker's read-only view; reloads when the supervisor's page shows a new version."""

    def __init__(self, path: str, version_source) -> None:
        self.path = path
        self._version_source = version_source   # callable -> current published version
        self.catalog = Catalog()
        self._seen = -1

    def get(self) -> Catalog:
        v = self._version_source()
        if v != self._seen:
            try:
                self.catalog = read_published(self.path)
            except FileNotFoundError:
                return self.catalog
            self._seen = v
        return self.catalog


def _remove_dirs(dirs: list[str]) -> None:
    """Directories of a change that was not committed: taken away now rather than at the next
    start's sweep (they hold blocks a full disk needs)."""
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)
