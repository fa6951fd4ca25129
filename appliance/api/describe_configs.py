"""DescribeConfigs (key 32), versions 1-4: topic configs and this broker's configs.

Runs in frontends. Topic entries are the effective topic configs with Kafka's sources and
synonyms (``appliance.topic_config``: the topic's own override, this node's or the cluster-wide
dynamic broker config, the TOML file, the built-in default). Broker entries map our
``config.toml`` keys onto the Kafka names a Kafka user looks for; the ones that can change live
(dynamic broker configs) are not read-only and show their dynamic value first. The cluster-wide
default broker resource (empty name) lists only its dynamic configs, as Kafka does.
GROUP resources (KIP-848 group configs, ``appliance.group_config``) list every group config.
CLIENT_METRICS resources (KIP-714 subscriptions, ``appliance.metrics.client_metrics_config``)
list the configs set on them (CLIENT_METRICS_CONFIG; none for one that does not exist, as Kafka).
Broker-logger resources are not supported.

Authorization (Kafka's ConfigHelper): DescribeConfigs on the topic (else TOPIC_AUTHORIZATION_FAILED)
or, for broker and CLIENT_METRICS resources, on the Cluster (else CLUSTER_AUTHORIZATION_FAILED),
with no configs.
"""

from __future__ import annotations

import datetime
from typing import Any

from appliance.acl.model import AclOperation, ResourceType
from appliance.api import handles
from appliance.broker_dynamic_configs import STORED_DYNAMIC_BROKER_CONFIGS
from appliance.config import Config
from appliance.errors import ErrorCode
from appliance.group_config import describe_group_configs
from appliance.metrics import client_metrics_config
from appliance.protocol.messages import build, encode_response_items
from appliance.topic_config import (DEFAULT_CONFIG, DYNAMIC_BROKER_CONFIG, DYNAMIC_BROKER_CONFIGS,
                                    DYNAMIC_DEFAULT_BROKER_CONFIG, STATIC_BROKER_CONFIG,
                                    TOPIC_CONFIGS, describe_topic_configs)

TOPIC, BROKER, BROKER_LOGGER, CLIENT_METRICS, GROUP = 2, 4, 8, 16, 32
CONFIG_TYPES = {"BOOLEAN": 1, "STRING": 2, "INT": 3, "SHORT": 4, "LONG": 5, "DOUBLE": 6, "LIST": 7,
                "CLASS": 8, "PASSWORD": 9}
_BUILTIN = Config()


def broker_configs(cfg, advertised: dict[str, tuple[str, int]]) -> dict[str, tuple[str, str]]:
    """Kafka name -> (value, type) of what this broker runs with."""
    s, lg, tx, cl = cfg.server, cfg.log, cfg.transactions, cfg.log.cleaner
    b = lambda v: "true" if v else "false"  # noqa: E731
    return {
        "node.id": (str(s.node_id), "INT"), "broker.id": (str(s.node_id), "INT"),
        "log.dirs": (s.data_dir, "STRING"),
        "listeners": (",".join(str(x) for x in cfg.listeners), "STRING"),
        "advertised.listeners": (",".join(f"{name}://{h}:{p}" for name, (h, p)
                                          in advertised.items()), "STRING"),
        # The broker configs topic configs default to, from the topic-config table.
        **{d.broker: (d.default(lg), d.type) for d in TOPIC_CONFIGS.values() if d.broker},
        "log.retention.check.interval.ms": (str(lg.retention_check_interval_ms), "LONG"),
        "log.cleaner.enable": (b(cl.enable), "BOOLEAN"),
        "log.cleaner.threads": (str(cl.processes), "INT"),
        # Kafka's default (no limit) is Double.MAX_VALUE; 0 is ours for the same.
        "log.cleaner.io.max.bytes.per.second":
            (str(float(cl.io_max_bytes_per_second)) if cl.io_max_bytes_per_second
             else "1.7976931348623157E308", "DOUBLE"),
        "log.cleaner.dedupe.buffer.size": (str(cl.dedupe_buffer_size), "LONG"),
        "log.cleaner.backoff.ms": (str(cl.backoff_ms), "LONG"),
        "auto.create.topics.enable": (b(cfg.topics.auto_create), "BOOLEAN"),
        "num.partitions": (str(cfg.topics.default_partitions), "INT"),
        "default.replication.factor": ("1", "INT"),
        "offsets.topic.replication.factor": ("1", "SHORT"),
        "transaction.state.log.replication.factor": ("1", "SHORT"),
        "transaction.state.log.min.isr": ("1", "INT"),
        "socket.request.max.bytes": (str(s.socket_request_max_bytes), "INT"),
        "listener.security.protocol.map": (",".join(
            f"{x.name}:{x.protocol}" for x in cfg.listeners), "STRING"),
        "sasl.enabled.mechanisms": (",".join(cfg.sasl.mechanisms), "LIST"),
        "connections.max.reauth.ms": (str(cfg.sasl.connections_max_reauth_ms), "LONG"),
        "sasl.oauthbearer.jwks.endpoint.url": (cfg.sasl.oauthbearer_jwks_endpoint_url or None,
                                               "STRING"),
        "sasl.oauthbearer.expected.issuer": (cfg.sasl.oauthbearer_expected_issuer or None,
                                             "STRING"),
        "sasl.oauthbearer.expected.audience": (
            ",".join(cfg.sasl.oauthbearer_expected_audience) or None, "LIST"),
        "sasl.oauthbearer.clock.skew.seconds": (str(cfg.sasl.oauthbearer_clock_skew_seconds),
                                                "INT"),
        "sasl.oauthbearer.sub.claim.name": (cfg.sasl.oauthbearer_sub_claim_name, "STRING"),
        "ssl.client.auth": (cfg.tls.client_auth, "STRING"),
        "connection.failed.authentication.delay.ms": (
            str(s.connection_failed_authentication_delay_ms), "INT"),
        "connections.max.idle.ms": (str(s.connections_max_idle_ms), "LONG"),
        "transaction.max.timeout.ms": (str(tx.max_timeout_ms), "INT"),
        "transactional.id.expiration.ms": (str(tx.id_expiration_ms), "INT"),
        "transaction.abort.timed.out.transaction.cleanup.interval.ms": (str(tx.abort_timed_out_interval_ms), "INT"),
        "producer.id.expiration.ms": (str(tx.producer_id_expiration_ms), "INT"),
        "transaction.two.phase.commit.enable": (b(tx.two_phase_commit_enable), "BOOLEAN"),
    }


def broker_entries(cfg, catalog, endpoints: dict[str, tuple[str, int]], default_resource: bool
                   ) -> dict[str, tuple[str, int, str, list[tuple[str, str, int]]]]:
    """Kafka name -> (value, source, type, synonyms) of the broker resource (this node's, or with
    ``default_resource`` the cluster-wide default one, which holds only dynamic defaults)."""
    static = broker_configs(cfg, endpoints)
    builtin = broker_configs(_BUILTIN, endpoints)
    out = {}
    for name, (value, ctype) in static.items():
        syn: list[tuple[str, str, int]] = []
        if not default_resource and name in catalog.broker_node:
            syn.append((name, catalog.broker_node[name], DYNAMIC_BROKER_CONFIG))
        if name in catalog.broker_default:
            syn.append((name, catalog.broker_default[name], DYNAMIC_DEFAULT_BROKER_CONFIG))
        if default_resource:
            if syn:
                out[name] = (syn[0][1], syn[0][2], ctype, syn)
            continue
        if value != builtin[name][0]:
            syn.append((name, value, STATIC_BROKER_CONFIG))
        syn.append((name, builtin[name][0], DEFAULT_CONFIG))
        out[name] = (syn[0][1], syn[0][2], ctype, syn)
    # Kafka's dynamic names the appliance only stores (appliance.broker_dynamic_configs): shown
    # once set, as Kafka shows a dynamic config over its static default.
    for name, ctype in STORED_DYNAMIC_BROKER_CONFIGS.items():
        syn = []
        if not default_resource and name in catalog.broker_node:
            syn.append((name, catalog.broker_node[name], DYNAMIC_BROKER_CONFIG))
        if name in catalog.broker_default:
            syn.append((name, catalog.broker_default[name], DYNAMIC_DEFAULT_BROKER_CONFIG))
        if syn:
            out[name] = (syn[0][1], syn[0][2], ctype, syn)
    return out


def _entry(name, value, source, ctype, doc, synonyms, req, read_only):
    return dict(name=name, value=value, read_only=read_only, config_source=source, is_sensitive=False,
                synonyms=tuple(dict(name=n, value=v, source=s) for n, v, s in synonyms)
                if req.include_synonyms else (),
                config_type=CONFIG_TYPES.get(ctype, 0),
                documentation=doc if getattr(req, "include_documentation", False) else None)


@handles(32, "DescribeConfigs", 1, 4)
def handle(ctx, req):
    m = ctx.response_module()
    cfg = ctx.broker.cfg
    catalog = ctx.broker.catalog
    endpoints = ctx.broker.endpoints
    results = []
    # A resource named again is answered again, as Kafka does, from the same result (regression:
    # 50,000 copies of the broker resource took the frontend minutes to build and encode, past
    # its heartbeat).
    seen: dict[tuple, Any] = {}
    for res in req.resources:
        key = (res.resource_type, res.resource_name,
               None if res.configuration_keys is None else tuple(res.configuration_keys))
        if key in seen:
            results.append(seen[key])
            continue
        keys = set(res.configuration_keys) if res.configuration_keys is not None else None
        err, msg, entries = ErrorCode.none, None, []
        if res.resource_type == TOPIC and not ctx.authorize(
                AclOperation.DESCRIBE_CONFIGS, ResourceType.TOPIC, res.resource_name):
            err, msg = ErrorCode.topic_authorization_failed, "Topic authorization failed."
        elif res.resource_type == GROUP and not ctx.authorize(
                AclOperation.DESCRIBE_CONFIGS, ResourceType.GROUP, res.resource_name):
            err, msg = ErrorCode.group_authorization_failed, "Group authorization failed."
        elif res.resource_type in (BROKER, BROKER_LOGGER, CLIENT_METRICS) and not \
                ctx.authorize_cluster(AclOperation.DESCRIBE_CONFIGS):
            err, msg = ErrorCode.cluster_authorization_failed, "Cluster authorization failed."
        elif res.resource_type == TOPIC:
            info = catalog.topics.get(res.resource_name)
            if info is None:
                err, msg = ErrorCode.unknown_topic_or_partition, "This server does not host this topic-partition."
            else:
                for name, (value, source, syn) in describe_topic_configs(cfg, catalog, info.configs).items():
                    if keys is None or name in keys:
                        d = TOPIC_CONFIGS[name]
                        entries.append(_entry(name, value, source, d.type, d.doc, syn, req, False))
        elif res.resource_type == GROUP:
            # KIP-848 group configs: every name, set on the group or the broker's default; a
            # group that does not exist (yet) has the defaults, as in Kafka.
            found = describe_group_configs(catalog.group_configs.get(res.resource_name, {}), cfg.groups)
            for name, (value, source, ctype, syn) in found.items():
                if keys is None or name in keys:
                    entries.append(_entry(name, value, source, ctype, None, syn, req, False))
        elif res.resource_type == CLIENT_METRICS:
            # KIP-714 subscriptions: the configs set on the resource (none: it does not exist).
            if not res.resource_name:
                err, msg = ErrorCode.invalid_request, "Client metrics subscription name must not be empty"
            found = client_metrics_config.describe(
                catalog.client_metrics.get(res.resource_name, {}))
            for name, (value, source, ctype, syn) in found.items():
                if keys is None or name in keys:
                    entries.append(_entry(name, value, source, ctype, None, syn, req, False))
        elif res.resource_type == BROKER:
            if res.resource_name not in ("", str(ctx.broker.node_id)):
                err, msg = ErrorCode.invalid_request, (
                    f"Unexpected broker id, expected {ctx.broker.node_id} or empty string, "
                    f"but received {res.resource_name}")
            else:
                found = broker_entries(cfg, catalog, endpoints, default_resource=not res.resource_name)
                for name, (value, source, ctype, syn) in found.items():
                    if keys is None or name in keys:
                        entries.append(_entry(name, value, source, ctype, None, syn, req,
                                              name not in DYNAMIC_BROKER_CONFIGS
                                              and name not in STORED_DYNAMIC_BROKER_CONFIGS))
        else:
            err, msg = ErrorCode.invalid_request, f"Unsupported resource type {res.resource_type}"
        seen[key] = build(m.DescribeConfigsResult, dict(
            error_code=err, error_message=msg, resource_type=res.resource_type,
            resource_name=res.resource_name, configs=tuple(entries)))
        results.append(seen[key])
    return encode_response_items(build(m.DescribeConfigsResponse, throttle_time=datetime.timedelta(0)),
                                 "results", tuple(results))
