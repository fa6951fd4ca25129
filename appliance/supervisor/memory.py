"""How many partitions this machine can hold: the one estimate that CreateTopics and
CreatePartitions refuse by (``room_problem``) and that the start sizes its produce rings by
(``start_ring_bytes``).

Runs in the supervisor only (``appliance.supervisor``); owns nothing. Rings connect writer
processes, not partitions (docs/architecture.md, "Writer processes and their rings"): a new
partition costs its pages and its objects in a writer process, and a new writer process (under the
process budget) its rings, which get their memory when made (tmpfs pages are memory), so creating
more than fit would have the kernel's OOM killer take the supervisor instead of a refusal.
"""

from __future__ import annotations

import logging
import os

from appliance.errors import ErrorCode
from appliance.runtime import RuntimeDirUnusable

log = logging.getLogger("appliance.supervisor")

# What a writer process costs besides its rings: its own memory (measured: 5 to 8 MiB of PSS,
# most of it the copy-on-write pages of the interpreter after the fork) and its pages.
WRITER_PROCESS_BYTES = 8 << 20
# What one more partition costs: its state page and metrics table in the runtime dir, and its
# objects in the writer process that carries it (the log's segment list and index maps, producer
# state; measured at 10,000 partitions, see loadtests/README.md "Ten thousand partitions").
PARTITION_PAGES_BYTES = 24 << 10
PARTITION_PROCESS_BYTES = 160 << 10
# Memory a partition creation leaves to everything else (page cache, client connections, the other
# processes of the machine): a twentieth of the machine's memory, at least 256 MiB.
MEMORY_RESERVE_MIN = 256 << 20


def process_cost(cfg, frontends: int, produce_ring_bytes: int | None = None) -> tuple[int, int]:
    """(runtime-dir bytes, memory bytes) one writer process takes: its rings to and from every
    frontend, the coordinator and its cleaner (each given all its blocks when made, so they are
    memory of the tmpfs from the start), its pages, and the process. The produce rings are
    ``produce_ring_bytes`` each (the supervisor's: a start may make them smaller than
    ``shm.produce_ring_bytes``, ``start_ring_bytes``)."""
    from shm.ring import HEADER_SIZE
    produce = HEADER_SIZE + (produce_ring_bytes or cfg.shm.produce_ring_bytes)
    small = HEADER_SIZE + cfg.shm.partition_ring_bytes
    shm = frontends * (produce + small) + 4 * small + (64 << 10)
    return shm, shm + WRITER_PROCESS_BYTES


def partition_cost() -> tuple[int, int]:
    """(runtime-dir bytes, memory bytes) one partition takes besides its writer process."""
    return PARTITION_PAGES_BYTES, PARTITION_PAGES_BYTES + PARTITION_PROCESS_BYTES


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
                 produce_ring_bytes: int | None = None,
                 processes: int = 0) -> tuple[ErrorCode, str] | None:
    """The one estimate of whether ``new`` more partitions, and the ``processes`` new writer
    processes they need, fit this machine, for CreateTopics and CreatePartitions (which refuse
    what does not fit) and for the start (which makes its rings smaller rather than refuse a
    catalog that ran here: ``start_ring_bytes``): None when they fit, else (Kafka's error code
    for the refusal, why)."""
    p_shm, p_mem = process_cost(cfg, frontends, produce_ring_bytes)
    t_shm, t_mem = partition_cost()
    shm = processes * p_shm + new * t_shm
    mem = processes * p_mem + new * t_mem
    free, available = memory_room(run_dir)
    if shm > free:
        return (ErrorCode.kafka_storage_error,
                f"the runtime dir has room for {free >> 20} MiB; {new} more partitions need "
                f"{_mib(shm)} ({processes} more writer processes' rings of {_mib(p_shm)} each: "
                f"shm.produce_ring_bytes per frontend and the small rings, and their pages)")
    if mem > available:
        return (ErrorCode.policy_violation,
                f"the machine has memory for {max(available, 0) >> 20} MiB more; {new} more "
                f"partitions need {_mib(mem)} ({processes} more writer processes of "
                f"{_mib(p_mem)} each with their rings, and {_mib(t_mem)} a partition); "
                f"{new} were asked for")
    return None


def start_ring_bytes(cfg, frontends: int, run_dir: str, partitions: int,
                     produce_ring_bytes: int, processes: int) -> int:
    """The produce rings' size for a start serving ``partitions`` on ``processes`` writer
    processes: ``produce_ring_bytes`` when they fit, else the smallest rings the configuration
    allows; refuse (exit 7) only when even those cannot be held, where making them would have
    the OOM killer stop the start. Each partition was admitted by CreateTopics or
    CreatePartitions with the same estimate (``room_problem``), which at run time counts the
    partitions already there by what they really take and here by the estimate, which is larger;
    a start that refused them would leave every acknowledged record unserved (regression: 900
    partitions accepted, then exit 7 after a kill -9)."""
    problem = room_problem(cfg, frontends, run_dir, partitions, produce_ring_bytes, processes)
    if problem is None:
        return produce_ring_bytes
    # The smallest rings, not the largest that would fit: a start filling the machine to the
    # estimate's limit would leave no room for the next CreateTopics.
    size = min(produce_ring_bytes, smallest_produce_ring(cfg))
    p_shm, _ = process_cost(cfg, frontends, size)
    t_shm, _ = partition_cost()
    shm = processes * p_shm + partitions * t_shm
    free, available = memory_room(run_dir)
    if shm > min(free, available):
        raise RuntimeDirUnusable(
            f"the catalog's {partitions} partitions need {shm >> 20} MiB of memory for their "
            f"writer processes' rings even at the smallest size the configuration allows "
            f"({processes} writer processes, {p_shm >> 20} MiB each in the runtime dir {run_dir}, "
            f"which has {free >> 20} MiB free); the machine has {max(available, 0) >> 20} MiB "
            f"available: give the machine more memory, or the rings less "
            f"(shm.produce_ring_bytes, shm.partition_ring_bytes, log.message_max_bytes)")
    log.warning("the catalog's %d partitions do not fit this machine with produce rings of "
                "shm.produce_ring_bytes = %d (%s): starting them all with produce rings of %d "
                "bytes, as they ran here before; give the machine more memory, or the rings "
                "less, before creating more", partitions, produce_ring_bytes, problem[1],
                size)
    return size


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


