"""File names and small durable files of a partition directory.

Owns nothing at run time; imported by the partition writer (which creates, replaces and deletes
these files) and by readers (fetchers, frontends), which only list and open them read-only.

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
    <base>.log.<inode>.deleted      a .log a swap replaced, kept for the fetches answered from
                                    it (log.segment_delete_delay_ms); removed at open

Offset and time index files are only ever shrunk by atomic replacement (write ``x.tmp``, fsync, rename), never
by truncating in place, because readers in other processes may have the old file mapped and
touching a mapped page past the end of a truncated file raises SIGBUS. (``.txnindex`` files are
never mapped - readers ``pread`` them - so they are appended to and cut in place.)
"""

from __future__ import annotations

import errno
import os

from shm.region import allocate

__all__ = [
    "LOG_SUFFIX", "INDEX_SUFFIX", "TIMEINDEX_SUFFIX", "TXNINDEX_SUFFIX", "TMP_SUFFIX",
    "LOG_START_OFFSET_FILE", "RECOVERY_POINT_FILE", "CLEAN_SHUTDOWN_FILE",
    "DELETED_SUFFIX", "CLEANED_SUFFIX", "SWAP_FILE", "CLEANER_CHECKPOINT_FILE", "segment_name", "log_path", "index_path", "timeindex_path", "txnindex_path",
    "retired_log_path",
    "list_segment_bases",
    "fsync_dir", "atomic_write", "write_tmp_copies", "allocate", "grow_file", "read_checkpoint",
    "write_checkpoint", "NO_SPACE", "is_no_space",
]

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIMEINDEX_SUFFIX = ".timeindex"
TXNINDEX_SUFFIX = ".txnindex"
TMP_SUFFIX = ".tmp"
LOG_START_OFFSET_FILE = "log-start-offset"
RECOVERY_POINT_FILE = "recovery-point"
CLEAN_SHUTDOWN_FILE = ".clean-shutdown"
_CHECKPOINT_VERSION = 0
NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


def is_no_space(e: BaseException) -> bool:
    """A full file system (or quota), as opposed to an I/O error."""
    return isinstance(e, OSError) and e.errno in NO_SPACE


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


def grow_file(fd: int, size: int, want: int, need: int) -> int:
    """Give a file whose first ``size`` bytes have their blocks more of them: up to ``want``
    bytes, or only up to ``need`` when the file system has less than twice that step left (what
    is taken ahead of the appends must not take the last blocks, which the disk reserve keeps for
    recovery and deletes) or not that much at all; returns the file's new size (every byte below
    it has its blocks). OSError (ENOSPC) when not even ``need`` fits; the file keeps whatever size
    it had then (ext4 keeps what it allocated)."""
    if want > need:
        st = os.fstatvfs(fd)
        if st.f_bavail * st.f_frsize < 2 * (want - size):
            want = need
    error: OSError | None = None
    for target in ((want, need) if need < want else (want,)):
        try:
            allocate(fd, target - size, size)
            return target
        except OSError as e:
            if not is_no_space(e):
                raise
            size = max(size, os.fstat(fd).st_size)
            if size >= need:
                return size
            error = e
    assert error is not None
    raise error


def fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_tmp(path: str, data: bytes, sync: bool, mode: int = 0o644) -> str:
    """``data`` in ``path.tmp`` (fsynced when ``sync``; a new file gets ``mode``); on failure (a
    full disk) the partial copy is removed again, giving its blocks back, and the error raised."""
    tmp = path + TMP_SUFFIX
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, mode)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException:
        _unlink_quietly(tmp)
        raise
    return tmp


def write_tmp_copies(items: list[tuple[str, bytes]]) -> list[tuple[str, str]]:
    """The first half of replacing several files at once: each ``data`` written and fsynced
    under ``path.tmp``; returns (tmp, path) pairs for ``os.replace``. All or none: on a failure
    the copies already made are removed and the error raised."""
    done: list[tuple[str, str]] = []
    try:
        for path, data in items:
            done.append((_write_tmp(path, data, True), path))
    except BaseException:
        for tmp, _ in done:
            _unlink_quietly(tmp)
        raise
    return done


def atomic_write(path: str, data: bytes, *, sync: bool = True, mode: int = 0o644,
                 sync_dir: bool = True) -> None:
    """Replace ``path`` with ``data`` so that a crash leaves either the old or the new file;
    readers holding the old file mapped keep it. A new file gets ``mode`` (0o600 for secrets).
    On a full disk (ENOSPC) the old file stands and nothing of the new one is left behind.
    ``sync_dir=False``: the new name is durable only once the caller fsyncs the directory
    (it is about to, after more changes there: one directory fsync for all of them)."""
    tmp = _write_tmp(path, data, sync, mode)
    try:
        os.replace(tmp, path)
    except BaseException:
        _unlink_quietly(tmp)
        raise
    if sync and sync_dir:
        fsync_dir(os.path.dirname(path) or ".")


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def read_checkpoint(path: str) -> int | None:
    """The offset in a checkpoint file, or None when absent or unreadable (treated as missing)."""
    try:
        with open(path, encoding="ascii") as f:
            lines = f.read().split()
    except FileNotFoundError:
        return None
    if len(lines) != 2 or lines[0] != str(_CHECKPOINT_VERSION):
        return None
    try:
        return int(lines[1])
    except ValueError:
        return None


def write_checkpoint(path: str, offset: int) -> None:
    atomic_write(path, f"{_CHECKPOINT_VERSION}\n{offset}\n".encode("ascii"))
