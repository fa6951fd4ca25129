"""Durable small files: atomic replacement, Kafka-style offset checkpoints, growing a file's
blocks ahead of its appends, and what a full disk looks like.

The floor of the house: owns nothing, imports nothing of the appliance but ``shm.region``'s
``allocate``, and is used by every process that writes a file of the data dir or the runtime dir
(the supervisor's catalog, credentials, ACLs and reserve; the writers' segments, indexes and
checkpoints; the coordinator's logs; the published copies in the runtime dir). Living here, below
``appliance.log`` and ``appliance.catalog``, lets each of them use it without importing the
other.

A replaced file is written under ``<name>.tmp`` (``TMP_SUFFIX``), fsynced, renamed over the name,
and the directory fsynced: a crash leaves the old file or the new one, never a mix, and readers
holding the old file mapped keep it.
"""

from __future__ import annotations

import errno
import os

from shm.region import allocate

__all__ = ["TMP_SUFFIX", "NO_SPACE", "is_no_space", "grow_file", "fsync_dir", "make_dirs",
           "DeferredSync", "write_tmp_copies", "atomic_write", "read_checkpoint", "write_checkpoint",
           "CHECKSUM_KEY", "with_checksum", "verify_checksum"]

TMP_SUFFIX = ".tmp"
# The JSON files of the data dir (catalog, credentials, ACLs) carry the CRC-32C of their content
# under this key (issue 34: a flipped byte that leaves valid JSON - a topic name, a partition
# count, a principal - must stop the start, not be believed).
CHECKSUM_KEY = "crc32c"
NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
_CHECKPOINT_VERSION = 0


def is_no_space(e: BaseException) -> bool:
    """A full file system (or quota), as opposed to an I/O error."""
    return isinstance(e, OSError) and e.errno in NO_SPACE


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


class DeferredSync:
    """The fsyncs of many clean closes, made together (a writer host's stop: thousands of
    partitions, each sealing its active segment). A close given one does its writes, renames
    and truncations without syncing and names here what it changed (``file``) and the directory
    that is to get its clean-shutdown marker (``marker``); ``run`` then fsyncs every file and
    directory named, on a pool of threads (each only opens, fsyncs and closes: the kernel and
    the file system's journal batch concurrent fsyncs into shared commits), then creates the
    markers and fsyncs their directories. A marker exists only once everything its close wrote
    is durable, which is all a clean-shutdown marker promises: a crash before ``run`` ends leaves
    no marker, and the next open recovers those partitions' active segments as after any crash
    (their indexes rebuilt from the log, a producer snapshot that fails its CRC skipped).
    Owned by the process that closes; the threads live only inside ``run``."""

    THREADS = 32

    def __init__(self, marker_name: str) -> None:
        self.marker_name = marker_name
        self.files: list[str] = []
        self.dirs: set[str] = set()
        self.markers: list[str] = []

    def file(self, path: str) -> None:
        self.files.append(path)
        self.dirs.add(os.path.dirname(path) or ".")

    def marker(self, directory: str) -> None:
        self.markers.append(directory)

    def run(self) -> None:
        """Raises the first OSError of an fsync (no marker is then written)."""
        from concurrent.futures import ThreadPoolExecutor
        with ThreadPoolExecutor(max_workers=self.THREADS) as pool:
            list(pool.map(_fsync_path, self.files))
            list(pool.map(fsync_dir, sorted(self.dirs)))
            for d in self.markers:
                os.close(os.open(os.path.join(d, self.marker_name),
                                 os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644))
            list(pool.map(fsync_dir, self.markers))


def _fsync_path(path: str) -> None:
    # fsync through a new descriptor flushes the file's data and size as through any other
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_dirs(directory: str) -> None:
    """``os.makedirs(directory, exist_ok=True)`` whose new names are durable: the parent of each
    level it creates is fsynced (a power loss would otherwise take the directory, and every file
    synced in it, away; only kill -9 keeps an unsynced name). Nothing is synced when it exists."""
    missing = []
    d = os.path.abspath(directory)
    while not os.path.isdir(d):
        missing.append(d)
        d = os.path.dirname(d)
    os.makedirs(directory, exist_ok=True)
    for d in reversed(missing):
        fsync_dir(os.path.dirname(d))


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


def write_tmp_copies(items: list[tuple[str, bytes]], sync: bool = True) -> list[tuple[str, str]]:
    """The first half of replacing several files at once: each ``data`` written and fsynced
    (unless not ``sync``: a ``DeferredSync`` makes it durable later) under ``path.tmp``; returns
    (tmp, path) pairs for ``os.replace``. All or none: on a failure the copies already made are
    removed and the error raised."""
    done: list[tuple[str, str]] = []
    try:
        for path, data in items:
            done.append((_write_tmp(path, data, sync), path))
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


def write_checkpoint(path: str, offset: int, *, sync: bool = True) -> None:
    """Replace the checkpoint with ``offset`` (``sync=False``: without the fsyncs, for a value
    whose loss would read back the same)."""
    atomic_write(path, f"{_CHECKPOINT_VERSION}\n{offset}\n".encode("ascii"), sync=sync)


def _canonical(raw: dict) -> bytes:
    import json
    return json.dumps(raw, sort_keys=True, separators=(",", ":")).encode()


def with_checksum(raw: dict) -> dict:
    """``raw`` with ``CHECKSUM_KEY`` set to the CRC-32C of its canonical JSON (sorted keys, no
    spaces): whatever layout the file is written in, ``verify_checksum`` finds the same."""
    from crc32c import crc32c
    body = {k: v for k, v in raw.items() if k != CHECKSUM_KEY}
    return {**body, CHECKSUM_KEY: crc32c(_canonical(body))}


def verify_checksum(raw: dict) -> dict:
    """``raw`` (a parsed JSON file) without its checksum; ValueError if the checksum does not
    match (the caller names the file). A file without one (written before issue 34) is taken as
    it is."""
    from crc32c import crc32c
    if not isinstance(raw, dict):
        raise ValueError("not a JSON object")
    body = {k: v for k, v in raw.items() if k != CHECKSUM_KEY}
    if CHECKSUM_KEY in raw and raw[CHECKSUM_KEY] != crc32c(_canonical(body)):
        raise ValueError("its content does not match its checksum (a damaged file)")
    return body
