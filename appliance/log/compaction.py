"""Swapping a rewritten log in for the live one, and repairing a swap a crash interrupted.

Owns nothing: a protocol over three directories that its callers own. Used by the coordinator
worker's two compacted logs, the transaction-state log (``appliance.txn.state_manager``) and the
group log (``appliance.group.store``), which rewrite their live records into a fresh
``PartitionLog`` and then call ``swap_in``; on open they call ``repair``. Single-threaded, like
its callers.

A log ``<live>`` is compacted through ``<live>.compacting`` (the new log, written and sealed by
the caller) and ``<live>.old`` (the previous log during the swap)::

    write the complete marker into .compacting (fsynced); fsync parent
    close the live log
    rename <live> -> <live>.old;           fsync parent
    rename <live>.compacting -> <live>;    fsync parent
    remove <live>.old and the marker;      fsync parent

``repair`` turns whatever a crash left into the old or the new log, never a mix and never
nothing::

    <live> present                       -> it is current; remove .compacting and .old
    <live> absent, .compacting complete  -> the crash fell between the two renames: finish them
    <live> absent, only .old             -> (cannot happen: .old exists only once .compacting
                                            is complete) put .old back

The caller's ``step`` hook is called by name after each stage ("marked", "closed", "old-moved",
"new-moved", "cleaned"): the crash tests raise from it to stop the swap at every point.

``rewrite_log_settings`` is the ``LogSettings`` both callers open these logs with: a rewrite is
the only thing that shrinks them, so nothing rolls by time and nothing goes by retention.
"""

from __future__ import annotations

import logging
import os
import shutil
from typing import Callable, NamedTuple

from appliance.log.files import atomic_write, fsync_dir
from appliance.log.partition_log import LogSettings

__all__ = ["COMPLETE_MARKER", "SwapDirs", "rmtree", "rewrite_log_settings"]

log = logging.getLogger("appliance.log.compaction")

COMPLETE_MARKER = "compaction-complete"


def rewrite_log_settings(segment_bytes: int) -> LogSettings:
    """Settings for a coordinator log compacted only by rewrite (see the module docstring)."""
    return LogSettings(segment_bytes=segment_bytes, segment_ms=2**62,
                       retention_bytes=-1, retention_ms=-1,
                       segment_index_bytes=1048576,
                       max_message_bytes=segment_bytes)


def rmtree(path: str) -> None:
    """Remove a directory tree (or a stray file or link) if it is there."""
    if os.path.lexists(path):
        shutil.rmtree(path)


class SwapDirs(NamedTuple):
    """The three directories of one compacted log, under ``parent``."""

    parent: str
    live: str
    new: str
    old: str

    @classmethod
    def under(cls, parent: str, live: str, new: str, old: str) -> "SwapDirs":
        j = os.path.join
        return cls(parent, j(parent, live), j(parent, new), j(parent, old))

    def swap_in(self, close_live: Callable[[], None], step: Callable[[str], None]) -> None:
        """Make the sealed log in ``new`` the live one (see the module docstring). ``close_live``
        closes the caller's live log; the caller opens ``live`` again afterwards."""
        atomic_write(os.path.join(self.new, COMPLETE_MARKER), b"")   # fsyncs the file and `new`
        fsync_dir(self.parent)
        step("marked")
        close_live()
        step("closed")
        os.rename(self.live, self.old)
        fsync_dir(self.parent)
        step("old-moved")
        os.rename(self.new, self.live)
        fsync_dir(self.parent)
        step("new-moved")
        rmtree(self.old)
        os.unlink(os.path.join(self.live, COMPLETE_MARKER))
        fsync_dir(self.parent)
        step("cleaned")

    def repair(self, what: str, logger: logging.Logger = log) -> bool:
        """Finish or undo a swap a crash interrupted; True if anything had to change. ``what``
        names the log in the message ("transaction log", "group log"); ``logger`` is the
        caller's, so the message comes from the module that owns the log."""
        changed = False
        if not os.path.isdir(self.live):
            if os.path.exists(os.path.join(self.new, COMPLETE_MARKER)):
                os.rename(self.new, self.live)
                changed = True
            elif os.path.isdir(self.old):
                os.rename(self.old, self.live)
                changed = True
        for leftover in (self.new, self.old):
            if os.path.lexists(leftover):
                rmtree(leftover)
                changed = True
        marker = os.path.join(self.live, COMPLETE_MARKER)
        if os.path.exists(marker):
            os.unlink(marker)
            changed = True
        if changed:
            fsync_dir(self.parent)
            logger.info("%s: finished an interrupted compaction", what)
        return changed
