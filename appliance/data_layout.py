"""Where things lie in the data dir: the names of the supervisor's catalog file, of a partition's
directory and its Kafka ``partition.metadata`` file, and of the coordinator worker's directory.

Owns nothing; imported by every process that finds a file of the data dir (the supervisor, the
writers, the fetchers, the coordinator, the cleaners, the CLI's offline tools). The other files of
the data dir are named beside their owners (README, "Data layout", lists them all).
"""

from __future__ import annotations

import os

__all__ = ["CATALOG_FILE", "PARTITION_METADATA_FILE", "COORDINATOR_DIR", "GROUP_LOG_DIR", "SHARE_LOG_DIR",
           "partition_dir"]

CATALOG_FILE = "catalog.json"                  # the supervisor's catalog, the topics' commit point
PARTITION_METADATA_FILE = "partition.metadata"   # Kafka's: the topic id in each partition dir
COORDINATOR_DIR = "__coordinator"        # <data_dir>/__coordinator/, the coordinator worker's
GROUP_LOG_DIR = "group-log"              # __coordinator/group-log/: the group coordinator's store
SHARE_LOG_DIR = "share-state-log"        # __coordinator/share-state-log/: share partitions' state


def partition_dir(data_dir: str, topic: str, partition: int) -> str:
    return os.path.join(data_dir, f"{topic}-{partition}")
