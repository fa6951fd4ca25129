"""The server side of SASL on one connection: Kafka's SaslServerAuthenticator.

Runs in frontends; one ``SaslServerAuthenticator`` per connection of a SASL_PLAINTEXT or
SASL_SSL listener, owned by that connection (``workers.frontend.connection``), which feeds it
the frames that arrive before authentication completes; the SaslHandshake and SaslAuthenticate
handlers (``appliance.api``) drive it.

States, as in Kafka: HANDSHAKE_OR_VERSIONS (ApiVersions or SaslHandshake may come), HANDSHAKE
(after ApiVersions: only SaslHandshake), AUTHENTICATE (SaslAuthenticate requests; or, after a
SaslHandshake v0, raw size-prefixed tokens with no request header, the pre-KIP-152 flow),
COMPLETE, FAILED. Before COMPLETE, a frame over ``MAX_RECEIVE_SIZE`` (Kafka's
sasl.server.max.receive.size, 512 KiB) fails the authentication.

Mechanisms: SCRAM-SHA-256 and SCRAM-SHA-512 (the ``scramp`` library's server, against the stored
credentials; any failure is answered with Kafka's generic message, which never says whether the
user exists), PLAIN (RFC 4616; the password is checked against the user's SCRAM credential; the
failures carry Kafka's PlainSaslServer messages). A client asking for an authorization id other
than its user name is refused, as Kafka does. The principal is ``User:<user name>``.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable

import scramp

from appliance.security.principal import USER
from appliance.security.scram import MECHANISMS, ScramCredential, check_password

log = logging.getLogger("appliance.sasl")

MAX_RECEIVE_SIZE = 524288        # Kafka's DEFAULT_SASL_SERVER_MAX_RECEIVE_SIZE
API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE = 18, 17, 36

# user name -> its credentials by mechanism name (the frontend's CredentialsView)
Lookup = Callable[[str], dict[str, ScramCredential] | None]


class SaslState(enum.Enum):
    HANDSHAKE_OR_VERSIONS = 1
    HANDSHAKE = 2
    AUTHENTICATE = 3
    COMPLETE = 4
    FAILED = 5


class SaslFailure(Exception):
    """A failed authentication; ``message`` is what the client is told (SaslAuthenticate's
    error message with SASL_AUTHENTICATION_FAILED)."""

    def __init__(self, message: str, detail: str | None = None) -> None:
        super().__init__(detail or message)
        self.message = message


class PlainServer:
    """RFC 4616: ``[authzid] NUL authcid NUL passwd`` in one message, answered with nothing."""

    name = "PLAIN"

    def __init__(self, lookup: Lookup) -> None:
        self.lookup = lookup
        self.complete = False
        self.user = ""

    def evaluate(self, token: bytes) -> bytes:
        # Kafka decodes as UTF-8 with replacement and splits on NUL into at most 4 parts.
        text = token.decode("utf-8", "replace")
        parts = text.split("\0", 3)
        if len(parts) != 3:
            raise SaslFailure(f"Invalid SASL/PLAIN response: expected 3 tokens, got {len(parts)}")
        authzid, user, password = parts
        if not user:
            raise SaslFailure("Authentication failed: username not specified")
        if not password:
            raise SaslFailure("Authentication failed: password not specified")
        creds = self.lookup(user) or {}
        if not any(check_password(mech, c, password) for mech, c in sorted(creds.items())):
            raise SaslFailure("Authentication failed: Invalid username or password",
                              f"PLAIN: wrong password or unknown user {user!r}")
        if authzid and authzid != user:
            raise SaslFailure("Authentication failed: Client requested an authorization id "
                              "that is different from username")
        self.user = user
        self.complete = True
        return b""


class ScramServer:
    """RFC 5802 server: client-first -> server-first, client-final -> server-final."""

    def __init__(self, mechanism: str, lookup: Lookup) -> None:
        self.name = mechanism
        self.lookup = lookup
        self.complete = False
        self.user = ""
        self._server = scramp.ScramMechanism(mechanism).make_server(self._auth_info)
        self._step = 0

    def _auth_info(self, user: str):
        cred = (self.lookup(user) or {}).get(self.name)
        if cred is None:
            return None           # scramp: unknown user
        self.user = user
        return cred.salt, cred.stored_key, cred.server_key, cred.iterations

    def evaluate(self, token: bytes) -> bytes:
        generic = (f"Authentication failed during authentication due to invalid credentials "
                   f"with SASL mechanism {self.name}")
        try:
            text = token.decode("utf-8")
        except UnicodeDecodeError:
            raise SaslFailure(generic, "not UTF-8") from None
        try:
            if self._step == 0:
                self._step = 1
                authzid = _authzid(text)
                self._server.set_client_first(text)
                if authzid and authzid != self.user:
                    raise SaslFailure("Authentication failed: Client requested an authorization "
                                      "id that is different from username")
                return self._server.get_server_first().encode()
            if self._step == 1:
                self._step = 2
                self._server.set_client_final(text)
                final = self._server.get_server_final().encode()
                self.complete = True
                return final
        except scramp.ScramException as e:
            raise SaslFailure(generic, f"{self.name}: {e}") from None
        raise SaslFailure(generic, "token after the exchange completed")


def _authzid(client_first: str) -> str:
    """The authorization id of a SCRAM client-first message's GS2 header (``n,a=id,...``)."""
    _flag, _, rest = client_first.partition(",")
    a, _, _ = rest.partition(",")
    return a[2:].replace("=2C", ",").replace("=3D", "=") if a.startswith("a=") else ""


def mechanism_server(name: str, lookup: Lookup):
    if name == "PLAIN":
        return PlainServer(lookup)
    if name in MECHANISMS:
        return ScramServer(name, lookup)
    raise ValueError(name)


class SaslServerAuthenticator:
    def __init__(self, mechanisms: list[str], lookup: Lookup) -> None:
        self.mechanisms = list(mechanisms)
        self.lookup = lookup
        self.state = SaslState.HANDSHAKE_OR_VERSIONS
        self.raw = False            # SaslHandshake v0: raw tokens follow, no SaslAuthenticate
        self.server = None
        self.principal: str | None = None

    @property
    def complete(self) -> bool:
        return self.state is SaslState.COMPLETE

    def refuses(self, api_key: int) -> bool:
        """Whether this request may not come in the current state (Kafka: IllegalSaslState)."""
        if self.state is SaslState.HANDSHAKE_OR_VERSIONS:
            return api_key not in (API_VERSIONS, SASL_HANDSHAKE)
        if self.state is SaslState.HANDSHAKE:
            return api_key != SASL_HANDSHAKE
        if self.state is SaslState.AUTHENTICATE:
            return api_key != SASL_AUTHENTICATE
        return self.state is SaslState.FAILED

    def api_versions_answered(self) -> None:
        if self.state is SaslState.HANDSHAKE_OR_VERSIONS:
            self.state = SaslState.HANDSHAKE

    def handshake(self, mechanism: str, version: int) -> bool:
        """SaslHandshake: True and AUTHENTICATE if ``mechanism`` is enabled."""
        if mechanism not in self.mechanisms:
            self.state = SaslState.FAILED
            return False
        self.server = mechanism_server(mechanism, self.lookup)
        self.raw = version == 0
        self.state = SaslState.AUTHENTICATE
        return True

    def evaluate(self, token: bytes) -> bytes:
        """One client token; the server's answer. SaslFailure fails the authentication."""
        try:
            out = self.server.evaluate(token)
        except SaslFailure:
            self.state = SaslState.FAILED
            raise
        if self.server.complete:
            self.state = SaslState.COMPLETE
            self.principal = USER + self.server.user
        return out

    @property
    def mechanism(self) -> str:
        return self.server.name if self.server is not None else ""
