"""The supervisor's process table: a row per worker (``WorkerSpec``), the capacity of each role's
metrics table, and ``ProcessTable``, what topic administration may do to the table.

Runs in the supervisor only. The ``Supervisor`` (``appliance.supervisor.supervisor``) owns the
table (its ``workers``, ``by_pid`` and free heartbeat slots) and implements ``ProcessTable``;
``TopicAdmin`` (``appliance.supervisor.topic_admin``) receives it as that interface and changes
the table only through its methods, single-threaded, in the supervisor's loop.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Callable, Protocol

from shm.statepage import StatePage

from appliance.catalog.model import Catalog, TopicInfo
from appliance.supervisor.catalog_store import CatalogStore
from appliance.config import Config
from appliance.errors import ErrorCode
from appliance.runtime import SUPERVISOR, WorkerContext

from .reserve import DiskReserve

# Series each role's metrics table holds at most (frontends: requests and errors per API, and
# three counters per topic; see appliance.metrics).
TABLE_CAPACITY = {"frontend": 8192, "writer": 16, "coordinator": 128, "fetcher": 32,
                  "metrics": 16, "console": 16, "cleaner": 64, SUPERVISOR: 64}


@dataclass(eq=False)
class WorkerSpec:
    role: str
    name: str
    index: int
    heartbeat_slot: int
    entry: Callable[[WorkerContext], int | None]
    pid: int | None = None
    generation: int = 0
    started_at: float = 0.0
    next_start: float = 0.0
    deaths: collections.deque = field(default_factory=collections.deque)
    removed: bool = False       # a writer process left without partitions: do not restart
    page: StatePage | None = None
    # A writer process: the partitions it carries (``writers.PartitionEntry``), in the order it
    # opens them.
    partitions: list = field(default_factory=list)


class ProcessTable(Protocol):
    """What topic administration uses of the supervisor: the partitions of the catalog and the
    writer processes that carry them (added, started, taken off, released), the files kept for
    the workers and tools, and the shared resources the supervisor owns (the catalog store, the
    disk reserve, the configuration)."""

    cfg: Config                     # the running configuration (a reload replaces it)
    store: CatalogStore             # the topic catalog, committed here
    reserve: DiskReserve            # the data dir's disk reserve
    processes_changed: bool         # processes.json is behind the table

    def room_problem(self, new: int) -> tuple[ErrorCode, str] | None:
        """Whether ``new`` more partitions fit this machine (``memory.room_problem`` with the
        writer processes they would need, the supervisor's frontends, runtime dir and rings)."""

    def add_partition(self, topic: TopicInfo, partition: int):
        """A row for a new partition, placed on a writer process (a new one, made but not yet
        forked, when the placement says so), with its page and metrics table made (OSError when
        the runtime dir has no room: nothing of it is left)."""

    def start_partitions(self, entries: list) -> None:
        """Publish the assignment with the partitions added, and fork the new writer processes
        among theirs (existing ones open their new partitions from the assignment)."""

    def forget_partition(self, entry) -> None:
        """Take back a partition that never ran (its commit failed), with its files."""

    def partition_ready(self, entry) -> bool:
        """Whether the partition is open (READY) in its writer process's current generation."""

    def topic_grown(self, topic: TopicInfo) -> None:
        """The topic has more partitions: the table's rows see the new count."""

    def stop_partitions(self, topic: TopicInfo) -> list:
        """Take a deleted topic's partitions off their writer processes (the assignment is
        published without them; processes left with none are stopped); returns their rows."""

    def partition_stopped(self, entry) -> bool:
        """Whether a removed partition has been closed by its process."""

    def release_partitions(self, entries: list) -> None:
        """Remove closed partitions' files, and the stopped processes left with none."""

    def write_processes(self) -> None:
        """Rewrite processes.json (for operators and tools) from the table."""

    def publish_catalog(self, catalog: Catalog) -> None:
        """Write ``catalog`` where the workers read it (OSError on a full runtime dir)."""

    def catalog_published(self, version: int) -> None:
        """The workers may follow catalog ``version``: the supervisor's page shows it, the
        writers are woken, systemd's STATUS= line is current."""

    def io_trouble(self, what: str, problem: str | None) -> None:
        """Log a failing write once, and once more when it works again."""
