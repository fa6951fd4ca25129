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

from shm.metrics import MetricsTable
from shm.statepage import StatePage

from appliance.catalog.model import Catalog, TopicInfo
from appliance.supervisor.catalog_store import CatalogStore
from appliance.config import Config
from appliance.errors import ErrorCode
from appliance.runtime import SUPERVISOR, WorkerContext

from .reserve import DiskReserve

# Series each role's metrics table holds at most (frontends: requests and errors per API, and
# three counters per topic; see appliance.metrics).
TABLE_CAPACITY = {"frontend": 8192, "writer": 64, "coordinator": 128, "fetcher": 32,
                  "metrics": 16, "cleaner": 64, SUPERVISOR: 64}


@dataclass
class WorkerSpec:
    role: str
    name: str
    index: int
    heartbeat_slot: int
    entry: Callable[[WorkerContext], int | None]
    topic: TopicInfo | None = None
    pid: int | None = None
    generation: int = 0
    started_at: float = 0.0
    next_start: float = 0.0
    deaths: collections.deque = field(default_factory=collections.deque)
    removed: bool = False       # topic deleted: do not restart
    page: StatePage | None = None
    metrics: MetricsTable | None = None     # writers: read for the recovery progress
    # The workers forked as one process with this one (itself included; set by _spawn): writers
    # sharing a writer host ([topics] partitions_per_writer > 1); a lone worker's group is [it].
    group: list = field(default_factory=list)


class ProcessTable(Protocol):
    """What topic administration uses of the supervisor: the writers of the catalog's partitions
    (added, forked, stopped, forgotten), the files kept for the workers and tools, and the shared
    resources the supervisor owns (the catalog store, the disk reserve, the configuration)."""

    cfg: Config                     # the running configuration (a reload replaces it)
    store: CatalogStore         # the topic catalog, committed here
    reserve: DiskReserve            # the data dir's disk reserve
    processes_changed: bool         # processes.json is behind the table

    def room_problem(self, new: int) -> tuple[ErrorCode, str] | None:
        """Whether ``new`` more partitions fit this machine (``memory.room_problem`` with the
        supervisor's frontends, runtime dir and produce rings)."""

    def add_writer(self, topic: TopicInfo, partition: int) -> WorkerSpec:
        """A row for the writer of a new partition, with its rings and pages made (OSError when
        the runtime dir has no room: nothing of it is left)."""

    def spawn_writers(self, specs: list[WorkerSpec]) -> None:
        """Fork the writers added (alone, or ``partitions_per_writer`` to a writer host)."""

    def forget_worker(self, spec: WorkerSpec) -> None:
        """Remove a worker that never ran from the table, with its runtime-dir files."""

    def writer_ready(self, spec: WorkerSpec) -> bool:
        """Whether the writer's current generation runs and is READY."""

    def topic_grown(self, topic: TopicInfo) -> None:
        """The topic has more partitions: its writers restart with this view of it."""

    def stop_writers(self, topic: TopicInfo) -> list[WorkerSpec]:
        """SIGTERM the writers of a deleted topic, never to be restarted; returns them."""

    def remove_workers(self, specs: list[WorkerSpec]) -> None:
        """Remove stopped workers (a deleted topic's writers) from the table, with their
        runtime-dir files."""

    def write_processes(self) -> None:
        """Rewrite processes.json (for operators and tools) from the table."""

    def publish_catalog(self, catalog: Catalog) -> None:
        """Write ``catalog`` where the workers read it (OSError on a full runtime dir)."""

    def catalog_published(self, version: int) -> None:
        """The workers may follow catalog ``version``: the supervisor's page shows it, the
        writers are woken, systemd's STATUS= line is current."""

    def io_trouble(self, what: str, problem: str | None) -> None:
        """Report a failing write of ``what`` (None: it works again), logged once."""
