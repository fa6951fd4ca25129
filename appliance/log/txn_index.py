"""Kafka's aborted-transaction index: one ``{base:020d}.txnindex`` file per log segment.

Written by the partition writer alone (``PartitionLog.append_aborted``, right after it appended
an ABORT marker, and when it rebuilds the index after recovery); read by fetchers
(``LogReader.collect_aborted``) for read_committed fetches, and by the writer's own checks at open.

The file is Kafka's ``.txnindex`` byte for byte (storage AbortedTxn / TransactionIndex): a plain
append-only sequence of 34-byte entries, big endian, no header, created on the first abort whose
marker lies in the segment::

    pos  size  field
    ---  ----  ---------------------------------------------------------------
      0     2  version             int16  always 0
      2     8  producer id         int64
     10     8  first offset        int64  first offset of the transaction on this partition
     18     8  last offset         int64  offset of its ABORT marker (strictly increasing)
     26     8  last stable offset  int64  the partition's LSO just after the marker was written

An entry lives in the file of the segment that holds its *marker*; the transaction's data may
lie in earlier segments. ``collect`` is Kafka's TransactionIndex.collectAbortedTxns: an entry
belongs to a fetch of ``[fetch_offset, upper_bound)`` when its range intersects that one
(``last >= fetch_offset and first < upper_bound``), and once an entry's stored LSO is at or
past ``upper_bound`` no later entry (in this file or a later segment's) can start below the
upper bound - every transaction still open then began at or after that LSO - so the search is
complete.

Readers and a live writer: the writer appends each entry with one ``write`` on an ``O_APPEND``
descriptor (not a map), so a reader may see at most a partial last entry: it ignores an
incomplete tail. The writer appends an entry before it publishes a high watermark past the
marker, so a reader given a high watermark ignores entries whose marker is at or above it (and,
last offsets being increasing, stops there). A crash can leave a partial last entry too; the
writer's open checks (``sane``) send such a segment to recovery, which rebuilds the file.
"""

from __future__ import annotations

import errno
import os
import struct
from typing import NamedTuple

from appliance.errors import ErrorCode, KafkaError

__all__ = ["AbortedTxn", "TransactionIndex", "ENTRY_SIZE", "encode_entry", "decode_entries",
           "collect_entries", "read_entries", "sane"]

_ENTRY = struct.Struct(">hqqqq")
ENTRY_SIZE = _ENTRY.size
assert ENTRY_SIZE == 34
VERSION = 0


class AbortedTxn(NamedTuple):
    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int


def encode_entry(txn: AbortedTxn) -> bytes:
    return _ENTRY.pack(VERSION, *txn)


def decode_entries(data) -> list[AbortedTxn]:
    """Every complete entry of ``data`` (an incomplete tail is ignored). Raises ValueError on an
    entry with a version other than 0 (Kafka refuses versions it does not know)."""
    n = len(data) - len(data) % ENTRY_SIZE
    out: list[AbortedTxn] = []
    for version, pid, first, last, lso in _ENTRY.iter_unpack(memoryview(data)[:n]):
        if version != VERSION:
            raise ValueError(f"unknown aborted-transaction entry version {version}")
        out.append(AbortedTxn(pid, first, last, lso))
    return out


def read_entries(path: str) -> list[AbortedTxn]:
    """The complete entries of the file at ``path`` ([] when there is no file)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return []
    try:
        return decode_entries(_read_all(fd))
    finally:
        os.close(fd)


def _read_all(fd: int) -> bytes:
    size = os.fstat(fd).st_size
    chunks = []
    pos = 0
    while pos < size:
        b = os.pread(fd, size - pos, pos)
        if not b:
            break
        chunks.append(b)
        pos += len(b)
    return b"".join(chunks)


def collect_entries(entries: list[AbortedTxn], fetch_offset: int, upper_bound_offset: int,
                    high_watermark: int | None = None) -> tuple[list[AbortedTxn], bool]:
    """Kafka's collectAbortedTxns over ``entries`` (one file's, in order): the entries that
    intersect ``[fetch_offset, upper_bound_offset)``, and whether the search is complete. With
    ``high_watermark``, entries whose marker is at or past it are not trusted (not yet
    published); as last offsets increase, none after them are either, and the search ends."""
    out: list[AbortedTxn] = []
    for e in entries:
        if high_watermark is not None and e.last_offset >= high_watermark:
            return out, True
        if e.last_offset >= fetch_offset and e.first_offset < upper_bound_offset:
            out.append(e)
        if e.last_stable_offset >= upper_bound_offset:
            return out, True
    return out, False


def sane(path: str, base_offset: int, next_offset: int) -> bool:
    """Kafka's TransactionIndex.sanityCheck, stricter: whole entries of version 0, each with
    first <= last, marker offsets strictly increasing and inside the segment
    ``[base_offset, next_offset)``. A missing file is sane (no abort in the segment)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return True
    try:
        data = _read_all(fd)
    finally:
        os.close(fd)
    if len(data) % ENTRY_SIZE:
        return False
    try:
        entries = decode_entries(data)
    except ValueError:
        return False
    prev = base_offset - 1
    for e in entries:
        if not (prev < e.last_offset < next_offset) or e.first_offset > e.last_offset:
            return False
        prev = e.last_offset
    return True


class TransactionIndex:
    """One segment's ``.txnindex``. Writable (the partition writer; the file is created on the
    first ``append``) or read-only (anyone; each read goes to the file)."""

    def __init__(self, path: str, base_offset: int, *, writable: bool = False) -> None:
        self.path = path
        self.base_offset = base_offset
        self.writable = writable
        self._fd = -1
        self.last_offset = -1            # marker offset of the last entry (-1: none)
        if writable and os.path.exists(path):
            self._open_for_append()

    def _open_for_append(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            data = _read_all(fd)
            whole = len(data) - len(data) % ENTRY_SIZE
            if whole != len(data):
                # A torn last entry (crash mid-write): appending after it would misalign every
                # later entry. Readers never trust a partial tail, so cutting it is safe.
                os.ftruncate(fd, whole)
            entries = decode_entries(data[:whole])
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        self.last_offset = entries[-1].last_offset if entries else -1

    # -- writing -------------------------------------------------------------------------------
    def append(self, txn: AbortedTxn) -> None:
        """Append one entry with a single write (Kafka requires increasing marker offsets)."""
        if not self.writable:
            raise ValueError(f"{self.path} is open read-only")
        if txn.last_offset <= self.last_offset:
            raise ValueError(f"aborted-transaction entries must have increasing last offsets: "
                             f"{txn.last_offset} after {self.last_offset} in {self.path}")
        if self._fd < 0:
            self._open_for_append()
        data = encode_entry(txn)
        end = os.fstat(self._fd).st_size
        try:
            n = os.write(self._fd, data)
            if n != ENTRY_SIZE:
                raise OSError(errno.ENOSPC, f"short write to {self.path} ({n} of {ENTRY_SIZE} bytes)")
        except OSError:
            # A full disk: no torn entry stays behind to misalign the next append.
            try:
                os.ftruncate(self._fd, end)
            except OSError:
                pass
            raise
        self.last_offset = txn.last_offset

    def fsync(self) -> None:
        if self._fd >= 0:
            os.fsync(self._fd)

    def has_file(self) -> bool:
        """Whether this writer has the file open (what ``fsync`` would sync)."""
        return self._fd >= 0

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def truncate_to(self, offset: int) -> None:
        """Drop every entry whose marker offset is >= ``offset`` (Kafka's truncateTo). In place:
        no reader maps this file, and readers ignore entries past the high watermark anyway."""
        entries = self.entries()
        keep = 0
        while keep < len(entries) and entries[keep].last_offset < offset:
            keep += 1
        try:
            fd = self._fd if self._fd >= 0 else os.open(self.path, os.O_RDWR)
        except FileNotFoundError:
            return
        try:
            if os.fstat(fd).st_size != keep * ENTRY_SIZE:
                os.ftruncate(fd, keep * ENTRY_SIZE)
        finally:
            if fd != self._fd:
                os.close(fd)
        self.last_offset = entries[keep - 1].last_offset if keep else -1

    def delete(self) -> None:
        self.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        self.last_offset = -1

    # -- reading -------------------------------------------------------------------------------
    def entries(self) -> list[AbortedTxn]:
        try:
            return read_entries(self.path)
        except ValueError as e:
            raise KafkaError(ErrorCode.unknown_server_error, f"{self.path}: {e}") from None

    def collect(self, fetch_offset: int, upper_bound_offset: int,
                high_watermark: int | None = None) -> tuple[list[AbortedTxn], bool]:
        """Kafka's collectAbortedTxns (see the module docstring); ``high_watermark`` limits the
        entries trusted to those whose marker lies below it."""
        return collect_entries(self.entries(), fetch_offset, upper_bound_offset, high_watermark)

    def __enter__(self) -> "TransactionIndex":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
