"""ACL administration over the Kafka protocol, for ``appliance acls add|list|remove`` (what Kafka's
kafka-acls.sh does).

Runs in the operator's shell; owns nothing but one connection to the broker
(``appliance.client.transaction_admin.connect``: the same, version-negotiated, connection
``appliance transactions`` uses), so it works the same against a Kafka cluster. ``plan`` turns the command line's
principals, hosts, operations and resources into ACLs exactly as AclCommand does (every
principal x host x operation, ``All`` by default, ``*`` hosts by default, ``--producer`` and
``--consumer`` shorthands, operations checked against what each resource type supports);
``create_acls`` / ``describe_acls`` / ``delete_acls`` are CreateAcls, DescribeAcls and
DeleteAcls.
"""

from __future__ import annotations

from appliance.client.connection import BrokerConnection
from appliance.client.errors import ErrorCode, KafkaError

from appliance.acl.model import (CLUSTER_NAME, SUPPORTED_OPERATIONS, WILDCARD_HOST, AclBinding,
                                 AclFilter, AclOperation, AclPermissionType, PatternType,
                                 ResourceType, operation_name, permission_name, pattern_name)

DESCRIBE_ACLS, CREATE_ACLS, DELETE_ACLS = 29, 30, 31
O, R, P, A = AclOperation, ResourceType, PatternType, AclPermissionType

Resource = tuple[int, str, int]           # (resource type, name, pattern type)
Entry = tuple[str, str, int, int]         # (principal, host, operation, permission)


class UsageError(ValueError):
    """A command line kafka-acls.sh would refuse (its message is AclCommand's)."""


def resource_str(rtype: int, name: str, pattern: int) -> str:
    """Kafka's ResourcePattern.toString."""
    return (f"ResourcePattern(resourceType={ResourceType(rtype).name}, name={name}, "
            f"patternType={pattern_name(pattern)})")


def entry_str(principal: str, host: str, op: int, perm: int) -> str:
    """Kafka's AccessControlEntry.toString."""
    return (f"(principal={principal}, host={host}, operation={AclOperation(op).name}, "
            f"permissionType={AclPermissionType(perm).name})")


def resources(topics=(), groups=(), transactional_ids=(), cluster: bool = False,
              pattern: int = P.LITERAL) -> list[Resource]:
    out: list[Resource] = [(R.TOPIC, t.strip(), pattern) for t in topics]
    if cluster and pattern == P.LITERAL:
        out.append((R.CLUSTER, CLUSTER_NAME, P.LITERAL))
    out += [(R.GROUP, g.strip(), pattern) for g in groups]
    out += [(R.TRANSACTIONAL_ID, t, pattern) for t in transactional_ids]
    return out


def _principal(text: str) -> str:
    ptype, sep, name = text.strip().partition(":")
    if not sep or not ptype:
        raise UsageError(f"expected a string in format principalType:principalName but got {text}")
    return f"{ptype}:{name}"


def _entries(allow_principals, deny_principals, allow_hosts, deny_hosts, operations) -> set[Entry]:
    allow = {_principal(p) for p in allow_principals}
    deny = {_principal(p) for p in deny_principals}
    # A principal with no host given gets "*" (AclCommand.getHosts).
    allow_h = {h.strip() for h in allow_hosts} or ({WILDCARD_HOST} if allow else set())
    deny_h = {h.strip() for h in deny_hosts} or ({WILDCARD_HOST} if deny else set())
    out = {(p, h, int(op), int(A.ALLOW)) for p in allow for h in allow_h for op in operations}
    out |= {(p, h, int(op), int(A.DENY)) for p in deny for h in deny_h for op in operations}
    return out


def plan(res: list[Resource], *, allow_principals=(), deny_principals=(), allow_hosts=(),
         deny_hosts=(), operations=(O.ALL,), producer: bool = False, consumer: bool = False,
         idempotent: bool = False) -> dict[Resource, set[Entry]]:
    """AclCommand.getResourceFilterToAcls: the ACLs each resource gets."""
    if not res:
        raise UsageError("You must provide at least one resource: --topic <topic> or --cluster "
                         "or --group <group> or --transactional-id <id>")

    def entries(ops):
        return _entries(allow_principals, deny_principals, allow_hosts, deny_hosts, ops)

    out: dict[Resource, set[Entry]] = {}
    if not producer and not consumer:
        out = {r: entries(operations) for r in res}
    if producer:
        if not any(r[0] == R.TOPIC for r in res):
            raise UsageError("With --producer you must specify a --topic")
        for r in res:
            if r[0] == R.TOPIC:
                out.setdefault(r, set()).update(entries((O.WRITE, O.DESCRIBE, O.CREATE)))
            elif r[0] == R.TRANSACTIONAL_ID:
                out.setdefault(r, set()).update(entries((O.WRITE, O.DESCRIBE)))
        if idempotent:
            out.setdefault((R.CLUSTER, CLUSTER_NAME, P.LITERAL), set()).update(
                entries((O.IDEMPOTENT_WRITE,)))
    if consumer:
        if not any(r[0] == R.TOPIC for r in res) or not any(r[0] == R.GROUP for r in res):
            raise UsageError("With --consumer you must specify a --topic and a --group")
        for r in res:
            if r[0] == R.TOPIC:
                out.setdefault(r, set()).update(entries((O.READ, O.DESCRIBE)))
            elif r[0] == R.GROUP:
                out.setdefault(r, set()).update(entries((O.READ,)))
    for (rtype, _, _), acls in out.items():
        valid = set(SUPPORTED_OPERATIONS[ResourceType(rtype)]) | {O.ALL}
        if any(op not in valid for _, _, op, _ in acls):
            raise UsageError(f"ResourceType {ResourceType(rtype).name} only supports operations "
                             + ", ".join(sorted(operation_name(op) for op in valid)))
    return out


# -- the three APIs ---------------------------------------------------------------------------------

def _check(code, message=None) -> None:
    if int(code) != 0:
        raise KafkaError(ErrorCode(int(code)), message)


def create_acls(conn: BrokerConnection, acls: list[AclBinding]) -> None:
    """CreateAcls; KafkaError with the first ACL's error, if any."""
    r = conn.request(CREATE_ACLS, {"creations": [
        {"resource_type": a.resource_type, "resource_name": a.resource_name,
         "resource_pattern_type": a.pattern_type, "principal": a.principal, "host": a.host,
         "operation": a.operation, "permission_type": a.permission_type} for a in acls]})
    for res in r.results:
        _check(res.error_code, res.error_message)


def describe_acls(conn: BrokerConnection, f: AclFilter) -> list[AclBinding]:
    r = conn.request(DESCRIBE_ACLS, {
        "resource_type_filter": f.resource_type, "resource_name_filter": f.resource_name,
        "pattern_type_filter": f.pattern_type, "principal_filter": f.principal,
        "host_filter": f.host, "operation": f.operation, "permission_type": f.permission_type})
    _check(r.error_code, r.error_message)
    return [AclBinding(res.resource_type, res.resource_name, res.pattern_type, a.principal,
                       a.host, a.operation, a.permission_type)
            for res in r.resources for a in res.acls]


def delete_acls(conn: BrokerConnection, filters: list[AclFilter]) -> list[AclBinding]:
    """DeleteAcls; the ACLs removed (KafkaError with the first filter's error, if any)."""
    r = conn.request(DELETE_ACLS, {"filters": [
        {"resource_type_filter": f.resource_type, "resource_name_filter": f.resource_name,
         "pattern_type_filter": f.pattern_type, "principal_filter": f.principal,
         "host_filter": f.host, "operation": f.operation, "permission_type": f.permission_type}
        for f in filters]})
    gone: list[AclBinding] = []
    for res in r.filter_results:
        _check(res.error_code, res.error_message)
        gone += [AclBinding(m.resource_type, m.resource_name, m.pattern_type, m.principal, m.host,
                            m.operation, m.permission_type) for m in res.matching_acls]
    return gone


def grouped(acls: list[AclBinding]) -> dict[Resource, list[Entry]]:
    """ACLs by resource pattern, as kafka-acls.sh --list prints them."""
    out: dict[Resource, list[Entry]] = {}
    for a in sorted(set(acls)):
        out.setdefault((a.resource_type, a.resource_name, a.pattern_type), []).append(
            (a.principal, a.host, a.operation, a.permission_type))
    return out


__all__ = ["UsageError", "plan", "resources", "create_acls", "describe_acls", "delete_acls",
           "grouped", "resource_str", "entry_str", "permission_name"]
