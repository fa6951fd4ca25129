"""The catalog as the supervisor publishes it to the other processes, and every worker's
read-only view of it.

The supervisor (which owns the catalog) writes ``<runtime dir>/catalog.msgpack`` (``publish``,
replaced atomically; tmpfs, so not fsynced) after each commit and moves the ``catalog_version``
field of its state page; a worker's ``CatalogView`` re-reads the file when that version moved.
Runs in every process.
"""

from __future__ import annotations

import msgspec

from appliance.catalog.model import Catalog, TopicInfo
from appliance.durable import atomic_write

__all__ = ["PUBLISHED_FILE", "publish", "read_published", "CatalogView"]

PUBLISHED_FILE = "catalog.msgpack"


def publish(catalog: Catalog, path: str) -> None:
    """Write the catalog for other processes (runtime dir, tmpfs: no fsync needed)."""
    atomic_write(path, msgspec.msgpack.encode(
        [catalog.version, [[t.name, t.topic_id, t.partitions, t.configs]
                           for t in catalog.topics.values()],
         catalog.broker_default, catalog.broker_node, catalog.group_configs,
         catalog.client_metrics]), sync=False)


def read_published(path: str) -> Catalog:
    with open(path, "rb") as f:
        (version, topics, broker_default, broker_node, group_configs,
         client_metrics) = msgspec.msgpack.decode(f.read())
    return Catalog(version=version, topics={
        n: TopicInfo(name=n, topic_id=i, partitions=p, configs=c) for n, i, p, c in topics},
        broker_default=broker_default, broker_node=broker_node, group_configs=group_configs,
        client_metrics=client_metrics)


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
