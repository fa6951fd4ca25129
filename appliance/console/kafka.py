"""What the console reads and changes, over the Kafka protocol as one principal: the admin code the
CLI uses (``appliance.client.admin``, ``transaction_admin``, ``acl_admin``), never a back door
into a worker's state.

Runs in the console worker; owns one principal's connections to the appliance's own listener
(opened on first use, dropped after a connection error and opened again at the next call). Every
request authenticates as the session's user (SASL SCRAM), so the ACL authorizer decides each
action exactly as it would for that user's own client. Results are plain values for the
templates; a refused or failed action raises ``KafkaError`` (its code and Kafka's name).
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

from appliance.acl import model
from appliance.client import acl_admin, scram_admin, transaction_admin
from appliance.client.admin import (BROKER, EARLIEST, LATEST, OP_DELETE, OP_SET, TOPIC,
                                    AdminClient, partitions_by_topic)
from appliance.client.connection import BrokerConnection
from appliance.client.errors import ErrorCode, KafkaConnectionError, KafkaError
from appliance.client.security import Security

from .records import browse_partition

TP = tuple[str, int]
READ_COMMITTED = 1
DESCRIBE_LOG_DIRS, DESCRIBE_PRODUCERS, DESCRIBE_USER_SCRAM = 35, 61, 50
MECHANISM_NAMES = {1: "SCRAM-SHA-256", 2: "SCRAM-SHA-512"}
# Short: the console's loop waits for each answer (the supervisor's heartbeat timeout is longer).
TIMEOUT_MS = 8000


def check(code: int, message: str | None = None, what: str = "") -> None:
    if int(code) != 0:
        raise KafkaError(int(code), f"{what}: {message}" if what and message else message or what)


def error_text(e: Exception) -> str:
    if isinstance(e, KafkaError):
        try:
            name = ErrorCode(int(e.code)).name.upper()
        except (ValueError, TypeError):
            name = str(e.code)
        text = str(e)
        return text if name in text else f"{name}: {text}" if text else name
    return f"{type(e).__name__}: {e}"


class Backend:
    """One principal's view of the appliance (``bootstrap`` is its own listener)."""

    def __init__(self, bootstrap: str, security: Security, client_id: str = "appliance-console"):
        self.bootstrap = bootstrap
        self.security = security
        self.client_id = client_id
        self._admin: AdminClient | None = None
        self._conn: BrokerConnection | None = None

    # -- connections ------------------------------------------------------------------------------
    @property
    def admin(self) -> AdminClient:
        if self._admin is None:
            self._admin = AdminClient(self.bootstrap, client_id=self.client_id,
                                      request_timeout_ms=TIMEOUT_MS, security=self.security)
        return self._admin

    @property
    def conn(self) -> BrokerConnection:
        if self._conn is None or not self._conn.connected:
            self._conn = transaction_admin.connect(self.bootstrap, TIMEOUT_MS, self.security,
                                                   client_id=self.client_id)
        return self._conn

    def login(self) -> None:
        """Authenticate once (SASL runs when the connection opens): raises what refused it."""
        self.conn.request(3, {"topics": [], "allow_auto_topic_creation": False,
                              "include_cluster_authorized_operations": False,
                              "include_topic_authorized_operations": False})

    def close(self) -> None:
        for c in (self._admin, self._conn):
            if c is not None:
                try:
                    c.close()
                except Exception:
                    pass
        self._admin = self._conn = None

    def call(self, fn, *args, **kw):
        """``fn(*args)``; after a connection error the connections are opened anew next time."""
        try:
            return fn(*args, **kw)
        except (KafkaConnectionError, OSError):
            self.close()
            raise

    # -- topics -----------------------------------------------------------------------------------
    def offsets(self, tps: list[TP]) -> dict[TP, dict]:
        """start, end (high watermark) and LSO of each partition."""
        if not tps:
            return {}
        a = self.admin
        start = a.list_offsets({tp: EARLIEST for tp in tps})
        end = a.list_offsets({tp: LATEST for tp in tps})
        lso = a.list_offsets({tp: LATEST for tp in tps}, isolation_level=READ_COMMITTED)
        return {tp: {"start": start[tp][1], "end": end[tp][1], "lso": lso[tp][1]} for tp in tps}

    def sizes(self, tps: list[TP] | None = None) -> dict[TP, int]:
        """Bytes on disk per partition (DescribeLogDirs; of ``tps`` only when given)."""
        topics = None
        if tps is not None:
            topics = [{"topic": t, "partitions": ps} for t, ps in partitions_by_topic(tps).items()]
        r = self.conn.request(DESCRIBE_LOG_DIRS, {"topics": topics})
        out: dict[TP, int] = defaultdict(int)
        for d in r.results:
            for t in d.topics:
                for p in t.partitions:
                    out[(t.name, p.partition_index)] += p.partition_size
        return out

    def topics(self) -> list[dict]:
        described = [t for t in self.admin.describe_topics() if t["error"][0] == 0]
        tps = [(t["name"], p["partition"]) for t in described for p in t["partitions"]]
        offs = self.offsets(tps)
        try:
            sizes = self.sizes()
        except KafkaError:
            sizes = {}
        rows = []
        for t in described:
            parts = [(t["name"], p["partition"]) for p in t["partitions"]]
            rows.append({"name": t["name"], "internal": t["internal"], "partitions": len(parts),
                         "records": sum(max(0, offs[tp]["end"] - offs[tp]["start"]) for tp in parts),
                         "bytes": sum(sizes.get(tp, 0) for tp in parts),
                         "unstable": sum(max(0, offs[tp]["end"] - offs[tp]["lso"]) for tp in parts)})
        return rows

    def topic(self, name: str) -> dict:
        (t,) = self.admin.describe_topics([name])
        check(t["error"][0], t["error"][1], f"topic {name}")
        tps = [(name, p["partition"]) for p in t["partitions"]]
        offs = self.offsets(tps)
        try:
            sizes = self.sizes(tps)
        except KafkaError:
            sizes = {}
        (cfg,) = self.admin.describe_configs([(TOPIC, name)])
        check(cfg["error"][0], cfg["error"][1], f"configs of {name}")
        return {"name": name, "topic_id": t["topic_id"], "internal": t["internal"],
                "partitions": [{**p, **offs[(name, p["partition"])],
                                "bytes": sizes.get((name, p["partition"]), 0)}
                               for p in t["partitions"]],
                "configs": sorted(cfg["configs"], key=lambda c: c["name"])}

    def create_topic(self, name: str, partitions: int, configs: dict[str, str]) -> None:
        r = self.admin.create_topics([{"name": name, "partitions": partitions, "configs": configs}])
        check(*r[name], f"create {name}")

    def delete_topic(self, name: str) -> None:
        check(*self.admin.delete_topics([name])[name], f"delete {name}")

    def add_partitions(self, name: str, count: int) -> None:
        check(*self.admin.create_partitions({name: count})[name], f"partitions of {name}")

    def alter_config(self, name: str, key: str, value: str | None) -> None:
        op = OP_DELETE if value is None else OP_SET
        (res,) = self.admin.incremental_alter_configs([(TOPIC, name, [(op, key, value)])])
        check(*res, f"{key} of {name}")

    def browse(self, topic: str, partition: int, *, offset: int | None = None,
               timestamp_ms: int | None = None, read_committed: bool = False,
               limit: int = 50) -> dict:
        """Records of one partition from ``offset`` (or the first at or after ``timestamp_ms``),
        control records and the fate of transactional ones marked (``records.browse_partition``)."""
        a = self.admin
        tp = (topic, partition)
        if timestamp_ms is not None:
            code, found, _ = a.list_offsets({tp: timestamp_ms})[tp]
            check(code, None, f"ListOffsets of {topic}-{partition}")
            offset = found if found >= 0 else a.list_offsets({tp: LATEST})[tp][1]
        if offset is None or offset < 0:
            offset = a.list_offsets({tp: EARLIEST})[tp][1]
        conn = a.cluster.connection(a.cluster.leader(topic, partition))
        return browse_partition(conn, topic, partition, offset, read_committed, limit)

    # -- groups -----------------------------------------------------------------------------------
    def groups(self) -> list[dict]:
        return self.admin.list_groups()

    def group(self, name: str) -> dict:
        a = self.admin
        d = a.describe_group(name)
        check(*d["error"], f"group {name}")
        committed = a.committed_offsets(name)
        owner = {tp: m["member_id"] for m in d["members"] for tp in m["assignment"]}
        tps = sorted(set(committed) | set(owner))
        ends = a.list_offsets({tp: LATEST for tp in tps}) if tps else {}
        d["lag"] = [{"topic": t, "partition": p, "committed": committed.get((t, p)),
                     "end": ends[(t, p)][1], "owner": owner.get((t, p)),
                     "lag": (ends[(t, p)][1] - committed[(t, p)]) if (t, p) in committed else None}
                    for t, p in tps]
        return d

    def share_group(self, name: str) -> dict:
        """A share group (KIP-932) as ``appliance share-groups describe`` shows it: state, epochs,
        members with their partitions, start offset and lag per share partition."""
        a = self.admin
        d = a.describe_share_group(name)
        check(*d["error"], f"share group {name}")
        owners: dict[TP, list[str]] = defaultdict(list)
        for m in d["members"]:
            for tp in m["assignment"]:
                owners[tp].append(m["member_id"])     # a share partition may have several
        d["offsets"] = [{"topic": t, "partition": p, "start": start, "lag": lag,
                         "members": owners.get((t, p), [])}
                        for (t, p), (start, lag) in sorted(a.share_offsets(name).items())]
        return d

    def reset_offsets(self, group: str, topic: str, to: str, dry_run: bool) -> list[dict]:
        """Kafka's --reset-offsets --to-earliest|--to-latest for every partition of ``topic``:
        the plan, committed unless ``dry_run`` (only while the group has no members)."""
        a = self.admin
        tps = [(topic, p) for p in a.partitions_of(topic)]
        spec = EARLIEST if to == "earliest" else LATEST
        target = {tp: off for tp, (code, off, _) in a.list_offsets({tp: spec for tp in tps}).items()
                  if code == 0}
        current = a.committed_offsets(group, tps)
        plan = [{"topic": t, "partition": p, "current": current.get((t, p)), "new": target[(t, p)]}
                for t, p in sorted(target)]
        if not dry_run:
            for tp, code in a.commit_offsets(group, target).items():
                check(code, None, f"commit {tp[0]}-{tp[1]} for {group}")
        return plan

    def share_reset_offsets(self, group: str, topic: str, to: str, offset: int | None,
                            dry_run: bool) -> list[dict]:
        """``appliance share-groups reset-offsets --to-earliest|--to-latest|--to-offset`` for
        every partition of ``topic`` (every share partition with state when ``topic`` is empty):
        the plan (each share partition's start offset now and after), set through
        AlterShareGroupOffsets (KIP-932, API 91) unless ``dry_run``. The broker refuses a group
        with members (NON_EMPTY_GROUP), as Kafka's kafka-share-groups.sh says; a dry run works
        on any group. ``offset`` is kept within the log, as the tool does."""
        a = self.admin
        current = a.share_offsets(group)
        tps = ([(topic, p) for p in a.partitions_of(topic)] if topic
               else sorted(current))
        if not tps:
            raise ValueError(f"share group {group} has no share partition to reset: name a topic")
        earliest = a.list_offsets({tp: EARLIEST for tp in tps})
        latest = a.list_offsets({tp: LATEST for tp in tps})
        for tp in tps:
            for found in (earliest, latest):
                check(found[tp][0], None, f"ListOffsets of {tp[0]}-{tp[1]}")
        if to == "earliest":
            new = {tp: earliest[tp][1] for tp in tps}
        elif to == "latest":
            new = {tp: latest[tp][1] for tp in tps}
        elif to == "offset" and offset is not None:
            new = {tp: max(earliest[tp][1], min(latest[tp][1], offset)) for tp in tps}
        else:
            raise ValueError("reset to earliest, latest, or an offset (give the offset)")
        plan = [{"topic": t, "partition": p, "current": current.get((t, p), (None,))[0],
                 "new": new[(t, p)]} for t, p in sorted(new)]
        if not dry_run:
            for (t, p), (code, message) in sorted(a.alter_share_offsets(group, new).items()):
                check(code, message, f"{t}-{p} of {group}")
        return plan

    # -- transactions -----------------------------------------------------------------------------
    def transactions(self, now_ms: int | None = None) -> list[dict]:
        conn = self.conn
        listed = transaction_admin.list_transactions(conn)
        described = transaction_admin.describe_transactions(
            conn, sorted(t["transactional_id"] for t in listed))
        now_ms = now_ms if now_ms is not None else int(time.time() * 1000)
        tps = sorted({tp for d in described for tp in d["partitions"]})
        offs = self.offsets(tps)
        starts = self._txn_starts(tps)
        out = []
        for d in described:
            if d["error_code"]:
                continue
            parts = []
            for tp in d["partitions"]:
                first = starts.get((tp, d["producer_id"]))
                o = offs.get(tp, {})
                parts.append({"topic": tp[0], "partition": tp[1], "first_offset": first,
                              "lso": o.get("lso"), "end": o.get("end"),
                              # this transaction holds the LSO where it began
                              "pins": first is not None and first == o.get("lso"),
                              "lag": (o["end"] - o["lso"]) if o else None})
            start = d["start_time_ms"]
            out.append({**d, "age_ms": now_ms - start if start > 0 else None, "partitions": parts,
                        "open": d["state"] not in ("Empty", "CompleteCommit", "CompleteAbort", "Dead")})
        return sorted(out, key=lambda d: d["transactional_id"])

    def _txn_starts(self, tps: list[TP]) -> dict[tuple[TP, int], int]:
        """(partition, producer id) -> first offset of that producer's open transaction there."""
        if not tps:
            return {}
        r = self.conn.request(DESCRIBE_PRODUCERS, {"topics": [
            {"name": t, "partition_indexes": ps} for t, ps in partitions_by_topic(tps).items()]})
        out = {}
        for t in r.topics:
            for p in t.partitions:
                for ap in (p.active_producers if not p.error_code else ()):
                    if ap.current_txn_start_offset >= 0:
                        out[((t.name, p.partition_index), ap.producer_id)] = ap.current_txn_start_offset
        return out

    def force_terminate(self, transactional_id: str) -> tuple[int, int]:
        return transaction_admin.force_terminate(self.conn, transactional_id, timeout_s=5.0)

    def abort(self, topic: str, partition: int, start_offset: int) -> dict:
        found = transaction_admin.find_hanging(self.conn, topic, partition, start_offset)
        transaction_admin.abort_transaction(self.conn, topic, partition, found["producer_id"],
                                            found["producer_epoch"],
                                            max(found["coordinator_epoch"], 0))
        return found

    # -- security ---------------------------------------------------------------------------------
    def users(self) -> dict[str, list[str]]:
        """SCRAM user -> its mechanisms (never a credential)."""
        r = self.conn.request(DESCRIBE_USER_SCRAM, {"users": None})
        check(r.error_code, r.error_message, "users")
        return {res.user: sorted(MECHANISM_NAMES.get(int(c.mechanism), str(c.mechanism))
                                 for c in res.credential_infos)
                for res in r.results if not int(res.error_code)}

    def add_user(self, name: str, mechanism: str, password: str, iterations: int = 4096) -> None:
        """``appliance users add --bootstrap-server``: AlterUserScramCredentials as this
        session's principal (the authorizer wants ALTER on the cluster)."""
        scram_admin.add_online(self.conn, name, mechanism, password, iterations)

    def delete_user(self, name: str, mechanism: str | None = None) -> list[str]:
        """``appliance users delete --bootstrap-server``: the mechanisms deleted."""
        return scram_admin.delete_online(self.conn, name, mechanism)

    def acls(self) -> list[dict]:
        found = acl_admin.describe_acls(self.conn, acl_admin.AclFilter())
        return [{"resource": acl_admin.resource_str(b.resource_type, b.resource_name, b.pattern_type),
                 "entry": acl_admin.entry_str(b.principal, b.host, b.operation, b.permission_type),
                 "binding": b, "names": {
                     "resource_type": model.resource_type_name(b.resource_type),
                     "pattern": model.pattern_name(b.pattern_type),
                     "operation": model.operation_name(b.operation),
                     "permission": model.permission_name(b.permission_type)}}
                for b in sorted(found)]

    def add_acl(self, binding: Any) -> None:
        acl_admin.create_acls(self.conn, [binding])

    def remove_acl(self, f: Any) -> list:
        return acl_admin.delete_acls(self.conn, [f])

    # -- Spark jobs (appliance.spark.jobs: the sink's job log and `appliance spark recover`) ------
    def client_config(self) -> dict[str, Any]:
        sec = self.security
        return {"bootstrap_servers": self.bootstrap, "client_id": "appliance-console-spark",
                "security_protocol": sec.protocol, "sasl_mechanism": sec.sasl_mechanism,
                "sasl_username": sec.sasl_username, "sasl_password": sec.sasl_password,
                "ssl_cafile": sec.ssl_cafile, "ssl_certfile": sec.ssl_certfile,
                "ssl_keyfile": sec.ssl_keyfile, "ssl_password": sec.ssl_password,
                "ssl_check_hostname": sec.ssl_check_hostname}

    def spark_jobs(self, now_ms: int | None = None) -> list[dict] | None:
        """Every job of the job log, its latest run's phase and whether it waits for a recovery
        (unresolved and not heard of within its timeout); None when there is no job log (this
        page never creates it)."""
        from appliance.spark import jobs
        if jobs.JOB_LOG_TOPIC not in self.admin.list_topics():
            return None
        with jobs.JobLog(self.client_config()) as jl:
            entries = jl.read()
        now_ms = now_ms if now_ms is not None else int(time.time() * 1000)
        out = []
        for (prefix, key), j in sorted(jobs.fold(entries).items()):
            stale = not j.resolved and now_ms - j.last_seen_ms > j.timeout_ms
            out.append({"prefix": prefix, "key": key, "kind": j.kind, "phase": j.phase,
                        "last_seen_ms": j.last_seen_ms, "timeout_ms": j.timeout_ms,
                        "transactions": len(j.txns), "resolved": j.resolved,
                        "needs_recovery": stale})
        return out

    def spark_recover(self) -> list[str]:
        """``appliance spark recover`` for every prefix: what each dead job became."""
        from appliance.spark import jobs
        cfg = self.client_config()
        lines = []
        with jobs.JobLog(cfg) as jl:
            entries = jl.read()
            for prefix in jobs.prefixes(jl, entries):
                lines += [a.line() for a in jobs.Recovery(jl, prefix, cfg).run(entries=entries)]
        return lines

    def broker_configs(self) -> list[dict]:
        node = transaction_admin.node_id(self.conn)
        (res,) = self.admin.describe_configs([(BROKER, str(node))])
        check(*res["error"], "broker configs")
        return res["configs"]
