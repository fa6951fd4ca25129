"""How many partitions this machine can hold: the one estimate that CreateTopics and
CreatePartitions refuse by (``room_problem``) and that the start sizes its produce rings by
(``start_ring_bytes``).

Runs in the supervisor only (``appliance.supervisor``); owns nothing. Every partition's rings get
their memory when made (tmpfs pages are memory), so creating more than fit would have the kernel's
OOM killer take the supervisor instead of a refusal.
"""

from __future__ import annotations

import logging
import os

from appliance.errors import ErrorCode
from appliance.runtime import RuntimeDirUnusable

log = logging.getLogger("appliance.supervisor")

# What one more partition costs besides its rings: its writer process's own memory (measured: 5 to
# 8 MiB of PSS, most of it the copy-on-write pages of the interpreter after the fork) and its state
# page and metrics table in the runtime dir.
WRITER_PROCESS_BYTES = 8 << 20
PARTITION_PAGES_BYTES = 64 << 10
# Memory a partition creation leaves to everything else (page cache, client connections, the other
# processes of the machine): a twentieth of the machine's memory, at least 256 MiB.
MEMORY_RESERVE_MIN = 256 << 20


def partition_cost(cfg, frontends: int, produce_ring_bytes: int | None = None) -> tuple[int, int]:
    """(runtime-dir bytes, memory bytes) one partition takes: the rings to and from every
    frontend, the coordinator and its cleaner (each given all its blocks when made, so they are
    memory of the tmpfs from the start), its pages, and its writer process. The produce rings
    are ``produce_ring_bytes`` each (the supervisor's: a start may make them smaller than
    ``shm.produce_ring_bytes``, ``start_ring_bytes``)."""
    from shm.ring import HEADER_SIZE
    produce = HEADER_SIZE + (produce_ring_bytes or cfg.shm.produce_ring_bytes)
    small = HEADER_SIZE + cfg.shm.partition_ring_bytes
    shm = frontends * (produce + small) + 4 * small + PARTITION_PAGES_BYTES
    return shm, shm + WRITER_PROCESS_BYTES


def smallest_produce_ring(cfg) -> int:
    """The smallest produce ring the configuration allows: a power of two that holds a record of
    log.message_max_bytes and its headers in half of it (``config.check``)."""
    return max(1 << (2 * (cfg.log.message_max_bytes + 65536) - 1).bit_length(), 65536)


def memory_room(run_dir: str) -> tuple[int, int]:
    """(free bytes of the runtime dir's file system, memory available to new partitions: the
    kernel's MemAvailable less the reserve)."""
    import psutil
    st = os.statvfs(run_dir)
    vm = psutil.virtual_memory()
    return st.f_bavail * st.f_frsize, vm.available - max(MEMORY_RESERVE_MIN, vm.total // 20)


def room_problem(cfg, frontends: int, run_dir: str, new: int,
                 produce_ring_bytes: int | None = None) -> tuple[ErrorCode, str] | None:
    """The one estimate of whether ``new`` more partitions fit this machine, for CreateTopics and
    CreatePartitions (which refuse what does not fit) and for the start (which makes its rings
    smaller rather than refuse a catalog that ran here: ``start_ring_bytes``):
    None when they fit, else (Kafka's error code for the refusal, why)."""
    shm, mem = partition_cost(cfg, frontends, produce_ring_bytes)
    free, available = memory_room(run_dir)
    if new * shm > free:
        return (ErrorCode.kafka_storage_error,
                f"the runtime dir has room for {free // shm} more partitions' rings "
                f"({_mib(shm)} each: shm.produce_ring_bytes per frontend and the small "
                f"rings); {new} were asked for")
    if new * mem > available:
        return (ErrorCode.policy_violation,
                f"the machine has memory for {max(available, 0) // mem} more partitions "
                f"({_mib(mem)} each: their rings, {_mib(shm)}, and writer process); "
                f"{new} were asked for")
    return None


def start_ring_bytes(cfg, frontends: int, run_dir: str, partitions: int,
                     produce_ring_bytes: int) -> int:
    """The produce rings' size for a start serving ``partitions``: ``produce_ring_bytes`` when
    they fit, else the smallest rings the configuration allows; refuse (exit 7) only when even
    those cannot be held, where making them would have the OOM killer stop the start. Each
    partition was admitted by CreateTopics or CreatePartitions with the same estimate
    (``room_problem``), which at run time counts the partitions already there by what they really
    take and here by the estimate, which is larger; a start that refused them would leave every
    acknowledged record unserved (regression: 900 partitions accepted, then exit 7 after a
    kill -9)."""
    problem = room_problem(cfg, frontends, run_dir, partitions, produce_ring_bytes)
    if problem is None:
        return produce_ring_bytes
    # The smallest rings, not the largest that would fit: a start filling the machine to the
    # estimate's limit would leave no room for the next CreateTopics.
    size = min(produce_ring_bytes, smallest_produce_ring(cfg))
    shm, _ = partition_cost(cfg, frontends, size)
    free, available = memory_room(run_dir)
    if partitions * shm > min(free, available):
        raise RuntimeDirUnusable(
            f"the catalog's {partitions} partitions need {partitions * shm >> 20} MiB of memory "
            f"for their rings even at the smallest size the configuration allows ({shm >> 20} "
            f"MiB each in the runtime dir {run_dir}, which has {free >> 20} MiB free); "
            f"the machine has {max(available, 0) >> 20} MiB available: give the machine more "
            f"memory, or the rings less (shm.produce_ring_bytes, shm.partition_ring_bytes, "
            f"log.message_max_bytes)")
    log.warning("the catalog's %d partitions do not fit this machine with produce rings of "
                "shm.produce_ring_bytes = %d (%s): starting them all with produce rings of %d "
                "bytes, as they ran here before; give the machine more memory, or the rings "
                "less, before creating more", partitions, produce_ring_bytes, problem[1],
                size)
    return size


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


