"""The appliance's configuration: one typed tree decoded from one TOML file.

Owns: nothing at run time. Every process receives the decoded tree from the supervisor (it is
decoded once, before any fork, so all workers see the same values).

Sources, later ones winning:
  1. the defaults below (``config.toml`` at the top of the repository repeats them, commented);
  2. the TOML file given with ``--config``;
  3. environment variables ``APPLIANCE_<SECTION>__<KEY>`` (double underscore between the section
     and the key, e.g. ``APPLIANCE_SERVER__LISTEN=0.0.0.0:9092``); the value is read as a TOML value
     when it parses as one (numbers, booleans, quoted strings) and as a bare string otherwise;
  4. command-line flags (``--listen``, ``--data-dir``).

Unknown keys and values of the wrong type or out of range are rejected with a message that names
the key, e.g. ``config: log.segment_bytes: Expected `int` >= 1048576, got 10``, and the
environment variable when the value came from one (``... (from environment
APPLIANCE_LOG__SEGMENT_BYTES)``). What only ``appliance run`` can find out (the listen address is in
use or does not resolve, the runtime dir cannot be made) is the supervisor's to report, with its own
exit status (``appliance.runtime``).
"""

from __future__ import annotations

import enum
import os
import tomllib
import typing
from typing import Annotated, Any, Literal, Mapping

import msgspec

from .listeners import (Listener, advertised_host, parse_listeners,
                        parse_protocol_map)
from .config_checks import ConfigError, check_consistency, parse_hostport  # noqa: F401 (re-exported)

__all__ = [
    "Config",
    "ConfigError",
    "FlushConfig",
    "FlushPolicy",
    "ServerConfig",
    "LogConfig",
    "TopicsConfig",
    "LogCleanerConfig",
    "ShmConfig",
    "SupervisorConfig",
    "TransactionsConfig",
    "AuthorizerConfig",
    "TlsConfig",
    "SaslConfig",
    "MetricsConfig",
    "check_consistency",
    "load",
    "parse_hostport",
]

ENV_PREFIX = "APPLIANCE_"
DEFAULT_LISTEN = "127.0.0.1:9092"   # the listener when neither listen nor listeners is set

Positive = Annotated[int, msgspec.Meta(ge=1)]
NonNegative = Annotated[int, msgspec.Meta(ge=0)]
Port = Annotated[int, msgspec.Meta(ge=0, le=65535)]
# Kafka's node.id is an int32 on the wire (Metadata, FindCoordinator, DescribeCluster).
Int32NonNegative = Annotated[int, msgspec.Meta(ge=0, le=2**31 - 1)]
# Every frontend and fetcher is a process with rings to every other; more than this is a typo,
# not a machine (and 0 = one per core is capped at it too).
MAX_WORKERS_PER_ROLE = 256
WorkerCount = Annotated[int, msgspec.Meta(ge=0, le=MAX_WORKERS_PER_ROLE)]


class _Section(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    pass


class ServerConfig(_Section):
    # host:port of one PLAINTEXT listener: the shorthand for listeners = "PLAINTEXT://host:port".
    # Set this or listeners, not both; neither = PLAINTEXT://127.0.0.1:9092.
    listen: str = ""
    # Kafka's listeners: "PROTOCOL://host:port" (or NAME://host:port with the protocol map),
    # comma-separated; protocols PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL.
    listeners: str = ""
    # host:port written into Metadata/FindCoordinator answers for the one listener of `listen`;
    # empty = same as listen.
    advertised_listener: str = ""
    # Kafka's advertised.listeners, same syntax as listeners: what each listener tells clients to
    # connect to (a listener not named here advertises its own address).
    advertised_listeners: str = ""
    # Kafka's listener.security.protocol.map ("CLIENT:SASL_SSL,INTERNAL:PLAINTEXT"), for
    # listener names that are not protocol names.
    listener_security_protocol_map: str = ""
    # This broker's node id (Kafka's node.id).
    node_id: Int32NonNegative = 1
    # Where partitions, the transaction log and the group log live.
    data_dir: str = "./data"
    # Bytes of the data dir's file system set aside (in <data_dir>/.reserve) while it has room,
    # and given back when a start finds it full, so that recovery and DeleteTopics can still
    # write there; 0 = none.
    disk_reserve_bytes: NonNegative = 67108864
    # Where shared-memory files (rings, state pages, doorbells) live; empty = /dev/shm/appliance-<pid>
    # (or the system temp dir when /dev/shm is missing). Removed on exit.
    runtime_dir: str = ""
    # Frontend processes (own client connections); 0 = one per CPU core.
    frontends: WorkerCount = 0
    # Fetch worker processes.
    fetchers: Annotated[int, msgspec.Meta(ge=1, le=MAX_WORKERS_PER_ROLE)] = 1
    # Most bytes a Fetch is answered with, whatever the client's max_bytes asks (Kafka's broker
    # fetch.max.bytes: the answer is min(request's max_bytes, this); a partition's first batch
    # still goes out whole, KIP-74).
    fetch_max_bytes: Annotated[int, msgspec.Meta(ge=1024, le=2**31 - 1)] = 57671680
    # Incremental fetch sessions (KIP-227) kept, over all frontends (Kafka's
    # max.incremental.fetch.session.cache.slots); 0 = none (clients send full fetches).
    max_incremental_fetch_session_cache_slots: NonNegative = 1000
    # Largest request frame accepted (Kafka's socket.request.max.bytes); bigger: connection closed.
    socket_request_max_bytes: Annotated[int, msgspec.Meta(ge=1024)] = 104857600
    # Idle client connections are closed after this long (Kafka's connections.max.idle.ms).
    connections_max_idle_ms: Positive = 600000
    # A failed authentication is answered, and its connection closed, this long after it failed
    # (Kafka's connection.failed.authentication.delay.ms): slows down password guessing.
    connection_failed_authentication_delay_ms: NonNegative = 100
    # Most client connections from one IP address at a time, over all frontends (Kafka's
    # max.connections.per.ip); a new connection beyond it is closed at once. 0 is allowed only
    # with overrides (then only the overridden addresses may connect).
    max_connections_per_ip: Int32NonNegative = 2**31 - 1
    # Per-address exceptions to max_connections_per_ip: IP address or host name -> limit
    # (Kafka's max.connections.per.ip.overrides).
    max_connections_per_ip_overrides: dict[str, Int32NonNegative] = msgspec.field(default_factory=dict)
    # Most client connections at a time, over all frontends (Kafka's max.connections): at the
    # limit the frontends stop accepting until one closes (new connections wait in the listen
    # backlog), as Kafka's acceptor waits for a slot.
    max_connections: Int32NonNegative = 2**31 - 1

    @property
    def limits_connections_per_ip(self) -> bool:
        """Whether connections are counted per IP address (a limit or an override is set)."""
        return self.max_connections_per_ip < 2**31 - 1 or bool(self.max_connections_per_ip_overrides)
    # Default request timeout for internal round trips (frontend -> writer/fetcher/coordinator).
    internal_request_timeout_ms: Positive = 30000


class FlushPolicy(enum.StrEnum):
    """``[log.flush] policy`` (its values are explained at ``FlushConfig.policy``). A str enum:
    it decodes from, equals and prints as its TOML value. Code asks it the questions below rather
    than comparing values. The coordinator's logs fdatasync every write before answering when
    ``ack_waits_for_sync``.
    """

    BATCH = "batch"
    INTERVAL = "interval"
    OS = "os"

    @property
    def ack_waits_for_sync(self) -> bool:
        """An acks=-1 answer (and every coordinator-log write) waits for an fdatasync covering
        it."""
        return self is not FlushPolicy.OS

    @property
    def group_commit(self) -> bool:
        """A partition writer starts an fdatasync as soon as an answer waits for one."""
        return self is FlushPolicy.BATCH

    @property
    def periodic(self) -> bool:
        """A partition writer starts an fdatasync every ``interval_ms``."""
        return self is FlushPolicy.INTERVAL


class FlushConfig(_Section):
    # "os" (Kafka's default): no explicit fsync; acks=-1 answers once the batch is in the page
    #   cache (kill -9 of any process loses nothing acknowledged; a power loss can lose what the
    #   kernel had not written back yet, as with single-replica Kafka).
    # "batch": group commit: acks=-1 answers after an fdatasync covering the batch; the writer
    #   keeps appending while a flush runs, the next flush covers everything appended meanwhile.
    # "interval": fdatasync every interval_ms; acks=-1 answers after the next one.
    policy: FlushPolicy = FlushPolicy.OS
    interval_ms: Positive = 1000

    @property
    def kafka_flush_interval_ms(self) -> int:
        """Kafka's ``log.flush.interval.ms`` for this policy, as DescribeConfigs reports it:
        the interval, 0 for a flush after every batch, Long.MAX_VALUE (Kafka's effective default:
        never, the OS writes back) for "os"."""
        if self.policy.periodic:
            return self.interval_ms
        return 0 if self.policy.group_commit else 2**63 - 1


# Kafka's log.cleaner.max.compaction.lag.ms default: Long.MAX_VALUE (never forces a cleaning).
NEVER = 2**63 - 1


class LogCleanerConfig(_Section):
    # Run the log cleaner: compaction of topics whose cleanup.policy has "compact"
    # (log.cleaner.enable). Off, compacted topics only grow (their retention still applies to
    # "compact,delete").
    enable: bool = True
    # Cleaner processes (log.cleaner.threads); each partition is cleaned by one of them.
    processes: Annotated[int, msgspec.Meta(ge=1, le=16)] = 1
    # Bytes per second the cleaners read and write in all (log.cleaner.io.max.bytes.per.second);
    # 0 = no limit.
    io_max_bytes_per_second: NonNegative = 0
    # Memory for the key -> offset maps of all cleaner processes, in bytes
    # (log.cleaner.dedupe.buffer.size): bounds how many distinct keys one cleaning round maps.
    dedupe_buffer_size: Annotated[int, msgspec.Meta(ge=1048576)] = 134217728
    # How long a cleaner with nothing to clean sleeps before it looks again (log.cleaner.backoff.ms).
    backoff_ms: Positive = 15000
    # Topic defaults: a partition is cleaned once its dirty (not yet cleaned) bytes are more than
    # this share of its log (log.cleaner.min.cleanable.ratio, topic min.cleanable.dirty.ratio).
    min_cleanable_ratio: Annotated[float, msgspec.Meta(ge=0.0, le=1.0)] = 0.5
    # A record stays uncompacted at least this long (log.cleaner.min.compaction.lag.ms).
    min_compaction_lag_ms: NonNegative = 0
    # A record is compacted at the latest this long after it was written, whatever the dirty
    # ratio (log.cleaner.max.compaction.lag.ms); the default never forces a cleaning.
    max_compaction_lag_ms: Positive = NEVER
    # Tombstones (null values) and transaction markers stay this long after the cleaner first
    # passed them (log.cleaner.delete.retention.ms, topic delete.retention.ms).
    delete_retention_ms: NonNegative = 86400000


class LogScrubConfig(_Section):
    # Bit rot (issue 34). Bytes per second the cleaner processes read, in all, to check the CRC
    # of every batch of every sealed segment, one pass after another, at idle priority; a batch
    # that fails is logged with its file, position and offset and counted
    # (appliance_log_scrub_corrupt_batches_total). 0 = no scrub.
    bytes_per_second: NonNegative = 8388608
    # Pause between two passes over every partition, in ms.
    pass_interval_ms: NonNegative = 3600000
    # Fetchers check the CRC of every batch they hand out (a range that passed is trusted 30 s): a
    # batch that fails is never served, its partition answers KAFKA_STORAGE_ERROR from there.
    verify_fetches: bool = True


class LogConfig(_Section):
    # Roll a segment at this size (Kafka's log.segment.bytes).
    segment_bytes: Annotated[int, msgspec.Meta(ge=14, le=2**31 - 1)] = 1073741824
    # Roll a segment this long after its first batch (log.roll.ms).
    segment_ms: Positive = 604800000
    # Delete old segments past this many bytes per partition; -1 = no size limit (log.retention.bytes).
    retention_bytes: Annotated[int, msgspec.Meta(ge=-1)] = -1
    # Delete segments whose newest record is older than this; -1 = keep forever (log.retention.ms).
    retention_ms: Annotated[int, msgspec.Meta(ge=-1)] = 604800000
    # How often writers check retention and time-based roll (log.retention.check.interval.ms).
    retention_check_interval_ms: Positive = 300000
    # One offset/time index entry per this many log bytes (log.index.interval.bytes).
    index_interval_bytes: NonNegative = 4096
    # Maximum size of an offset or time index file (log.index.size.max.bytes).
    segment_index_bytes: Annotated[int, msgspec.Meta(ge=4096)] = 10485760
    # Largest record batch accepted (message.max.bytes).
    message_max_bytes: Annotated[int, msgspec.Meta(ge=1024)] = 1048588
    # "CreateTime" keeps the producer's timestamps; "LogAppendTime" stamps the broker's clock.
    message_timestamp_type: Literal["CreateTime", "LogAppendTime"] = "CreateTime"
    # A CreateTime record older / newer than now by more than this is refused with
    # INVALID_TIMESTAMP (log.message.timestamp.before.max.ms / after.max.ms; Kafka's default:
    # no limit). Defaults of the topic configs message.timestamp.before/after.max.ms.
    message_timestamp_before_max_ms: NonNegative = (1 << 63) - 1
    message_timestamp_after_max_ms: NonNegative = (1 << 63) - 1
    # A compressed batch may decompress to at most this many times message_max_bytes (topic
    # max.message.bytes); beyond it produce refuses it with INVALID_RECORD, recovery truncates
    # there. Bounds the memory one small batch can make a frontend, writer or fetcher inflate.
    decompressed_batch_max_factor: Annotated[int, msgspec.Meta(ge=1, le=4096)] = 64
    # "delete" removes old segments by retention_ms / retention_bytes; "compact" keeps the last
    # record of every key (the log cleaner) and no retention; "compact,delete" does both
    # (log.cleanup.policy, topic cleanup.policy).
    cleanup_policy: Literal["delete", "compact", "compact,delete", "delete,compact"] = "delete"
    # Segment files a cleaner swap replaced stay readable (renamed *.deleted) this long, for the
    # fetches that were answered from them (log.segment.delete.delay.ms; the default of the
    # topic config file.delete.delay.ms).
    segment_delete_delay_ms: NonNegative = 60000
    flush: FlushConfig = msgspec.field(default_factory=FlushConfig)
    cleaner: LogCleanerConfig = msgspec.field(default_factory=LogCleanerConfig)
    scrub: LogScrubConfig = msgspec.field(default_factory=LogScrubConfig)


class TopicsConfig(_Section):
    # Create a topic on first Metadata or Produce reference to it (auto.create.topics.enable).
    auto_create: bool = True
    # Partitions of an auto-created topic, and of CreateTopics with num_partitions = -1.
    default_partitions: Positive = 1
    # Refuse to create more than this many partitions in all.
    max_partitions: Positive = 100000
    # The writer-process budget (docs/architecture.md, "Writer processes and their rings"):
    # under it, each partition's writer runs in a process of its own; past it, a new partition
    # joins the writer process that carries the fewest. 0: four per core, at least four. Each
    # partition still has exactly one writer. Applies to new partitions; every start lays the
    # catalog out again.
    writer_processes: NonNegative = 0
    # Above 1: explicit writer hosts, every writer process carrying up to this many partitions
    # (the budget then does not apply); 1 lets the budget decide.
    partitions_per_writer: Annotated[int, msgspec.Meta(ge=1, le=100000)] = 1


class ShmConfig(_Section):
    # Capacity of each frontend -> writer produce ring; must hold two of the largest batch.
    produce_ring_bytes: Annotated[int, msgspec.Meta(ge=65536)] = 8388608
    # Capacity of each small ring (control, coordinator requests, fetch requests and replies).
    small_ring_bytes: Annotated[int, msgspec.Meta(ge=4096)] = 1048576
    # Capacity of each writer process's rings other than the produce rings (acks to each
    # frontend, markers and verifications with the coordinator, its cleaner's rounds): they carry
    # short messages, and every writer process has 2 + frontends of them, all memory from its
    # creation (the name is from when rings were per partition).
    partition_ring_bytes: Annotated[int, msgspec.Meta(ge=4096)] = 262144


class SupervisorConfig(_Section):
    # A worker whose heartbeat is older than this is killed with SIGKILL and restarted.
    heartbeat_timeout_ms: Positive = 30000
    # Restart backoff doubles from initial to max for a worker that keeps dying.
    restart_backoff_initial_ms: NonNegative = 100
    restart_backoff_max_ms: NonNegative = 10000
    # More than crash_loop_restarts restarts of one worker within crash_loop_window_ms is a crash
    # loop: the supervisor logs it, stops everything and exits with status 4.
    crash_loop_restarts: Positive = 5
    crash_loop_window_ms: Positive = 60000
    # On SIGTERM, workers get this long to drain before SIGKILL.
    shutdown_timeout_ms: Positive = 30000


class TransactionsConfig(_Section):
    # Upper bound for a producer's transaction.timeout.ms (transaction.max.timeout.ms).
    max_timeout_ms: Positive = 900000
    # An idle transactional id is forgotten after this long (transactional.id.expiration.ms).
    id_expiration_ms: Positive = 604800000
    # How often timed-out transactions are looked for (KIP-447 lowered it to 10 s).
    abort_timed_out_interval_ms: Positive = 10000
    # Producer state of an idle producer id is dropped after this long (producer.id.expiration.ms).
    producer_id_expiration_ms: Positive = 86400000
    # KIP-939: allow InitProducerId with Enable2Pc.
    two_phase_commit_enable: bool = False
    # KIP-890 part 1: before the first transactional batch of a transaction is appended to a
    # partition, check with the coordinator that the partition is in the transaction
    # (transaction.partition.verification.enable).
    partition_verification_enable: bool = True
    # KIP-890: while the previous transaction's markers are still being written, an add of a
    # partition meets CONCURRENT_TRANSACTIONS. The broker asks again every
    # add_partitions_retry_backoff_ms for up to add_partitions_retry_backoff_max_ms before it
    # passes that on (add.partitions.to.txn.retry.backoff.ms and .max.ms): a partition writer for
    # Produce v12's implicit add, the coordinator for AddPartitionsToTxn and AddOffsetsToTxn
    # (there it waits for the markers themselves; 0 answers at once).
    add_partitions_retry_backoff_ms: Positive = 20
    add_partitions_retry_backoff_max_ms: NonNegative = 100
    # KIP-890 part 2: the finalized feature transaction.version advertised in ApiVersions. 2 lets
    # clients that know it (Java 4.x) bump the epoch on every commit and add partitions implicitly;
    # 1 keeps every client on the KIP-98 protocol.
    transaction_version: Annotated[int, msgspec.Meta(ge=1, le=2)] = 2


class GroupsConfig(_Section):
    # Bounds for a member's session.timeout.ms (group.min/max.session.timeout.ms);
    # a JoinGroup outside them gets INVALID_SESSION_TIMEOUT.
    min_session_timeout_ms: Positive = 6000
    max_session_timeout_ms: Positive = 1800000
    # A new group waits this long for more members before its first rebalance completes
    # (group.initial.rebalance.delay.ms, KIP-134).
    initial_rebalance_delay_ms: NonNegative = 3000
    # Most members one group may have (group.max.size).
    max_size: Positive = 2147483647
    # Offsets of an empty group are dropped this long after it became empty
    # (offsets.retention.minutes, KIP-211), checked every offsets_retention_check_interval_ms.
    offsets_retention_ms: Positive = 604800000
    offsets_retention_check_interval_ms: Positive = 600000
    # Longest metadata string an offset commit may carry (offset.metadata.max.bytes).
    offset_metadata_max_bytes: Positive = 4096
    # KIP-848 consumer groups (group.protocol=consumer): the heartbeat interval the broker tells
    # members (group.consumer.heartbeat.interval.ms), the session timeout it enforces
    # (group.consumer.session.timeout.ms), the server-side assignors, the first the default
    # (group.consumer.assignors: uniform, range), and the most members one group may have
    # (group.consumer.max.size). Reloadable.
    consumer_heartbeat_interval_ms: Positive = 5000
    consumer_session_timeout_ms: Positive = 45000
    consumer_assignors: list[Literal["uniform", "range"]] = msgspec.field(
        default_factory=lambda: ["uniform", "range"])
    consumer_max_size: Positive = 2147483647
    # KIP-848 online migration of a non-empty group between the classic and the consumer
    # protocols (group.consumer.migration.policy): bidirectional (Kafka 4's default), upgrade
    # (classic -> consumer only), downgrade (consumer -> classic only) or disabled. Empty groups
    # always convert. Reloadable.
    consumer_migration_policy: Literal["bidirectional", "upgrade", "downgrade",
                                       "disabled"] = "bidirectional"
    # KIP-932 share groups: the heartbeat interval told to members
    # (group.share.heartbeat.interval.ms), the session timeout enforced
    # (group.share.session.timeout.ms), how long a delivered record stays locked to its consumer
    # (group.share.record.lock.duration.ms), deliveries before a record is archived
    # (group.share.delivery.count.limit), where a new share group starts
    # (share.auto.offset.reset), the most members of one group (group.share.max.size) and the
    # most share sessions (group.share.max.share.sessions).
    share_heartbeat_interval_ms: Positive = 5000
    share_session_timeout_ms: Positive = 45000
    share_record_lock_duration_ms: Positive = 30000
    # The bounds of a group's share.record.lock.duration.ms (group.share.min/max.record.lock.
    # duration.ms, Kafka's 15 s and 60 s; Kafka's test clusters lower the minimum to 1 s).
    share_min_record_lock_duration_ms: Positive = 15000
    share_max_record_lock_duration_ms: Positive = 60000
    share_delivery_count_limit: Positive = 5
    share_auto_offset_reset: Literal["latest", "earliest"] = "latest"
    share_max_size: Positive = 200
    share_max_share_sessions: Positive = 2000
    # The most records in flight (acquired, or acknowledged above the start offset) per share
    # partition (group.share.partition.max.record.locks, Kafka's range 100-10000): an
    # acquisition stops there, the rest of a log batch it ended inside is still taken. A
    # producer's batches larger than it are read by one member at a time. Reloadable.
    share_partition_max_record_locks: Annotated[int, msgspec.Meta(ge=100, le=10000)] = 2000


class AuthorizerConfig(_Section):
    # Check every request against the ACLs (Kafka's authorizer.class.name = StandardAuthorizer);
    # off, every client may do everything (and the ACL APIs answer SECURITY_DISABLED).
    enable: bool = False
    # Principals allowed everything whatever the ACLs say (super.users), e.g. ["User:admin"].
    super_users: list[str] = msgspec.field(default_factory=list)
    # A resource with no ACL at all is open to every principal (allow.everyone.if.no.acl.found).
    allow_everyone_if_no_acl_found: bool = False
TlsVersion = Literal["TLSv1.2", "TLSv1.3"]
SaslMechanism = Literal["SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN", "OAUTHBEARER"]


class TlsConfig(_Section):
    # The broker's certificate chain and private key (PEM), for SSL and SASL_SSL listeners.
    # Re-read on SIGHUP: new connections get the new certificate, open ones keep theirs.
    cert_file: str = ""
    key_file: str = ""
    # Password of an encrypted key_file; empty = the key is not encrypted.
    key_password: str = ""
    # CA certificates (PEM) that client certificates must chain to (Kafka's truststore).
    ca_file: str = ""
    # Client certificates (Kafka's ssl.client.auth): "none", "requested" (verified when sent),
    # "required". On an SSL listener the principal is then the certificate's subject.
    client_auth: Literal["none", "requested", "required"] = "none"
    # Oldest protocol version accepted.
    min_version: TlsVersion = "TLSv1.2"
    # OpenSSL cipher list for TLS 1.2 (Kafka's ssl.cipher.suites); empty = Python's defaults.
    ciphers: str = ""
    # Kafka's ssl.principal.mapping.rules, one rule per item: "RULE:pattern/replacement/[LU]"
    # applied to the certificate subject (RFC 2253), first match wins; "DEFAULT" keeps it.
    principal_mapping_rules: list[str] = msgspec.field(default_factory=lambda: ["DEFAULT"])


class SaslConfig(_Section):
    # Mechanisms offered on SASL_PLAINTEXT and SASL_SSL listeners (Kafka's
    # sasl.enabled.mechanisms); credentials are the SCRAM credentials of `appliance users`
    # (PLAIN checks its password against them).
    mechanisms: list[SaslMechanism] = msgspec.field(
        default_factory=lambda: ["SCRAM-SHA-256", "SCRAM-SHA-512"])
    # KIP-368 (Kafka's connections.max.reauth.ms): the longest session of a SASL connection
    # before the client must re-authenticate (SaslAuthenticate's SessionLifetimeMs), after which
    # the next request that is not a re-authentication closes it; 0 = no limit but an
    # OAUTHBEARER token's exp.
    connections_max_reauth_ms: Annotated[int, msgspec.Meta(ge=0)] = 0
    # OAUTHBEARER (KIP-768), Kafka's sasl.oauthbearer.* broker keys: the JWKS the tokens' signing
    # keys come from, a file: URL (re-read on every reload); required with OAUTHBEARER unless
    # the unsecured validator is on.
    oauthbearer_jwks_endpoint_url: str = ""
    # Required `iss` (empty: not checked) and `aud` values (empty: not checked).
    oauthbearer_expected_issuer: str = ""
    oauthbearer_expected_audience: list[str] = msgspec.field(default_factory=list)
    # Leeway for exp and nbf.
    oauthbearer_clock_skew_seconds: Annotated[int, msgspec.Meta(ge=0)] = 30
    # The claim whose value is the principal's name (User:<value>).
    oauthbearer_sub_claim_name: str = "sub"
    # Development only: accept unsigned tokens (alg "none"), Kafka's
    # OAuthBearerUnsecuredValidatorCallbackHandler. Anyone can then claim any principal.
    oauthbearer_unsecured_validator: bool = False


class MetricsConfig(_Section):
    # host:port of the Prometheus endpoint (GET /metrics, text format); empty = none.
    listen: str = ""


class ConsoleConfig(_Section):
    # host:port of the web console (workers/console_server.py); empty = none.
    listen: str = ""
    # Serve HTTPS with [tls]'s certificate and key (cert_file, key_file, key_password).
    tls: bool = False
    # Without SASL on any listener the console cannot tell who is asking: it only shows, unless
    # this is set (then every change is made as User:ANONYMOUS, whom the authorizer judges).
    allow_changes: bool = False
    # A login session ends after this long without a request.
    session_idle_ms: Positive = 3600000
    # The console's own Kafka connections when the listener they use is SSL or SASL_SSL (the
    # console prefers SASL_PLAINTEXT, SASL_SSL, PLAINTEXT, SSL): the CAs (PEM) the appliance's
    # certificate must chain to; empty = tls.ca_file, else tls.cert_file (self-signed). Set it
    # when tls.cert_file comes from an outside CA that tls.ca_file (the clients' CAs) lacks.
    ssl_cafile: str = ""
    # The client certificate chain and key (PEM) the console presents when that listener asks
    # for one (tls.client_auth; required with "required"). On SSL its subject, mapped by
    # tls.principal_mapping_rules, is the principal the authorizer judges the console's requests as.
    ssl_certfile: str = ""
    ssl_keyfile: str = ""
    # Password of an encrypted ssl_keyfile; empty = not encrypted.
    ssl_password: str = ""


class TelemetryConfig(_Section):
    # KIP-714 client telemetry, the broker-wide subscription: metric name prefixes clients are
    # asked to push ("*" = all; empty = none, Kafka's default with no CLIENT_METRICS resource).
    metrics: list[str] = msgspec.field(default_factory=list)
    # Push interval handed to clients (Kafka's interval.ms, default 5 minutes).
    interval_ms: Annotated[int, msgspec.Meta(ge=100, le=3600000)] = 300000
    # Largest PushTelemetry payload, compressed or not (Kafka's telemetry.max.bytes).
    max_bytes: Annotated[int, msgspec.Meta(ge=1024)] = 1048576
    # Cardinality bounds, per frontend: client instances remembered (least recently heard
    # dropped first) and series exported (a push past it keeps its first series).
    max_clients: Annotated[int, msgspec.Meta(ge=1)] = 1000
    max_series: Annotated[int, msgspec.Meta(ge=1)] = 20000


class QuotasConfig(_Section):
    # Client quotas' windowed rates (Kafka's quota.window.num, quota.window.size.seconds): a rate
    # is measured over window_num samples of window_size_seconds each.
    window_num: Annotated[int, msgspec.Meta(ge=2, le=100)] = 11
    window_size_seconds: Annotated[int, msgspec.Meta(ge=1, le=3600)] = 1


class Config(_Section):
    server: ServerConfig = msgspec.field(default_factory=ServerConfig)
    log: LogConfig = msgspec.field(default_factory=LogConfig)
    topics: TopicsConfig = msgspec.field(default_factory=TopicsConfig)
    shm: ShmConfig = msgspec.field(default_factory=ShmConfig)
    supervisor: SupervisorConfig = msgspec.field(default_factory=SupervisorConfig)
    transactions: TransactionsConfig = msgspec.field(default_factory=TransactionsConfig)
    groups: GroupsConfig = msgspec.field(default_factory=GroupsConfig)
    authorizer: AuthorizerConfig = msgspec.field(default_factory=AuthorizerConfig)
    tls: TlsConfig = msgspec.field(default_factory=TlsConfig)
    sasl: SaslConfig = msgspec.field(default_factory=SaslConfig)
    metrics: MetricsConfig = msgspec.field(default_factory=MetricsConfig)
    console: ConsoleConfig = msgspec.field(default_factory=ConsoleConfig)
    telemetry: TelemetryConfig = msgspec.field(default_factory=TelemetryConfig)
    quotas: QuotasConfig = msgspec.field(default_factory=QuotasConfig)

    # -- derived values -------------------------------------------------------------------
    @property
    def listeners(self) -> list[Listener]:
        """Every listener, in the order configured (``listen`` is one PLAINTEXT listener)."""
        s = self.server
        if s.listeners:
            return parse_listeners(s.listeners, parse_protocol_map(s.listener_security_protocol_map))
        host, port = parse_hostport(s.listen or DEFAULT_LISTEN, "server.listen")
        return [Listener("PLAINTEXT", "PLAINTEXT", host, port)]

    def advertised_endpoints(self, bound_ports: Mapping[str, int] | None = None
                             ) -> dict[str, tuple[str, int]]:
        """Listener name -> the (host, port) its clients are told to connect to (Metadata,
        FindCoordinator, DescribeCluster answer with the one of the listener asked through).

        ``bound_ports`` are the ports actually bound, which differ from the configured ones for
        port 0.
        """
        s = self.server
        bound_ports = bound_ports or {}
        out = {}
        for lst in self.listeners:
            out[lst.name] = (advertised_host(lst.host), bound_ports.get(lst.name) or lst.port)
        if s.advertised_listener:
            out[self.listeners[0].name] = parse_hostport(s.advertised_listener,
                                                         "server.advertised_listener")
        if s.advertised_listeners:
            for adv in parse_listeners(s.advertised_listeners,
                                       parse_protocol_map(s.listener_security_protocol_map)):
                out[adv.name] = (adv.host, adv.port)
        return out

    @property
    def frontend_count(self) -> int:
        return self.server.frontends or min(os.cpu_count() or 1, MAX_WORKERS_PER_ROLE)


def _env_value(raw: str) -> Any:
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw


def _env_overrides(environ: Mapping[str, str]) -> tuple[dict[str, Any], dict[str, str]]:
    """The overrides the environment gives, and which variable set each dotted key."""
    out: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for name, raw in environ.items():
        if not name.startswith(ENV_PREFIX):
            continue
        path = name[len(ENV_PREFIX):].lower().split("__")
        if len(path) < 2 or not all(path):
            raise ConfigError(
                f"config: environment {name}: expected {ENV_PREFIX}<SECTION>__<KEY>")
        try:
            raw.encode("utf-8")
        except UnicodeEncodeError:
            # os.environ keeps undecodable bytes as surrogates (PEP 383).
            raise ConfigError(f"config: {'.'.join(path)}: not valid UTF-8 "
                              f"(from environment {name})") from None
        node: dict[str, Any] = out
        for depth, part in enumerate(path[:-1]):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"config: {'.'.join(path[:depth + 1])}: is a value, not a table "
                                  f"(from environment {origin.get('.'.join(path[:depth + 1]), name)})")
            node = child
        if isinstance(node.get(path[-1]), dict):
            raise ConfigError(f"config: {'.'.join(path)}: is a table, not a value "
                              f"(from environment {name})")
        node[path[-1]] = _env_value(raw)
        origin[".".join(path)] = name
    return out, origin


def _merge(base: dict[str, Any], over: Mapping[str, Any], where: str = "") -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        key = f"{where}.{k}" if where else k
        if isinstance(v, Mapping):
            if k not in out:
                out[k] = _merge({}, v, key)
            elif isinstance(out[k], dict):
                out[k] = _merge(out[k], v, key)
            else:
                # A table the file got wrong (``server = 5``) is reported, never silently replaced
                # by the overrides of one of its keys.
                raise ConfigError(f"config: {key}: Expected `object`, got "
                                  f"`{type(out[k]).__name__}`")
        else:
            out[k] = v
    return out


def _read_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise ConfigError(f"config: file not found: {path}") from None
    except OSError as e:
        raise ConfigError(f"config: {path}: cannot be read: {e.strerror}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        # TOML files are UTF-8 (TOML 1.0, "Spec"); say where the first bad byte is.
        line = data.count(b"\n", 0, e.start) + 1
        raise ConfigError(f"config: {path}: not valid TOML: not UTF-8 "
                          f"(byte 0x{data[e.start]:02x} on line {line})") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config: {path}: not valid TOML: {e}") from None


def load(path: str | os.PathLike[str] | None = None,
         environ: Mapping[str, str] | None = None,
         overrides: Mapping[str, Any] | None = None) -> Config:
    """Decode the effective configuration; raise ConfigError naming the bad key (and the
    environment variable it came from, if it did)."""
    raw: dict[str, Any] = _read_file(path) if path is not None else {}
    env, origin = _env_overrides(os.environ if environ is None else environ)
    try:
        raw = _merge(raw, env)
        if overrides:
            # A bad value in the file or the environment is an error even where a flag
            # overrides it: the flag must not hide a file that the next start without it reads.
            _convert(raw)
            for section, values in overrides.items():
                for key in values:
                    origin.pop(f"{section}.{key}", None)   # a flag wins over the environment
            raw = _merge(raw, overrides)
        cfg = _convert(raw)
        check_consistency(cfg)
    except ConfigError as e:
        raise ConfigError(_name_origin(str(e), origin)) from None
    return cfg


def _convert(raw: dict[str, Any]) -> Config:
    try:
        return msgspec.convert(raw, Config)
    except msgspec.ValidationError as e:
        raise ConfigError(f"config: {_explain(str(e))}") from None


def _name_origin(msg: str, origin: Mapping[str, str]) -> str:
    """Append the environment variable that set the key a message names."""
    key = msg.removeprefix("config: ").partition(":")[0]
    if ", " in key:
        # A message about several keys ("server.listen, server.listeners: set one of them"):
        # name every variable among them.
        names = [origin[k] for k in key.split(", ") if k in origin]
        return f"{msg} (from environment {', '.join(names)})" if names else msg
    name = origin.get(key)
    if name is None:
        # A key below a table an environment variable set (APPLIANCE_LOG__FLUSH=x), or an
        # unknown table only an environment variable names (APPLIANCE_LGO__X: "lgo: unknown key").
        unknown = msg.endswith(": unknown key")
        name = next((n for k, n in origin.items()
                     if key.startswith(k + ".") or (unknown and k.startswith(key + "."))), None)
    return f"{msg} (from environment {name})" if name and "(from environment" not in msg else msg


def _explain(msg: str) -> str:
    # msgspec says "Object contains unknown field `x` - at `$.log`" or "Expected `int`, got `str` -
    # at `$.log.segment_bytes`"; turn the path into the dotted key the user wrote.
    text, sep, where = msg.rpartition(" - at `")
    if not sep:
        text, key = msg, ""
    else:
        key = where.rstrip("`").removeprefix("$").lstrip(".")
    if text.startswith("Object contains unknown field `"):
        field = text.split("`")[1]
        full = f"{key}.{field}" if key else field
        return f"{full}: unknown key"
    if text.startswith("Invalid enum value") and key:
        choices = _choices(key)
        if choices:
            text = f"{text} (valid values: {', '.join(repr(c) for c in choices)})"
    return f"{key}: {text}" if key else text


def _choices(dotted: str) -> list[str]:
    """The values a Literal or enum key of the config tree accepts (for error messages)."""
    node: Any = Config
    for part in dotted.split("."):
        hints = typing.get_type_hints(node, include_extras=True)
        if part not in hints:
            return []
        node = hints[part]
        while typing.get_origin(node) is Annotated:
            node = typing.get_args(node)[0]
    if typing.get_origin(node) is Literal:
        return [str(a) for a in typing.get_args(node)]
    if isinstance(node, type) and issubclass(node, enum.Enum):
        return [str(m.value) for m in node]
    return []
