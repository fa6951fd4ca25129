"""SaslHandshake (key 17), versions 0-1: choose the SASL mechanism of a connection.

Runs in frontends, on the connection's ``SaslServerAuthenticator`` (``appliance.security.sasl``).
An enabled mechanism (``sasl.mechanisms``) is answered NONE with the enabled list and the
exchange begins: SaslAuthenticate requests after v1, raw tokens after v0 (the pre-KIP-152 flow,
which the connection handles). Any other mechanism is UNSUPPORTED_SASL_MECHANISM with the enabled
list, then the connection is closed after Kafka's failed-authentication delay. On a listener
without SASL, or once authenticated, the answer is ILLEGAL_SASL_STATE (Kafka's KafkaApis
answer), unless it begins a re-authentication (KIP-368: the connection decides, see
``workers.frontend.connection``), which must keep the mechanism.
"""

from __future__ import annotations

from appliance.api import FailAuthentication, handles
from appliance.errors import ErrorCode
from appliance.protocol.messages import build, response_class


@handles(17, "SaslHandshake", 0, 1)
def handle(ctx, req):
    cls = ctx.response_class()
    auth = ctx.connection.sasl
    if auth is None or auth.complete:
        return build(cls, error_code=ErrorCode.illegal_sasl_state, mechanisms=())
    enabled = tuple(auth.mechanisms)
    if not auth.handshake(req.mechanism, ctx.version):
        return FailAuthentication(
            build(cls, error_code=ErrorCode.unsupported_sasl_mechanism, mechanisms=enabled),
            f"Unsupported SASL mechanism {req.mechanism}")
    if auth.raw:
        ctx.connection.expect_raw_tokens()
    return build(cls, error_code=ErrorCode.none, mechanisms=enabled)


@handle.on_error
def error_response(version, req, err):
    return build(response_class(17, version), error_code=err.code, mechanisms=())
