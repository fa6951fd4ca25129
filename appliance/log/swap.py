"""The partition writer's side of a cleaner round: swapping cleaned segments in, crash-safe.

Run by the partition writer only (``PartitionLog.replace_segments``, and ``recover`` when it
opens the log): a cleaner process (``appliance.log.cleaner``) writes a group's copy as
``<base>.log.cleaned`` with ``.index.cleaned``, ``.timeindex.cleaned`` and ``.txnindex.cleaned``
(fsynced, the directory too) and asks the writer to swap it in for the old segments
``old`` (the first of which is named ``<base>``, like the copy); one swap takes several groups
(one commit, whatever their number). The discipline is the coordinator logs' compaction
(``compacted_log``): a durable commit point, before which a crash leaves the old segments and
after which opening the log finishes the swap, so that a kill -9 at any step leaves the old or
the new segments, never a mix::

    check each copy (``load_segment`` on the .cleaned files, its .txnindex) and that every old
    segment is still the file the cleaner read (inode and size)          step "checked"
    write the swap file ``cleaner-swap`` (atomic: tmp, fsync, rename, fsync dir): the commit
                                                                         step "committed"
    per group: link <base>.log to its retired name; rename the .cleaned indexes, then the
    .cleaned log, over <base>'s names (rename(2): each name always names one whole file)
                                                                         step "renamed"
    the group's other old segments: .log renamed to its retired name, indexes removed
                                                                         step "retired"
    the cleaner checkpoint (with the round's last groups), fsync the directory,
    remove the swap file, fsync the directory                            step "done"

A full disk: the commit (the swap file) is the only step that needs a new block, and an ENOSPC
there is ``SwapNoSpace`` (the copies are removed, the log is as before, the writer answers
KAFKA_STORAGE_ERROR and lives on). After the commit nothing waits for space: a retired name
that cannot be made (a directory that would have to grow) is given up (readers of that file
get an empty answer and read anew), and so is the cleaner checkpoint (the next round reads the
clean segments again), so that neither a live swap nor the roll-forward of an open can fail
for want of space.

Opening (``recover``) before anything else: a swap file that parses is finished (each rename
happens only while its ``.cleaned`` source is there, so repeating a step is harmless); then
every ``.cleaned`` file (a copy no committed swap names) and every retired file goes.

Readers in other processes (fetchers, frontends) keep what they hold: a map of a file renamed
over or retired stays valid, and they see the new files after their next refresh (the writer
bumps ``segments_version`` after the swap). A fetch answered from a replaced ``<base>.log`` is
copied from its retired name (``<base>.log.<inode>.deleted``), kept for
the topic's file.delete.delay.ms (default ``log.segment_delete_delay_ms``), as Kafka keeps
``.deleted`` files. For
the moment between the renames and the removals, readers may list the new segment beside the
old ones it replaces: ``reader.LogReader`` skips what it has read already, and treats index
entries as hints checked against the log.
"""

from __future__ import annotations

import logging
import os
from typing import Callable

import msgspec

from appliance.log.files import (CLEANED_SUFFIX, CLEANER_CHECKPOINT_FILE, DELETED_SUFFIX,
                                 INDEX_SUFFIX, LOG_SUFFIX, SWAP_FILE, TIMEINDEX_SUFFIX,
                                 TXNINDEX_SUFFIX, index_path, log_path, retired_log_path,
                                 timeindex_path, txnindex_path)
from appliance.durable import atomic_write, fsync_dir, is_no_space, write_checkpoint

__all__ = ["SwapManifest", "write_manifest", "roll_forward", "recover", "remove_cleaned"]

log = logging.getLogger("appliance.log.swap")

# The indexes before the log: once the log is renamed, every file of <base> is the new one.
_SUFFIXES = (TXNINDEX_SUFFIX, TIMEINDEX_SUFFIX, INDEX_SUFFIX, LOG_SUFFIX)
_PATHS = {LOG_SUFFIX: log_path, INDEX_SUFFIX: index_path, TIMEINDEX_SUFFIX: timeindex_path,
          TXNINDEX_SUFFIX: txnindex_path}


class SwapManifest(msgspec.Struct, frozen=True):
    groups: list[tuple[int, list[int]]]   # (copy's base offset = old[0], the segments it replaces)
    checkpoint: int = -1      # the cleaner's next first dirty offset, -1: none with this swap


def write_manifest(directory: str, m: SwapManifest) -> None:
    """The commit. On a full disk nothing is committed (``atomic_write`` leaves no file) and
    the copies go: SwapNoSpace."""
    try:
        atomic_write(os.path.join(directory, SWAP_FILE), msgspec.json.encode(m))
    except OSError as e:
        if not is_no_space(e):
            raise
        remove_cleaned(directory)
        raise SwapNoSpace(f"no space to commit the swap: {e}") from None


def _read_manifest(directory: str) -> SwapManifest | None:
    try:
        with open(os.path.join(directory, SWAP_FILE), "rb") as f:
            return msgspec.json.decode(f.read(), type=SwapManifest)
    except FileNotFoundError:
        return None
    except (msgspec.DecodeError, msgspec.ValidationError):
        # atomic_write renames a complete file: an unreadable one was never committed.
        return None


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def roll_forward(directory: str, m: SwapManifest, *, retire: bool,
                 step: Callable[[str], None] = lambda name: None) -> list[str]:
    """Make the swap ``m`` describes (committed: its swap file is durable), group by group.
    ``retire``: keep the replaced .log files under their retired names for readers (a live
    swap) instead of removing them (at open, nobody reads). Returns the retired paths."""
    retired: list[str] = []
    for base, old in m.groups:
        base_log = log_path(directory, base)
        if os.path.exists(base_log + CLEANED_SUFFIX):
            if retire and os.path.exists(base_log):
                dst = retired_log_path(directory, base, os.stat(base_log).st_ino)
                if _retire(lambda: os.path.exists(dst) or os.link(base_log, dst)):
                    retired.append(dst)
            for suffix in _SUFFIXES:
                live = _PATHS[suffix](directory, base)
                if os.path.exists(live + CLEANED_SUFFIX):
                    os.replace(live + CLEANED_SUFFIX, live)
        step("renamed")
        for b in old:
            if b == base:
                continue
            p = log_path(directory, b)
            if retire and os.path.exists(p):
                dst = retired_log_path(directory, b, os.stat(p).st_ino)
                if _retire(lambda: os.replace(p, dst)):
                    retired.append(dst)
            # Indexes first, the log last (as segment.delete_segment_files).
            for suffix in (TXNINDEX_SUFFIX, INDEX_SUFFIX, TIMEINDEX_SUFFIX, LOG_SUFFIX):
                _unlink(_PATHS[suffix](directory, b))
        step("retired")
    if m.checkpoint >= 0:
        try:
            write_checkpoint(os.path.join(directory, CLEANER_CHECKPOINT_FILE), m.checkpoint)
        except OSError as e:
            if not is_no_space(e):
                raise
            log.warning("%s: no cleaner checkpoint at %d (file system full): the next round "
                        "reads the cleaned segments again", directory, m.checkpoint)
    fsync_dir(directory)
    _unlink(os.path.join(directory, SWAP_FILE))
    fsync_dir(directory)
    step("done")
    return retired


def _retire(make: Callable[[], object]) -> bool:
    """Make a retired name; False when the directory has no room for it (full disk)."""
    try:
        make()
    except OSError as e:
        if not is_no_space(e):
            raise
        return False
    return True


def remove_cleaned(directory: str) -> int:
    """Remove every ``.cleaned`` file (copies no committed swap names); returns how many."""
    n = 0
    for name in os.listdir(directory):
        if name.endswith(CLEANED_SUFFIX):
            _unlink(os.path.join(directory, name))
            n += 1
    return n


def recover(directory: str) -> bool:
    """At open, before the segments are listed: finish a committed swap, then remove copies and
    retired files. True if a swap was finished."""
    m = _read_manifest(directory)
    if m is not None:
        roll_forward(directory, m, retire=False)
    for name in os.listdir(directory):
        if name.endswith(CLEANED_SUFFIX) or name.endswith(DELETED_SUFFIX):
            _unlink(os.path.join(directory, name))
    if os.path.exists(os.path.join(directory, SWAP_FILE)):
        _unlink(os.path.join(directory, SWAP_FILE))       # one that does not parse
    return m is not None


class SwapRefused(Exception):
    """The copy cannot be swapped in (the old segments changed, or the copy fails its checks);
    the copy's files are removed and the log is as before."""


class SwapNoSpace(SwapRefused):
    """The commit found the file system full: the copies are removed, the log is as before."""


def check_copy(directory: str, base: int, old: list[tuple[int, int, int]], next_base: int):
    """Before the commit: every old segment (base, inode, size) is still the file the cleaner
    read, and the copy loads as a sealed segment ending at or below ``next_base`` with a sane
    aborted-transaction index. Returns the copy's (SegmentInfo, offset entries, time entries);
    raises SwapRefused."""
    from appliance.log.segment import load_segment
    from appliance.log.txn_index import sane
    if not old or old[0][0] != base:
        raise SwapRefused(f"a copy named {base} must replace segment {base} first")
    for b, ino, size in old:
        try:
            st = os.stat(log_path(directory, b))
        except FileNotFoundError:
            raise SwapRefused(f"segment {b} is gone") from None
        if st.st_ino != ino or st.st_size != size:
            raise SwapRefused(f"segment {b} is not the file the cleaner read")
    got = load_segment(directory, base, next_base=next_base, suffix=CLEANED_SUFFIX)
    if got is None:
        raise SwapRefused(f"the copy of segment {base} does not load")
    if not sane(txnindex_path(directory, base) + CLEANED_SUFFIX, base, got[0].next_offset):
        raise SwapRefused(f"the copy of segment {base} has a bad aborted-transaction index")
    return got
