"""Which writer process carries which partition: the assignment the supervisor publishes beside
the catalog (docs/architecture.md, "Writer processes and their rings").

Owned by the supervisor (its placement decides, ``appliance.supervisor.placement``), which writes
``<runtime dir>/assignment.msgpack`` (``publish``, replaced atomically; tmpfs, not fsynced) and
moves the ``assignment_version`` field of its page; every other process reads it through an
``AssignmentView``, which re-reads the file when that version moved. A writer process opens the
partitions assigned to it and closes those no longer assigned; frontends, the coordinator and the
cleaners find a partition's process here (``process_of``).

The assignment is not durable: a start lays the catalog out again from scratch.
"""

from __future__ import annotations

import msgspec

from appliance.durable import atomic_write

__all__ = ["ASSIGNMENT_FILE", "Assignment", "PartitionKey", "publish", "read_published",
           "AssignmentView"]

ASSIGNMENT_FILE = "assignment.msgpack"

PartitionKey = tuple[bytes, int]          # (topic id, partition index)


class Assignment:
    """An immutable snapshot: each writer process's partitions, as (topic id, topic name,
    partition index), in the order the process opens them, and the reverse map."""

    __slots__ = ("version", "processes", "_of")

    def __init__(self, version: int = 0,
                 processes: dict[str, list[tuple[bytes, str, int]]] | None = None) -> None:
        self.version = version
        self.processes: dict[str, list[tuple[bytes, str, int]]] = processes or {}
        self._of: dict[PartitionKey, str] = {
            (tid, p): proc for proc, parts in self.processes.items() for tid, _, p in parts}

    def process_of(self, topic_id: bytes, partition: int) -> str | None:
        """The writer process that carries the partition (None: none does, or not yet)."""
        return self._of.get((topic_id, partition))

    def partitions_of(self, process: str) -> list[tuple[bytes, str, int]]:
        return self.processes.get(process, [])

    def __len__(self) -> int:
        return len(self._of)


def publish(assignment: Assignment, path: str) -> None:
    atomic_write(path, msgspec.msgpack.encode(
        [assignment.version, [[proc, [list(x) for x in parts]]
                              for proc, parts in assignment.processes.items()]]), sync=False)


def read_published(path: str) -> Assignment:
    with open(path, "rb") as f:
        version, processes = msgspec.msgpack.decode(f.read())
    return Assignment(version, {proc: [(bytes(t), n, p) for t, n, p in parts]
                                for proc, parts in processes})


class AssignmentView:
    """A worker's read-only view; reloads when the supervisor's page shows a new version."""

    def __init__(self, path: str, version_source) -> None:
        self.path = path
        self._version_source = version_source   # callable -> current published version
        self.assignment = Assignment()
        self._seen = -1

    def get(self) -> Assignment:
        v = self._version_source()
        if v != self._seen:
            try:
                self.assignment = read_published(self.path)
            except FileNotFoundError:
                return self.assignment
            self._seen = v
        return self.assignment
