"""The names of a partition directory's files, and their listing.

Owns nothing at run time; imported by the partition writer (which creates, replaces and deletes
these files) and by readers (fetchers, frontends), which only list and open them read-only. How
the small ones are written durably (atomic replacement, checkpoints) is ``appliance.durable``.

A partition directory, Kafka's layout plus three small files of our own::

    00000000000000000000.log        record batches (given blocks ahead of the appends while active)
    00000000000000000000.index      offset index: [u32 relative offset, u32 position] * n
    00000000000000000000.timeindex  time index:   [i64 timestamp, u32 relative offset] * n
    00000000000000000000.txnindex   aborted transactions whose ABORT marker is in this segment
                                    (34-byte entries, see txn_index.py); only once there is one
    00000000000000004711.log  ...   next segment, named after its base offset (20 digits)
    log-start-offset                checkpoint: "0\\n<offset>\\n" (Kafka's checkpoint style)
    recovery-point                  checkpoint: every segment below this base offset is sealed
                                    and fsynced; recovery scans only segments from here on
    .clean-shutdown                 present only between a clean close and the next open
    *.tmp                           an atomic replacement in progress; removed at open
    *.cleaned                       a cleaner's copy of a group of segments (log/cleaner),
                                    waiting for the writer to swap it in; removed at open
    cleaner-swap                    a swap the writer committed to (see log/swap.py); an open
                                    finishes it
    cleaner-offset-checkpoint       checkpoint: the cleaner's first dirty offset (Kafka's
                                    cleaner-offset-checkpoint, one partition's)
    <base>.log.<inode>.deleted      a .log a swap replaced (kept for the fetches answered from
                                    it) or retention / DeleteRecords removed, kept for the
                                    topic's file.delete.delay.ms; removed at open

Offset and time index files are only ever shrunk by atomic replacement (write ``x.tmp``, fsync, rename), never
by truncating in place, because readers in other processes may have the old file mapped and
touching a mapped page past the end of a truncated file raises SIGBUS. (``.txnindex`` files are
never mapped - readers ``pread`` them - so they are appended to and cut in place.)
"""

from __future__ import annotations

import os

__all__ = [
    "LOG_SUFFIX", "INDEX_SUFFIX", "TIMEINDEX_SUFFIX", "TXNINDEX_SUFFIX",
    "LOG_START_OFFSET_FILE", "RECOVERY_POINT_FILE", "CLEAN_SHUTDOWN_FILE",
    "DELETED_SUFFIX", "CLEANED_SUFFIX", "SWAP_FILE", "CLEANER_CHECKPOINT_FILE", "segment_name", "log_path", "index_path", "timeindex_path", "txnindex_path",
    "retired_log_path",
    "list_segment_bases",
]

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIMEINDEX_SUFFIX = ".timeindex"
TXNINDEX_SUFFIX = ".txnindex"
LOG_START_OFFSET_FILE = "log-start-offset"
RECOVERY_POINT_FILE = "recovery-point"
CLEAN_SHUTDOWN_FILE = ".clean-shutdown"


def segment_name(base_offset: int) -> str:
    return f"{base_offset:020d}"


def log_path(directory: str, base_offset: int) -> str:
    return os.path.join(directory, segment_name(base_offset) + LOG_SUFFIX)


def index_path(directory: str, base_offset: int) -> str:
    return os.path.join(directory, segment_name(base_offset) + INDEX_SUFFIX)


def timeindex_path(directory: str, base_offset: int) -> str:
    return os.path.join(directory, segment_name(base_offset) + TIMEINDEX_SUFFIX)


def txnindex_path(directory: str, base_offset: int) -> str:
    return os.path.join(directory, segment_name(base_offset) + TXNINDEX_SUFFIX)


DELETED_SUFFIX = ".deleted"
CLEANED_SUFFIX = ".cleaned"
SWAP_FILE = "cleaner-swap"
CLEANER_CHECKPOINT_FILE = "cleaner-offset-checkpoint"


def retired_log_path(directory: str, base_offset: int, inode: int) -> str:
    """Where a swap keeps the replaced ``<base>.log`` whose inode was ``inode`` (Kafka renames
    replaced segments ``.deleted`` and deletes them after file.delete.delay.ms): fetch answers
    read from it before the swap are copied from there."""
    return os.path.join(directory, f"{segment_name(base_offset)}{LOG_SUFFIX}.{inode}{DELETED_SUFFIX}")


def _base_of(name: str, suffix: str) -> int | None:
    if not name.endswith(suffix):
        return None
    stem = name[:-len(suffix)]
    if len(stem) != 20 or not stem.isdigit():
        return None
    return int(stem)


def list_segment_bases(directory: str, suffix: str = LOG_SUFFIX) -> list[int]:
    """Sorted base offsets of the files ``<20 digits><suffix>`` in ``directory``."""
    out = []
    for name in os.listdir(directory):
        base = _base_of(name, suffix)
        if base is not None:
            out.append(base)
    out.sort()
    return out
