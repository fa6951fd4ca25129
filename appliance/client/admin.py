"""An admin client over the Kafka protocol: what Kafka's command-line tools need (topics, configs,
offsets, consumer groups, records), for ``appliance topics|groups|configs|get-offsets``.

Runs in the caller's process (the operator's shell); owns its ``Cluster`` (connections and
metadata, ``appliance.client.metadata``) and nothing else. Every call is one or a few requests
sent where Kafka's AdminClient sends them: topic and config changes to any broker (KRaft brokers
forward them to the controller), ListOffsets and DeleteRecords to each partition's leader, group
calls to the group's coordinator (FindCoordinator), ListGroups to every broker. So it works
against a Kafka cluster as against the appliance. Results are plain values; per-item errors come
back as ``(error code, message)`` pairs for the caller to report, request-level failures raise
``KafkaError``. TLS and SASL: ``security`` (``appliance.client.security``), used on every
connection it opens.
"""

from __future__ import annotations

import datetime
import struct
from collections import defaultdict
from typing import Any, Iterable, Mapping

from appliance.client.connection import BrokerConnection
from appliance.client.errors import ErrorCode, KafkaError, error_code
from appliance.client.metadata import COORDINATOR_GROUP, Cluster
from appliance.client.security import Security

__all__ = ["AdminClient", "TOPIC", "BROKER", "CLIENT_METRICS", "EARLIEST", "LATEST", "MAX_TIMESTAMP",
           "OP_SET", "OP_DELETE", "OP_APPEND", "OP_SUBTRACT", "CONFIG_SOURCES"]

METADATA, LIST_OFFSETS, OFFSET_COMMIT, OFFSET_FETCH = 3, 2, 8, 9
DESCRIBE_GROUPS, LIST_GROUPS, CREATE_TOPICS, DELETE_TOPICS, DELETE_RECORDS = 15, 16, 19, 20, 21
CONSUMER_GROUP_DESCRIBE = 69
SHARE_GROUP_DESCRIBE, DESCRIBE_SHARE_OFFSETS, ALTER_SHARE_OFFSETS, DELETE_SHARE_OFFSETS = 77, 90, 91, 92
GROUP_ID_NOT_FOUND = 69
DESCRIBE_CONFIGS, CREATE_PARTITIONS, DELETE_GROUPS, INCREMENTAL_ALTER_CONFIGS = 32, 37, 42, 44
LIST_CONFIG_RESOURCES = 74
DESCRIBE_CLIENT_QUOTAS, ALTER_CLIENT_QUOTAS = 48, 49
TOPIC, BROKER, CLIENT_METRICS = 2, 4, 16
EARLIEST, LATEST, MAX_TIMESTAMP = -2, -1, -3
OP_SET, OP_DELETE, OP_APPEND, OP_SUBTRACT = 0, 1, 2, 3
CONFIG_SOURCES = {0: "UNKNOWN", 1: "DYNAMIC_TOPIC_CONFIG", 2: "DYNAMIC_BROKER_CONFIG",
                  3: "DYNAMIC_DEFAULT_BROKER_CONFIG", 4: "STATIC_BROKER_CONFIG", 5: "DEFAULT_CONFIG",
                  6: "DYNAMIC_BROKER_LOGGER_CONFIG", 7: "CLIENT_METRICS_CONFIG", 8: "GROUP_CONFIG"}
# Versions from which these APIs name topics by id only: stay below them.
_MAX_VERSIONS = {OFFSET_COMMIT: 9, OFFSET_FETCH: 7}

TP = tuple[str, int]


def _ms(timeout_ms: int) -> datetime.timedelta:
    return datetime.timedelta(milliseconds=timeout_ms)


def _err(code, message=None) -> tuple[int, str | None]:
    c = error_code(code)
    return int(c), message or (None if c == ErrorCode.none else c.name.upper())


def decode_assignment(data: bytes | None) -> list[TP]:
    """The partitions of a consumer-protocol assignment (what a classic group's leader hands each
    member in SyncGroup: version, [topic, [partition]], user data)."""
    if not data:
        return []
    out: list[TP] = []
    try:
        pos = 2
        (n,) = struct.unpack_from(">i", data, pos)
        pos += 4
        for _ in range(max(n, 0)):
            (ln,) = struct.unpack_from(">h", data, pos)
            pos += 2
            topic = data[pos:pos + ln].decode()
            pos += ln
            (count,) = struct.unpack_from(">i", data, pos)
            pos += 4
            parts = struct.unpack_from(f">{max(count, 0)}i", data, pos)
            pos += 4 * max(count, 0)
            out += [(topic, p) for p in parts]
    except (struct.error, UnicodeDecodeError):
        return []                       # another protocol's assignment: nothing we can read
    return sorted(out)


class QuotaRequestError(Exception):
    """DescribeClientQuotas answered an error for the whole request."""

    def __init__(self, code: int, message: str | None) -> None:
        super().__init__(code, message)
        self.code, self.message = code, message


def partitions_by_topic(partitions: Iterable[TP]) -> dict[str, list[int]]:
    """(topic, partition) pairs as topic -> its partitions, in first-seen order (the shape of
    every request that names partitions by topic)."""
    by_topic: dict[str, list[int]] = defaultdict(list)
    for t, p in partitions:
        by_topic[t].append(p)
    return by_topic


class AdminClient:
    def __init__(self, bootstrap_servers: str, *, client_id: str = "appliance-admin",
                 request_timeout_ms: int = 30000, security: Security | None = None) -> None:
        self.timeout_ms = request_timeout_ms
        self.cluster = Cluster(bootstrap_servers, client_id=client_id, request_timeout_ms=request_timeout_ms,
                               metadata_timeout_ms=request_timeout_ms, allow_auto_create_topics=False,
                               max_versions=_MAX_VERSIONS, security=security)

    def close(self) -> None:
        self.cluster.close()

    def __enter__(self) -> "AdminClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _any(self) -> BrokerConnection:
        return self.cluster.any_connection()

    # -- topics ---------------------------------------------------------------------------------
    def metadata(self, topics: Iterable[str] | None = None):
        """One Metadata answer (every topic when ``topics`` is None), without creating topics."""
        conn = self._any()
        names = None if topics is None else list(topics)
        return conn.request(METADATA, {
            "topics": None if names is None else [{"name": t, "topic_id": None} for t in names],
            "allow_auto_topic_creation": False, "include_cluster_authorized_operations": False,
            "include_topic_authorized_operations": False})

    def describe_topics(self, topics: Iterable[str] | None = None) -> list[dict]:
        md = self.metadata(topics)
        out = []
        for t in md.topics:
            tid = getattr(t, "topic_id", None)
            out.append({
                "name": t.name, "error": _err(t.error_code),
                "topic_id": None if tid is None or tid.int == 0 else str(tid),
                "internal": bool(t.is_internal),
                "partitions": [{"partition": p.partition_index, "leader": p.leader_id,
                                "leader_epoch": getattr(p, "leader_epoch", -1),
                                "replicas": list(p.replica_nodes), "isr": list(p.isr_nodes),
                                "offline": list(getattr(p, "offline_replicas", ()) or ()),
                                "error": _err(p.error_code)}
                               for p in sorted(t.partitions, key=lambda p: p.partition_index)]})
        return sorted(out, key=lambda t: t["name"] or "")

    def list_topics(self, include_internal: bool = True) -> list[str]:
        return [t["name"] for t in self.describe_topics()
                if t["error"][0] == 0 and (include_internal or not t["internal"])]

    def partitions_of(self, topic: str) -> list[int]:
        (t,) = self.describe_topics([topic])
        if t["error"][0] != 0:
            raise KafkaError(t["error"][0], f"topic {topic!r}")
        return [p["partition"] for p in t["partitions"]]

    def create_topics(self, topics: list[dict], *, validate_only: bool = False) -> dict[str, tuple[int, str | None]]:
        """``topics``: dicts of name, partitions (-1: the broker's default), replication_factor
        (-1: default), configs. Returns name -> (error code, message)."""
        r = self._any().request(CREATE_TOPICS, {
            "topics": [{"name": t["name"], "num_partitions": t.get("partitions", -1),
                        "replication_factor": t.get("replication_factor", -1), "assignments": [],
                        "configs": [{"name": k, "value": v} for k, v in (t.get("configs") or {}).items()]}
                       for t in topics],
            "timeout_ms": self.timeout_ms, "validate_only": validate_only})
        return {t.name: _err(t.error_code, getattr(t, "error_message", None)) for t in r.topics}

    def delete_topics(self, names: list[str]) -> dict[str, tuple[int, str | None]]:
        r = self._any().request(DELETE_TOPICS, {"topic_names": list(names),
                                                "topics": [{"name": n, "topic_id": None} for n in names],
                                                "timeout_ms": self.timeout_ms})
        return {t.name: _err(t.error_code, getattr(t, "error_message", None)) for t in r.responses}

    def create_partitions(self, counts: Mapping[str, int], *, validate_only: bool = False
                          ) -> dict[str, tuple[int, str | None]]:
        r = self._any().request(CREATE_PARTITIONS, {
            "topics": [{"name": n, "count": c, "assignments": None} for n, c in counts.items()],
            "timeout_ms": self.timeout_ms, "validate_only": validate_only})
        return {t.name: _err(t.error_code, t.error_message) for t in r.results}

    # -- configs --------------------------------------------------------------------------------
    def describe_configs(self, resources: list[tuple[int, str]], *, include_synonyms: bool = False
                         ) -> list[dict]:
        r = self._any().request(DESCRIBE_CONFIGS, {
            "resources": [{"resource_type": rt, "resource_name": name, "configuration_keys": None}
                          for rt, name in resources],
            "include_synonyms": include_synonyms, "include_documentation": False})
        out = []
        for res in r.results:
            out.append({"type": int(res.resource_type), "name": res.resource_name,
                        "error": _err(res.error_code, res.error_message),
                        "configs": [{"name": c.name, "value": c.value, "read_only": c.read_only,
                                     "sensitive": c.is_sensitive,
                                     "source": CONFIG_SOURCES.get(int(getattr(c, "config_source", 0)), "UNKNOWN"),
                                     "synonyms": [{"name": s.name, "value": s.value,
                                                   "source": CONFIG_SOURCES.get(int(s.source), "UNKNOWN")}
                                                  for s in (getattr(c, "synonyms", ()) or ())]}
                                    for c in res.configs]})
        return out

    def incremental_alter_configs(self, resources: list[tuple[int, str, list[tuple[int, str, str | None]]]],
                                  *, validate_only: bool = False) -> list[tuple[int, str | None]]:
        """``resources``: (type, name, [(op, config name, value)]). One (code, message) each."""
        r = self._any().request(INCREMENTAL_ALTER_CONFIGS, {
            "resources": [{"resource_type": rt, "resource_name": name,
                           "configs": [{"name": n, "config_operation": op, "value": v} for op, n, v in ops]}
                          for rt, name, ops in resources],
            "validate_only": validate_only})
        return [_err(x.error_code, x.error_message) for x in r.responses]

    def list_config_resources(self, resource_types: Iterable[int] = ()) -> list[tuple[str, int]]:
        """ListConfigResources (KIP-1142; v0, ListClientMetricsResources, on brokers that have
        only that, lists CLIENT_METRICS): (name, type) of every config resource of the types."""
        r = self._any().request(LIST_CONFIG_RESOURCES, {"resource_types": list(resource_types)})
        if r.error_code:
            raise KafkaError(error_code(r.error_code))
        return [(c.resource_name, int(getattr(c, "resource_type", CLIENT_METRICS)))
                for c in r.config_resources]

    # -- client quotas (KIP-546) ----------------------------------------------------------------
    def describe_client_quotas(self, components: list[tuple[str, int, str | None]],
                               strict: bool = False) -> list[tuple[dict, dict]]:
        """``components``: (entity type, match type 0 exact / 1 default / 2 any, name). Returns
        [(entity: type -> name or None, values: key -> value)]; KafkaError-like (code, message)
        raised as AdminError by the caller through ``error``."""
        r = self._any().request(DESCRIBE_CLIENT_QUOTAS, {
            "components": [{"entity_type": t, "match_type": m, "match": n} for t, m, n in components],
            "strict": strict})
        if r.error_code:
            raise QuotaRequestError(int(r.error_code), r.error_message)
        return [({e.entity_type: e.entity_name for e in entry.entity},
                 {v.key: v.value for v in entry.values}) for entry in r.entries or ()]

    def alter_client_quotas(self, entries: list[tuple[dict, list[tuple[str, float | None]]]],
                            *, validate_only: bool = False) -> list[tuple[int, str | None]]:
        """``entries``: (entity: type -> name or None, [(key, value, or None to remove)])."""
        r = self._any().request(ALTER_CLIENT_QUOTAS, {
            "entries": [{"entity": [{"entity_type": t, "entity_name": n} for t, n in entity.items()],
                         "ops": [{"key": k, "value": 0.0 if v is None else float(v),
                                  "remove": v is None} for k, v in ops]}
                        for entity, ops in entries],
            "validate_only": validate_only})
        return [_err(x.error_code, x.error_message) for x in r.entries]

    # -- offsets and records --------------------------------------------------------------------
    def _by_leader(self, tps: Iterable[TP]) -> dict[int, list[TP]]:
        out: dict[int, list[TP]] = defaultdict(list)
        for tp in tps:
            out[self.cluster.leader(*tp)].append(tp)
        return out

    def list_offsets(self, specs: Mapping[TP, int], *, isolation_level: int = 0
                     ) -> dict[TP, tuple[int, int, int]]:
        """(topic, partition) -> (error code, offset, timestamp) for each spec: EARLIEST, LATEST,
        MAX_TIMESTAMP or a timestamp in ms; offset -1 when none matches."""
        out: dict[TP, tuple[int, int, int]] = {}
        for leader, tps in self._by_leader(specs).items():
            topics: dict[str, list] = defaultdict(list)
            for t, p in tps:
                topics[t].append({"partition_index": p, "timestamp": specs[(t, p)], "current_leader_epoch": -1})
            conn = self.cluster.connection(leader)
            version = conn.version(LIST_OFFSETS, minimum=7 if MAX_TIMESTAMP in specs.values() else None)
            r = conn.request(LIST_OFFSETS, {"replica_id": -1, "isolation_level": isolation_level,
                                            "topics": [{"name": t, "partitions": ps} for t, ps in topics.items()]},
                             version=version)
            for t in r.topics:
                for p in t.partitions:
                    out[(t.name, p.partition_index)] = (int(p.error_code), p.offset, p.timestamp)
        return out

    def delete_records(self, offsets: Mapping[TP, int]) -> dict[TP, tuple[int, int]]:
        """(topic, partition) -> (error code, low watermark) after deleting below each offset."""
        out: dict[TP, tuple[int, int]] = {}
        for leader, tps in self._by_leader(offsets).items():
            topics: dict[str, list] = defaultdict(list)
            for t, p in tps:
                topics[t].append({"partition_index": p, "offset": offsets[(t, p)]})
            r = self.cluster.connection(leader).request(DELETE_RECORDS, {
                "topics": [{"name": t, "partitions": ps} for t, ps in topics.items()],
                "timeout_ms": self.timeout_ms})
            for t in r.topics:
                for p in t.partitions:
                    out[(t.name, p.partition_index)] = (int(p.error_code), p.low_watermark)
        return out

    # -- consumer groups ------------------------------------------------------------------------
    def list_groups(self, states: Iterable[str] = (), types: Iterable[str] = ()) -> list[dict]:
        """``types`` (ListGroups v5, KIP-848): "classic", "consumer", "share"; a broker below v5
        lists every group, told apart by protocol type ("share" for share groups)."""
        self.cluster.refresh(())
        seen: dict[str, dict] = {}
        kinds = [t.lower() for t in types]
        for node in sorted(self.cluster.brokers):
            r = self.cluster.connection(node).request(LIST_GROUPS, {"states_filter": list(states),
                                                                    "types_filter": kinds})
            if r.error_code != 0:
                raise KafkaError(r.error_code, f"ListGroups on broker {node}")
            for g in r.groups:
                seen[g.group_id] = {"group": g.group_id, "protocol_type": g.protocol_type,
                                    "state": getattr(g, "group_state", "") or "",
                                    # ListGroups v5 (KIP-848): classic or consumer
                                    "group_type": getattr(g, "group_type", None) or None}
        if states:        # a broker without the states filter (ListGroups < v4) lists them all
            wanted = {s.lower() for s in states}
            seen = {k: v for k, v in seen.items() if v["state"].lower() in wanted}
        if kinds:
            seen = {k: v for k, v in seen.items()
                    if (v["group_type"] or ("share" if v["protocol_type"] == "share" else "classic"))
                    in kinds}
        return sorted(seen.values(), key=lambda g: g["group"])

    def _coordinator(self, group: str) -> BrokerConnection:
        return self.cluster.coordinator(group, COORDINATOR_GROUP)

    def describe_group(self, group: str) -> dict:
        """A group as Kafka's Admin describes it: ConsumerGroupDescribe first (KIP-848 consumer
        groups, with ``type`` "consumer", epochs and assignments), DescribeGroups when the broker
        lacks it or answers GROUP_ID_NOT_FOUND (a classic group)."""
        conn = self._coordinator(group)
        if conn.supports(CONSUMER_GROUP_DESCRIBE, 0):
            r = conn.request(CONSUMER_GROUP_DESCRIBE, {"group_ids": [group],
                                                       "include_authorized_operations": False})
            (g,) = r.groups
            if g.error_code != ErrorCode.group_id_not_found:
                names = {}
                if g.members:
                    md = conn.request(3, {"topics": None, "allow_auto_topic_creation": False,
                                          "include_topic_authorized_operations": False})
                    names = {t.topic_id: t.name for t in md.topics}
                return {"group": g.group_id, "type": "consumer",
                        "error": _err(g.error_code, g.error_message), "state": g.group_state,
                        "protocol_type": "consumer", "protocol": g.assignor_name,
                        "group_epoch": g.group_epoch, "assignment_epoch": g.assignment_epoch,
                        "coordinator": conn.node_id,
                        "members": [{"member_id": m.member_id, "instance_id": m.instance_id,
                                     "client_id": m.client_id, "host": m.client_host,
                                     "member_epoch": m.member_epoch,
                                     "assignment": sorted(
                                         (t.topic_name or names.get(t.topic_id, ""), p)
                                         for t in m.assignment.topic_partitions
                                         for p in t.partitions)}
                                    for m in g.members]}
        r = conn.request(DESCRIBE_GROUPS, {"groups": [group],
                                                               "include_authorized_operations": False})
        (g,) = r.groups
        # DescribeGroups v6 (KIP-1043) says GROUP_ID_NOT_FOUND where v0-5 said Dead: both are
        # a group that does not exist (state Dead), as kafka-consumer-groups.sh reports it.
        not_found = g.error_code == GROUP_ID_NOT_FOUND
        return {"group": g.group_id, "type": "classic",
                "error": _err(0, None) if not_found else _err(g.error_code, getattr(g, "error_message", None)),
                "state": g.group_state, "protocol_type": g.protocol_type, "protocol": g.protocol_data,
                "coordinator": self._coordinator(group).node_id,
                "members": [{"member_id": m.member_id, "instance_id": getattr(m, "group_instance_id", None),
                             "client_id": m.client_id, "host": m.client_host,
                             "assignment": decode_assignment(m.member_assignment)
                             if g.protocol_type == "consumer" else []}
                            for m in g.members]}

    def delete_groups(self, groups: list[str]) -> dict[str, tuple[int, str | None]]:
        out = {}
        for g in groups:
            r = self._coordinator(g).request(DELETE_GROUPS, {"groups_names": [g]})
            for res in r.results:
                out[res.group_id] = _err(res.error_code)
        return out

    def committed_offsets(self, group: str, partitions: Iterable[TP] | None = None) -> dict[TP, int]:
        """The group's committed offsets (all of them when ``partitions`` is None)."""
        topics = None
        if partitions is not None:
            topics = [{"name": t, "partition_indexes": ps}
                      for t, ps in partitions_by_topic(partitions).items()]
        r = self._coordinator(group).request(OFFSET_FETCH, {"group_id": group, "topics": topics,
                                                            "require_stable": False})
        if getattr(r, "error_code", 0):
            raise KafkaError(r.error_code, f"OffsetFetch of group {group!r}")
        out = {}
        for t in r.topics:
            for p in t.partitions:
                if p.error_code:
                    raise KafkaError(p.error_code, f"OffsetFetch of {t.name}-{p.partition_index}")
                if p.committed_offset >= 0:
                    out[(t.name, p.partition_index)] = p.committed_offset
        return out

    def commit_offsets(self, group: str, offsets: Mapping[TP, int]) -> dict[TP, int]:
        """Commit as Kafka's alterConsumerGroupOffsets does (generation -1, no member: allowed
        only while the group has no members). (topic, partition) -> error code."""
        by_topic: dict[str, list] = defaultdict(list)
        for (t, p), off in offsets.items():
            by_topic[t].append({"partition_index": p, "committed_offset": off, "committed_leader_epoch": -1,
                                "committed_metadata": ""})
        r = self._coordinator(group).request(OFFSET_COMMIT, {
            "group_id": group, "generation_id_or_member_epoch": -1, "member_id": "",
            "group_instance_id": None, "retention_time_ms": -1,
            "topics": [{"name": t, "partitions": ps} for t, ps in by_topic.items()]})
        return {(t.name, p.partition_index): int(p.error_code) for t in r.topics for p in t.partitions}

    # -- share groups (KIP-932) -----------------------------------------------------------------
    def describe_share_group(self, group: str) -> dict:
        """ShareGroupDescribe: state, epochs and members (their partitions by topic name)."""
        conn = self._coordinator(group)
        (g,) = conn.request(SHARE_GROUP_DESCRIBE, {"group_ids": [group],
                                                   "include_authorized_operations": False}).groups
        return {"group": g.group_id, "error": _err(g.error_code, g.error_message),
                "state": g.group_state, "group_epoch": g.group_epoch,
                "assignment_epoch": g.assignment_epoch, "coordinator": conn.node_id,
                "members": [{"member_id": m.member_id, "client_id": m.client_id,
                             "host": m.client_host, "member_epoch": m.member_epoch,
                             "assignment": sorted((t.topic_name, p)
                                                  for t in m.assignment.topic_partitions
                                                  for p in t.partitions)}
                            for m in g.members]}

    def share_offsets(self, group: str, partitions: Iterable[TP] | None = None
                      ) -> dict[TP, tuple[int, int | None]]:
        """DescribeShareGroupOffsets: (topic, partition) -> (start offset, lag; None below v1)
        of the share partitions with state (all of them when ``partitions`` is None)."""
        topics = None
        if partitions is not None:
            topics = [{"topic_name": t, "partitions": ps}
                      for t, ps in partitions_by_topic(partitions).items()]
        (g,) = self._coordinator(group).request(DESCRIBE_SHARE_OFFSETS, {"groups": [
            {"group_id": group, "topics": topics}]}).groups
        if g.error_code:
            raise KafkaError(g.error_code, g.error_message or f"DescribeShareGroupOffsets of {group!r}")
        out = {}
        for t in g.topics:
            for p in t.partitions:
                if p.error_code:
                    raise KafkaError(p.error_code, f"DescribeShareGroupOffsets of {t.topic_name}-{p.partition_index}")
                if p.start_offset >= 0:
                    lag = getattr(p, "lag", -1)
                    out[(t.topic_name, p.partition_index)] = (p.start_offset, lag if lag >= 0 else None)
        return out

    def alter_share_offsets(self, group: str, offsets: Mapping[TP, int]) -> dict[TP, tuple[int, str | None]]:
        """AlterShareGroupOffsets (only while the group has no members): (topic, partition) ->
        (error code, message); a request-level error raises."""
        by_topic: dict[str, list] = defaultdict(list)
        for (t, p), off in offsets.items():
            by_topic[t].append({"partition_index": p, "start_offset": off})
        r = self._coordinator(group).request(ALTER_SHARE_OFFSETS, {"group_id": group, "topics": [
            {"topic_name": t, "partitions": ps} for t, ps in by_topic.items()]})
        if r.error_code:
            raise KafkaError(r.error_code, r.error_message or f"AlterShareGroupOffsets of {group!r}")
        return {(t.topic_name, p.partition_index): _err(p.error_code, p.error_message)
                for t in r.responses for p in t.partitions}

    def delete_share_offsets(self, group: str, topics: Iterable[str]) -> dict[str, tuple[int, str | None]]:
        """DeleteShareGroupOffsets: topic -> (error code, message); a request-level error raises."""
        r = self._coordinator(group).request(DELETE_SHARE_OFFSETS, {
            "group_id": group, "topics": [{"topic_name": t} for t in topics]})
        if r.error_code:
            raise KafkaError(r.error_code, r.error_message or f"DeleteShareGroupOffsets of {group!r}")
        return {t.topic_name: _err(t.error_code, t.error_message) for t in r.responses}
