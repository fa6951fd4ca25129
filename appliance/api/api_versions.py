"""ApiVersions (key 18), versions 0-4: the version ranges of every registered handler.

Runs in frontends. The ranges are derived from the handler registry, never listed by hand. An
unknown ApiVersions version never reaches this module: the connection answers it in the v0 layout
with UNSUPPORTED_VERSION (Kafka's rule, so that clients can retry with a version we support).
"""

from __future__ import annotations

from appliance.api import api_ranges, handles
from appliance.errors import ErrorCode
from appliance.protocol import messages


@handles(18, "ApiVersions", 0, 4)
def handle(ctx, req):
    # KIP-511: a v3+ request naming its client software with forbidden characters is refused.
    error = 0 if messages.api_versions_request_valid(req) else int(ErrorCode.invalid_request)
    return messages.build_api_versions_response(ctx.version, api_ranges(), error_code=error)
