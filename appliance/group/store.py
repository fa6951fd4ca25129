"""The group log: committed offsets, pending transactional offsets and group metadata, on disk.

Owned by the coordinator worker (``workers/coordinator.py``; one process, single-threaded, not
thread-safe), next to the transaction-state log (``appliance.txn.state_manager``). Kafka keeps
this state in the compacted topic ``__consumer_offsets``; a single node needs one partition of
it, so the log is one ``CompactedLog`` (``appliance.log.compacted_log``, which owns the
directories, appending and syncing per ``log.flush.policy``, replay, compaction by rewrite and
its crash-safe swap, and draws them) holding exactly the batches Kafka's GroupMetadataManager
appends to an offsets partition. ``appliance.group.offsets`` (the OffsetManager) is the only
caller; it holds the policy (validation, fetch, expiration), this module holds the record codec,
the replay rules, which records are live, and the in-memory view that replay and live appends
both build with the same code (so what a restart rebuilds is what memory held).

On disk (``directory`` is what the worker passes: ``<data_dir>/__coordinator/group-log``)::

    <directory>/log/               the PartitionLog: segments, indexes, checkpoints
    <directory>/log.compacting/    only while a compaction writes the new log
    <directory>/log.old/           only between the two renames of a compaction swap

Batches (magic 2, no compression, CreateTime, the record timestamps are the caller's ``now_ms``):

* an OffsetCommit: one non-transactional batch (producer id -1) holding one record per
  partition, key OffsetCommitKey, value OffsetCommitValue;
* a TxnOffsetCommit: the same, but a *transactional* batch carrying the producer id and epoch
  (base sequence 0, as Kafka's generateOffsetRecords). Its records are *pending* for that producer
  until a control batch of the same producer id ends the transaction;
* the end of a transaction: a control batch (``PartitionLog.append_control``: transactional +
  control attributes, key = (version 0, type ABORT 0 / COMMIT 1), value = (version 0,
  coordinator epoch)), written when the transaction coordinator's marker arrives;
* group metadata: a non-transactional batch with one record, key GroupMetadataKey, value
  GroupMetadataValue;
* deletions (DeleteGroups, OffsetDelete, expiration): one non-transactional batch of tombstones
  (null values) for offset keys and/or the group key.

A batch is the unit of atomicity: recovery after a crash keeps a batch whole or cuts it.

Record layouts (Kafka's internal-records JSON specs; every key and value starts with an int16
version, ``MessageUtil.toVersionPrefixedBytes``; integers big-endian)::

    OffsetCommitKey v1 (v0 identical; v1 is what Kafka writes)
        version             int16   1
        group               int16 length N, N bytes UTF-8
        topic               int16 length N, N bytes UTF-8
        partition           int32

    GroupMetadataKey v2
        version             int16   2
        group               int16 length N, N bytes UTF-8

    OffsetCommitValue v3 (written; Kafka's choice when no expire timestamp is given)
        version             int16   3
        offset              int64
        leader_epoch        int32   -1 = none
        metadata            int16 length N, N bytes UTF-8
        commit_timestamp    int64

    OffsetCommitValue v1 (written when the commit carries an explicit expire timestamp, i.e.
    OffsetCommit v2-v4 with a retention time; Kafka's choice too: v1 has no leader epoch)
        version             int16   1
        offset              int64
        metadata            int16 length N, N bytes UTF-8
        commit_timestamp    int64
        expire_timestamp    int64

    read as well: v0 / v2 = offset, metadata, commit_timestamp; v4 (flexible) = offset,
    leader_epoch, metadata (uvarint N+1, N bytes), commit_timestamp, tagged fields

    GroupMetadataValue v4 (written; first flexible version)
        version                     int16   4
        protocol_type               uvarint N+1, N bytes UTF-8
        generation                  int32
        protocol                    uvarint N+1 (0 = null), N bytes UTF-8
        leader                      uvarint N+1 (0 = null), N bytes UTF-8
        current_state_timestamp     int64   -1 = none
        members                     uvarint count+1, then count x
            member_id               uvarint N+1, N bytes UTF-8
            group_instance_id       uvarint N+1 (0 = null), N bytes UTF-8
            client_id               uvarint N+1, N bytes UTF-8
            client_host             uvarint N+1, N bytes UTF-8
            rebalance_timeout       int32
            session_timeout         int32
            subscription            uvarint N+1, N bytes
            assignment              uvarint N+1, N bytes
            (tagged fields)         uvarint 0
        (tagged fields)             uvarint 0

    read as well: v0-v3 (non-flexible: strings int16 length, -1 = null; arrays and bytes int32
    length): v0 has no rebalance_timeout (= session_timeout, as Kafka loads it), v0-v1 no
    current_state_timestamp (-1), v0-v2 no group_instance_id (null).

    uvarint = unsigned LEB128. Tagged fields this module does not know are skipped.

Replay (``load``), from the start of the log, Kafka's GroupMetadataManager.doLoadGroupsAndOffsets
with the tombstone rule of the newer OffsetMetadataManager.replay:

* an offset record in a non-transactional batch replaces the committed offset of its
  (group, topic, partition); its tombstone removes the committed offset *and* every pending
  transactional offset of that key (so a DeleteGroups or OffsetDelete also cancels offsets a
  transaction still holds, in memory and after a restart alike);
* an offset record in a transactional batch becomes (or replaces) the pending offset of that
  producer for that key; a tombstone there removes only that producer's pending offset;
* a COMMIT control batch moves every pending offset of its producer into the committed offsets,
  each only if its record is later in the log than the committed one (Kafka keeps the most
  recent of a mix of transactional and plain commits by record offset); an ABORT control batch
  drops them. One marker completes the producer's pending offsets of *every* group: a producer
  has at most one open transaction, and all of its groups' offsets partitions are in it;
* a group record replaces the group's metadata; its tombstone deletes it (offsets stay);
* a KIP-848 consumer group record (key versions 3-8, ``consumer_records``) replaces its key's
  value; its tombstone deletes it (the records are decoded by the membership side at load);
* a key with an unknown version is skipped and kept in ``anomalies`` (Kafka: "a left-over from
  an aborted upgrade"); a value that cannot be
  decoded raises ``GroupLogCorrupt`` (we refuse to start rather than run without the records
  after it).

Durability: every write returns only after its batch is in the log and, unless
``log.flush.policy`` is ``os``, fdatasynced: persisted before the caller answers the client.

Live records (what a compaction rewrite keeps, estimated at ``RECORD_OVERHEAD`` bytes a record
besides key and value for the trigger): the committed offset and group record of each key, the
last value of each consumer group record, and
every pending transactional offset, which must survive because its transaction is still open. The
rewrite keeps their original log order - committed offsets and group records as plain batches,
pending ones as transactional batches of their producer id and epoch - so replaying the new log
gives the same state, including which of a pending and a committed offset is the more recent.
Tombstones, control batches and superseded records are dropped (a tombstone's only job is to
shadow earlier records, which are gone too).

Offsets are renumbered by a compaction; the in-memory record offsets are renumbered with them
(also when the swap fails after its first rename and opening finishes it).
"""

from __future__ import annotations

import logging
import struct
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, NamedTuple

from appliance.config import FlushPolicy
from appliance.errors import KafkaError
from appliance.group import consumer_records
from appliance.group.consumer_records import ConsumerKey
from appliance.group.records import GroupMemberRecord, GroupRecord
from appliance.log.compacted_log import (COMPLETE_MARKER, NO_PRODUCER_EPOCH, NO_PRODUCER_ID,
                                         CompactedLog, CompactedLogCorrupt, CompactedLogWriteError,
                                         LiveRecord)
from appliance.protocol.internal_records import (RecordDecodeError, UnknownKeyVersion,
                                                 get_bytes as _get_bytes,
                                                 get_compact_bytes as _get_compact_bytes,
                                                 get_compact_string as _get_compact_string,
                                                 get_string as _get_string, get_uvarint as _get_uvarint,
                                                 need as _need, put_compact_bytes as _put_compact_bytes,
                                                 put_compact_string as _put_compact_string,
                                                 put_string as _put_string, put_uvarint as _put_uvarint,
                                                 skip_tagged as _skip_tagged, version_of as _version)
from appliance.protocol.records import (CONTROL_ABORT, CONTROL_COMMIT, BatchHeader,
                                        parse_control_record)

__all__ = [
    "GroupStateStore", "GroupLogCorrupt", "GroupLogWriteError", "LoadedState",
    "OffsetEntry", "GroupEntry", "TopicPartition",
    "RecordDecodeError", "UnknownKeyVersion",
    "encode_offset_key", "encode_group_key", "decode_key", "OffsetKey", "GroupKey",
    "encode_offset_value", "decode_offset_value", "encode_group_value", "decode_group_value",
    "LOG_DIR", "COMPACTING_DIR", "OLD_DIR", "COMPLETE_MARKER",
]

log = logging.getLogger("appliance.group.store")

LOG_DIR = "log"
COMPACTING_DIR = "log.compacting"
OLD_DIR = "log.old"

DEFAULT_SEGMENT_BYTES = 104857600      # offsets.topic.segment.bytes
DEFAULT_COMPACT_BYTES = 16 * 1024 * 1024
# Estimated bytes a record adds to a batch besides its key and value (length, attributes,
# timestamp and offset deltas, key/value lengths, header count) plus a share of the 61-byte
# batch header; only used to decide when to compact.
RECORD_OVERHEAD = 16

TopicPartition = tuple[str, int]

OFFSET_KEY_VERSION = 1               # written; 0 is read too
GROUP_KEY_VERSION = 2
OFFSET_VALUE_VERSION = 3             # written without an expire timestamp
OFFSET_VALUE_VERSION_EXPIRE = 1      # written with one
GROUP_VALUE_VERSION = 4

_h = struct.Struct(">h")
_i = struct.Struct(">i")
_q = struct.Struct(">q")
_qi = struct.Struct(">qi")


class GroupLogCorrupt(CompactedLogCorrupt):
    """A record of the group log cannot be decoded."""


class GroupLogWriteError(CompactedLogWriteError):
    """An append to the group log failed (see CompactedLogWriteError: ``code``,
    ``maybe_written``)."""


# -- in-memory entries ----------------------------------------------------------------------------

@dataclass(slots=True, eq=False)
class OffsetEntry:
    """One committed or pending offset (Kafka's OffsetAndMetadata with its record offset)."""

    offset: int
    leader_epoch: int = -1          # -1 = none
    metadata: str = ""
    commit_timestamp: int = -1
    expire_timestamp: int = -1      # -1 = none (only v1 values carry one)
    # Where its record is in the log (Kafka's recordOffset / appendedBatchOffset): decides which
    # of a committed and a transactional offset is the more recent. Renumbered by compaction.
    record_offset: int = -1
    producer_id: int = NO_PRODUCER_ID      # of the transactional batch that wrote it, else -1
    producer_epoch: int = NO_PRODUCER_EPOCH
    value: bytes = b""              # the encoded value, copied as is by compaction
    size: int = 0                   # estimated bytes in the log (for the compaction trigger)


@dataclass(slots=True, eq=False)
class GroupEntry:
    """The last stored metadata record of a group."""

    record: GroupRecord
    record_offset: int = -1
    value: bytes = b""
    size: int = 0


@dataclass(slots=True, eq=False)
class ConsumerEntry:
    """The last stored value of one KIP-848 consumer group record (``consumer_records``)."""

    value: bytes
    record_offset: int = -1
    size: int = 0


class LoadedState(NamedTuple):
    """What ``load`` rebuilt (the same objects the store keeps; treat them as read-only)."""

    groups: dict[str, GroupRecord]
    offsets: dict[str, dict[TopicPartition, OffsetEntry]]               # group -> committed
    pending: dict[int, dict[str, dict[TopicPartition, OffsetEntry]]]   # producer -> group -> ...
    consumer: dict[str, dict[ConsumerKey, bytes]] = {}                  # group -> KIP-848 records


# -- keys -----------------------------------------------------------------------------------------

class OffsetKey(NamedTuple):
    group: str
    topic: str
    partition: int


class GroupKey(NamedTuple):
    group: str


def encode_offset_key(group: str, topic: str, partition: int) -> bytes:
    out = bytearray(_h.pack(OFFSET_KEY_VERSION))
    _put_string(out, group)
    _put_string(out, topic)
    out += _i.pack(partition)
    return bytes(out)


def encode_group_key(group: str) -> bytes:
    out = bytearray(_h.pack(GROUP_KEY_VERSION))
    _put_string(out, group)
    return bytes(out)


def decode_key(data) -> OffsetKey | GroupKey | ConsumerKey:
    """Kafka's readMessageKey: versions 0-1 are offset keys, 2 a group key, 3-8 the KIP-848
    consumer group records (``consumer_records``); UnknownKeyVersion for anything else."""
    buf = memoryview(data)
    version = _version(buf)
    if version in (0, 1):
        group, pos = _get_string(buf, 2)
        topic, pos = _get_string(buf, pos)
        _need(buf, pos, 4)
        return OffsetKey(group, topic, _i.unpack_from(buf, pos)[0])   # type: ignore[arg-type]
    if version == GROUP_KEY_VERSION:
        group, _ = _get_string(buf, 2)
        return GroupKey(group)                                         # type: ignore[arg-type]
    if version in consumer_records.KEY_VERSIONS:
        return consumer_records.decode_key(buf, version)
    raise UnknownKeyVersion("group log", version)


# -- offset values --------------------------------------------------------------------------------

def encode_offset_value(offset: int, leader_epoch: int, metadata: str, commit_timestamp: int,
                        expire_timestamp: int = -1) -> bytes:
    """v3, or v1 when ``expire_timestamp`` is given (Kafka's offsetCommitValue)."""
    if expire_timestamp != -1:
        out = bytearray(_h.pack(OFFSET_VALUE_VERSION_EXPIRE))
        out += _q.pack(offset)
        _put_string(out, metadata)
        out += _q.pack(commit_timestamp)
        out += _q.pack(expire_timestamp)
        return bytes(out)
    out = bytearray(_h.pack(OFFSET_VALUE_VERSION))
    out += _qi.pack(offset, leader_epoch)
    _put_string(out, metadata)
    out += _q.pack(commit_timestamp)
    return bytes(out)


def decode_offset_value(data) -> OffsetEntry:
    """An OffsetEntry (without record offset) from a v0-v4 value; RecordDecodeError otherwise."""
    buf = memoryview(data)
    version = _version(buf)
    pos = 2
    leader_epoch = expire = -1
    if version in (0, 1, 2):
        _need(buf, pos, 8)
        (offset,) = _q.unpack_from(buf, pos)
        metadata, pos = _get_string(buf, pos + 8)
        _need(buf, pos, 8)
        (commit,) = _q.unpack_from(buf, pos)
        pos += 8
        if version == 1:
            _need(buf, pos, 8)
            (expire,) = _q.unpack_from(buf, pos)
    elif version in (3, 4):
        _need(buf, pos, 12)
        offset, leader_epoch = _qi.unpack_from(buf, pos)
        pos += 12
        if version == 3:
            metadata, pos = _get_string(buf, pos)
        else:
            metadata, pos = _get_compact_string(buf, pos)
        _need(buf, pos, 8)
        (commit,) = _q.unpack_from(buf, pos)
        pos += 8
        if version == 4:
            _skip_tagged(buf, pos)
    else:
        raise RecordDecodeError(f"unknown offset commit value version {version}")
    return OffsetEntry(offset, leader_epoch, metadata or "", commit, expire, value=bytes(buf))


# -- group values ---------------------------------------------------------------------------------

def encode_group_value(rec: GroupRecord) -> bytes:
    """GroupMetadataValue v4 (flexible)."""
    out = bytearray(_h.pack(GROUP_VALUE_VERSION))
    _put_compact_string(out, rec.protocol_type)
    out += _i.pack(rec.generation)
    _put_compact_string(out, rec.protocol, nullable=True)
    _put_compact_string(out, rec.leader, nullable=True)
    out += _q.pack(rec.current_state_timestamp)
    _put_uvarint(out, len(rec.members) + 1)
    for m in rec.members:
        _put_compact_string(out, m.member_id)
        _put_compact_string(out, m.group_instance_id, nullable=True)
        _put_compact_string(out, m.client_id)
        _put_compact_string(out, m.client_host)
        out += _i.pack(m.rebalance_timeout)
        out += _i.pack(m.session_timeout)
        _put_compact_bytes(out, bytes(m.subscription))
        _put_compact_bytes(out, bytes(m.assignment))
        out.append(0)                               # no tagged fields
    out.append(0)
    return bytes(out)


def decode_group_value(data) -> GroupRecord:
    """A GroupRecord from a v0-v4 value; RecordDecodeError otherwise."""
    buf = memoryview(data)
    version = _version(buf)
    if not 0 <= version <= 4:
        raise RecordDecodeError(f"unknown group metadata value version {version}")
    flexible = version >= 4
    gets = _get_compact_string if flexible else _get_string
    getb = _get_compact_bytes if flexible else _get_bytes
    pos = 2
    protocol_type, pos = gets(buf, pos)
    _need(buf, pos, 4)
    (generation,) = _i.unpack_from(buf, pos)
    pos += 4
    protocol, pos = gets(buf, pos, nullable=True)
    leader, pos = gets(buf, pos, nullable=True)
    current_state_timestamp = -1
    if version >= 2:
        _need(buf, pos, 8)
        (current_state_timestamp,) = _q.unpack_from(buf, pos)
        pos += 8
    if flexible:
        n, pos = _get_uvarint(buf, pos)
        if n == 0:
            raise RecordDecodeError("null members array")
        n -= 1
    else:
        _need(buf, pos, 4)
        (n,) = _i.unpack_from(buf, pos)
        pos += 4
        if n < 0:
            raise RecordDecodeError("null members array")
    members: list[GroupMemberRecord] = []
    for _ in range(n):
        member_id, pos = gets(buf, pos)
        instance_id = None
        if version >= 3:
            instance_id, pos = gets(buf, pos, nullable=True)
        client_id, pos = gets(buf, pos)
        client_host, pos = gets(buf, pos)
        rebalance_timeout = -1
        if version >= 1:
            _need(buf, pos, 4)
            (rebalance_timeout,) = _i.unpack_from(buf, pos)
            pos += 4
        _need(buf, pos, 4)
        (session_timeout,) = _i.unpack_from(buf, pos)
        pos += 4
        if version == 0:
            rebalance_timeout = session_timeout         # Kafka's readGroupMessageValue
        subscription, pos = getb(buf, pos)
        assignment, pos = getb(buf, pos)
        if flexible:
            pos = _skip_tagged(buf, pos)
        members.append(_member(member_id, instance_id, client_id, client_host, rebalance_timeout,
                               session_timeout, subscription, assignment))
    if flexible:
        _skip_tagged(buf, pos)
    return _group(protocol_type, generation, protocol, leader, current_state_timestamp, members)


def _member(member_id, instance_id, client_id, client_host, rebalance_timeout, session_timeout,
            subscription, assignment) -> GroupMemberRecord:
    return GroupMemberRecord(member_id=member_id, group_instance_id=instance_id,
                             client_id=client_id, client_host=client_host,
                             rebalance_timeout=rebalance_timeout, session_timeout=session_timeout,
                             subscription=subscription, assignment=assignment)


def _group(protocol_type, generation, protocol, leader, current_state_timestamp,
           members) -> GroupRecord:
    return GroupRecord(protocol_type=protocol_type, generation=generation, protocol=protocol,
                       leader=leader, current_state_timestamp=current_state_timestamp,
                       members=members)


# -- the store ------------------------------------------------------------------------------------

class GroupStateStore(CompactedLog):
    """The group log of one coordinator (``<directory>/log/``) and the state it holds.

    State, rebuilt by ``load`` and kept current by every write (read-only for callers):
    ``offsets`` group -> (topic, partition) -> committed OffsetEntry; ``pending`` producer id ->
    group -> (topic, partition) -> pending OffsetEntry; ``open_producers`` group -> producer
    ids with pending offsets for it; ``groups`` group -> GroupEntry.

    Every write raises ``GroupLogWriteError`` on failure; memory is then unchanged (if
    ``maybe_written``, the log may hold the batch: the caller must stop trusting memory).
    """

    WHAT = "group log"
    DIRS = (LOG_DIR, COMPACTING_DIR, OLD_DIR)
    LOGGER = log
    Corrupt = GroupLogCorrupt
    WriteError = GroupLogWriteError

    def __init__(self, directory: str, flush_policy: FlushPolicy | str = FlushPolicy.OS,
                 now_ms: int = 0, *,
                 segment_bytes: int = DEFAULT_SEGMENT_BYTES,
                 compact_bytes: int = DEFAULT_COMPACT_BYTES,
                 crash_hook: Callable[[str], None] | None = None) -> None:
        """``now_ms``: the time of opening (segment creation). ``crash_hook``: tests only;
        called with the name of each compaction step boundary, raising there simulates a crash."""
        self.offsets: dict[str, dict[TopicPartition, OffsetEntry]] = {}
        self.pending: dict[int, dict[str, dict[TopicPartition, OffsetEntry]]] = {}
        self.open_producers: dict[str, set[int]] = {}
        self.groups: dict[str, GroupEntry] = {}
        self.consumer: dict[str, dict[ConsumerKey, ConsumerEntry]] = {}
        super().__init__(directory, flush_policy, now_ms, segment_bytes=segment_bytes,
                         compact_bytes=compact_bytes, crash_hook=crash_hook)

    # -- the in-memory view (shared by replay and live writes) ------------------------------------
    def _put_committed(self, group: str, tp: TopicPartition, e: OffsetEntry) -> None:
        by_tp = self.offsets.setdefault(group, {})
        old = by_tp.get(tp)
        if old is not None:
            self._live_bytes -= old.size
        by_tp[tp] = e
        self._live_bytes += e.size

    def _drop_committed(self, group: str, tp: TopicPartition) -> None:
        by_tp = self.offsets.get(group)
        if by_tp is None:
            return
        old = by_tp.pop(tp, None)
        if old is not None:
            self._live_bytes -= old.size
        if not by_tp:
            del self.offsets[group]

    def _put_pending(self, pid: int, group: str, tp: TopicPartition, e: OffsetEntry) -> None:
        by_tp = self.pending.setdefault(pid, {}).setdefault(group, {})
        old = by_tp.get(tp)
        if old is not None:
            self._live_bytes -= old.size
        by_tp[tp] = e
        self._live_bytes += e.size
        self.open_producers.setdefault(group, set()).add(pid)

    def _drop_pending(self, pid: int, group: str, tp: TopicPartition) -> None:
        by_group = self.pending.get(pid)
        if by_group is None:
            return
        by_tp = by_group.get(group)
        if by_tp is None:
            return
        old = by_tp.pop(tp, None)
        if old is not None:
            self._live_bytes -= old.size
        if not by_tp:
            del by_group[group]
            self._close_open(group, pid)
        if not by_group:
            del self.pending[pid]

    def _close_open(self, group: str, pid: int) -> None:
        pids = self.open_producers.get(group)
        if pids is not None:
            pids.discard(pid)
            if not pids:
                del self.open_producers[group]

    def _apply_offset(self, pid: int, group: str, tp: TopicPartition, e: OffsetEntry | None) -> None:
        if e is None:
            if pid == NO_PRODUCER_ID:
                # OffsetMetadataManager.replay: a tombstone removes the committed offset and
                # every pending transactional offset of the key.
                self._drop_committed(group, tp)
                for p in list(self.open_producers.get(group, ())):
                    self._drop_pending(p, group, tp)
            else:
                self._drop_pending(pid, group, tp)
        elif pid == NO_PRODUCER_ID:
            self._put_committed(group, tp, e)
        else:
            self._put_pending(pid, group, tp, e)

    def _apply_marker(self, pid: int, commit: bool) -> list[str]:
        """Complete ``pid``'s pending offsets (Kafka's completePendingTxnOffsetCommit); returns
        the groups that had some."""
        by_group = self.pending.pop(pid, None)
        if not by_group:
            return []
        for group, by_tp in by_group.items():
            self._close_open(group, pid)
            for tp, e in by_tp.items():
                self._live_bytes -= e.size
                if not commit:
                    continue
                cur = self.offsets.get(group, {}).get(tp)
                # KIP-98 / Kafka: keep the most recent of a mix of transactional and plain
                # commits, by position in the log.
                if cur is None or e.record_offset > cur.record_offset:
                    self._put_committed(group, tp, e)
        return list(by_group)

    def _apply_group(self, group: str, entry: GroupEntry | None) -> None:
        old = self.groups.pop(group, None)
        if old is not None:
            self._live_bytes -= old.size
        if entry is not None:
            self.groups[group] = entry
            self._live_bytes += entry.size

    def _apply_consumer(self, key: ConsumerKey, entry: ConsumerEntry | None) -> None:
        by_key = self.consumer.setdefault(key.group, {})
        old = by_key.pop(key, None)
        if old is not None:
            self._live_bytes -= old.size
        if entry is not None:
            by_key[key] = entry
            self._live_bytes += entry.size
        elif not by_key:
            del self.consumer[key.group]

    # -- loading ----------------------------------------------------------------------------------
    def load(self) -> LoadedState:
        """Replay the log (see the module doc)."""
        self.consumer.clear()
        self.offsets.clear()
        self.pending.clear()
        self.open_producers.clear()
        self.groups.clear()
        self._replay(self._apply_batch)
        return self.state()

    def _apply_batch(self, h: BatchHeader, batch: memoryview) -> None:
        if h.is_control:
            try:
                ctype, _epoch = parse_control_record(batch)
            except KafkaError as e:
                self._anomaly(f"unreadable control batch at offset {h.base_offset}: {e}")
                return
            if ctype in (CONTROL_COMMIT, CONTROL_ABORT):
                self._apply_marker(h.producer_id, ctype == CONTROL_COMMIT)
            return
        pid = h.producer_id if h.is_transactional else NO_PRODUCER_ID
        epoch = h.producer_epoch if h.is_transactional else NO_PRODUCER_EPOCH
        for rec in self._decode(h, batch):
            self._replay_record(rec.offset, rec.key, rec.value, pid, epoch)

    def _replay_record(self, offset: int, key: bytes | None, value: bytes | None, pid: int,
                       epoch: int) -> None:
        k = self._replay_key(key, decode_key, f" at offset {offset}")
        if k is None:
            return
        if isinstance(k, ConsumerKey):
            self._apply_consumer(k, None if value is None else ConsumerEntry(
                bytes(value), offset, len(key) + len(value) + RECORD_OVERHEAD))
            return
        if isinstance(k, OffsetKey):
            entry = None
            if value is not None:
                try:
                    entry = decode_offset_value(value)
                except (RecordDecodeError, UnicodeDecodeError) as e:
                    raise GroupLogCorrupt(f"offset {offset}: undecodable offset commit value for "
                                          f"{k}: {e}") from None
                entry.record_offset = offset
                entry.producer_id, entry.producer_epoch = pid, epoch
                entry.size = len(key) + len(value) + RECORD_OVERHEAD
            self._apply_offset(pid, k.group, (k.topic, k.partition), entry)
        else:
            gentry = None
            if value is not None:
                try:
                    rec = decode_group_value(value)
                except (RecordDecodeError, UnicodeDecodeError) as e:
                    raise GroupLogCorrupt(f"offset {offset}: undecodable group metadata value for "
                                          f"{k.group!r}: {e}") from None
                gentry = GroupEntry(rec, offset, bytes(value), len(key) + len(value) + RECORD_OVERHEAD)
            self._apply_group(k.group, gentry)

    def state(self) -> LoadedState:
        return LoadedState({g: e.record for g, e in self.groups.items()}, self.offsets, self.pending,
                           {g: {k: e.value for k, e in by_key.items()}
                            for g, by_key in self.consumer.items()})

    # -- writing ----------------------------------------------------------------------------------
    def commit_offsets(self, group: str, offsets: Mapping[TopicPartition, OffsetEntry], now_ms: int,
                       *, producer_id: int = NO_PRODUCER_ID,
                       producer_epoch: int = NO_PRODUCER_EPOCH) -> None:
        """Write ``offsets`` of ``group`` as one batch: committed at once (producer id -1), or
        pending for ``producer_id`` (a transactional batch with that id and epoch). Fills in each
        entry's value, record offset, producer and size."""
        if not offsets:
            return
        txn = producer_id != NO_PRODUCER_ID
        items = list(offsets.items())
        records = []
        for (topic, partition), e in items:
            key = encode_offset_key(group, topic, partition)
            e.value = encode_offset_value(e.offset, e.leader_epoch, e.metadata, e.commit_timestamp,
                                          e.expire_timestamp)
            e.producer_id = producer_id if txn else NO_PRODUCER_ID
            e.producer_epoch = producer_epoch if txn else NO_PRODUCER_EPOCH
            e.size = len(key) + len(e.value) + RECORD_OVERHEAD
            records.append((key, e.value))
        base = self._append(records, now_ms, producer_id if txn else NO_PRODUCER_ID,
                            producer_epoch if txn else NO_PRODUCER_EPOCH).base_offset
        for i, (tp, e) in enumerate(items):
            e.record_offset = base + i
            self._apply_offset(e.producer_id, group, tp, e)
        self._maybe_compact(now_ms)

    def end_transaction(self, producer_id: int, producer_epoch: int, commit: bool, now_ms: int,
                        coordinator_epoch: int = 0) -> list[str]:
        """Write the COMMIT/ABORT control batch of ``producer_id`` and complete its pending
        offsets; returns the groups that had some."""
        self._append_control(producer_id, producer_epoch, commit, coordinator_epoch, now_ms)
        groups = self._apply_marker(producer_id, commit)
        self._maybe_compact(now_ms)
        return groups

    def store_group(self, group: str, record: GroupRecord | None, now_ms: int) -> None:
        """Write ``record`` as the group's metadata, or its tombstone (None)."""
        key = encode_group_key(group)
        value = None if record is None else encode_group_value(record)
        base = self._append([(key, value)], now_ms).base_offset
        entry = None
        if record is not None:
            assert value is not None
            entry = GroupEntry(record, base, value, len(key) + len(value) + RECORD_OVERHEAD)
        self._apply_group(group, entry)
        self._maybe_compact(now_ms)

    def store_consumer(self, group: str, changes: list[tuple[ConsumerKey, bytes | None]],
                       now_ms: int, classic: GroupRecord | None | bool = False) -> None:
        """Write a KIP-848 consumer group's changed records (None: a tombstone) as one batch;
        ``classic`` (a GroupRecord, or None for its tombstone; False: none) adds the group's
        classic metadata record to the same batch, so that a conversion between the two group
        types (KIP-848 online migration) is all or nothing, as Kafka writes it."""
        records: list[tuple[bytes, bytes | None]] = [(consumer_records.encode_key(k), v)
                                                     for k, v in changes]
        gkey = gvalue = None
        if classic is not False:
            gkey = encode_group_key(group)
            gvalue = None if classic is None else encode_group_value(classic)  # type: ignore[arg-type]
            records.append((gkey, gvalue))
        if not records:
            return
        base = self._append(records, now_ms).base_offset
        for i, ((k, v), (kb, _)) in enumerate(zip(changes, records)):
            self._apply_consumer(k, None if v is None else ConsumerEntry(
                v, base + i, len(kb) + len(v) + RECORD_OVERHEAD))
        if gkey is not None:
            self._apply_group(group, None if gvalue is None else GroupEntry(
                classic, base + len(changes), gvalue,                     # type: ignore[arg-type]
                len(gkey) + len(gvalue) + RECORD_OVERHEAD))
        self._maybe_compact(now_ms)

    def delete(self, deletions: Mapping[str, tuple[Iterable[TopicPartition], bool]], now_ms: int) -> None:
        """Tombstones: for each group, one batch with a tombstone per given partition (which
        removes its committed and pending offsets) and, if the flag is set, one for the group
        record; one fdatasync for all. If a later group's append fails, the earlier groups'
        tombstones are kept (written, synced, applied) and the error is raised."""
        done: list[tuple[str, list[TopicPartition], bool]] = []
        error: GroupLogWriteError | None = None
        for group, (tps, drop_group) in deletions.items():
            tps = list(tps)
            records: list[tuple[bytes, bytes | None]] = [(encode_offset_key(group, t, p), None)
                                                         for t, p in tps]
            if drop_group:
                records.append((encode_group_key(group), None))
            if not records:
                continue
            try:
                self._append(records, now_ms, sync=False)
            except GroupLogWriteError as e:
                error = e
                break
            done.append((group, tps, drop_group))
        if done:
            self._sync()
            for group, tps, drop_group in done:
                for tp in tps:
                    self._apply_offset(NO_PRODUCER_ID, group, tp, None)
                if drop_group:
                    self._apply_group(group, None)
        if error is not None:
            raise error
        self._maybe_compact(now_ms)

    def live_records(self) -> list[LiveRecord]:
        """The committed offset and group record of each key and every pending transactional
        offset, in log order (see the module doc)."""
        out: list[LiveRecord] = []
        for group, by_tp in self.offsets.items():
            for (topic, partition), e in by_tp.items():
                out.append(LiveRecord(encode_offset_key(group, topic, partition), e.value,
                                      entry=e))
        for pid, by_group in self.pending.items():
            for group, by_tp in by_group.items():
                for (topic, partition), e in by_tp.items():
                    out.append(LiveRecord(encode_offset_key(group, topic, partition), e.value,
                                          pid, e.producer_epoch, e))
        for group, ge in self.groups.items():
            out.append(LiveRecord(encode_group_key(group), ge.value, entry=ge))
        for by_key in self.consumer.values():
            for k, ce in by_key.items():
                out.append(LiveRecord(consumer_records.encode_key(k), ce.value, entry=ce))
        # A transaction's pending offset that was also materialized is the same object in
        # both maps only after its marker, when it is no longer pending: no duplicates.
        out.sort(key=lambda r: r.entry.record_offset)       # type: ignore[union-attr]
        return out
