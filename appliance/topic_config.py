"""Topic-level configuration and the dynamic broker configs that topic configs default to: the one
table of the Kafka topic configs (``TOPIC_CONFIGS``: Kafka 4.3's whole TopicConfig set, each with
its type, default, check as Kafka's LogConfig checks it, broker synonym and the setting it
carries; names that mean nothing on one node are stored as Kafka stores them, tiered-storage names
accept only the values that ask for none), the effective settings a topic's processes apply
(``LogSettings``, Kafka's LogConfig values), their layers and sources, and the checks of
CreateTopics, AlterConfigs and IncrementalAlterConfigs (with the dynamic broker names that are
only stored, ``appliance.broker_dynamic_configs``).

Owns nothing; used by the supervisor (validation of CreateTopics and of config changes, which it
applies to the catalog it owns), the frontends (DescribeConfigs, the produce checks) and the
writers and fetchers (effective ``LogSettings``).

A topic config's value comes from the first layer that sets it, as in Kafka (KIP-226):

    the topic's own override               DYNAMIC_TOPIC_CONFIG          catalog, per topic
    this node's dynamic broker config      DYNAMIC_BROKER_CONFIG         catalog ``broker_node``
    the cluster-wide dynamic default       DYNAMIC_DEFAULT_BROKER_CONFIG catalog ``broker_default``
    the TOML file's ``[log]`` section      STATIC_BROKER_CONFIG          ``Config`` (reloadable)
    the built-in default                   DEFAULT_CONFIG

The first three are changed over the Kafka protocol and persisted in the catalog; the TOML file
stays the static layer, so that re-reading it never loses what an operator set with
kafka-configs.sh, and what kafka-configs.sh set wins over the file, as Kafka's dynamic configs win
over server.properties.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Literal, Mapping

import msgspec

from .broker_dynamic_configs import STORED_DYNAMIC_BROKER_CONFIGS, check_typed
from .config import Config, LogConfig
from .errors import ErrorCode, KafkaError

# Kafka's ConfigSource ids (DescribeConfigs v1+).
DYNAMIC_TOPIC_CONFIG, DYNAMIC_BROKER_CONFIG, DYNAMIC_DEFAULT_BROKER_CONFIG = 1, 2, 3
STATIC_BROKER_CONFIG, DEFAULT_CONFIG = 4, 5
OP_SET, OP_DELETE, OP_APPEND, OP_SUBTRACT = 0, 1, 2, 3     # IncrementalAlterConfigs op types


@dataclass(frozen=True)
class TopicConfigDef:
    """One topic config, the one place that says everything about it: Kafka's name and type, its
    default (from the ``[log]`` section), its check, its documentation, the broker config it
    defaults to (Kafka's synonym, also what DescribeConfigs lists for the broker), and the
    ``LogSettings`` field that carries its value to the writer, the cleaner, the fetchers and the
    produce checks (None: it means nothing to them)."""
    name: str
    type: str                       # Kafka ConfigEntry type name: LONG, INT, STRING, BOOLEAN, LIST
    default: Callable[[LogConfig], str]
    check: Callable[[str], str | None]   # returns an error text or None
    doc: str
    broker: str | None = None       # the broker config it defaults to (Kafka's synonym)
    setting: str | None = None      # its LogSettings field

    def parse(self, value: str):
        """The typed value of a checked string, as LogSettings holds it."""
        if self.type in ("INT", "LONG", "SHORT"):
            return int(value)
        if self.type == "DOUBLE":
            return float(value)
        if self.type == "BOOLEAN":
            return value.strip().lower() == "true"
        return value


LONG_MAX = 2**63 - 1


def _int_check(lo: int, hi: int = LONG_MAX) -> Callable[[str], str | None]:
    def check(v: str) -> str | None:
        try:
            n = int(v)
        except ValueError:
            return f"value {v!r} is not a number"
        if not lo <= n <= hi:
            return f"value {n} out of range [{lo}, {hi}]"
        return None
    return check


def _ratio_check(v: str) -> str | None:
    try:
        x = float(v)
    except ValueError:
        return f"value {v!r} is not a number"
    if not 0.0 <= x <= 1.0:
        return f"value {x} out of range [0.0, 1.0]"
    return None


def _bool_check(v: str) -> str | None:
    # Kafka's ConfigDef parses a BOOLEAN string case-insensitively.
    return None if v.strip().lower() in ("true", "false") else f"value {v!r} is not true or false"


def _gzip_level_check(v: str) -> str | None:
    # KIP-390: Deflater's levels 1..9, or -1 for its default.
    err = _int_check(-1, 9)(v)
    if err is None and int(v) == 0:
        err = "value 0 is not in [1,...,9] or -1"
    return err


def _throttled_replicas_check(v: str) -> str | None:
    # Kafka's ThrottledReplicaListValidator: "*" or [partitionId]:[brokerId],...
    items = [p.strip() for p in v.split(",")]
    if "".join(items) == "*" or all(re.fullmatch(r"([0-9]+:[0-9]+)?", p) for p in items):
        return None
    return ("must be the literal '*' or a list of replicas in the following format: "
            "[partitionId]:[brokerId],[partitionId]:[brokerId],...")


CLEANUP_POLICIES = ("compact", "delete")


def cleanup_policy_set(value: str) -> frozenset[str]:
    """The policies a cleanup.policy value names (a Kafka LIST: comma-separated)."""
    return frozenset(p.strip() for p in value.split(",") if p.strip())


def _policy_check(v: str) -> str | None:
    items = [p.strip() for p in v.split(",")]
    bad = [p for p in items if p not in CLEANUP_POLICIES]
    if bad or not v.strip():
        return f"value {v!r}: every item must be one of {list(CLEANUP_POLICIES)}"
    return None


def _choice(*allowed: str) -> Callable[[str], str | None]:
    def check(v: str) -> str | None:
        return None if v in allowed else f"value {v!r} not in {list(allowed)}"
    return check


# Kafka's BrokerCompressionType names (KIP-390): "producer" keeps the producer's codec.
COMPRESSION_TYPES = ("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer")

# A tiered-storage config at a value that asks for no tiered storage is stored as Kafka stores it
# (Kafka accepts remote.storage.enable=false on a broker without it); any other value is refused.
TIERED_STORAGE_REFUSAL = ("Tiered Storage functionality is disabled in the broker. Topic cannot be "
                          "configured with remote log storage: the appliance does not offer tiered "
                          "storage (KIP-405)")


def _tiered(*allowed: str) -> Callable[[str], str | None]:
    def check(v: str) -> str | None:
        return None if v.strip().lower() in allowed else TIERED_STORAGE_REFUSAL
    return check


def _const(value: str) -> Callable[[LogConfig], str]:
    return lambda lg: value


def _flush_messages_default(lg: LogConfig) -> str:
    """[log.flush] as Kafka's log.flush.interval.messages: ``batch`` syncs every batch (1)."""
    return "1" if lg.flush.policy.group_commit else str(LONG_MAX)


_L = LONG_MAX
_D = TopicConfigDef
TOPIC_CONFIGS: dict[str, TopicConfigDef] = {d.name: d for d in [
    # -- the log's shape and retention ---------------------------------------------------------
    _D("retention.ms", "LONG", lambda lg: str(lg.retention_ms), _int_check(-1),
       "Delete segments whose newest record is older than this; -1 keeps forever.",
       "log.retention.ms", setting="retention_ms"),
    _D("retention.bytes", "LONG", lambda lg: str(lg.retention_bytes), _int_check(-(2**63)),
       "Delete the oldest segments beyond this many bytes per partition; negative: no limit.",
       "log.retention.bytes", setting="retention_bytes"),
    _D("segment.bytes", "INT", lambda lg: str(lg.segment_bytes), _int_check(14, 2**31 - 1),
       "Roll a new segment at this size.", "log.segment.bytes", setting="segment_bytes"),
    _D("segment.ms", "LONG", lambda lg: str(lg.segment_ms), _int_check(1),
       "Roll a new segment this long after the segment's first batch.", "log.roll.ms", setting="segment_ms"),
    _D("segment.jitter.ms", "LONG", _const("0"), _int_check(0),
       "A segment rolls up to this much earlier than segment.ms (a random share per segment), so "
       "that the partitions of a topic do not all roll at once.", "log.roll.jitter.ms",
       setting="segment_jitter_ms"),
    _D("segment.index.bytes", "INT", lambda lg: str(lg.segment_index_bytes),
       _int_check(4096, 2**31 - 1), "Size of a segment's offset and time index files.",
       "log.index.size.max.bytes", setting="segment_index_bytes"),
    _D("index.interval.bytes", "INT", lambda lg: str(lg.index_interval_bytes),
       _int_check(0, 2**31 - 1), "One index entry per this many log bytes.",
       "log.index.interval.bytes", setting="index_interval_bytes"),
    _D("file.delete.delay.ms", "LONG", lambda lg: str(lg.segment_delete_delay_ms), _int_check(0),
       "Segment files a compaction or retention replaced stay readable this long (renamed "
       "*.deleted) for the fetches answered from them.", "log.segment.delete.delay.ms",
       setting="file_delete_delay_ms"),
    _D("preallocate", "BOOLEAN", _const("false"), _bool_check,
       "true: the active segment's file gets all of segment.bytes (posix_fallocate) at its first "
       "append; false: 1 MiB ahead of the appends. Either way a full disk is answered, not "
       "faulted on, and a sealed segment is cut to its size.", "log.preallocate",
       setting="preallocate"),
    # -- durability -------------------------------------------------------------------------------
    _D("flush.messages", "LONG", _flush_messages_default, _int_check(1),
       "fdatasync once this many records are not yet synced; 1: every batch, and acks=-1 "
       "answers after the fdatasync covering it (the [log.flush] batch policy for this topic).",
       "log.flush.interval.messages", setting="flush_messages"),
    _D("flush.ms", "LONG", lambda lg: str(lg.flush.kafka_flush_interval_ms), _int_check(0),
       "fdatasync every this many milliseconds, acks=-1 answering after the next one (the "
       "[log.flush] interval policy for this topic); 0: every batch.", "log.flush.interval.ms",
       setting="flush_ms"),
    _D("min.insync.replicas", "INT", _const("1"), _int_check(1, 2**31 - 1),
       "One node is the one in-sync replica: above 1, acks=-1 produce is refused with "
       "NOT_ENOUGH_REPLICAS, as a one-broker Kafka refuses it.", "min.insync.replicas",
       setting="min_insync_replicas"),
    _D("unclean.leader.election.enable", "BOOLEAN", _const("false"), _bool_check,
       "Stored as Kafka stores it; one node never elects another leader.",
       "unclean.leader.election.enable"),
    _D("leader.replication.throttled.replicas", "LIST", _const(""), _throttled_replicas_check,
       "Stored as Kafka stores it; one node replicates nothing."),
    _D("follower.replication.throttled.replicas", "LIST", _const(""), _throttled_replicas_check,
       "Stored as Kafka stores it; one node replicates nothing."),
    # -- records ----------------------------------------------------------------------------------
    _D("max.message.bytes", "INT", lambda lg: str(lg.message_max_bytes),
       _int_check(0, 2**31 - 1), "Largest record batch accepted.", "message.max.bytes", setting="max_message_bytes"),
    _D("message.timestamp.type", "STRING", lambda lg: lg.message_timestamp_type,
       _choice("CreateTime", "LogAppendTime"), "CreateTime or LogAppendTime.",
       "log.message.timestamp.type", setting="message_timestamp_type"),
    _D("message.timestamp.before.max.ms", "LONG", lambda lg: str(lg.message_timestamp_before_max_ms),
       _int_check(0), "A CreateTime record older than now by more than this is refused with "
       "INVALID_TIMESTAMP (KIP-937).", "log.message.timestamp.before.max.ms",
       setting="message_timestamp_before_max_ms"),
    _D("message.timestamp.after.max.ms", "LONG", lambda lg: str(lg.message_timestamp_after_max_ms),
       _int_check(0), "A CreateTime record newer than now by more than this is refused with "
       "INVALID_TIMESTAMP (KIP-937).", "log.message.timestamp.after.max.ms",
       setting="message_timestamp_after_max_ms"),
    _D("compression.type", "STRING", _const("producer"), _choice(*COMPRESSION_TYPES),
       "producer: batches are stored as the producer compressed them; uncompressed, gzip, "
       "snappy, lz4 or zstd: a batch in another codec is recompressed into this one.",
       "compression.type", setting="compression_type"),
    _D("compression.gzip.level", "INT", _const("-1"), _gzip_level_check,
       "The gzip level of recompression (KIP-390): 1..9, or -1 for zlib's default.",
       "compression.gzip.level", setting="compression_gzip_level"),
    _D("compression.lz4.level", "INT", _const("9"), _int_check(1, 17),
       "The lz4 level of recompression (KIP-390).", "compression.lz4.level",
       setting="compression_lz4_level"),
    _D("compression.zstd.level", "INT", _const("3"), _int_check(-131072, 22),
       "The zstd level of recompression (KIP-390).", "compression.zstd.level",
       setting="compression_zstd_level"),
    # -- compaction -------------------------------------------------------------------------------
    _D("cleanup.policy", "LIST", lambda lg: lg.cleanup_policy, _policy_check,
       "delete: segments go by retention.ms and retention.bytes; compact: the log "
       "cleaner keeps the last record of every key (no retention); both: compact,delete.",
       "log.cleanup.policy", setting="cleanup_policy"),
    _D("min.cleanable.dirty.ratio", "DOUBLE",
       lambda lg: str(lg.cleaner.min_cleanable_ratio), _ratio_check,
       "Clean once the not yet cleaned bytes are more than this share of the log.",
       "log.cleaner.min.cleanable.ratio", setting="min_cleanable_ratio"),
    _D("min.compaction.lag.ms", "LONG", lambda lg: str(lg.cleaner.min_compaction_lag_ms),
       _int_check(0), "A record stays uncompacted at least this long.",
       "log.cleaner.min.compaction.lag.ms", setting="min_compaction_lag_ms"),
    _D("max.compaction.lag.ms", "LONG", lambda lg: str(lg.cleaner.max_compaction_lag_ms),
       _int_check(1), "A record is compacted at the latest this long after it was written.",
       "log.cleaner.max.compaction.lag.ms", setting="max_compaction_lag_ms"),
    _D("delete.retention.ms", "LONG", lambda lg: str(lg.cleaner.delete_retention_ms),
       _int_check(0), "Tombstones and transaction markers stay this long once cleaned.",
       "log.cleaner.delete.retention.ms", setting="delete_retention_ms"),
    # -- tiered storage (KIP-405): not offered ----------------------------------------------------
    _D("remote.storage.enable", "BOOLEAN", _const("false"), _tiered("false"),
       "Tiered storage is not offered: only false."),
    _D("local.retention.ms", "LONG", _const("-2"), _tiered("-2"),
       "Tiered storage is not offered: only -2 (the local log is the whole log).", "log.local.retention.ms"),
    _D("local.retention.bytes", "LONG", _const("-2"), _tiered("-2"),
       "Tiered storage is not offered: only -2 (the local log is the whole log).", "log.local.retention.bytes"),
    _D("remote.log.copy.disable", "BOOLEAN", _const("false"), _tiered("false"),
       "Tiered storage is not offered: only false."),
    _D("remote.log.delete.on.disable", "BOOLEAN", _const("false"), _tiered("false"),
       "Tiered storage is not offered: only false."),
]}
del _D

class LogSettings(msgspec.Struct, frozen=True, kw_only=True):
    """A topic's effective settings (Kafka's LogConfig values): ``TOPIC_CONFIGS``' fields with the
    ``[log]`` defaults under the topic's overrides (``from_config``), what its writer applies to
    its log, its cleaner compacts by, the fetchers bound inflation with and produce validates
    against. The defaults below are Kafka's, for logs built without a configuration (tests, the
    coordinator's compacted logs)."""

    segment_bytes: int = 1073741824
    segment_ms: int = 604800000
    retention_bytes: int = -1
    retention_ms: int = 604800000
    index_interval_bytes: int = 4096
    segment_index_bytes: int = 10485760
    message_timestamp_type: Literal["CreateTime", "LogAppendTime"] = "CreateTime"
    max_message_bytes: int = 1048588
    decompressed_batch_max_factor: int = 64          # broker-wide ([log]), not a topic config
    cleanup_policy: str = "delete"
    min_cleanable_ratio: float = 0.5
    min_compaction_lag_ms: int = 0
    max_compaction_lag_ms: int = 2**63 - 1
    delete_retention_ms: int = 86400000
    segment_jitter_ms: int = 0
    file_delete_delay_ms: int = 60000
    flush_messages: int = 2**63 - 1
    flush_ms: int = 2**63 - 1
    min_insync_replicas: int = 1
    message_timestamp_before_max_ms: int = 2**63 - 1
    message_timestamp_after_max_ms: int = 2**63 - 1
    compression_type: str = "producer"
    compression_gzip_level: int = -1
    compression_lz4_level: int = 9
    compression_zstd_level: int = 3
    preallocate: bool = False

    @classmethod
    def from_config(cls, log_cfg: LogConfig, overrides: Mapping[str, str] | None = None) -> "LogSettings":
        """The ``[log]`` defaults overlaid with a topic's configs (Kafka names, string values,
        already checked: ``Catalog.overrides``). Names that carry no setting are ignored here."""
        overrides = overrides or {}
        values: dict[str, object] = {"decompressed_batch_max_factor": log_cfg.decompressed_batch_max_factor}
        for d in _SETTINGS:
            raw = overrides.get(d.name)
            values[d.setting] = d.parse(d.default(log_cfg) if raw is None else raw)
        return msgspec.convert(values, cls)

    @property
    def compact(self) -> bool:
        """cleanup.policy has "compact": the log cleaner keeps the last record of each key."""
        return "compact" in cleanup_policy_set(self.cleanup_policy)

    @property
    def delete(self) -> bool:
        """cleanup.policy has "delete": retention.ms and retention.bytes delete old segments
        (Kafka's LogConfig.delete; a "compact" topic keeps every segment)."""
        return "delete" in cleanup_policy_set(self.cleanup_policy)

    @property
    def roll_ms(self) -> int:
        """Kafka's LogConfig.maxSegmentMs: a compacted topic also rolls by max.compaction.lag.ms,
        so that a record does not wait in the active segment, which is never cleaned, for longer
        than that."""
        if self.compact and self.max_compaction_lag_ms > 0:
            return min(self.max_compaction_lag_ms, self.segment_ms)
        return self.segment_ms

    @property
    def max_decompressed_bytes(self) -> int:
        """What one compressed batch may inflate to (produce's bound, recovery's, a fetcher's)."""
        return self.max_message_bytes * self.decompressed_batch_max_factor

    @property
    def log_append_time(self) -> bool:
        return self.message_timestamp_type == "LogAppendTime"


_SETTINGS = [d for d in TOPIC_CONFIGS.values() if d.setting is not None]
assert {d.setting for d in _SETTINGS} == set(LogSettings.__struct_fields__) - {"decompressed_batch_max_factor"}


# The broker configs that may be changed live (Kafka's dynamic broker configs that the appliance
# can apply: the log defaults every partition writer re-reads), by broker name -> topic name.
DYNAMIC_BROKER_CONFIGS: dict[str, str] = {d.broker: d.name for d in TOPIC_CONFIGS.values() if d.broker}


def validate_topic_configs(configs: dict[str, str | None]) -> dict[str, str]:
    """Check CreateTopics configs; raise KafkaError(INVALID_CONFIG) naming the first bad one."""
    out: dict[str, str] = {}
    for name, value in configs.items():
        d = TOPIC_CONFIGS.get(name)
        if d is None:
            raise KafkaError(ErrorCode.invalid_config, f"Unknown topic config name: {name}")
        if value is None:
            continue
        _check_value(d, name, value, ErrorCode.invalid_config)
        out[name] = value
    _check_lags(out.get("min.compaction.lag.ms"), out.get("max.compaction.lag.ms"))
    return out


def _check_lags(lo: str | None, hi: str | None) -> None:
    if lo is not None and hi is not None and int(lo) > int(hi):
        # Kafka's LogConfig.validateValues: the same conflict, as INVALID_CONFIG.
        raise KafkaError(ErrorCode.invalid_config,
                         f"conflict topic config setting min.compaction.lag.ms ({lo}) > "
                         f"max.compaction.lag.ms ({hi})")


def _check_value(d: TopicConfigDef, name: str, value: str, code: ErrorCode) -> None:
    err = d.check(value)
    if err:
        raise KafkaError(code, f"Invalid value {value} for configuration {name}: {err}")


def dynamic_log_defaults(catalog) -> dict[str, str]:
    """The dynamic broker configs of a catalog under their topic names (this node's over the
    cluster-wide default)."""
    out: dict[str, str] = {}
    for layer in (catalog.broker_default, catalog.broker_node):
        for name, value in layer.items():
            topic_name = DYNAMIC_BROKER_CONFIGS.get(name)
            if topic_name is not None:
                out[topic_name] = value
    return out


# -- DescribeConfigs --------------------------------------------------------------------------

_BUILTIN = Config()


def describe_topic_configs(cfg: Config, catalog, topic_configs: dict[str, str]
                           ) -> dict[str, tuple[str, int, list[tuple[str, str, int]]]]:
    """name -> (value, source, synonyms) of every known topic config of a topic whose own
    overrides are ``topic_configs``. Synonyms are (name, value, source) in precedence order,
    the topic's own first, then the broker config it defaults to at each layer, as Kafka lists
    them; the value and source are the first synonym's."""
    out = {}
    for name, d in TOPIC_CONFIGS.items():
        syn: list[tuple[str, str, int]] = []
        if name in topic_configs:
            syn.append((name, topic_configs[name], DYNAMIC_TOPIC_CONFIG))
        b = d.broker
        if b is not None:
            if b in catalog.broker_node:
                syn.append((b, catalog.broker_node[b], DYNAMIC_BROKER_CONFIG))
            if b in catalog.broker_default:
                syn.append((b, catalog.broker_default[b], DYNAMIC_DEFAULT_BROKER_CONFIG))
            static, builtin = d.default(cfg.log), d.default(_BUILTIN.log)
            if static != builtin:
                syn.append((b, static, STATIC_BROKER_CONFIG))
            syn.append((b, builtin, DEFAULT_CONFIG))
        elif not syn:
            # No broker config behind it: Kafka's ConfigHelper lists no synonym for the default.
            out[name] = (d.default(cfg.log), DEFAULT_CONFIG, syn)
            continue
        out[name] = (syn[0][1], syn[0][2], syn)
    return out


# -- AlterConfigs / IncrementalAlterConfigs ----------------------------------------------------

def _list_op(op: int, current: str, value: str) -> str:
    have = [v for v in current.split(",") if v] if current else []
    items = [v.strip() for v in value.split(",") if v.strip()]
    if op == OP_APPEND:
        have += [v for v in items if v not in have]
    else:
        have = [v for v in have if v not in items]
    return ",".join(have)


def _apply_ops(current: dict[str, str], ops, incremental: bool, known: Callable[[str], bool],
               current_value: Callable[[str], str], is_list: Callable[[str], bool],
               unknown: Callable[[list[str]], KafkaError]) -> dict[str, str]:
    names = [name for _, name, _ in ops]
    if len(set(names)) != len(names):
        raise KafkaError(ErrorCode.invalid_request, "Error due to duplicate config keys")
    nulls = [name for op, name, value in ops if value is None and (op != OP_DELETE or not incremental)]
    if nulls:
        raise KafkaError(ErrorCode.invalid_request, f"Null value not supported for : {', '.join(nulls)}")
    bad = [name for op, name, _ in ops if not known(name) and (op != OP_DELETE or not incremental)]
    if bad:
        raise unknown(bad)
    new = dict(current) if incremental else {}
    for op, name, value in ops:
        if op == OP_SET:
            new[name] = value
        elif op == OP_DELETE:
            new.pop(name, None)
        elif op in (OP_APPEND, OP_SUBTRACT):
            if not is_list(name):
                verb = "append" if op == OP_APPEND else "subtract"
                raise KafkaError(ErrorCode.invalid_config,
                                 f"Config value {verb} is not allowed for config key: {name}")
            new[name] = _list_op(op, new.get(name, current_value(name)), value)
        else:
            raise KafkaError(ErrorCode.invalid_request, f"Unknown operations type {op}")
    return new


# The shared op semantics, for the group configs too (appliance.group_config).
apply_config_ops = _apply_ops


def alter_topic_configs(cfg: Config, catalog, topic: str, ops, incremental: bool) -> dict[str, str]:
    """The topic's new override set after ``ops`` ((op, name, value); every op SET and the whole
    set replaced when not ``incremental``), checked as Kafka's LogConfig.validate checks it:
    INVALID_CONFIG for an unknown name or a bad value."""
    info = catalog.topics[topic]

    def effective(name: str) -> str:
        return describe_topic_configs(cfg, catalog, info.configs)[name][0]

    new = _apply_ops(info.configs, ops, incremental, lambda n: n in TOPIC_CONFIGS, effective,
                     lambda n: TOPIC_CONFIGS[n].type == "LIST",
                     lambda bad: KafkaError(ErrorCode.invalid_config, f"Unknown topic config name: {bad[0]}"))
    for name, value in new.items():
        _check_value(TOPIC_CONFIGS[name], name, value, ErrorCode.invalid_config)
    if "min.compaction.lag.ms" in new or "max.compaction.lag.ms" in new:
        # Checked against what the topic would get from the broker layers where it sets only one.
        inherited = describe_topic_configs(cfg, catalog, {})
        _check_lags(new.get("min.compaction.lag.ms", inherited["min.compaction.lag.ms"][0]),
                    new.get("max.compaction.lag.ms", inherited["max.compaction.lag.ms"][0]))
    return new


def alter_broker_configs(current: dict[str, str], ops, incremental: bool) -> dict[str, str]:
    """A broker resource's new dynamic config set: the log defaults the writers re-read (applied
    live), and the Kafka dynamic names the appliance only stores and reports
    (``STORED_DYNAMIC_BROKER_CONFIGS``). Any other name is refused for the whole resource with
    Kafka's INVALID_REQUEST "Cannot update these configs dynamically" (a bad value too, as
    Kafka's broker-side validation answers it)."""
    def unknown(bad: list[str]) -> KafkaError:
        return KafkaError(ErrorCode.invalid_request,
                          f"Cannot update these configs dynamically: Set({', '.join(bad)}) "
                          "(the appliance changes the log defaults live; the rest are set in its "
                          "TOML file)")

    def broker_type(n: str) -> str:
        topic_name = DYNAMIC_BROKER_CONFIGS.get(n)
        return TOPIC_CONFIGS[topic_name].type if topic_name else STORED_DYNAMIC_BROKER_CONFIGS[n]

    def default(n: str) -> str:
        # Kafka's ConfigAdminManager: a list op on a broker config starts from the resource's
        # own value, else the config's built-in default (log.cleanup.policy APPEND compact ->
        # "delete,compact").
        topic_name = DYNAMIC_BROKER_CONFIGS.get(n)
        return TOPIC_CONFIGS[topic_name].default(_BUILTIN.log) if topic_name else ""

    new = _apply_ops(current, ops, incremental,
                     lambda n: n in DYNAMIC_BROKER_CONFIGS or n in STORED_DYNAMIC_BROKER_CONFIGS,
                     default, lambda n: broker_type(n) == "LIST", unknown)
    for name, value in new.items():
        if name in DYNAMIC_BROKER_CONFIGS:
            _check_value(TOPIC_CONFIGS[DYNAMIC_BROKER_CONFIGS[name]], name, value, ErrorCode.invalid_request)
        else:
            err = check_typed(STORED_DYNAMIC_BROKER_CONFIGS[name], value)
            if err:
                raise KafkaError(ErrorCode.invalid_request,
                                 f"Invalid value {value} for configuration {name}: {err}")
    return new
