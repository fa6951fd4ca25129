"""``appliance dump-log --verify PATH...``: find damage offline (issue 34, bit rot and torn files).

Runs in the operator's shell on files of a data dir (a file, a partition directory or the whole
data dir), reading only (``pread`` and read-only maps), so it is safe beside a running appliance
(whose active segments it reads up to what is written). Prints one line per damaged place - the
file, the position and, for a batch, its offset - and a summary; exits 1 when it found any.

What it checks, per kind of file:

* ``.log``: every batch's length, magic and CRC-32C (``appliance.log.scrub.scan_segment``, the
  background scrub's walk); zeros after the last batch are the unwritten end of a preallocated
  active segment, not damage;
* ``.index``, ``.timeindex``: Kafka's sanity check, every entry in order and inside the segment
  (``check_all``), and each offset entry against the batch at its position;
* ``.txnindex``: the sanity check, and each entry against the ABORT marker it names
  (``segment.aborted_index_matches``);
* ``*.snapshot`` (producer state): magic, version and CRC;
* ``catalog.json``, ``credentials.json``, ``acls.json``: JSON, and the checksum they carry.

At a start the appliance rebuilds a damaged index, aborted-transaction index or snapshot from the
log by itself; a damaged batch or state file is what needs the operator (restore from a backup,
or ``DeleteRecords`` past a damaged batch to give up its records).
"""

from __future__ import annotations

import json
import os
from typing import Iterator, NamedTuple

from appliance.log.files import INDEX_SUFFIX, LOG_SUFFIX, TIMEINDEX_SUFFIX, TXNINDEX_SUFFIX

__all__ = ["Problem", "verify_paths"]

STATE_FILES = ("catalog.json", "credentials.json", "acls.json")
SNAPSHOT_SUFFIX = ".snapshot"


class Problem(NamedTuple):
    path: str
    position: int          # -1: the file as a whole
    offset: int            # the batch's base offset; -1 when none applies
    reason: str

    def line(self) -> str:
        where = self.path
        if self.position >= 0:
            where += f": position {self.position}"
        if self.offset >= 0:
            where += f": offset {self.offset}"
        return f"{where}: {self.reason}"


def _files(paths: list[str]) -> Iterator[str]:
    for p in paths:
        if os.path.isdir(p):
            for root, dirs, names in os.walk(p):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                for n in sorted(names):
                    if n.endswith((LOG_SUFFIX, INDEX_SUFFIX, TIMEINDEX_SUFFIX, TXNINDEX_SUFFIX,
                                   SNAPSHOT_SUFFIX)) or n in STATE_FILES:
                        yield os.path.join(root, n)
        else:
            yield p


def _zeros_from(path: str, pos: int) -> bool:
    with open(path, "rb") as f:
        f.seek(pos)
        while chunk := f.read(1 << 20):
            if chunk.strip(b"\0"):
                return False
    return True


def verify_log(path: str) -> list[Problem]:
    from appliance.log.scrub import scan_segment
    out = []
    pos, done = 0, False
    while not done:
        pos, _, damage, done = scan_segment(path, pos, 1 << 62)
        for d in damage:
            if d.reason.startswith("a batch header") or d.reason.startswith("a torn"):
                if _zeros_from(path, d.position):
                    continue             # the preallocated end of an active segment
            out.append(Problem(path, d.position, d.offset, d.reason))
    return out


def _segment(path: str) -> tuple[str, int]:
    name = os.path.basename(path)
    return os.path.dirname(path), int(name.split(".", 1)[0])


def verify_index(path: str) -> list[Problem]:
    from appliance.log.index import CorruptIndex, OffsetIndex, TimeIndex
    from appliance.log.files import log_path
    from appliance.protocol.records import HEADER_SIZE, read_header
    directory, base = _segment(path)
    log = log_path(directory, base)
    size = os.path.getsize(log) if os.path.exists(log) else 0
    time_index = path.endswith(TIMEINDEX_SUFFIX)
    ix = (TimeIndex if time_index else OffsetIndex)(path, base)
    out = []
    try:
        try:
            if time_index:
                ix.sanity_check()
                ix.check_all(1 << 62)
            else:
                ix.sanity_check(size)
                ix.check_all(size, 1 << 62)
        except CorruptIndex as e:
            return [Problem(path, -1, -1, str(e))]
        if time_index or not size:
            return out
        with open(log, "rb") as f:
            for n in range(ix.entries):
                off, position = ix.entry(n)
                head = os.pread(f.fileno(), HEADER_SIZE, position)
                if len(head) < HEADER_SIZE or read_header(head, 0).last_offset != off:
                    out.append(Problem(path, n * 8, off, f"entry {n} (offset {off} at position "
                                       f"{position}) names no batch ending there"))
    finally:
        ix.close()
    return out


def verify_txn_index(path: str) -> list[Problem]:
    from appliance.log.segment import aborted_index_matches
    from appliance.log.txn_index import sane
    directory, base = _segment(path)
    if not sane(path, base, 1 << 62):
        return [Problem(path, -1, -1, "fails the sanity check (torn, out of order or unknown version)")]
    try:
        if not aborted_index_matches(directory, base):
            return [Problem(path, -1, -1, "an entry names no ABORT marker of its producer")]
    except FileNotFoundError:
        return [Problem(path, -1, -1, "no .log beside it")]
    return []


def verify_snapshot(path: str) -> list[Problem]:
    import struct
    from appliance.log.producer_state import ProducerStateManager
    try:
        with open(path, "rb") as f:
            ProducerStateManager.decode(f.read())
    except (ValueError, struct.error) as e:
        return [Problem(path, -1, -1, f"producer snapshot: {e} (the next start replays the log)")]
    return []


def verify_state_file(path: str) -> list[Problem]:
    from appliance.durable import verify_checksum
    try:
        with open(path, "rb") as f:
            verify_checksum(json.load(f))
    except ValueError as e:
        return [Problem(path, -1, -1, f"{e} (the appliance refuses to start on it)")]
    return []


def verify_paths(paths: list[str]) -> tuple[int, list[Problem]]:
    """(files checked, problems found) for ``paths`` (files or directories)."""
    n = 0
    problems: list[Problem] = []
    for path in _files(paths):
        name = os.path.basename(path)
        try:
            if name.endswith(LOG_SUFFIX):
                got = verify_log(path)
            elif name.endswith((INDEX_SUFFIX, TIMEINDEX_SUFFIX)):
                got = verify_index(path)
            elif name.endswith(TXNINDEX_SUFFIX):
                got = verify_txn_index(path)
            elif name.endswith(SNAPSHOT_SUFFIX):
                got = verify_snapshot(path)
            elif name in STATE_FILES:
                got = verify_state_file(path)
            else:
                continue
        except (OSError, ValueError) as e:
            got = [Problem(path, -1, -1, f"cannot be read: {e}")]
        n += 1
        problems += got
    return n, problems
