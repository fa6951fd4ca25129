"""Group configs (KIP-848's GROUP config resources, Kafka 4.x's GroupConfig): the table of their
names, types, defaults and checks, and the checks of IncrementalAlterConfigs / AlterConfigs of a
GROUP resource and the entries of its DescribeConfigs.

Owns nothing; used by the supervisor (it validates a change and commits it to the catalog it
owns, ``Catalog.group_configs``: group name -> the configs set on it) and the frontends
(DescribeConfigs). A group config may be set before the group exists, as in Kafka. The values are
stored and shown; the consumer group protocol (KIP-848) applies ``consumer.session.timeout.ms``
and ``consumer.heartbeat.interval.ms`` over ``[groups]`` (``appliance.group.table.GroupTable``,
from each member's next heartbeat, as Kafka does); share groups (KIP-932) apply the ``share.*``
ones over ``[groups]``'s ``share_*`` keys (``appliance.group.share_group``, from the next
request); the streams protocol is not served, so its configs are only stored.

Each default is the broker config Kafka names as its synonym (group.consumer.session.timeout.ms
for consumer.session.timeout.ms ...), with Kafka's default, and a value must lie within the
broker's bounds (group.consumer.min/max.session.timeout.ms ...), as Kafka's GroupConfig.validate
checks it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

from .errors import ErrorCode, KafkaError

DEFAULT_CONFIG, GROUP_CONFIG = 5, 8          # DescribeConfigs ConfigSource ids (KIP-848: 8)


def _int_in(lo: int, hi: int, why: str) -> Callable[[str], str | None]:
    def check(v: str) -> str | None:
        try:
            n = int(v)
        except ValueError:
            return f"value {v!r} is not a number"
        return None if lo <= n <= hi else f"{why} must be in [{lo}, {hi}]"
    return check


def _choice(*allowed: str) -> Callable[[str], str | None]:
    return lambda v: None if v in allowed else f"value {v!r} not in {list(allowed)}"


def _offset_reset(v: str) -> str | None:
    # KIP-1106: latest, earliest or by_duration:<ISO-8601 duration>
    if v in ("latest", "earliest") or re.fullmatch(r"by_duration:P(?:\d+D)?(?:T(?:\d+H)?(?:\d+M)?(?:\d+(?:\.\d+)?S)?)?", v):
        return None
    return f"value {v!r}: one of latest, earliest, by_duration:<ISO8601 duration>"


@dataclass(frozen=True)
class GroupConfigDef:
    name: str
    type: str
    default: str
    check: Callable[[str], str | None]
    broker: str            # its broker synonym


GROUP_CONFIGS: dict[str, GroupConfigDef] = {d.name: d for d in [
    GroupConfigDef("consumer.session.timeout.ms", "INT", "45000",
                   _int_in(45000, 60000, "consumer.session.timeout.ms"),
                   "group.consumer.session.timeout.ms"),
    GroupConfigDef("consumer.heartbeat.interval.ms", "INT", "5000",
                   _int_in(5000, 15000, "consumer.heartbeat.interval.ms"),
                   "group.consumer.heartbeat.interval.ms"),
    GroupConfigDef("share.session.timeout.ms", "INT", "45000",
                   _int_in(45000, 60000, "share.session.timeout.ms"), "group.share.session.timeout.ms"),
    GroupConfigDef("share.heartbeat.interval.ms", "INT", "5000",
                   _int_in(5000, 15000, "share.heartbeat.interval.ms"),
                   "group.share.heartbeat.interval.ms"),
    GroupConfigDef("share.record.lock.duration.ms", "INT", "30000",
                   _int_in(15000, 60000, "share.record.lock.duration.ms"),
                   "group.share.record.lock.duration.ms"),
    GroupConfigDef("share.delivery.count.limit", "INT", "5",
                   _int_in(2, 10, "share.delivery.count.limit"),
                   "group.share.delivery.count.limit"),
    GroupConfigDef("share.auto.offset.reset", "STRING", "latest", _offset_reset,
                   "group.share.auto.offset.reset"),
    GroupConfigDef("share.isolation.level", "STRING", "read_uncommitted",
                   _choice("read_uncommitted", "read_committed"), "group.share.isolation.level"),
    # KIP-1240 (Kafka 4.3): a group's own in-flight window per share partition, within the
    # broker's bounds (group.share.partition.max.record.locks' 100-10,000 here).
    GroupConfigDef("share.partition.max.record.locks", "INT", "2000",
                   _int_in(100, 10000, "share.partition.max.record.locks"),
                   "group.share.partition.max.record.locks"),
    GroupConfigDef("streams.session.timeout.ms", "INT", "45000",
                   _int_in(45000, 60000, "streams.session.timeout.ms"),
                   "group.streams.session.timeout.ms"),
    GroupConfigDef("streams.heartbeat.interval.ms", "INT", "5000",
                   _int_in(5000, 15000, "streams.heartbeat.interval.ms"),
                   "group.streams.heartbeat.interval.ms"),
    GroupConfigDef("streams.num.standby.replicas", "INT", "0",
                   _int_in(0, 2, "streams.num.standby.replicas"), "group.streams.num.standby.replicas"),
]}


def alter_group_configs(current: dict[str, str], ops, incremental: bool, apply_ops,
                        groups_cfg=None) -> dict[str, str]:
    """A group's new config set after ``ops`` (``topic_config._apply_ops`` semantics, passed in as
    ``apply_ops``): INVALID_CONFIG for an unknown name or a bad value, as Kafka's GroupConfig.
    With ``groups_cfg`` (``[groups]``), share.record.lock.duration.ms is held to its
    ``share_min/max_record_lock_duration_ms`` instead of Kafka's default bounds."""
    new = apply_ops(current, ops, incremental, lambda n: n in GROUP_CONFIGS, lambda n: "",
                    lambda n: False,
                    lambda bad: KafkaError(ErrorCode.invalid_config, f"Unknown group config name: {bad[0]}"))
    checks = {}
    if groups_cfg is not None:
        checks["share.record.lock.duration.ms"] = _int_in(
            groups_cfg.share_min_record_lock_duration_ms,
            groups_cfg.share_max_record_lock_duration_ms, "share.record.lock.duration.ms")
    for name, value in new.items():
        err = checks.get(name, GROUP_CONFIGS[name].check)(value)
        if err:
            raise KafkaError(ErrorCode.invalid_config,
                             f"Invalid value {value} for configuration {name}: {err}")
    return new


def describe_group_configs(configs: dict[str, str], groups_cfg=None) -> dict[str, tuple[str, int, str, list]]:
    """name -> (value, source, type, synonyms) of every group config of a group whose own configs
    are ``configs`` (GROUP_CONFIG when set, else the broker default: ``[groups]``'s consumer
    session timeout and heartbeat interval when ``groups_cfg`` is given, Kafka's otherwise)."""
    defaults = {}
    if groups_cfg is not None:
        defaults = {"consumer.session.timeout.ms": str(groups_cfg.consumer_session_timeout_ms),
                    "consumer.heartbeat.interval.ms": str(groups_cfg.consumer_heartbeat_interval_ms),
                    "share.session.timeout.ms": str(groups_cfg.share_session_timeout_ms),
                    "share.heartbeat.interval.ms": str(groups_cfg.share_heartbeat_interval_ms),
                    "share.record.lock.duration.ms": str(groups_cfg.share_record_lock_duration_ms),
                    "share.delivery.count.limit": str(groups_cfg.share_delivery_count_limit),
                    "share.auto.offset.reset": str(groups_cfg.share_auto_offset_reset),
                    "share.partition.max.record.locks":
                        str(groups_cfg.share_partition_max_record_locks)}
    out = {}
    for name, d in GROUP_CONFIGS.items():
        syn = []
        if name in configs:
            syn.append((name, configs[name], GROUP_CONFIG))
        syn.append((d.broker, defaults.get(name, d.default), DEFAULT_CONFIG))
        out[name] = (syn[0][1], syn[0][2], d.type, syn)
    return out
