"""AlterUserScramCredentials (key 51), version 0: add, replace or delete SCRAM credentials.

Runs in frontends; the supervisor owns the credential store and applies the request
(``AlterScramCredentialsRequest``, ``appliance.security.credentials``) with the rules of Kafka's
controller, then publishes the new credentials before it answers, so that a login right after
the answer uses them. The client sends a salt and the salted password (Hi(password, salt, i)),
never the password; the store keeps the stored key and server key derived from it.
"""

from __future__ import annotations

import datetime

from appliance.acl.model import AclOperation
from appliance.api import handles
from appliance.errors import ErrorCode
from appliance.protocol.messages import build
from appliance.security.messages import AlterScramCredentialsRequest, Deletion, Upsertion


@handles(51, "AlterUserScramCredentials", 0, 0)
async def handle(ctx, req):
    m = ctx.response_module()
    if not ctx.authorize_cluster(AclOperation.ALTER):
        # Kafka's KafkaApis: Alter on the Cluster, else every user named is refused.
        names = dict.fromkeys([d.name for d in req.deletions] + [u.name for u in req.upsertions])
        return build(m.AlterUserScramCredentialsResponse, throttle_time=datetime.timedelta(0),
                     results=tuple(dict(user=n, error_code=ErrorCode.cluster_authorization_failed,
                                        error_message=None) for n in names))
    request = AlterScramCredentialsRequest(
        deletions=[Deletion(d.name, int(d.mechanism)) for d in req.deletions],
        upsertions=[Upsertion(u.name, int(u.mechanism), int(u.iterations), bytes(u.salt),
                              bytes(u.salted_password)) for u in req.upsertions])
    r = await ctx.broker.call_supervisor(
        request, ctx.broker.cfg.server.internal_request_timeout_ms / 1000)
    return build(m.AlterUserScramCredentialsResponse, throttle_time=datetime.timedelta(0),
                 results=tuple(dict(user=x.user, error_code=x.error_code,
                                    error_message=x.error_message) for x in r.results))
