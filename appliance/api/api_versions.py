"""ApiVersions (key 18), versions 0-4: the version ranges of every registered handler.

Runs in frontends. The ranges are derived from the handler registry, never listed by hand. An
unknown ApiVersions version never reaches this module: the connection answers it in the v0 layout
with UNSUPPORTED_VERSION (Kafka's rule, so that clients can retry with a version we support).

Features (v3+): ``transaction.version`` supported 0-2 and finalized at
``transactions.transaction_version`` (default 2). A Java 4.x client uses transaction version 2
(KIP-890 part 2: epoch bump on every EndTxn v5, implicit partition adds through Produce v12 and
TxnOffsetCommit v5) only when the finalized level is 2; at 1 it keeps the KIP-98 protocol.
``group.version`` supported 0-1 and finalized at 1: the KIP-848 consumer group protocol
(ConsumerGroupHeartbeat / ConsumerGroupDescribe) is on, as in Kafka 4.x. ``share.version``
supported 0-1 and finalized at 1: KIP-932 share groups (ShareGroupHeartbeat, ShareFetch,
ShareAcknowledge) are on; clients use share groups only when it is.
"""

from __future__ import annotations

from appliance.api import api_ranges, handles
from appliance.errors import ErrorCode
from appliance.protocol import messages


@handles(18, "ApiVersions", 0, 4)
def handle(ctx, req):
    # KIP-511: a v3+ request naming its client software with forbidden characters is refused.
    error = 0 if messages.api_versions_request_valid(req) else int(ErrorCode.invalid_request)
    if not error and ctx.version >= 3:
        # KIP-714's client_software_name/version selectors and labels (push_telemetry).
        ctx.connection.software = (req.client_software_name, req.client_software_version)
    tv = ctx.broker.cfg.transactions.transaction_version
    return messages.build_api_versions_response(
        ctx.version, api_ranges(), error_code=error,
        supported_features={"transaction.version": (0, 2), "group.version": (0, 1),
                            "share.version": (0, 1)},
        finalized_features={"transaction.version": tv, "group.version": GROUP_VERSION,
                            "share.version": SHARE_VERSION},
        finalized_features_epoch=FEATURES_EPOCH)


# KIP-848: group.version 1 enables the consumer group protocol (ConsumerGroupHeartbeat); Kafka
# 4.x finalizes it by default and clients use group.protocol=consumer only when it is.
GROUP_VERSION = 1
# KIP-932: share.version 1 enables share groups (Kafka 4.2 finalizes it by default).
SHARE_VERSION = 1


# Kafka sends the metadata offset of the last feature change; a fixed value is enough for one node
# whose features change only with its configuration (clients only compare epochs they have seen).
FEATURES_EPOCH = 1
