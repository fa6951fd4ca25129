"""The authorizer's decisions: Kafka's StandardAuthorizer rules over a snapshot of the ACLs.

Runs in every frontend process (``Broker.authorizer``); owns that process's decision cache.
The ACLs themselves are the supervisor's (``appliance.acl.store``); a frontend holds the
immutable ``AclSnapshot`` the supervisor last published and swaps it when the version on the
supervisor's state page changes.

The rules (Kafka's StandardAuthorizerData.authorize / findResult):

- a principal in ``super_users`` may do everything, whatever the ACLs say;
- the ACLs that apply to a resource are the LITERAL ones with its name, the LITERAL ones named
  ``*`` (every resource of that type) and the PREFIXED ones whose name starts the resource's;
- of those, an ACL applies to the request when its principal is the request's or ``User:*``,
  its host is the client's address or ``*``, and its operation is the one asked, or ``All``, or
  (ALLOW only) one that implies it: Read, Write, Delete and Alter imply Describe; AlterConfigs
  implies DescribeConfigs;
- one applying DENY refuses (Deny wins); else one applying ALLOW allows;
- with no ACL on the resource at all (for any principal), ``allow_everyone_if_no_acl_found``
  decides (Kafka's ``allow.everyone.if.no.acl.found``, default false); with ACLs on the resource
  but none applying to this principal, the answer is no.

Cost per check: with the authorizer off, one attribute test; for a super user, one set lookup;
otherwise one dict lookup in the decision cache, keyed by (principal, host, operation, resource
type, name) and dropped whenever the snapshot changes (or grows past ``CACHE_MAX`` entries, so
that clients naming random resources cannot grow it without bound). Only a miss walks the
snapshot's index.
"""

from __future__ import annotations

import ipaddress
from typing import Callable, Iterable

from .model import (CLUSTER_NAME, IMPLIES_DESCRIBE, IMPLIES_DESCRIBE_CONFIGS, SUPPORTED_OPERATIONS,
                    WILDCARD_HOST, WILDCARD_PRINCIPAL, WILDCARD_RESOURCE, AclBinding, AclFilter,
                    AclOperation, AclPermissionType, PatternType, ResourceType,
                    operations_bitfield)

O, A, P, R = AclOperation, AclPermissionType, PatternType, ResourceType
CACHE_MAX = 65536
_EMPTY: tuple = ()


class AclSnapshot:
    """An immutable set of ACLs with the index the decisions need."""

    __slots__ = ("version", "acls", "_literal", "_prefixed", "_prefix_lengths", "_by_type")

    def __init__(self, version: int = 0, acls: Iterable[AclBinding] = ()) -> None:
        self.version = version
        self.acls: tuple[AclBinding, ...] = tuple(sorted(set(acls)))
        literal: dict[tuple[int, str], list[AclBinding]] = {}
        prefixed: dict[tuple[int, str], list[AclBinding]] = {}
        lengths: dict[int, set[int]] = {}
        by_type: dict[int, list[AclBinding]] = {}
        for acl in self.acls:
            key = (acl.resource_type, acl.resource_name)
            by_type.setdefault(acl.resource_type, []).append(acl)
            if acl.pattern_type == P.PREFIXED:
                prefixed.setdefault(key, []).append(acl)
                lengths.setdefault(acl.resource_type, set()).add(len(acl.resource_name))
            else:
                literal.setdefault(key, []).append(acl)
        self._literal = {k: tuple(v) for k, v in literal.items()}
        self._prefixed = {k: tuple(v) for k, v in prefixed.items()}
        self._prefix_lengths = {t: tuple(sorted(v)) for t, v in lengths.items()}
        self._by_type = {t: tuple(v) for t, v in by_type.items()}

    def __len__(self) -> int:
        return len(self.acls)

    def applicable(self, resource_type: int, name: str) -> list[AclBinding]:
        """Every ACL whose pattern applies to the resource, for any principal."""
        out = list(self._literal.get((resource_type, name), _EMPTY))
        if name != WILDCARD_RESOURCE:
            out.extend(self._literal.get((resource_type, WILDCARD_RESOURCE), _EMPTY))
        n = len(name)
        for length in self._prefix_lengths.get(resource_type, _EMPTY):
            if length > n:
                break
            out.extend(self._prefixed.get((resource_type, name[:length]), _EMPTY))
        return out

    def of_type(self, resource_type: int) -> tuple[AclBinding, ...]:
        return self._by_type.get(resource_type, _EMPTY)

    def matching(self, f: AclFilter) -> list[AclBinding]:
        """DescribeAcls / DeleteAcls: the ACLs the filter matches."""
        return [acl for acl in self.acls if f.matches(acl)]


def _entry_result(acl: AclBinding, principal: str, host: str, op: int) -> int | None:
    """ALLOW or DENY when the ACL's entry applies to (principal, host, operation), else None
    (StandardAuthorizerData.findResult)."""
    if acl.principal != principal and acl.principal != WILDCARD_PRINCIPAL:
        return None
    if acl.host != WILDCARD_HOST and acl.host != host:
        return None
    if acl.operation != O.ALL:
        if acl.permission_type == A.ALLOW:
            if op == O.DESCRIBE:
                if acl.operation not in IMPLIES_DESCRIBE:
                    return None
            elif op == O.DESCRIBE_CONFIGS:
                if acl.operation not in IMPLIES_DESCRIBE_CONFIGS:
                    return None
            elif acl.operation != op:
                return None
        elif acl.operation != op:
            return None
    return acl.permission_type


def decide(snapshot: AclSnapshot, principal: str, host: str, op: int, resource_type: int,
           name: str, allow_if_no_acl: bool) -> bool:
    """One decision for a non-super user, without the cache."""
    acls = snapshot.applicable(resource_type, name)
    if not acls:
        return allow_if_no_acl
    allowed = False
    for acl in acls:
        r = _entry_result(acl, principal, host, op)
        if r == A.DENY:
            return False
        if r == A.ALLOW:
            allowed = True
    return allowed


def kafka_host(address: str) -> str:
    """The client's address as Kafka's ACL hosts name it (Java's InetAddress.getHostAddress):
    an IPv4-mapped IPv6 address as plain IPv4, any other IPv6 address with every group written
    and none compressed (``0:0:0:0:0:0:0:1``)."""
    text, sep, scope = address.partition("%")
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return address
    if ip.version == 6:
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        full = ":".join(format(int(g, 16), "x") for g in ip.exploded.split(":"))
        return full + sep + scope
    return text


class Authorizer:
    """The frontend's authorizer: config (enable, super users, the no-ACL default) plus the
    current snapshot from ``snapshots`` (a callable, cheap when nothing changed)."""

    __slots__ = ("enabled", "super_users", "allow_if_no_acl", "_snapshots", "_snapshot",
                 "_cache", "_hosts")

    def __init__(self, enabled: bool, super_users: Iterable[str] = (),
                 allow_everyone_if_no_acl_found: bool = False,
                 snapshots: Callable[[], AclSnapshot] | None = None) -> None:
        self.enabled = enabled
        self.super_users = frozenset(super_users)
        self.allow_if_no_acl = allow_everyone_if_no_acl_found
        empty = AclSnapshot()
        self._snapshots = snapshots or (lambda: empty)
        self._snapshot = empty
        self._cache: dict[tuple, bool] = {}
        self._hosts: dict[str, str] = {}

    @classmethod
    def from_config(cls, cfg, snapshots: Callable[[], AclSnapshot] | None = None) -> "Authorizer":
        return cls(cfg.enable, cfg.super_users, cfg.allow_everyone_if_no_acl_found, snapshots)

    def snapshot(self) -> AclSnapshot:
        snap = self._snapshots()
        if snap is not self._snapshot:
            self._snapshot = snap
            self._cache.clear()
        return snap

    def _host(self, address: str) -> str:
        host = self._hosts.get(address)
        if host is None:
            if len(self._hosts) >= CACHE_MAX:
                self._hosts.clear()
            host = self._hosts[address] = kafka_host(address)
        return host

    def authorize(self, principal: str, address: str, op: int, resource_type: int,
                  name: str) -> bool:
        """May ``principal``, connected from ``address``, do ``op`` on the (LITERAL) resource?"""
        if not self.enabled or principal in self.super_users:
            return True
        snap = self._snapshots()          # inlined snapshot(): this runs on every Produce
        if snap is not self._snapshot:
            self._snapshot = snap
            self._cache.clear()
        key = (principal, address, op, resource_type, name)
        r = self._cache.get(key)
        if r is None:
            r = decide(snap, principal, self._host(address), op, resource_type, name,
                       self.allow_if_no_acl)
            if len(self._cache) >= CACHE_MAX:
                self._cache.clear()
            self._cache[key] = r
        return r

    def authorize_cluster(self, principal: str, address: str, op: int) -> bool:
        return self.authorize(principal, address, op, R.CLUSTER, CLUSTER_NAME)

    def authorize_by_resource_type(self, principal: str, address: str, op: int,
                                   resource_type: int) -> bool:
        """May the principal do ``op`` on at least one resource of the type? (Kafka's
        Authorizer.authorizeByResourceType default: an InitProducerId without a transactional
        id is allowed with Write on any topic.)"""
        if not self.enabled or principal in self.super_users:
            return True
        # A hard-coded name first, so that super users and the no-ACL default apply as for any
        # resource (as Kafka's default implementation does).
        if self.authorize(principal, address, op, resource_type, "hardcode"):
            return True
        snap = self.snapshot()
        key = (principal, address, op, resource_type, None)
        r = self._cache.get(key)
        if r is None:
            r = _by_resource_type(snap, principal, self._host(address), op, resource_type)
            self._cache[key] = r
        return r

    def authorized_operations(self, principal: str, address: str, resource_type: int,
                              name: str) -> int:
        """The ``*_authorized_operations`` bit field: every supported operation allowed."""
        ops = SUPPORTED_OPERATIONS[ResourceType(resource_type)]
        return operations_bitfield(op for op in ops
                                   if self.authorize(principal, address, op, resource_type, name))


def _by_resource_type(snap: AclSnapshot, principal: str, host: str, op: int,
                      resource_type: int) -> bool:
    deny_literal: set[str] = set()
    deny_prefixed: set[str] = set()
    allows: list[tuple[int, str]] = []
    wildcard_allow = False
    for acl in snap.of_type(resource_type):
        if acl.host != host and acl.host != WILDCARD_HOST:
            continue
        if acl.principal != principal and acl.principal != WILDCARD_PRINCIPAL:
            continue
        if acl.operation != op and acl.operation != O.ALL:
            continue
        if acl.permission_type == A.DENY:
            if acl.pattern_type == P.LITERAL:
                if acl.resource_name == WILDCARD_RESOURCE:
                    return False
                deny_literal.add(acl.resource_name)
            elif acl.pattern_type == P.PREFIXED:
                deny_prefixed.add(acl.resource_name)
        elif acl.permission_type == A.ALLOW:
            if acl.pattern_type == P.LITERAL and acl.resource_name == WILDCARD_RESOURCE:
                wildcard_allow = True      # unless a DENY on "*" comes up: that one wins
            else:
                allows.append((acl.pattern_type, acl.resource_name))
    if wildcard_allow:
        return True
    # An allowed name (or prefix) counts unless a deny covers it: the same literal, or a denied
    # prefix of it.
    for pattern_type, name in allows:
        if pattern_type == P.LITERAL and name in deny_literal:
            continue
        if any(name[:i] in deny_prefixed for i in range(1, len(name) + 1)):
            continue
        return True
    return False
