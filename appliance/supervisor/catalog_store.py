"""The supervisor's durable topic catalog (``CatalogStore``): ``<data_dir>/catalog.json``,
replaced atomically (write, fsync, rename, fsync the directory), the commit point of
CreateTopics, DeleteTopics, CreatePartitions and AlterConfigs; and the partitions' directories
with Kafka's ``partition.metadata`` file (``version: 0`` / ``topic_id: <base64url id>``), so that
a directory can be matched to its topic the way Kafka does.

Runs in the supervisor only, single-threaded; the other processes read the published copy
(``appliance.catalog.view``).
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Iterable

import msgspec

from appliance.catalog.model import (Catalog, TopicInfo, kafka_str_to_uuid, partition_metadata,
                                     uuid_to_kafka_str)
from appliance.data_layout import CATALOG_FILE, PARTITION_METADATA_FILE, partition_dir
from appliance.durable import atomic_write, verify_checksum, with_checksum
from appliance.runtime import DataDirUnusable

__all__ = ["CatalogStore"]


class CatalogStore:
    """The supervisor's durable catalog. Single-threaded, supervisor process only."""

    def __init__(self, data_dir: str) -> None:
        self.data_dir = data_dir
        self.catalog = Catalog()

    def load(self) -> Catalog:
        """The committed catalog. A file that cannot be read, does not parse or does not match
        its checksum stops the start (DataDirUnusable, exit 3) before anything acts on it: the
        sweep below removes partition directories the catalog does not name, so a topic name
        with a flipped bit would delete that topic's data."""
        path = os.path.join(self.data_dir, CATALOG_FILE)
        if os.path.exists(path):
            try:
                with open(path, "rb") as f:
                    raw = verify_checksum(json.load(f))
                topics = {
                    name: TopicInfo(name=name, topic_id=kafka_str_to_uuid(t["id"]),
                                    partitions=int(t["partitions"]),
                                    configs=dict(t.get("configs", {})))
                    for name, t in raw.get("topics", {}).items()
                }
                broker = raw.get("broker_configs", {})
                self.catalog = Catalog(version=int(raw.get("version", 0)), topics=topics,
                                       broker_default=dict(broker.get("default", {})),
                                       broker_node=dict(broker.get("node", {})),
                                       group_configs={g: dict(c) for g, c
                                                      in raw.get("group_configs", {}).items()},
                                       client_metrics={n: dict(c) for n, c
                                                       in raw.get("client_metrics", {}).items()})
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
                raise DataDirUnusable(f"the topic catalog {path} cannot be read: {e}; restore it "
                                      "from a backup (nothing in the data dir was changed)") from None
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
            "group_configs": catalog.group_configs,
            "client_metrics": catalog.client_metrics,
        }
        data = json.dumps(with_checksum(raw), indent=1, sort_keys=True).encode()
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
              broker_node=None, group_configs=None, client_metrics=None) -> Catalog:
        c = self.catalog
        return Catalog(version=c.version + 1, topics=c.topics if topics is None else topics,
                       broker_default=c.broker_default if broker_default is None else broker_default,
                       broker_node=c.broker_node if broker_node is None else broker_node,
                       group_configs=c.group_configs if group_configs is None else group_configs,
                       client_metrics=c.client_metrics if client_metrics is None else client_metrics)

    def _make_dirs(self, t: TopicInfo, partitions: Iterable[int]) -> list[str]:
        """The partitions' directories with their partition.metadata; returns the directories."""
        made = []
        for p in partitions:
            d = partition_dir(self.data_dir, t.name, p)
            os.makedirs(d, exist_ok=True)
            made.append(d)
            # Not fsynced here: the catalog's commit is the durable point (its directory fsync
            # keeps the new directories), and the partition's writer writes the file again,
            # fsynced, when it finds it missing (workers/partition_writer.py); two fsyncs a
            # partition were a third of a CreateTopics of ten thousand.
            atomic_write(os.path.join(d, PARTITION_METADATA_FILE),
                         partition_metadata(t.topic_id), sync=False)
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
                    broker_node: dict[str, str] | None = None,
                    group_configs: dict[str, dict[str, str]] | None = None,
                    client_metrics: dict[str, dict[str, str]] | None = None) -> Catalog:
        """AlterConfigs: commit new override sets (whole sets: name -> configs; None = unchanged;
        a group or a client metrics resource whose set is empty is dropped)."""
        new = dict(self.catalog.topics)
        for name, configs in topic_configs.items():
            new[name] = msgspec.structs.replace(new[name], configs=dict(configs))
        groups = None
        if group_configs:
            groups = dict(self.catalog.group_configs)
            for g, configs in group_configs.items():
                if configs:
                    groups[g] = dict(configs)
                else:
                    groups.pop(g, None)
        metrics = None
        if client_metrics:
            metrics = dict(self.catalog.client_metrics)
            for n, configs in client_metrics.items():
                if configs:
                    metrics[n] = dict(configs)
                else:
                    metrics.pop(n, None)
        self._save(self._next(new, broker_default, broker_node, groups, metrics))
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


def _remove_dirs(dirs: list[str]) -> None:
    """Directories of a change that was not committed: taken away now rather than at the next
    start's sweep (they hold blocks a full disk needs)."""
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)
