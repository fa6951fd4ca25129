"""DescribeConfigs (key 32), versions 1-4: topic configs and this broker's configs.

Runs in frontends. Topic entries are the effective topic configs (``appliance.topic_config``) with
their source (TOPIC_CONFIG when set on the topic, DEFAULT_CONFIG otherwise, and with synonyms the
broker setting it defaults to). Broker entries map our ``config.toml`` keys onto the Kafka names a
Kafka user looks for, as STATIC_BROKER_CONFIG. Broker-logger resources are not supported.

Authorization (Kafka's ConfigHelper): DescribeConfigs on the topic (else TOPIC_AUTHORIZATION_FAILED)
or, for broker resources, on the Cluster (else CLUSTER_AUTHORIZATION_FAILED), with no configs.
"""

from __future__ import annotations

import datetime

from appliance.acl.model import AclOperation, ResourceType
from appliance.api import handles
from appliance.protocol.messages import build
from appliance.errors import ErrorCode
from appliance.topic_config import TOPIC_CONFIGS, effective_topic_configs

TOPIC, BROKER, BROKER_LOGGER = 2, 4, 8
TOPIC_CONFIG_SOURCE, STATIC_BROKER_CONFIG, DEFAULT_CONFIG = 1, 4, 5
CONFIG_TYPES = {"BOOLEAN": 1, "STRING": 2, "INT": 3, "SHORT": 4, "LONG": 5, "DOUBLE": 6, "LIST": 7,
                "CLASS": 8, "PASSWORD": 9}
# The broker setting each topic config defaults to (Kafka's synonyms).
BROKER_SYNONYM = {"retention.ms": "log.retention.ms", "retention.bytes": "log.retention.bytes",
                  "segment.bytes": "log.segment.bytes", "segment.ms": "log.roll.ms",
                  "max.message.bytes": "message.max.bytes",
                  "message.timestamp.type": "log.message.timestamp.type"}


def broker_configs(cfg, host: str, port: int) -> dict[str, tuple[str, str]]:
    """Kafka name -> (value, type) of what this broker runs with."""
    s, lg, tx = cfg.server, cfg.log, cfg.transactions
    b = lambda v: "true" if v else "false"  # noqa: E731
    return {
        "node.id": (str(s.node_id), "INT"), "broker.id": (str(s.node_id), "INT"),
        "log.dirs": (s.data_dir, "STRING"),
        "listeners": (f"PLAINTEXT://{s.listen}", "STRING"),
        "advertised.listeners": (f"PLAINTEXT://{host}:{port}", "STRING"),
        "log.segment.bytes": (str(lg.segment_bytes), "INT"),
        "log.roll.ms": (str(lg.segment_ms), "LONG"),
        "log.retention.bytes": (str(lg.retention_bytes), "LONG"),
        "log.retention.ms": (str(lg.retention_ms), "LONG"),
        "log.retention.check.interval.ms": (str(lg.retention_check_interval_ms), "LONG"),
        "log.index.interval.bytes": (str(lg.index_interval_bytes), "INT"),
        "log.index.size.max.bytes": (str(lg.segment_index_bytes), "INT"),
        "message.max.bytes": (str(lg.message_max_bytes), "INT"),
        "log.message.timestamp.type": (lg.message_timestamp_type, "STRING"),
        "log.flush.interval.ms": (str(lg.flush.kafka_flush_interval_ms), "LONG"),
        "auto.create.topics.enable": (b(cfg.topics.auto_create), "BOOLEAN"),
        "num.partitions": (str(cfg.topics.default_partitions), "INT"),
        "default.replication.factor": ("1", "INT"),
        "min.insync.replicas": ("1", "INT"),
        "offsets.topic.replication.factor": ("1", "SHORT"),
        "transaction.state.log.replication.factor": ("1", "SHORT"),
        "transaction.state.log.min.isr": ("1", "INT"),
        "socket.request.max.bytes": (str(s.socket_request_max_bytes), "INT"),
        "connections.max.idle.ms": (str(s.connections_max_idle_ms), "LONG"),
        "transaction.max.timeout.ms": (str(tx.max_timeout_ms), "INT"),
        "transactional.id.expiration.ms": (str(tx.id_expiration_ms), "INT"),
        "transaction.abort.timed.out.transaction.cleanup.interval.ms": (str(tx.abort_timed_out_interval_ms), "INT"),
        "producer.id.expiration.ms": (str(tx.producer_id_expiration_ms), "INT"),
        "transaction.two.phase.commit.enable": (b(tx.two_phase_commit_enable), "BOOLEAN"),
    }


def _entry(m, name, value, source, ctype, doc, synonyms, req):
    return dict(name=name, value=value, read_only=source != TOPIC_CONFIG_SOURCE and source != DEFAULT_CONFIG,
                config_source=source, is_sensitive=False,
                synonyms=tuple(synonyms) if req.include_synonyms else (),
                config_type=CONFIG_TYPES.get(ctype, 0),
                documentation=doc if getattr(req, "include_documentation", False) else None)


@handles(32, "DescribeConfigs", 1, 4)
def handle(ctx, req):
    m = ctx.response_module()
    cfg = ctx.broker.cfg
    host, port = ctx.broker.advertised
    brokers = broker_configs(cfg, host, port)
    results = []
    for res in req.resources:
        keys = set(res.configuration_keys) if res.configuration_keys is not None else None
        err, msg, entries = ErrorCode.none, None, []
        if res.resource_type == TOPIC and not ctx.authorize(
                AclOperation.DESCRIBE_CONFIGS, ResourceType.TOPIC, res.resource_name):
            err, msg = ErrorCode.topic_authorization_failed, "Topic authorization failed."
        elif res.resource_type in (BROKER, BROKER_LOGGER) and not ctx.authorize_cluster(
                AclOperation.DESCRIBE_CONFIGS):
            err, msg = ErrorCode.cluster_authorization_failed, "Cluster authorization failed."
        elif res.resource_type == TOPIC:
            info = ctx.broker.catalog.topics.get(res.resource_name)
            if info is None:
                err, msg = ErrorCode.unknown_topic_or_partition, "This server does not host this topic-partition."
            else:
                for name, (value, is_default) in effective_topic_configs(cfg, info.configs).items():
                    if keys is not None and name not in keys:
                        continue
                    d = TOPIC_CONFIGS[name]
                    syn = []
                    if not is_default:
                        syn.append(dict(name=name, value=value, source=TOPIC_CONFIG_SOURCE))
                    if name in BROKER_SYNONYM:
                        bname = BROKER_SYNONYM[name]
                        syn.append(dict(name=bname, value=brokers[bname][0],
                                        source=STATIC_BROKER_CONFIG))
                    entries.append(_entry(m, name, value, DEFAULT_CONFIG if is_default else TOPIC_CONFIG_SOURCE,
                                          d.type, d.doc, syn, req))
        elif res.resource_type == BROKER:
            if res.resource_name not in ("", str(ctx.broker.node_id)):
                err, msg = ErrorCode.invalid_request, (
                    f"Unexpected broker id, expected {ctx.broker.node_id} or empty string, "
                    f"but received {res.resource_name}")
            else:
                for name, (value, ctype) in brokers.items():
                    if keys is None or name in keys:
                        syn = [dict(name=name, value=value, source=STATIC_BROKER_CONFIG)]
                        entries.append(_entry(m, name, value, STATIC_BROKER_CONFIG, ctype, None, syn, req))
        else:
            err, msg = ErrorCode.invalid_request, f"Unsupported resource type {res.resource_type}"
        results.append(dict(error_code=err, error_message=msg,
                            resource_type=res.resource_type, resource_name=res.resource_name,
                            configs=tuple(entries)))
    return build(m.DescribeConfigsResponse, throttle_time=datetime.timedelta(0), results=tuple(results))
