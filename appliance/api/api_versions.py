"""ApiVersions (key 18), versions 0-4: the version ranges of every registered handler.

Runs in frontends. The ranges are derived from the handler registry, never listed by hand. An
unknown ApiVersions version never reaches this module: the connection answers it in the v0 layout
with UNSUPPORTED_VERSION (Kafka's rule, so that clients can retry with a version we support).
"""

from __future__ import annotations

import re

from appliance.api import api_ranges, handles
from appliance.protocol import messages

# Kafka's ApiVersionsRequest.isValid(): client software name and version from v3 on.
_SOFTWARE = re.compile(r"^[a-zA-Z0-9](?:[a-zA-Z0-9\-.]*[a-zA-Z0-9])?$")
INVALID_REQUEST = 42


@handles(18, "ApiVersions", 0, 4)
def handle(ctx, req):
    error = 0
    if ctx.version >= 3 and not (_SOFTWARE.match(req.client_software_name or "")
                                 and _SOFTWARE.match(req.client_software_version or "")):
        error = INVALID_REQUEST
    return messages.build_api_versions_response(ctx.version, api_ranges(), error_code=error)
