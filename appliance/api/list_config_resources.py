"""ListConfigResources (key 74), versions 0-1 (KIP-714's ListClientMetricsResources, renamed and
widened by KIP-1142): the config resources that exist.

Runs in frontends, on the catalog the frontend follows. As Kafka's KafkaApis: the principal needs
DescribeConfigs on the cluster (else CLUSTER_AUTHORIZATION_FAILED); v0 lists CLIENT_METRICS
resources only; v1 takes ``ResourceTypes`` (empty: every type it supports: TOPIC, BROKER,
BROKER_LOGGER, CLIENT_METRICS, GROUP) and answers UNSUPPORTED_VERSION for a type outside them.
GROUP: the groups that have group configs; CLIENT_METRICS: the client metrics subscriptions
(``appliance.metrics.client_metrics_config``); BROKER and BROKER_LOGGER: this node; TOPIC: every
topic.
"""

from __future__ import annotations

import datetime

from appliance.acl.model import AclOperation
from appliance.api import handles
from appliance.errors import ErrorCode
from appliance.protocol.messages import build, response_class

TOPIC, BROKER, BROKER_LOGGER, CLIENT_METRICS, GROUP = 2, 4, 8, 16, 32
SUPPORTED = {0: (CLIENT_METRICS,), 1: (TOPIC, BROKER, BROKER_LOGGER, CLIENT_METRICS, GROUP)}
ZERO = datetime.timedelta(0)


@handles(74, "ListConfigResources", 0, 1)
def handle(ctx, req):
    cls = ctx.response_class()
    if not ctx.authorize_cluster(AclOperation.DESCRIBE_CONFIGS):
        return build(cls, throttle_time=ZERO, error_code=ErrorCode.cluster_authorization_failed,
                     config_resources=())
    supported = SUPPORTED[ctx.version]
    types = tuple(getattr(req, "resource_types", ())) or supported
    if any(t not in supported for t in types):
        return build(cls, throttle_time=ZERO, error_code=ErrorCode.unsupported_version,
                     config_resources=())
    catalog = ctx.broker.catalog
    node = str(ctx.broker.node_id)
    out = []
    # Kafka's order: groups, client metrics, broker loggers, brokers, topics.
    if GROUP in types:
        out += [(g, GROUP) for g in sorted(catalog.group_configs)]
    if CLIENT_METRICS in types:
        out += [(n, CLIENT_METRICS) for n in sorted(catalog.client_metrics)]
    if BROKER_LOGGER in types:
        out.append((node, BROKER_LOGGER))
    if BROKER in types:
        out.append((node, BROKER))
    if TOPIC in types:
        out += [(t, TOPIC) for t in sorted(catalog.topics)]
    return build(cls, throttle_time=ZERO, error_code=ErrorCode.none,
                 config_resources=tuple(dict(resource_name=n, resource_type=t) for n, t in out))


@handle.on_error
def error_response(version, req, err):
    return build(response_class(74, version), throttle_time=ZERO, error_code=err.code,
                 config_resources=())
