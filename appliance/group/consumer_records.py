"""The records of a KIP-848 consumer group in the group log (``__consumer_offsets``), with
Kafka's layouts, and the translation between them and a ``consumer_group.ConsumerGroup``.

Owns nothing and does no I/O. Used in the coordinator worker by ``appliance.group.store`` (key
decoding, so that replay and compaction keep these records) and by
``appliance.group.consumer_protocol`` (``group_records`` when a group changes, ``restore`` at
load). The records are Kafka's group-coordinator ones (common/message/ConsumerGroup*.json):

    key version  record (value fields)
    3   ConsumerGroupMetadata             group: epoch int32
    4   ConsumerGroupPartitionMetadata    group: topics [topic id, name, partitions, racks []]
    5   ConsumerGroupMemberMetadata       group, member: instance id, rack id, client id, client
                                          host, subscribed topic names, regex, rebalance timeout,
                                          server assignor; tagged field 0: ClassicMemberMetadata
                                          (session timeout, [protocol name, metadata]) for a
                                          member that uses the classic protocol
    6   ConsumerGroupTargetAssignmentMetadata  group: assignment epoch int32
    7   ConsumerGroupTargetAssignmentMember    group, member: [topic id, [partitions]]
    8   ConsumerGroupCurrentMemberAssignment   group, member: member epoch, previous epoch,
                                          state int8, assigned, pending revocation

Keys are not flexible (int16 version, then int16-length strings); values start with int16
version 0 and are flexible (compact strings and arrays, uuid as 16 bytes, an empty tagged-field
section). A tombstone (null value) deletes its key; a group is gone once every key is.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from appliance.group.consumer_group import (ClassicMemberMetadata, ConsumerGroup, ConsumerMember,
                                            MemberState)
from appliance.protocol.internal_records import (RecordDecodeError, get_compact_bytes,
                                                 get_compact_string, get_string, get_uvarint,
                                                 need, put_compact_bytes, put_compact_string,
                                                 put_string, put_uvarint, read_tagged,
                                                 skip_tagged, version_of)

__all__ = ["ConsumerKey", "KEY_VERSIONS", "encode_key", "decode_key", "group_records", "restore",
           "GROUP_METADATA", "PARTITION_METADATA", "MEMBER_METADATA", "TARGET_METADATA",
           "TARGET_MEMBER", "CURRENT_ASSIGNMENT"]

GROUP_METADATA, PARTITION_METADATA, MEMBER_METADATA = 3, 4, 5
TARGET_METADATA, TARGET_MEMBER, CURRENT_ASSIGNMENT = 6, 7, 8
KEY_VERSIONS = frozenset(range(3, 9))
_WITH_MEMBER = frozenset({MEMBER_METADATA, TARGET_MEMBER, CURRENT_ASSIGNMENT})

# Kafka's MemberState values (CurrentMemberAssignment.State)
_STATE_CODE = {MemberState.STABLE: 0, MemberState.UNREVOKED_PARTITIONS: 1,
               MemberState.UNRELEASED_PARTITIONS: 2}
_CODE_STATE = {v: k for k, v in _STATE_CODE.items()}

_h = struct.Struct(">h")
_b = struct.Struct(">b")
_i = struct.Struct(">i")


class ConsumerKey(NamedTuple):
    kind: int                 # the key version
    group: str
    member_id: str | None     # for the per-member records


def encode_key(k: ConsumerKey) -> bytes:
    out = bytearray(_h.pack(k.kind))
    put_string(out, k.group)
    if k.kind in _WITH_MEMBER:
        put_string(out, k.member_id or "")
    return bytes(out)


def decode_key(buf: memoryview, version: int) -> ConsumerKey:
    group, pos = get_string(buf, 2)
    member = None
    if version in _WITH_MEMBER:
        member, pos = get_string(buf, pos)
    return ConsumerKey(version, group, member)          # type: ignore[arg-type]


# -- value helpers ---------------------------------------------------------------------------------

def _start() -> bytearray:
    return bytearray(_h.pack(0))


def _end(out: bytearray) -> bytes:
    put_uvarint(out, 0)                 # no tagged fields
    return bytes(out)


def _put_parts(out: bytearray, a: dict[bytes, frozenset[int]]) -> None:
    items = sorted((tid, ps) for tid, ps in a.items() if ps)
    put_uvarint(out, len(items) + 1)
    for tid, ps in items:
        out += tid
        put_uvarint(out, len(ps) + 1)
        for p in sorted(ps):
            out += _i.pack(p)
        put_uvarint(out, 0)


def _get_array_len(buf: memoryview, pos: int) -> tuple[int, int]:
    n, pos = get_uvarint(buf, pos)
    if n == 0:
        raise RecordDecodeError("null array")
    return n - 1, pos


def _get_parts(buf: memoryview, pos: int) -> tuple[dict[bytes, frozenset[int]], int]:
    n, pos = _get_array_len(buf, pos)
    out = {}
    for _ in range(n):
        need(buf, pos, 16)
        tid = bytes(buf[pos:pos + 16])
        pos += 16
        m, pos = _get_array_len(buf, pos)
        need(buf, pos, 4 * m)
        ps = frozenset(_i.unpack_from(buf, pos + 4 * j)[0] for j in range(m))
        pos += 4 * m
        pos = skip_tagged(buf, pos)
        out[tid] = ps
    return out, pos


def _epoch_value(epoch: int) -> bytes:
    out = _start()
    out += _i.pack(epoch)
    return _end(out)


def _get_i32(buf: memoryview, pos: int) -> tuple[int, int]:
    need(buf, pos, 4)
    return _i.unpack_from(buf, pos)[0], pos + 4


def _check_version(buf: memoryview) -> None:
    v = version_of(buf)
    if v != 0:
        raise RecordDecodeError(f"unknown consumer group value version {v}")


# -- a group as records ----------------------------------------------------------------------------

def group_records(group: ConsumerGroup) -> dict[ConsumerKey, bytes]:
    """Every record the group stands for now (Kafka writes the same set, record by record)."""
    gid = group.group_id
    out: dict[ConsumerKey, bytes] = {ConsumerKey(GROUP_METADATA, gid, None):
                                     _epoch_value(group.group_epoch)}
    v = _start()
    topics = sorted(group.subscription_metadata.items())
    put_uvarint(v, len(topics) + 1)
    for name, (tid, n) in topics:
        v += tid
        put_compact_string(v, name)
        v += _i.pack(n)
        put_uvarint(v, 1)                              # no partition racks
        put_uvarint(v, 0)
    out[ConsumerKey(PARTITION_METADATA, gid, None)] = _end(v)
    out[ConsumerKey(TARGET_METADATA, gid, None)] = _epoch_value(group.assignment_epoch)
    for mid, m in group.members.items():
        v = _start()
        put_compact_string(v, m.instance_id, nullable=True)
        put_compact_string(v, m.rack_id, nullable=True)
        put_compact_string(v, m.client_id)
        put_compact_string(v, m.client_host)
        put_uvarint(v, len(m.subscribed_topic_names) + 1)
        for t in m.subscribed_topic_names:
            put_compact_string(v, t)
        put_compact_string(v, m.subscribed_topic_regex, nullable=True)
        v += _i.pack(m.rebalance_timeout_ms)
        put_compact_string(v, m.server_assignor, nullable=True)
        if m.classic is None:
            out[ConsumerKey(MEMBER_METADATA, gid, mid)] = _end(v)
        else:
            c = bytearray(_i.pack(m.classic.session_timeout_ms))
            put_uvarint(c, len(m.classic.protocols) + 1)
            for name, meta in m.classic.protocols:
                put_compact_string(c, name)
                put_compact_bytes(c, bytes(meta))
                put_uvarint(c, 0)
            put_uvarint(c, 0)
            put_uvarint(v, 1)                          # one tagged field: tag 0
            put_uvarint(v, 0)
            put_uvarint(v, len(c))
            v += c
            out[ConsumerKey(MEMBER_METADATA, gid, mid)] = bytes(v)
        v = _start()
        _put_parts(v, group.target.get(mid, {}))
        out[ConsumerKey(TARGET_MEMBER, gid, mid)] = _end(v)
        v = _start()
        v += _i.pack(m.member_epoch)
        v += _i.pack(m.previous_member_epoch)
        v += _b.pack(_STATE_CODE[m.state])
        _put_parts(v, m.assigned)
        _put_parts(v, m.pending_revocation)
        out[ConsumerKey(CURRENT_ASSIGNMENT, gid, mid)] = _end(v)
    return out


def _classic_metadata(buf: memoryview) -> ClassicMemberMetadata:
    session, pos = _get_i32(buf, 0)
    n, pos = _get_array_len(buf, pos)
    protocols = []
    for _ in range(n):
        name, pos = get_compact_string(buf, pos)
        meta, pos = get_compact_bytes(buf, pos)
        pos = skip_tagged(buf, pos)
        protocols.append((name or "", meta))
    return ClassicMemberMetadata(session, tuple(protocols))


def restore(group_id: str, records: dict[ConsumerKey, bytes], now_ms: int) -> ConsumerGroup | None:
    """The group the records stand for (Kafka's replay of them), or None when they hold no
    group metadata. Raises RecordDecodeError."""
    meta = records.get(ConsumerKey(GROUP_METADATA, group_id, None))
    if meta is None:
        return None
    group = ConsumerGroup(group_id, now_ms)
    buf = memoryview(meta)
    _check_version(buf)
    group.group_epoch, _ = _get_i32(buf, 2)
    target_meta = records.get(ConsumerKey(TARGET_METADATA, group_id, None))
    if target_meta is not None:
        buf = memoryview(target_meta)
        _check_version(buf)
        group.assignment_epoch, _ = _get_i32(buf, 2)
    pm = records.get(ConsumerKey(PARTITION_METADATA, group_id, None))
    if pm is not None:
        buf = memoryview(pm)
        _check_version(buf)
        n, pos = _get_array_len(buf, 2)
        for _ in range(n):
            need(buf, pos, 16)
            tid = bytes(buf[pos:pos + 16])
            name, pos = get_compact_string(buf, pos + 16)
            count, pos = _get_i32(buf, pos)
            racks, pos = _get_array_len(buf, pos)
            for _ in range(racks):                      # partition racks: not used here
                pos += 4
                k, pos = _get_array_len(buf, pos)
                for _ in range(k):
                    _, pos = get_compact_string(buf, pos)
                pos = skip_tagged(buf, pos)
            pos = skip_tagged(buf, pos)
            group.subscription_metadata[name] = (tid, count)      # type: ignore[index]
    for key, value in records.items():
        if key.kind != MEMBER_METADATA:
            continue
        buf = memoryview(value)
        _check_version(buf)
        instance, pos = get_compact_string(buf, 2, nullable=True)
        rack, pos = get_compact_string(buf, pos, nullable=True)
        client_id, pos = get_compact_string(buf, pos)
        client_host, pos = get_compact_string(buf, pos)
        n, pos = _get_array_len(buf, pos)
        names = []
        for _ in range(n):
            t, pos = get_compact_string(buf, pos)
            names.append(t)
        regex, pos = get_compact_string(buf, pos, nullable=True)
        rebalance, pos = _get_i32(buf, pos)
        assignor, pos = get_compact_string(buf, pos, nullable=True)
        member = ConsumerMember(key.member_id or "", instance, rack, client_id or "",
                                client_host or "", rebalance, tuple(sorted(names)), regex,
                                assignor)
        if pos < len(buf):
            tagged, _ = read_tagged(buf, pos)
            if 0 in tagged:
                member.classic = _classic_metadata(memoryview(tagged[0]))
        cur = records.get(ConsumerKey(CURRENT_ASSIGNMENT, group_id, key.member_id))
        if cur is not None:
            buf = memoryview(cur)
            _check_version(buf)
            member.member_epoch, pos = _get_i32(buf, 2)
            member.previous_member_epoch, pos = _get_i32(buf, pos)
            need(buf, pos, 1)
            member.state = _CODE_STATE.get(_b.unpack_from(buf, pos)[0], MemberState.STABLE)
            member.assigned, pos = _get_parts(buf, pos + 1)
            member.pending_revocation, pos = _get_parts(buf, pos)
        tgt = records.get(ConsumerKey(TARGET_MEMBER, group_id, key.member_id))
        if tgt is not None:
            buf = memoryview(tgt)
            _check_version(buf)
            group.target[member.member_id], _ = _get_parts(buf, 2)
        group.add_member(member)
        group._claim(member)
    return group
