"""What a cleaner process asks a partition writer (ring cleaner -> writer, answered on the ring
writer -> cleaner; envelopes of ``appliance.ipc``).

Defined here, next to the cleaner that sends them; served by the partition's writer
(``appliance.log.partition.Partition``, ``@serves``, and ``workers/partition_writer.py``), which
owns the partition's files and producer state.

- ``CleanerBeginRequest``: a round starts. The writer removes ``.cleaned`` files no swap of its
  own named (a cleaner that died while writing one), and answers the last records of its
  producers that have not expired (Kafka's lastRecordsOfActiveProducers): packed, ``cursor`` to
  page through more than one answer holds.
- ``CleanerSwapRequest``: swap the copies ``<base>.*.cleaned`` in for their groups of old
  segments, in one commit (``appliance.log.swap``); ``checkpoint`` >= 0 with a round's last
  groups (the next round's first dirty offset).
"""

from __future__ import annotations

import struct

from appliance.errors import ErrorCode
from appliance.ipc import Message, Request

__all__ = ["CleanerBeginRequest", "CleanerBeginResult", "CleanerSwapRequest",
           "CleanerSwapResult", "PRODUCER", "pack_producers", "unpack_producers"]

# One producer: id, last data offset (-1: none since its epoch changed), epoch.
PRODUCER = struct.Struct(">qqh")
# Producers in one answer: well inside half of the smallest ring (shm.small_ring_bytes >= 4 KiB
# records must fit in half a ring; 1 MiB by default).
PRODUCERS_PER_ANSWER = 8192


class CleanerBeginResult(Message):
    error: ErrorCode
    producers: bytes = b""          # PRODUCER entries
    next_cursor: int = -1           # ask again from this producer id; -1: that was all


class CleanerBeginRequest(Request):
    cursor: int = -1                # -1: a new round (and its clean-up); else the next page
    topic_id: bytes = b""           # the partition (its writer process carries many)
    partition: int = -1

    def error_reply(self, code: ErrorCode) -> CleanerBeginResult:
        return CleanerBeginResult(code)


class CleanerSwapResult(Message):
    error: ErrorCode
    message: str = ""


class CleanerSwapRequest(Request):
    # (copy's base offset, [(base offset, inode, size) of each segment it replaces]) per group
    groups: list[tuple[int, list[tuple[int, int, int]]]]
    checkpoint: int = -1
    topic_id: bytes = b""           # the partition (its writer process carries many)
    partition: int = -1

    def error_reply(self, code: ErrorCode) -> CleanerSwapResult:
        return CleanerSwapResult(code)


def pack_producers(items: list[tuple[int, int, int]]) -> bytes:
    return b"".join(PRODUCER.pack(*x) for x in items)


def unpack_producers(data: bytes) -> list[tuple[int, int, int]]:
    return list(PRODUCER.iter_unpack(data))
