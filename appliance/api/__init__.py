"""The API handler registry: one module per Kafka API, each registering itself here.

Runs in frontend processes. A handler is ``handle(ctx, request) -> response`` (plain function or
coroutine function). It decodes nothing and encodes nothing itself: the connection hands it the kio
request entity and encodes whatever it returns (a kio response entity, or already-encoded bytes or
buffer parts, or None for "send no response" as with acks=0 produce, or ``CloseConnection`` to
answer nothing and close the connection once the requests before it are answered, or
``FailAuthentication`` to answer after Kafka's delay and close). Handlers stay thin: check,
delegate to the broker facade handed to them in the request context (``ctx.broker``, the
frontend's ``workers.frontend.broker.Broker``; never imported here: handlers hold no process
code), build the response.

The version ranges we advertise in ApiVersions are read from this registry (``api_ranges``), never
kept by hand elsewhere.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from dataclasses import dataclass
from typing import Any, Callable

from appliance.errors import KafkaError
from appliance.protocol import messages


@dataclass(frozen=True)
class Api:
    key: int
    name: str
    min_version: int
    max_version: int
    handle: Callable[["RequestContext", Any], Any]
    # Builds the response that carries an error for the whole request (Kafka's getErrorResponse);
    # None: the connection is closed instead.
    error_response: Callable[[int, Any, KafkaError], Any] | None = None


REGISTRY: dict[int, Api] = {}


def handles(key: int, name: str, min_version: int, max_version: int):
    """Register the decorated function as the handler of API ``key``."""
    def deco(fn):
        REGISTRY[key] = Api(key, name, min_version, max_version, fn)

        def on_error(err_fn):
            REGISTRY[key] = dataclasses.replace(REGISTRY[key], error_response=err_fn)
            return err_fn
        fn.on_error = on_error
        return fn
    return deco


def load_handlers() -> dict[int, Api]:
    """Import every handler module of this package (each registers itself)."""
    for mod in pkgutil.iter_modules(__path__):
        if not mod.name.startswith("_"):
            importlib.import_module(f"{__name__}.{mod.name}")
    return REGISTRY


def api_ranges() -> dict[int, tuple[int, int]]:
    return {a.key: (a.min_version, a.max_version) for a in sorted(REGISTRY.values(), key=lambda a: a.key)}


@dataclass(frozen=True)
class CloseConnection:
    """A handler's result that closes the connection instead of answering, after the answers to
    the connection's earlier requests (Kafka's closeConnection response, e.g. an acks=0 produce
    that failed: the producer notices the error only by the closed connection)."""

    reason: str


@dataclass(frozen=True)
class FailAuthentication:
    """A handler's result that fails the connection's authentication: ``response`` (a response
    entity, or None for no answer) is sent after ``server.connection_failed_authentication_delay_ms``
    and the connection then closed (Kafka's delayed close on a failed authentication, KIP-306);
    nothing more is read from the connection meanwhile."""

    response: Any
    reason: str


class RequestContext:
    """What a handler gets besides the request: the broker facade and the request header.
    A handler that encodes its answer itself reports the answer's error codes in ``errors``
    (code -> count, for the request metrics); for the others they are read from the entity."""

    __slots__ = ("broker", "connection", "header", "errors", "slot")

    def __init__(self, broker, connection, header, slot=None) -> None:
        self.broker = broker
        self.connection = connection
        self.header = header
        self.errors = None
        self.slot = slot

    def throttle(self, quota_type: str, value: float) -> int:
        """Client quotas (KIP-13, KIP-124): record ``value`` (bytes) against the client's
        ``quota_type`` quota ("Produce", "Fetch") and its frontend time so far against its
        request quota; the ThrottleTimeMs for the response (the connection is muted that long
        once the response is sent, KIP-219). 0 at once when no quota is configured."""
        if not self.broker.quotas.any or self.slot is None:
            return 0
        return self.connection.quota_throttle(self.slot, quota_type, value)

    def mutation(self, permits: float, strict_since: int) -> tuple[bool, int]:
        """KIP-599 controller_mutation_rate: (admitted, throttle ms) for ``permits`` partitions
        created or deleted; strict (refused while over the quota) from ``strict_since`` on,
        permissive (throttled only) below. (True, 0) when no such quota is configured."""
        q = self.broker.quotas
        if not q.any or not q.enabled["ControllerMutation"] or self.slot is None:
            return True, 0
        return self.connection.quota_mutation(self.slot, permits, self.version >= strict_since)

    def unmutate(self, permits: float) -> None:
        """Give back the permits of a mutation that did not happen."""
        if self.broker.quotas.any and self.slot is not None:
            self.connection.quota_unmutate(self.slot, permits)

    def unrecord(self, quota_type: str, value: float) -> None:
        """Take back ``value`` that ``throttle`` recorded (Kafka's unrecordQuotaSensor)."""
        if self.broker.quotas.any and self.slot is not None:
            self.connection.quota_unrecord(self.slot, quota_type, value)

    @property
    def version(self) -> int:
        return self.header.api_version

    @property
    def principal(self) -> str:
        """Kafka's principal of the connection (``User:ANONYMOUS`` until it authenticates)."""
        return self.connection.principal

    @property
    def client_host(self) -> str:
        """The client's address, as Kafka's ACLs match hosts."""
        return self.connection.host

    # -- authorization (Kafka's AuthHelper), through the frontend's ``Authorizer`` -------------
    def authorize(self, op: int, resource_type: int, name: str) -> bool:
        """May this connection's principal do ``op`` on the (LITERAL) resource? Always yes
        while ``[authorizer] enable`` is off."""
        conn = self.connection
        return self.broker.authorizer.authorize(conn.principal, conn.host, op, resource_type, name)

    def authorize_cluster(self, op: int) -> bool:
        conn = self.connection
        return self.broker.authorizer.authorize_cluster(conn.principal, conn.host, op)

    def authorize_by_resource_type(self, op: int, resource_type: int) -> bool:
        conn = self.connection
        return self.broker.authorizer.authorize_by_resource_type(conn.principal, conn.host, op,
                                                                 resource_type)

    def authorized_operations(self, resource_type: int, name: str) -> int:
        """The ``*_authorized_operations`` bit field of the resource for this principal."""
        conn = self.connection
        return self.broker.authorizer.authorized_operations(conn.principal, conn.host,
                                                            resource_type, name)
    @property
    def listener(self) -> str:
        """Kafka's name of the listener the request came through (``PLAINTEXT``, ``SASL_SSL``,
        or a name of ``server.listener_security_protocol_map``)."""
        return self.connection.listener

    @property
    def security_protocol(self) -> str:
        """PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL: the protocol of that listener."""
        return self.connection.security_protocol

    @property
    def advertised(self) -> tuple[str, int]:
        """(host, port) of the listener the client connected through, as Metadata,
        FindCoordinator and DescribeCluster answer it (Kafka answers with the endpoint of the
        request's listener)."""
        return self.connection.advertised

    def response_class(self):
        return messages.response_class(self.header.api_key, self.header.api_version)

    def response_module(self):
        """The kio module of this version's response (for its nested entity classes)."""
        return importlib.import_module(self.response_class().__module__)


def encode_body(result: Any) -> list:
    if isinstance(result, (bytes, bytearray, memoryview)):
        return [result]
    if isinstance(result, list):
        return result
    return [messages.encode_response(result)]
