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

Mechanisms: SCRAM-SHA-256 and SCRAM-SHA-512 (RFC 5802 against the stored credentials; any failure
is answered with Kafka's generic message, which never says whether the user exists), PLAIN (RFC 4616; the password is checked against the user's SCRAM credential; the
failures carry Kafka's PlainSaslServer messages). A client asking for an authorization id other
than its user name is refused, as Kafka does. The principal is ``User:<user name>``.
"""

from __future__ import annotations

import base64
import enum
import hashlib
import hmac
import logging
import os
import re
import time
from collections.abc import Callable

from appliance.security import oauthbearer
from appliance.security.principal import USER
from appliance.security.scram import MECHANISMS, ScramCredential, check_password, hash_name

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
    """RFC 5802 server, as Kafka's ScramSaslServer: client-first -> server-first, client-final
    -> server-final. No channel binding (GS2 flag ``n``), Kafka's token extension is not offered.
    Written here rather than with a library: Kafka accepts any salt (AlterUserScramCredentials
    takes the client's), where the library we tried refuses salts under 12 bytes."""

    _FIRST = re.compile(r"^n,(?:a=((?:[^,=]|=2C|=3D)+))?,n=((?:[^,=]|=2C|=3D)+),r=([\x21-\x2b\x2d-\x7e]+)"
                        r"((?:,[A-Za-z]+=[^,]*)*)$")
    _FINAL = re.compile(r"^(c=([A-Za-z0-9+/]+={0,2}),r=([\x21-\x2b\x2d-\x7e]+)"
                        r"(?:,[A-Za-z]+=[^,]*)*),p=([A-Za-z0-9+/]+={0,2})$")

    def __init__(self, mechanism: str, lookup: Lookup) -> None:
        self.name = mechanism
        self.hash = hash_name(mechanism)
        self.lookup = lookup
        self.complete = False
        self.user = ""
        self._step = 0

    def evaluate(self, token: bytes) -> bytes:
        generic = (f"Authentication failed during authentication due to invalid credentials "
                   f"with SASL mechanism {self.name}")
        try:
            text = token.decode("utf-8")
        except UnicodeDecodeError:
            raise SaslFailure(generic, "not UTF-8") from None
        if self._step == 0:
            self._step = 1
            return self._first(text, generic)
        if self._step == 1:
            self._step = 2
            return self._final(text, generic)
        raise SaslFailure(generic, "token after the exchange completed")

    def _first(self, text: str, generic: str) -> bytes:
        m = self._FIRST.match(text)
        if m is None:
            raise SaslFailure(generic, "invalid client-first message")
        authzid, user, nonce, extensions = (_unescape(m.group(1) or ""), _unescape(m.group(2)),
                                            m.group(3), m.group(4))
        if "tokenauth=" in extensions:
            raise SaslFailure(generic, "delegation tokens are not supported")
        cred = (self.lookup(user) or {}).get(self.name)
        if cred is None:
            raise SaslFailure(generic, f"unknown user {user!r}")
        if authzid and authzid != user:
            raise SaslFailure("Authentication failed: Client requested an authorization id "
                              "that is different from username")
        self.user, self._cred = user, cred
        self._gs2 = text[:text.index(",n=") + 1]
        self._nonce = nonce + base64.b64encode(os.urandom(24)).decode()
        self._bare = text[len(self._gs2):]
        self._server_first = (f"r={self._nonce},s={base64.b64encode(cred.salt).decode()},"
                              f"i={cred.iterations}")
        return self._server_first.encode()

    def _final(self, text: str, generic: str) -> bytes:
        m = self._FINAL.match(text)
        if m is None:
            raise SaslFailure(generic, "invalid client-final message")
        without_proof, binding, nonce, proof = m.group(1), m.group(2), m.group(3), m.group(4)
        if nonce != self._nonce:
            raise SaslFailure(generic, "Invalid client nonce in the final client message.")
        if base64.b64decode(binding) != self._gs2.encode():
            raise SaslFailure(generic, "channel binding does not match the GS2 header")
        auth_message = f"{self._bare},{self._server_first},{without_proof}".encode()
        signature = hmac.digest(self._cred.stored_key, auth_message, self.hash)
        proof = base64.b64decode(proof)
        if len(proof) != len(signature):
            raise SaslFailure(generic, "Invalid client credentials")
        client_key = bytes(a ^ b for a, b in zip(proof, signature))
        if not hmac.compare_digest(hashlib.new(self.hash, client_key).digest(),
                                   self._cred.stored_key):
            raise SaslFailure(generic, "Invalid client credentials")
        self.complete = True
        server_signature = hmac.digest(self._cred.server_key, auth_message, self.hash)
        return f"v={base64.b64encode(server_signature).decode()}".encode()


def _dotted(principal: str) -> str:
    kind, _, name = principal.partition(":")
    return f"{kind}.{name}"


def _unescape(saslname: str) -> str:
    return saslname.replace("=2C", ",").replace("=3D", "=")


def mechanism_server(name: str, lookup: Lookup, oauth=None):
    if name == "PLAIN":
        return PlainServer(lookup)
    if name in MECHANISMS:
        return ScramServer(name, lookup)
    if name == oauthbearer.MECHANISM:
        return oauthbearer.OAuthBearerServer(oauth, SaslFailure)
    raise ValueError(name)


class SaslServerAuthenticator:
    """``reauth_ms``: Kafka's connections.max.reauth.ms (0: sessions do not expire unless the
    credential does, as an OAUTHBEARER token's ``exp``); ``oauth``: returns the frontend's
    current ``oauthbearer.JwtValidator`` (a re-authentication after a reload uses the re-read
    JWKS); ``clock``: wall-clock seconds (token expiry is wall time),
    ``monotonic``: the deadline's clock."""

    def __init__(self, mechanisms: list[str], lookup: Lookup, *, oauth=None, reauth_ms: int = 0,
                 clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.mechanisms = list(mechanisms)
        self.lookup = lookup
        self.oauth = oauth
        self.reauth_ms = reauth_ms
        self.clock, self.monotonic = clock, monotonic
        self.state = SaslState.HANDSHAKE_OR_VERSIONS
        self.raw = False            # SaslHandshake v0: raw tokens follow, no SaslAuthenticate
        self.server = None
        self.principal: str | None = None
        # KIP-368: when the session ends (monotonic seconds; None = never), what SaslAuthenticate
        # told the client, and the re-authentication in progress (previous mechanism, principal).
        self.session_expires: float | None = None
        self.session_lifetime_ms = 0
        self.supports_reauthentication = False     # a SaslAuthenticate v1+ was seen
        self.reauth_of: tuple[str, str] | None = None
        self.last_reauth_start: float | None = None
        self._bad_mechanism: str | None = None

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
        if self.reauth_of is not None and mechanism != self.reauth_of[0]:
            # Kafka answers the handshake, then fails the SaslAuthenticate that follows.
            self._bad_mechanism = (f"SASL mechanism '{mechanism}' requested by client is not "
                                   f"supported for re-authentication of mechanism "
                                   f"'{self.reauth_of[0]}'")
        self.server = mechanism_server(mechanism, self.lookup,
                                       self.oauth() if self.oauth is not None else None)
        self.raw = version == 0
        self.state = SaslState.AUTHENTICATE
        return True

    @property
    def reauthenticating(self) -> bool:
        return self.reauth_of is not None

    def may_reauthenticate(self) -> bool:
        """A SaslHandshake on an authenticated connection begins a re-authentication (KIP-368)
        only if the session has an end, and at most once a second (Kafka's KafkaChannel);
        otherwise it is answered as any SaslHandshake after authentication."""
        if self.state is not SaslState.COMPLETE or self.session_expires is None:
            return False
        now = self.monotonic()
        if self.last_reauth_start is not None and now - self.last_reauth_start < 1.0:
            return False
        self.last_reauth_start = now
        return True

    def begin_reauthentication(self) -> None:
        self.reauth_of = (self.mechanism, self.principal)
        self.server = None
        self.raw = False
        self._bad_mechanism = None
        self.state = SaslState.HANDSHAKE

    def expired(self) -> bool:
        """The session ended and no re-authentication is under way: Kafka closes the
        connection on its next request."""
        return (self.session_expires is not None and self.reauth_of is None
                and self.monotonic() > self.session_expires)

    def evaluate(self, token: bytes, version: int = 0) -> bytes:
        """One client token; the server's answer. SaslFailure fails the authentication."""
        if version > 0:
            self.supports_reauthentication = True
        try:
            if self._bad_mechanism is not None:
                raise SaslFailure(self._bad_mechanism)
            out = self.server.evaluate(token)
            if self.server.complete:
                principal = getattr(self.server, "principal", "") or USER + self.server.user
                if self.reauth_of is not None and principal != self.reauth_of[1]:
                    raise SaslFailure(
                        f"Cannot change principals during re-authentication from "
                        f"{_dotted(self.reauth_of[1])}: {_dotted(principal)}")
        except SaslFailure as e:
            if self.reauth_of is not None:
                e.message = e.message.replace("during authentication", "during re-authentication")
            self.state = SaslState.FAILED
            raise
        if self.server.complete:
            self.state = SaslState.COMPLETE
            self.principal = principal
            self.reauth_of = None
            self._session_times()
        return out

    def _session_times(self) -> None:
        """Kafka's calcCompletionTimesAndReturnSessionLifetimeMs: the credential's remaining
        lifetime (a token's exp), connections.max.reauth.ms, the smaller of the two, or no end."""
        expires_ms = getattr(self.server, "expires_ms", None)
        lifetime = None
        if expires_ms is not None:
            lifetime = max(0, expires_ms - int(self.clock() * 1000))
        if self.reauth_ms > 0:
            lifetime = self.reauth_ms if lifetime is None else min(lifetime, self.reauth_ms)
        self.session_lifetime_ms = lifetime or 0
        self.session_expires = (None if lifetime is None
                                else self.monotonic() + lifetime / 1000)

    @property
    def mechanism(self) -> str:
        return self.server.name if self.server is not None else ""
