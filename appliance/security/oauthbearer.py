"""SASL/OAUTHBEARER on the server (RFC 7628, KIP-255; KIP-768's JWT validation).

Runs in frontends: one ``JwtValidator`` per frontend, built from ``[sasl]`` when the frontend
starts and again on every reload (so a rotated JWKS file is re-read by SIGHUP, as Kafka's
refreshing JWKS does on its schedule); one ``OAuthBearerServer`` per authenticating connection
(``appliance.security.sasl`` creates it). Owns no state beyond the keys it loaded.

Validation, as Kafka's BrokerJwtValidator (KIP-768): the token is a JWS signed by a key of the
JWKS file (``oauthbearer_jwks_endpoint_url``, a ``file:`` URL: the key of the token's ``kid``,
or the only key when the token names none), with an asymmetric algorithm the key's type allows
("none" and the HMAC ones are refused); ``exp`` is required and, like ``nbf``, checked with
``oauthbearer_clock_skew_seconds`` of leeway; ``iss`` must be ``oauthbearer_expected_issuer``
and ``aud`` one of ``oauthbearer_expected_audience`` when they are set; the principal is
``User:<claim>`` of ``oauthbearer_sub_claim_name`` (``sub``). Kafka's unsecured mode
(OAuthBearerUnsecuredValidatorCallbackHandler: ``alg`` "none", no signature) is served only with
``oauthbearer_unsecured_validator = true``, for development.

An invalid token is answered as Kafka's OAuthBearerSaslServer does: the server's challenge is the
JSON error ``{"status":"invalid_token"}`` (SaslAuthenticate NONE), the client acknowledges it with
a single 0x01 byte, and that is failed with the JSON as the error message. The token's ``exp``
bounds the session (KIP-368: SessionLifetimeMs, the connection is closed after it unless the
client re-authenticates).
"""

from __future__ import annotations

import json
import logging
import re
import time
import urllib.parse
from collections.abc import Callable

import jwt

from appliance.security.principal import USER

log = logging.getLogger("appliance.sasl")

MECHANISM = "OAUTHBEARER"
_CONTROL_A = b"\x01"
INVALID_TOKEN = '{"status":"invalid_token"}'

# RFC 7628's client initial response with Kafka's grammar (OAuthBearerSaslServer): GS2 header,
# then \x01-separated key=value pairs, "auth" carrying "Bearer <token>".
_FIRST = re.compile(r"n,(?:a=(?P<authzid>(?:[^=,\x00]|=2C|=3D)+))?,\x01(?P<kvs>.*)\x01\x01",
                    re.DOTALL)
_KEY = re.compile(r"[A-Za-z]+")
_VALUE = re.compile(r"[\x21-\x7e \t\r\n]*")
_TOKEN = re.compile(r"[-_.a-zA-Z0-9]+")

# JWS algorithms by JWK key type: asymmetric only (a JWKS is public; an HMAC secret in it would
# let anyone who can read it mint tokens).
_ALGORITHMS = {"RSA": ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512"),
               "EC": ("ES256", "ES384", "ES512", "ES256K"),
               "OKP": ("EdDSA",)}


class OAuthConfigError(Exception):
    """The JWKS file cannot be read or holds no usable key."""


class InvalidToken(Exception):
    """The token does not validate; the text is for the broker's log only."""


def jwks_path(url: str) -> str:
    """The file of a ``file:`` JWKS URL (Kafka takes file: URLs for a JWKS on disk)."""
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme != "file" or not parsed.path:
        raise OAuthConfigError(f"{url!r}: only file: URLs are supported (file:///path/jwks.json)")
    return urllib.parse.unquote(parsed.path)


class JwtValidator:
    """Validates bearer tokens; ``validate`` returns (principal, expiry in epoch ms)."""

    def __init__(self, *, jwks: dict | None, issuer: str, audience: list[str],
                 clock_skew_s: int, principal_claim: str, unsecured: bool,
                 clock: Callable[[], float] | None = None) -> None:
        self.keys: dict[str | None, tuple[jwt.PyJWK, str | None]] = {}
        self.issuer = issuer
        self.audience = list(audience)
        self.skew = clock_skew_s
        self.claim = principal_claim
        self.unsecured = unsecured
        self.clock = clock
        if jwks is not None:
            for entry in jwks.get("keys", ()):
                if entry.get("use", "sig") != "sig" or entry.get("kty") not in _ALGORITHMS:
                    continue
                try:
                    key = jwt.PyJWK.from_dict(entry)
                except jwt.PyJWTError as e:
                    log.warning("JWKS: skipping key %r: %s", entry.get("kid"), e)
                    continue
                self.keys[entry.get("kid")] = (key, entry.get("alg"))

    @classmethod
    def from_config(cls, sasl) -> "JwtValidator | None":
        """The validator of a ``[sasl]`` section; None when OAUTHBEARER is not enabled."""
        if MECHANISM not in sasl.mechanisms:
            return None
        jwks = None
        if sasl.oauthbearer_jwks_endpoint_url:
            path = jwks_path(sasl.oauthbearer_jwks_endpoint_url)
            try:
                with open(path, "rb") as f:
                    jwks = json.load(f)
            except (OSError, ValueError) as e:
                raise OAuthConfigError(f"JWKS file {path}: {e}") from None
            if not isinstance(jwks, dict) or not isinstance(jwks.get("keys"), list):
                raise OAuthConfigError(f"JWKS file {path}: not a JSON Web Key Set")
        v = cls(jwks=jwks, issuer=sasl.oauthbearer_expected_issuer,
                audience=sasl.oauthbearer_expected_audience,
                clock_skew_s=sasl.oauthbearer_clock_skew_seconds,
                principal_claim=sasl.oauthbearer_sub_claim_name,
                unsecured=sasl.oauthbearer_unsecured_validator)
        if jwks is not None and not v.keys:
            raise OAuthConfigError(f"JWKS file {path}: no signature key (RSA, EC or OKP)")
        return v

    def validate(self, token: str) -> tuple[str, int]:
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError as e:
            raise InvalidToken(f"malformed JWT: {e}") from None
        alg = header.get("alg")
        options = {"require": ["exp"], "verify_aud": bool(self.audience),
                   "verify_iss": bool(self.issuer)}
        kwargs = {"leeway": self.skew, "options": options}
        if self.audience:
            kwargs["audience"] = self.audience
        if self.issuer:
            kwargs["issuer"] = self.issuer
        try:
            if alg == "none":
                if not self.unsecured:
                    raise InvalidToken("an unsecured JWS (alg none) and "
                                       "sasl.oauthbearer_unsecured_validator is off")
                claims = self._unsecured_claims(token)
            else:
                key, key_alg = self._key(header.get("kid"))
                allowed = (key_alg,) if key_alg else _ALGORITHMS[key.key_type]
                if alg not in allowed:
                    raise InvalidToken(f"algorithm {alg!r} is not one of {allowed} for this key")
                claims = jwt.decode(token, key.key, algorithms=[alg], **kwargs)
        except jwt.PyJWTError as e:
            raise InvalidToken(str(e)) from None
        principal = claims.get(self.claim)
        if not isinstance(principal, str) or not principal:
            raise InvalidToken(f"no string claim {self.claim!r} for the principal")
        exp = claims["exp"]
        if not isinstance(exp, (int, float)):
            raise InvalidToken("exp is not a number")
        return USER + principal, int(exp * 1000)

    def _unsecured_claims(self, token: str) -> dict:
        """Kafka's unsecured validator: no signature; exp required, nbf, iss and aud as for a
        signed token."""
        parts = token.split(".")
        if len(parts) != 3 or parts[2]:
            raise InvalidToken("an unsecured JWS has three parts and an empty signature")
        try:
            claims = json.loads(jwt.utils.base64url_decode(parts[1]))
        except (ValueError, jwt.PyJWTError) as e:
            raise InvalidToken(f"unsecured JWS payload: {e}") from None
        if not isinstance(claims, dict):
            raise InvalidToken("unsecured JWS payload is not a JSON object")
        now = self.clock() if self.clock is not None else time.time()
        exp, nbf = claims.get("exp"), claims.get("nbf")
        if not isinstance(exp, (int, float)):
            raise InvalidToken("no numeric exp claim")
        if exp + self.skew <= now:
            raise InvalidToken("the token has expired")
        if isinstance(nbf, (int, float)) and nbf - self.skew > now:
            raise InvalidToken("the token is not yet valid (nbf)")
        if self.issuer and claims.get("iss") != self.issuer:
            raise InvalidToken("invalid issuer")
        if self.audience:
            aud = claims.get("aud")
            auds = [aud] if isinstance(aud, str) else aud if isinstance(aud, list) else []
            if not set(auds) & set(self.audience):
                raise InvalidToken("invalid audience")
        return claims

    def _key(self, kid) -> tuple[jwt.PyJWK, str | None]:
        if kid is not None:
            key = self.keys.get(kid)
            if key is None:
                raise InvalidToken(f"no key {kid!r} in the JWKS")
            return key
        if len(self.keys) == 1:
            return next(iter(self.keys.values()))
        raise InvalidToken("the token names no key id and the JWKS has "
                           f"{len(self.keys)} keys")


class OAuthBearerServer:
    """One connection's OAUTHBEARER exchange (the ``evaluate`` interface of ``sasl``)."""

    name = MECHANISM

    def __init__(self, validator: JwtValidator | None, failure: type[Exception]) -> None:
        self.validator = validator
        self.failure = failure          # sasl.SaslFailure (no import cycle)
        self.complete = False
        self.user = ""
        self.principal = ""
        self.expires_ms: int | None = None
        self._error: str | None = None

    def evaluate(self, token: bytes) -> bytes:
        if token == _CONTROL_A and self._error is not None:
            # The client acknowledged our error challenge: Kafka fails with the JSON.
            raise self.failure(self._error, "invalid token")
        self._error = None
        generic = ("Authentication failed during authentication due to invalid credentials "
                   "with SASL mechanism OAUTHBEARER")
        m = _FIRST.fullmatch(token.decode("utf-8", "replace"))
        if m is None:
            raise self.failure(generic, "Invalid OAUTHBEARER client first message")
        pairs = {}
        for kv in m.group("kvs").split("\x01"):
            key, eq, value = kv.partition("=")
            if not eq or not _KEY.fullmatch(key) or not _VALUE.fullmatch(value):
                raise self.failure(generic, "Invalid OAUTHBEARER client first message")
            pairs[key] = value
        scheme, _, bearer = pairs.get("auth", "").partition(" ")
        bearer = bearer.lstrip(" ")
        if scheme.lower() != "bearer" or not _TOKEN.fullmatch(bearer):
            raise self.failure(generic, f"Invalid scheme or token in OAUTHBEARER client first "
                                        f"message: {scheme!r}")
        if self.validator is None:
            raise self.failure(generic, "OAUTHBEARER is not configured")
        try:
            principal, expires_ms = self.validator.validate(bearer)
        except InvalidToken as e:
            log.info("OAUTHBEARER: token refused: %s", e)
            self._error = INVALID_TOKEN
            return INVALID_TOKEN.encode()
        authzid = (m.group("authzid") or "").replace("=2C", ",").replace("=3D", "=")
        user = principal[len(USER):]
        if authzid and authzid != user:
            raise self.failure(f"Authentication failed: Client requested an authorization id "
                               f"({authzid}) that is different from the token's principal name "
                               f"({user})")
        self.user, self.principal, self.expires_ms = user, principal, expires_ms
        self.complete = True
        return b""
