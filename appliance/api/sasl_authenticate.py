"""SaslAuthenticate (key 36), versions 0-2: one step of the SASL exchange (KIP-152).

Runs in frontends, on the connection's ``SaslServerAuthenticator`` (``appliance.security.sasl``):
the client's token in, the server's token out. When the exchange completes, the connection
takes the principal (``User:<name>``) and serves every API. A failure is
SASL_AUTHENTICATION_FAILED with Kafka's message (SCRAM: the generic "Authentication failed
during authentication due to invalid credentials with SASL mechanism ..."; PLAIN: its own
messages), sent after Kafka's failed-authentication delay, then the connection is closed. v1+
carries SessionLifetimeMs (KIP-368): 0 when the session has no end, else the smaller of
``sasl.connections_max_reauth_ms`` and what is left of an OAUTHBEARER token; the client must
re-authenticate within it (a SaslHandshake on the same connection). Outside the
exchange (no SASL on the listener, or already authenticated): ILLEGAL_SASL_STATE, as Kafka's
KafkaApis answers.
"""

from __future__ import annotations

import datetime

from appliance.api import FailAuthentication, handles
from appliance.errors import ErrorCode
from appliance.protocol.messages import build, response_class
from appliance.security.sasl import SaslFailure, SaslState

ZERO = datetime.timedelta(0)


@handles(36, "SaslAuthenticate", 0, 2)
def handle(ctx, req):
    cls = ctx.response_class()
    conn = ctx.connection
    auth = conn.sasl
    if auth is None or auth.state is not SaslState.AUTHENTICATE or auth.raw:
        return build(cls, error_code=ErrorCode.illegal_sasl_state,
                     error_message="SaslAuthenticate request received after successful "
                                   "authentication", auth_bytes=b"", session_lifetime=ZERO)
    try:
        token = auth.evaluate(bytes(req.auth_bytes), ctx.version)
    except SaslFailure as e:
        return FailAuthentication(
            build(cls, error_code=ErrorCode.sasl_authentication_failed, error_message=e.message,
                  auth_bytes=b"", session_lifetime=ZERO),
            f"{auth.mechanism}: {e}")
    lifetime = ZERO
    if auth.complete:
        conn.authenticated(auth.principal)
        lifetime = datetime.timedelta(milliseconds=auth.session_lifetime_ms)
    return build(cls, error_code=ErrorCode.none, error_message=None, auth_bytes=token,
                 session_lifetime=lifetime)


@handle.on_error
def error_response(version, req, err):
    return build(response_class(36, version), error_code=err.code, error_message=err.message,
                 auth_bytes=b"", session_lifetime=ZERO)
