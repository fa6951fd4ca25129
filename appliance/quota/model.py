"""Kafka's client quota entities and configs: the checks of AlterClientQuotas (Kafka's
ClientQuotaControlManager), the filter of DescribeClientQuotas (ClientQuotasImage.describe) and
which configured entity governs a client (ClientQuotaManager's DefaultQuotaCallback, KIP-55).

Owns nothing; pure functions over a quota table, run by the supervisor (alterations) and the
frontends (describe, precedence).

An entity is a tuple of (entity type, name) pairs sorted by type, a name of None being the
type's default (``--entity-default``): ``(("user", "alice"),)``,
``(("client-id", None), ("user", "alice"))``, ``(("ip", None),)``.
"""

from __future__ import annotations

import ipaddress
import socket

from appliance.errors import ErrorCode

USER = "user"
CLIENT_ID = "client-id"
IP = "ip"
ENTITY_TYPES = (USER, CLIENT_ID, IP)

PRODUCER_BYTE_RATE = "producer_byte_rate"
CONSUMER_BYTE_RATE = "consumer_byte_rate"
REQUEST_PERCENTAGE = "request_percentage"
CONTROLLER_MUTATION_RATE = "controller_mutation_rate"
CONNECTION_CREATION_RATE = "connection_creation_rate"

# QuotaConfig.userAndClientQuotaConfigs / ipConfigs: key -> ConfigDef type.
USER_CLIENT_KEYS = {PRODUCER_BYTE_RATE: "LONG", CONSUMER_BYTE_RATE: "LONG",
                    REQUEST_PERCENTAGE: "DOUBLE", CONTROLLER_MUTATION_RATE: "DOUBLE"}
IP_KEYS = {CONNECTION_CREATION_RATE: "INT"}

MATCH_EXACT, MATCH_DEFAULT, MATCH_SPECIFIED = 0, 1, 2

Entity = tuple[tuple[str, "str | None"], ...]
# entity -> key -> value
Quotas = dict[Entity, dict[str, float]]


class QuotaError(Exception):
    """A Kafka ApiError: ``code`` and the message Kafka gives."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def entity_of(pairs) -> Entity:
    return tuple(sorted(pairs))


def describe_entity(entity: Entity) -> str:
    """Kafka's ClientQuotaEntity toString, for messages."""
    return "ClientQuotaEntity(entries={" + ", ".join(f"{t}={n}" for t, n in entity) + "})"


# -- AlterClientQuotas --------------------------------------------------------------------------

def _check_entity(pairs: list[tuple[str, str | None]]) -> dict[str, str | None]:
    """ClientQuotaControlManager.validateEntity and configKeysForEntityType."""
    if not pairs:
        raise QuotaError(ErrorCode.invalid_request, "Invalid empty client quota entity")
    seen: dict[str, str | None] = {}
    for etype, name in pairs:
        if etype in seen:
            raise QuotaError(ErrorCode.invalid_request,
                             f"Invalid client quota entity, duplicate entity entry {etype}")
        if etype not in ENTITY_TYPES:
            raise QuotaError(ErrorCode.invalid_request,
                             f"Unhandled client quota entity type: {etype}")
        seen[etype] = name
        if name is not None and name == "":
            raise QuotaError(ErrorCode.invalid_request, f"Empty {etype} not supported")
    return seen


def keys_for(entity: dict[str, str | None]) -> dict[str, str]:
    if IP in entity:
        if USER in entity or CLIENT_ID in entity:
            raise QuotaError(ErrorCode.invalid_request,
                             "Invalid quota entity combination, IP entity should"
                             "not be combined with User or ClientId")
        if not valid_ip_entity(entity[IP]):
            raise QuotaError(ErrorCode.invalid_request,
                             f"{entity[IP]} is not a valid IP or resolvable host.")
        return IP_KEYS
    return USER_CLIENT_KEYS


def valid_ip_entity(ip: str | None) -> bool:
    if ip is None:
        return True
    try:
        ipaddress.ip_address(ip)
        return True
    except ValueError:
        pass
    try:
        socket.getaddrinfo(ip, None)
        return True
    except OSError:
        return False


def check_value(keys: dict[str, str], key: str, value: float) -> None:
    """ClientQuotaControlManager.validateQuotaKeyValue."""
    ctype = keys.get(key)
    if ctype is None:
        raise QuotaError(ErrorCode.invalid_request, f"Invalid configuration key {key}")
    if value <= 0.0:
        raise QuotaError(ErrorCode.invalid_request, f"Quota {key} must be greater than 0")
    if ctype == "DOUBLE":
        return
    if ctype == "INT" and value > 2**31 - 1:
        raise QuotaError(ErrorCode.invalid_request,
                         f"Proposed value for {key} is too large for an INT.")
    if ctype == "LONG" and value > 2**63 - 1:
        raise QuotaError(ErrorCode.invalid_request,
                         f"Proposed value for {key} is too large for a LONG.")
    if abs(value % 1.0) > 1e-6:
        raise QuotaError(ErrorCode.invalid_request, f"{key} cannot be a fractional value.")


# An alteration as the frontend hands it: (entity pairs as sent, [(key, value, remove)]).
Alteration = tuple[list[tuple[str, "str | None"]], list[tuple[str, float, bool]]]


def alter(quotas: Quotas, alterations: list[Alteration]
          ) -> tuple[Quotas, list[tuple[int, str | None]]]:
    """Kafka's ClientQuotaControlManager.alterClientQuotas: each entry is checked and applied on
    its own (an entity's error leaves its other keys unchanged, other entries go on). Returns the
    new table and (error code, message) per entry, in the request's order. A key named twice in
    one entry, or an entity named twice, is INVALID_REQUEST (the second's answer)."""
    new = {e: dict(v) for e, v in quotas.items()}
    results: list[tuple[int, str | None]] = []
    seen: set[Entity] = set()
    for pairs, ops in alterations:
        entity = entity_of(pairs)
        try:
            wanted: dict[str, float | None] = {}
            for key, value, remove in ops:
                if key in wanted:
                    raise QuotaError(ErrorCode.invalid_request,
                                     f"Duplicate quota key {key} not updating quota for this "
                                     f"entity {describe_entity(entity)}")
                wanted[key] = None if remove else value
            if entity in seen:
                raise QuotaError(ErrorCode.invalid_request,
                                 f"Ignoring duplicate entity {describe_entity(entity)}")
            seen.add(entity)
            keys = keys_for(_check_entity(list(pairs)))
            current = dict(new.get(entity, {}))
            for key, value in wanted.items():
                if value is None:
                    current.pop(key, None)
                else:
                    check_value(keys, key, value)
                    current[key] = float(value)
        except QuotaError as e:
            results.append((int(e.code), e.message))
            continue
        if current:
            new[entity] = current
        else:
            new.pop(entity, None)
        results.append((0, None))
    return new, results


# -- DescribeClientQuotas -----------------------------------------------------------------------

def describe(quotas: Quotas, components: list[tuple[str, int, str | None]], strict: bool
             ) -> list[tuple[Entity, dict[str, float]]]:
    """ClientQuotasImage.describe: the entities the filter matches (QuotaError for a bad filter:
    INVALID_REQUEST, or UNSUPPORTED_VERSION for an unknown entity type, as Kafka answers)."""
    exact: dict[str, str | None] = {}
    typed: set[str] = set()
    for etype, match_type, match in components:
        if etype == "":
            raise QuotaError(ErrorCode.invalid_request, "Invalid empty entity type.")
        if etype in exact or etype in typed:
            raise QuotaError(ErrorCode.invalid_request,
                             f"Entity type {etype} cannot appear more than once in the filter.")
        if etype not in ENTITY_TYPES:
            raise QuotaError(ErrorCode.unsupported_version, f"Unsupported entity type {etype}")
        if match_type == MATCH_EXACT:
            if match is None:
                raise QuotaError(ErrorCode.invalid_request, "Request specified MATCH_TYPE_EXACT, "
                                 "but set match string to null.")
            exact[etype] = match
        elif match_type == MATCH_DEFAULT:
            if match is not None:
                raise QuotaError(ErrorCode.invalid_request, "Request specified "
                                 "MATCH_TYPE_DEFAULT, but also specified a match string.")
            exact[etype] = None
        elif match_type == MATCH_SPECIFIED:
            if match is not None:
                raise QuotaError(ErrorCode.invalid_request, "Request specified "
                                 "MATCH_TYPE_SPECIFIED, but also specified a match string.")
            typed.add(etype)
        else:
            raise QuotaError(ErrorCode.invalid_request, f"Unknown match type {match_type}")
    named = set(exact) | typed
    if IP in named and (USER in named or CLIENT_ID in named):
        raise QuotaError(ErrorCode.invalid_request, "Invalid entity filter component "
                         "combination. IP filter component should not be used with user or "
                         "clientId filter component.")
    out = []
    for entity, values in sorted(quotas.items(), key=lambda kv: repr(kv[0])):
        d = dict(entity)
        if strict and len(d) != len(exact) + len(typed):
            continue
        if any(t not in d or d[t] != n for t, n in exact.items()):
            continue
        if any(t not in d for t in typed):
            continue
        out.append((entity, values))
    return out


# -- precedence (KIP-55) ------------------------------------------------------------------------

def levels(user: str, client_id: str) -> list[tuple[Entity, tuple[str, str]]]:
    """The eight levels of ClientQuotaManager's precedence, each with the metric tags (user,
    client-id) whose sensor it shares: the clients an entity's quota covers share one rate."""
    return [
        (((CLIENT_ID, client_id), (USER, user)), (user, client_id)),
        (((CLIENT_ID, None), (USER, user)), (user, client_id)),
        (((USER, user),), (user, "")),
        (((CLIENT_ID, client_id), (USER, None)), (user, client_id)),
        (((CLIENT_ID, None), (USER, None)), (user, client_id)),
        (((USER, None),), (user, "")),
        (((CLIENT_ID, client_id),), ("", client_id)),
        (((CLIENT_ID, None),), ("", client_id)),
    ]


def governing(by_key: dict[Entity, float], user: str, client_id: str
              ) -> tuple[float, tuple[str, str]] | None:
    """The quota of ``key`` (``by_key``: the entities that set it) that governs a client, and
    its metric tags; None when none does. The first of the eight levels that sets the key wins
    (one level per client, as Kafka's quotaMetricTags and quotaLimit agree)."""
    for entity, tags in levels(user, client_id):
        # An empty name is no name: Kafka's callback skips the levels that would need it.
        if (not client_id and any(t == CLIENT_ID for t, _ in entity)) or (
                not user and any(t == USER for t, _ in entity)):
            continue
        bound = by_key.get(entity)
        if bound is not None:
            return bound, tags
    return None


def by_key(quotas: Quotas) -> dict[str, dict[Entity, float]]:
    """The table turned round: key -> entity -> value."""
    out: dict[str, dict[Entity, float]] = {}
    for entity, values in quotas.items():
        for key, value in values.items():
            out.setdefault(key, {})[entity] = value
    return out


def user_of(principal: str) -> str:
    """The user name a quota names: the principal's name (``User:alice`` -> ``alice``)."""
    _, sep, name = principal.partition(":")
    return name if sep else principal
