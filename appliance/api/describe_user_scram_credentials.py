"""DescribeUserScramCredentials (key 50), version 0: the users that have SCRAM credentials, with
each credential's mechanism and iteration count (never the credential itself).

Runs in frontends, from the credentials the supervisor publishes (``CredentialsView``; no round
trip). Kafka's rules (ScramImage.describe): no users or an empty list describes every user; a
user named twice is DUPLICATE_RESOURCE, a user without credentials RESOURCE_NOT_FOUND, each with
Kafka's message.
"""

from __future__ import annotations

import datetime

from appliance.acl.model import AclOperation
from appliance.api import handles
from appliance.errors import ErrorCode
from appliance.protocol.messages import build
from appliance.security.scram import MECHANISMS


@handles(50, "DescribeUserScramCredentials", 0, 0)
def handle(ctx, req):
    m = ctx.response_module()
    if not ctx.authorize_cluster(AclOperation.DESCRIBE):
        # Kafka's KafkaApis: Describe on the Cluster, else the request's error response.
        denied = ErrorCode.cluster_authorization_failed
        return build(m.DescribeUserScramCredentialsResponse, throttle_time=datetime.timedelta(0),
                     error_code=denied, error_message=None, results=tuple(
                         dict(user=u.name, error_code=denied, error_message=None, credential_infos=())
                         for u in req.users or ()))
    users = ctx.broker.credentials.get()
    if not req.users:
        wanted = {name: False for name in sorted(users)}
    else:
        wanted: dict[str, bool] = {}
        for u in req.users:
            wanted[u.name] = u.name in wanted        # True: named twice
    results = []
    for name, twice in wanted.items():
        if twice:
            results.append(dict(user=name, error_code=ErrorCode.duplicate_resource,
                                error_message="Cannot describe SCRAM credentials for the same "
                                              f"user twice in a single request: {name}",
                                credential_infos=()))
            continue
        creds = users.get(name)
        if not creds:
            results.append(dict(user=name, error_code=ErrorCode.resource_not_found,
                                error_message="Attempt to describe a user credential that does "
                                              f"not exist: {name}",
                                credential_infos=()))
            continue
        results.append(dict(user=name, error_code=ErrorCode.none, error_message=None,
                            credential_infos=tuple(
                                dict(mechanism=MECHANISMS[mech][0], iterations=c.iterations)
                                for mech, c in sorted(creds.items()))))
    return build(m.DescribeUserScramCredentialsResponse, throttle_time=datetime.timedelta(0),
                 error_code=ErrorCode.none, error_message=None, results=tuple(results))
