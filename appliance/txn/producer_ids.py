"""Producer-id allocation: ids are never handed out twice, across restarts included.

Owned by the coordinator worker. Ids are reserved in blocks (as Kafka's ProducerIdManager does):
before the first id of a block is given out, the end of the block is written durably to
``<coordinator dir>/producer-id-block`` (atomic replace + fsync). After a crash the next process
starts at that end, skipping whatever was left of the last block: ids may be skipped, never
reused (KIP-98: a producer id is unique and never reassigned).
"""

from __future__ import annotations

import os

from appliance.durable import atomic_write

BLOCK_SIZE = 1000
FILE_NAME = "producer-id-block"
MAX_PRODUCER_ID = (1 << 63) - 1


class ProducerIdManager:
    def __init__(self, directory: str, block_size: int = BLOCK_SIZE) -> None:
        self.path = os.path.join(directory, FILE_NAME)
        self.block_size = block_size
        self._next = 0
        self._end = 0          # exclusive end of the reserved block
        try:
            with open(self.path) as f:
                self._next = self._end = int(f.read().strip())
        except FileNotFoundError:
            pass

    def next_id(self) -> int:
        if self._next >= self._end:
            end = self._next + self.block_size
            if end > MAX_PRODUCER_ID:
                raise RuntimeError("producer ids exhausted")
            atomic_write(self.path, f"{end}\n".encode())      # durable before any id is used
            self._end = end
        pid = self._next
        self._next += 1
        return pid
