"""Kafka's ACL vocabulary: resource types, pattern types, operations, permissions, bindings, filters.

Owns nothing; imported by frontends (the ACL APIs and the authorizer), the supervisor (the ACL
store) and the ``appliance acls`` CLI. The codes are Kafka's wire codes (``ResourceType``,
``PatternType``, ``AclOperation``, ``AclPermissionType`` in Kafka's clients); the names are the
ones Kafka's tools print and parse (``SecurityUtils.operationName``: ``Read``, ``ClusterAction``,
``TwoPhaseCommit``...).

``AclBinding`` is one ACL: a resource pattern (type, name, LITERAL or PREFIXED) and an access
control entry (principal, host, operation, ALLOW or DENY). ``AclFilter`` is Kafka's
``AclBindingFilter``: a None name, principal or host matches any, ANY matches any type,
operation or permission, and the pattern type MATCH matches every pattern that would apply to
the named resource (the literal name, the wildcard ``*``, and every prefix of it).
"""

from __future__ import annotations

import enum

import msgspec

from appliance.errors import ErrorCode

CLUSTER_NAME = "kafka-cluster"        # Kafka's Resource.CLUSTER_NAME: the one Cluster resource
WILDCARD_RESOURCE = "*"               # ResourcePattern.WILDCARD_RESOURCE (a LITERAL pattern)
WILDCARD_PRINCIPAL = "User:*"         # matches every principal
WILDCARD_HOST = "*"


class ResourceType(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5
    DELEGATION_TOKEN = 6
    USER = 7


class PatternType(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1          # filters only: any pattern type, the name compared exactly
    MATCH = 2        # filters only: every pattern that applies to the named resource
    LITERAL = 3
    PREFIXED = 4


class AclOperation(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12
    CREATE_TOKENS = 13
    DESCRIBE_TOKENS = 14
    TWO_PHASE_COMMIT = 15     # KIP-939: InitProducerId with Enable2Pc


class AclPermissionType(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    DENY = 2
    ALLOW = 3


R, P, O, A = ResourceType, PatternType, AclOperation, AclPermissionType

# The operations each resource type supports (Kafka's AclEntry.supportedOperations): what the
# ``*_authorized_operations`` fields of Metadata, DescribeCluster and DescribeGroups report.
SUPPORTED_OPERATIONS: dict[ResourceType, tuple[AclOperation, ...]] = {
    R.TOPIC: (O.READ, O.WRITE, O.CREATE, O.DESCRIBE, O.DELETE, O.ALTER, O.DESCRIBE_CONFIGS,
              O.ALTER_CONFIGS),
    R.GROUP: (O.READ, O.DESCRIBE, O.DELETE, O.DESCRIBE_CONFIGS, O.ALTER_CONFIGS),
    R.CLUSTER: (O.CREATE, O.CLUSTER_ACTION, O.DESCRIBE_CONFIGS, O.ALTER_CONFIGS,
                O.IDEMPOTENT_WRITE, O.ALTER, O.DESCRIBE),
    R.TRANSACTIONAL_ID: (O.DESCRIBE, O.WRITE, O.TWO_PHASE_COMMIT),
    R.DELEGATION_TOKEN: (O.DESCRIBE,),
    R.USER: (O.CREATE_TOKENS, O.DESCRIBE_TOKENS),
}


def operations_bitfield(ops) -> int:
    """Kafka's Utils.to32BitField: bit ``code`` set for every operation."""
    field = 0
    for op in ops:
        field |= 1 << int(op)
    return field


# An ALLOW of any of these also allows DESCRIBE (resp. DESCRIBE_CONFIGS); a DENY implies
# nothing (StandardAuthorizerData.findResult).
IMPLIES_DESCRIBE = frozenset({O.DESCRIBE, O.READ, O.WRITE, O.DELETE, O.ALTER})
IMPLIES_DESCRIBE_CONFIGS = frozenset({O.DESCRIBE_CONFIGS, O.ALTER_CONFIGS})


# -- names, as Kafka's tools print and parse them ----------------------------------------------------

_RESOURCE_NAMES = {R.UNKNOWN: "Unknown", R.ANY: "Any", R.TOPIC: "Topic", R.GROUP: "Group",
                   R.CLUSTER: "Cluster", R.TRANSACTIONAL_ID: "TransactionalId",
                   R.DELEGATION_TOKEN: "DelegationToken", R.USER: "User"}


def _camel(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_"))


def resource_type_name(code: int) -> str:
    try:
        return _RESOURCE_NAMES[ResourceType(code)]
    except ValueError:
        return f"Unknown({code})"


def operation_name(code: int) -> str:
    try:
        return _camel(AclOperation(code).name)
    except ValueError:
        return f"Unknown({code})"


def permission_name(code: int) -> str:
    try:
        return _camel(AclPermissionType(code).name)
    except ValueError:
        return f"Unknown({code})"


def pattern_name(code: int) -> str:
    try:
        return PatternType(code).name
    except ValueError:
        return f"UNKNOWN({code})"


def _key(text: str) -> str:
    return text.replace("_", "").replace("-", "").lower()


def _parse(enum_cls, text: str):
    """Kafka's fromString: case-insensitive; ``ClusterAction`` and ``CLUSTER_ACTION`` both."""
    wanted = _key(text)
    for member in enum_cls:
        if _key(member.name) == wanted:
            return member
    if enum_cls is ResourceType and wanted == "transactionalid":
        return ResourceType.TRANSACTIONAL_ID
    raise ValueError(f"unknown {enum_cls.__name__} {text!r}; one of "
                     + ", ".join(_camel(m.name) for m in enum_cls if m.value > 1))


def parse_operation(text: str) -> AclOperation:
    return _parse(AclOperation, text)


def parse_pattern_type(text: str) -> PatternType:
    return _parse(PatternType, text)


def parse_resource_type(text: str) -> ResourceType:
    return _parse(ResourceType, text)


def parse_permission(text: str) -> AclPermissionType:
    return _parse(AclPermissionType, text)


# -- bindings and filters ---------------------------------------------------------------------------

class AclBinding(msgspec.Struct, array_like=True, frozen=True, order=True):
    """One ACL (Kafka's AclBinding). Plain ints, so that it travels in ring messages and sorts."""
    resource_type: int
    resource_name: str
    pattern_type: int
    principal: str
    host: str
    operation: int
    permission_type: int

    def __str__(self) -> str:
        return (f"(principal={self.principal}, host={self.host}, "
                f"operation={operation_name(self.operation)}, "
                f"permissionType={permission_name(self.permission_type)}) on "
                f"{resource_type_name(self.resource_type)}:{pattern_name(self.pattern_type)}:"
                f"{self.resource_name}")


class AclFilter(msgspec.Struct, array_like=True, frozen=True):
    """Kafka's AclBindingFilter: None (name, principal, host) and ANY match anything."""
    resource_type: int = R.ANY
    resource_name: str | None = None
    pattern_type: int = P.ANY
    principal: str | None = None
    host: str | None = None
    operation: int = O.ANY
    permission_type: int = A.ANY

    def matches(self, acl: AclBinding) -> bool:
        return self.matches_pattern(acl) and self.matches_entry(acl)

    def matches_pattern(self, acl: AclBinding) -> bool:
        """ResourcePatternFilter.matches."""
        if self.resource_type != R.ANY and self.resource_type != acl.resource_type:
            return False
        pt = self.pattern_type
        if pt != P.ANY and pt != P.MATCH and pt != acl.pattern_type:
            return False
        name = self.resource_name
        if name is None:
            return True
        if pt == P.ANY or pt == acl.pattern_type:
            return name == acl.resource_name
        # MATCH: the ACL's pattern applies to the resource the filter names.
        if acl.pattern_type == P.LITERAL:
            return name == acl.resource_name or acl.resource_name == WILDCARD_RESOURCE
        if acl.pattern_type == P.PREFIXED:
            return name.startswith(acl.resource_name)
        return False

    def matches_entry(self, acl: AclBinding) -> bool:
        """AccessControlEntryFilter.matches."""
        if self.principal is not None and self.principal != acl.principal:
            return False
        if self.host is not None and self.host != acl.host:
            return False
        if self.operation != O.ANY and self.operation != acl.operation:
            return False
        return self.permission_type == A.ANY or self.permission_type == acl.permission_type


def _known(enum_cls, code: int) -> bool:
    try:
        enum_cls(code)
    except ValueError:
        return False
    return True


def unknown_elements(resource_type: int, pattern_type: int, operation: int,
                     permission_type: int) -> bool:
    """What Kafka's CreateAcls/DescribeAcls/DeleteAcls request parsing refuses (an UNKNOWN code,
    or a code its enums do not know, which they read as UNKNOWN): the request does not parse and
    the broker closes the connection."""
    return not (_known(ResourceType, resource_type) and resource_type != R.UNKNOWN
                and _known(PatternType, pattern_type) and pattern_type != P.UNKNOWN
                and _known(AclOperation, operation) and operation != O.UNKNOWN
                and _known(AclPermissionType, permission_type) and permission_type != A.UNKNOWN)


def validate_new_acl(acl: AclBinding) -> tuple[ErrorCode, str] | None:
    """Why CreateAcls refuses this ACL (Kafka's AclApis checks and the controller's
    AclControlManager.validateNewAcl), or None; the error is INVALID_REQUEST."""
    bad = ErrorCode.invalid_request
    if acl.resource_type in (R.UNKNOWN, R.ANY) or not _known(ResourceType, acl.resource_type):
        return bad, f"Invalid resourceType {resource_type_name(acl.resource_type).upper()}"
    if acl.resource_type == R.CLUSTER and acl.resource_name != CLUSTER_NAME:
        return bad, f"The only valid name for the CLUSTER resource is {CLUSTER_NAME}"
    if not acl.resource_name:
        return bad, "Invalid empty resource name"
    if acl.pattern_type not in (P.LITERAL, P.PREFIXED):
        return bad, f"Invalid patternType {pattern_name(acl.pattern_type)}"
    if acl.operation in (O.UNKNOWN, O.ANY) or not _known(AclOperation, acl.operation):
        return bad, f"Invalid operation {operation_name(acl.operation).upper()}"
    if acl.permission_type not in (A.ALLOW, A.DENY):
        return bad, f"Invalid permissionType {permission_name(acl.permission_type).upper()}"
    # An ACL is only ever matched against a "Type:Name" principal; one without the colon could
    # never apply (Kafka's SecurityUtils.parseKafkaPrincipal refuses it the same way).
    ptype, sep, pname = acl.principal.partition(":")
    if not sep or not ptype:
        return bad, (f"Could not parse principal from `{acl.principal}` (no colon is present "
                     "separating the principal type from the principal name)")
    return None


def validate_filter(f: AclFilter) -> tuple[ErrorCode, str] | None:
    """AclControlManager.validateFilter: a filter with an UNKNOWN element matches nothing."""
    if unknown_elements(f.resource_type, f.pattern_type, f.operation, f.permission_type):
        return ErrorCode.invalid_request, "Unknown patternFilter or entryFilter."
    return None
