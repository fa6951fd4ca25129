"""The supervisor's table of partitions and the writer processes that carry them (issue 32,
docs/architecture.md "Writer processes and their rings").

Runs in the supervisor only, single-threaded. ``WriterTable`` owns each partition's row
(``PartitionEntry``: its topic, its state page and metrics table in the runtime dir, the writer
process that carries it), where new partitions go (``placement.place``), and the published
assignment (``appliance.catalog.assignment``: the file, and ``assignment_version`` on the
supervisor's page). The writer processes themselves are rows of the supervisor's process table
(``WorkerSpec``, role ``writer``): the supervisor makes them (rings, process page, ready map) and
forks them; this table asks it for a new one through ``new_process``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable

from shm.metrics import MetricsTable
from shm.statepage import StatePage
from shm.topology import Topology

from appliance.catalog.assignment import ASSIGNMENT_FILE, Assignment, publish
from appliance.catalog.model import TopicInfo
from appliance.runtime import PARTITION_PAGE_FIELDS, READY, STOPPED, writer_name

from .placement import place, process_budget

log = logging.getLogger("appliance.supervisor")

# Series a partition's own metrics table holds (appliance.metrics: its log size and segments,
# its topic's messages and bytes in, its producers, its recovery, its flush histogram).
PARTITION_TABLE_CAPACITY = 32


@dataclass(eq=False)
class PartitionEntry:
    """A partition's row. Its page and metrics table are files the supervisor made; it does not
    keep them open (ten thousand partitions would be twenty thousand descriptors: every mapping
    holds one), but opens them when it looks (``read``, ``metrics``)."""
    topic: TopicInfo
    index: int
    name: str                       # writer_name: its page and metrics table
    process: object                 # the WorkerSpec of the writer process that carries it
    topo: Topology
    removed: bool = False           # its topic was deleted: waiting for its process to close it
    ready_seen: int = 0             # the process generation it was last seen READY in

    def read(self):
        """Its state page now."""
        with StatePage.open(self.topo.page_path(self.name), PARTITION_PAGE_FIELDS,
                            readonly=True) as page:
            return page.read()

    def metrics(self) -> MetricsTable:
        """Its metrics table, open (the caller closes it)."""
        return MetricsTable.open(self.topo.metrics_path(self.name), readonly=True)


@dataclass
class WriterTable:
    topo: Topology
    new_process: Callable[[], object]              # the supervisor makes a writer process row
    forget_worker: Callable[[object], None]        # and takes one that never ran away again
    publish_version: Callable[[int], None]         # assignment_version on the supervisor's page
    budget: int = 4
    per_writer: int = 1
    partitions: dict[tuple[bytes, int], PartitionEntry] = field(default_factory=dict)
    version: int = 0
    processes: list = field(default_factory=list)  # the writer process rows, in creation order

    def configure(self, writer_processes: int, per_writer: int) -> None:
        """``topics.writer_processes`` (0: four per core) and ``topics.partitions_per_writer``."""
        self.budget = process_budget(writer_processes)
        self.per_writer = per_writer

    # -- placement --------------------------------------------------------------------------------
    def live_processes(self) -> list:
        return [s for s in self.processes if not s.removed]

    def new_processes_for(self, n: int) -> int:
        """How many new writer processes ``n`` more partitions would need (for the memory check)."""
        live = self.live_processes()
        counts = {s.name: len(s.partitions) for s in live}
        names = {s.name for s in live}
        return len({t for t in place(counts, n, self.budget, self.per_writer) if t not in names})

    def add(self, topic: TopicInfo, index: int) -> PartitionEntry:
        """A row for a new partition on the process the placement names (a new process row when
        it names none), with its page and metrics table made (OSError when the runtime dir has
        no room: nothing of it is left). Not published until ``publish``."""
        live = self.live_processes()
        counts = {s.name: len(s.partitions) for s in live}
        target = place(counts, 1, self.budget, self.per_writer)[0]
        spec = next((s for s in live if s.name == target), None)
        if spec is None:
            spec = self.new_process()
            self.processes.append(spec)
        name = writer_name(topic.topic_id, index)
        try:
            StatePage.create(self.topo.page_path(name), PARTITION_PAGE_FIELDS).close()
            MetricsTable.create(self.topo.metrics_path(name), PARTITION_TABLE_CAPACITY).close()
        except OSError:
            self.topo.remove_endpoint(name)
            if not spec.partitions and spec.pid is None and spec.generation == 0:
                self.forget_process(spec)
            raise
        entry = PartitionEntry(topic, index, name, spec, self.topo)
        spec.partitions.append(entry)
        self.partitions[(topic.topic_id, index)] = entry
        return entry

    def forget(self, entry: PartitionEntry) -> None:
        """Take back a partition that never ran (its commit failed), with its files; a process
        row made for it alone goes too."""
        self._drop(entry)
        spec = entry.process
        if not spec.partitions and spec.pid is None and spec.generation == 0:
            self.forget_process(spec)

    def forget_process(self, spec) -> None:
        if spec in self.processes:
            self.processes.remove(spec)
        self.forget_worker(spec)

    def _drop(self, entry: PartitionEntry) -> None:
        self.partitions.pop((entry.topic.topic_id, entry.index), None)
        if entry in entry.process.partitions:
            entry.process.partitions.remove(entry)
        self.topo.remove_endpoint(entry.name)

    # -- the published assignment -----------------------------------------------------------------
    def snapshot(self) -> Assignment:
        return Assignment(self.version, {
            s.name: [(e.topic.topic_id, e.topic.name, e.index) for e in s.partitions]
            for s in self.live_processes()})

    def publish(self) -> None:
        """Write the assignment (a new version) where the writer processes read it, then show
        its version on the page (OSError on a full runtime dir: the version does not move)."""
        self.version += 1
        publish(self.snapshot(), self.topo.file_path(ASSIGNMENT_FILE))
        self.publish_version(self.version)

    # -- readiness ----------------------------------------------------------------------------------
    def ready(self, entry: PartitionEntry) -> bool:
        """Whether the partition is open in its process's current generation."""
        if entry.removed:
            # Deleted while its create waited (a DeleteTopics right after the CreateTopics): not
            # waited for; its page may be gone already, and reading it killed the supervisor.
            return True
        spec = entry.process
        if spec.pid is None:
            return False
        if entry.ready_seen == spec.generation:
            return True              # seen READY in this generation: a page read less per look
        st = entry.read()
        if st.status == READY and st.generation == spec.generation:
            entry.ready_seen = spec.generation
            return True
        return False

    def remove_topic(self, topic: TopicInfo) -> list[PartitionEntry]:
        """Take a deleted topic's partitions off their processes (``publish`` tells them);
        returns their rows, to wait for ``stopped``. Processes left without a partition are
        returned by ``emptied``."""
        out = []
        for p in range(topic.partitions):
            entry = self.partitions.pop((topic.topic_id, p), None)
            if entry is None:
                continue
            entry.removed = True
            if entry in entry.process.partitions:
                entry.process.partitions.remove(entry)
            out.append(entry)
        return out

    def emptied(self) -> list:
        """Live writer processes that carry no partition any more."""
        return [s for s in self.live_processes() if not s.partitions]

    def stopped(self, entry: PartitionEntry) -> bool:
        """Whether a removed partition's process has closed it (or no longer runs the
        generation that had it open)."""
        spec = entry.process
        if spec.pid is None:
            return True
        st = entry.read()
        return st.status == STOPPED or st.generation != spec.generation

    def release(self, entries: list[PartitionEntry]) -> None:
        """Remove closed partitions' rows and files."""
        for e in entries:
            self.topo.remove_endpoint(e.name)

    def topic_grown(self, topic: TopicInfo) -> None:
        for e in self.partitions.values():
            if e.topic.topic_id == topic.topic_id:
                e.topic = topic
