"""The supervisor's topic administration: CreateTopics, DeleteTopics, CreatePartitions and
AlterConfigs / IncrementalAlterConfigs, served from the frontends' admin rings.

Runs in the supervisor process, which owns the catalog (``appliance.supervisor.catalog_store.CatalogStore``) and the
process table; this service is the supervisor's, single-threaded, and changes both only through
the supervisor's ``ProcessTable`` interface (``appliance.supervisor.process_table``: add,
start, take off and release partitions on writer processes). Each change commits the catalog
first (the durable point), then acts: new partitions are placed on writer processes (new ones
forked, existing ones told by the published assignment) and the catalog is published only once
every new partition is READY (so frontends never route to a partition without a writer); deleted
topics' partitions are closed by their processes before their directories go; config changes are
published at once, and every writer process applies them live when it sees the new catalog
version (``workers.writer_process``). Whether more partitions fit the
machine: ``appliance.supervisor.memory``.

I/O errors never stop the supervisor here: new partitions' rings and pages are made before the
catalog commit (they get their memory when made), so a runtime dir (tmpfs) or a data dir without
room refuses the request with KAFKA_STORAGE_ERROR, as Kafka refuses a write to a full log dir, and
leaves the catalog and the runtime dir as they were; a catalog that cannot be published is
published again every turn (``Supervisor._turn``).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from appliance.catalog.messages import (RESOURCE_BROKER, RESOURCE_CLIENT_METRICS, RESOURCE_GROUP,
                                        RESOURCE_TOPIC, AlterConfigsRequest, AlterConfigsResult, ConfigResult, CreatePartitionsRequest,
                                        CreateTopicsRequest, DeleteTopicsRequest, TopicResult,
                                        TopicsResult)
from appliance.supervisor.catalog_store import CatalogStore
from appliance.catalog.model import INTERNAL_TOPICS, TopicInfo, check_topic_name, new_topic_id
from appliance.errors import ErrorCode, KafkaError
from appliance.durable import NO_SPACE
from appliance.service import Responder, serves
from appliance.group_config import alter_group_configs
from appliance.metrics import client_metrics_config
from appliance.topic_config import (alter_broker_configs, alter_topic_configs, apply_config_ops,
                                    validate_topic_configs)

from .process_table import ProcessTable

log = logging.getLogger("appliance.supervisor")

FULL_DISK = "the data dir's file system is full"
CREATE_TIMEOUT_S = 60.0


@dataclass
class PendingCreate:
    respond: Responder
    results: list[TopicResult]
    writers: list            # the new partitions' rows (writers.PartitionEntry)
    deadline: float


@dataclass
class PendingDelete:
    respond: Responder
    results: list[TopicResult]
    writers: list            # the deleted partitions' rows (writers.PartitionEntry)
    topics: list[TopicInfo]


class TopicAdmin:
    """The ``@serves`` methods of the supervisor's admin registry, and what they wait for."""

    def __init__(self, table: ProcessTable) -> None:
        self.table = table
        self.pending_creates: list[PendingCreate] = []
        self.pending_deletes: list[PendingDelete] = []
        self.unpublished = False     # the committed catalog could not be published yet

    @property
    def busy(self) -> bool:
        return bool(self.pending_creates or self.pending_deletes)

    @property
    def store(self) -> CatalogStore:
        return self.table.store

    # -- CreateTopics ---------------------------------------------------------------------------
    @serves(CreateTopicsRequest, late=True)
    def create_topics(self, req: CreateTopicsRequest, respond: Responder) -> None:
        """Answered once the new writers are READY (or after 60 s)."""
        cfg = self.table.cfg
        results: list[TopicResult] = []
        accepted: list[TopicInfo] = []
        current = self.store.catalog
        total = current.partition_count()
        seen: set[str] = set()
        for nt in req.topics:
            try:
                if nt.name in seen:
                    raise KafkaError(ErrorCode.invalid_request,
                                     f"Duplicate topic name {nt.name} in CreateTopics")
                seen.add(nt.name)
                check_topic_name(nt.name)
                if nt.name in INTERNAL_TOPICS:
                    raise KafkaError(ErrorCode.invalid_topic_exception,
                                     f"{nt.name} is an internal topic of the appliance")
                if nt.name in current.topics:
                    raise KafkaError(ErrorCode.topic_already_exists,
                                     f"Topic '{nt.name}' already exists.")
                parts = nt.num_partitions if nt.num_partitions != -1 else cfg.topics.default_partitions
                if parts <= 0:
                    raise KafkaError(ErrorCode.invalid_partitions,
                                     "Number of partitions must be larger than 0.")
                self._check_room(total, parts)
                configs = validate_topic_configs(dict(nt.configs))
                info = TopicInfo(name=nt.name, topic_id=new_topic_id(), partitions=parts,
                                     configs=configs)
                total += parts
                accepted.append(info)
                results.append(TopicResult(name=nt.name, error_code=0, topic_id=info.topic_id,
                                               num_partitions=parts, configs=configs))
            except KafkaError as e:
                results.append(TopicResult(name=nt.name, error_code=int(e.code),
                                               error_message=e.message))
        writers = []
        if accepted and not req.validate_only:
            writers, results = self._commit_with_writers(
                [(t, range(t.partitions)) for t in accepted],
                lambda: self.store.add_topics(accepted), results, "CreateTopics")
            for t in accepted if writers else ():
                log.info("creating topic %s: %d partitions%s", t.name, t.partitions,
                         f", configs {dict(t.configs)}" if t.configs else "")
        self._wait_for(respond, results, writers)

    def _check_room(self, total: int, more: int) -> None:
        """Refuse ``more`` partitions (after ``total`` counted so far, the catalog's and this
        request's earlier ones) beyond ``topics.max_partitions`` or beyond what the machine can
        hold: every partition's rings get their memory when made, so creating more than fit would
        have the kernel's OOM killer take the supervisor instead of a refusal."""
        limit = self.table.cfg.topics.max_partitions
        if total + more > limit:
            raise KafkaError(ErrorCode.policy_violation,
                             f"Creating {more} partitions would exceed topics.max_partitions = {limit}")
        new = total + more - self.store.catalog.partition_count()
        problem = self.table.room_problem(new)
        if problem is not None:
            raise KafkaError(*problem)

    def _commit_with_writers(self, parts: list[tuple[TopicInfo, range]], commit,
                             results: list[TopicResult], what: str):
        """Place the new partitions on writer processes and make their pages (and the rings of
        new processes) first, then ``commit()`` the catalog, then publish the assignment and fork
        the new processes. Either step failing for lack of room refuses the request with
        KAFKA_STORAGE_ERROR and takes away what was made. Returns (partition rows, results)."""
        table = self.table
        writers = []
        problem = None
        try:
            for t, partitions in parts:
                for p in partitions:
                    writers.append(table.add_partition(t, p))
        except OSError as e:
            problem = f"the runtime dir has no room for the new partitions' rings: {e.strerror}"
        if problem is None:
            try:
                commit()
            except OSError as e:
                problem = (FULL_DISK if e.errno in NO_SPACE
                           else f"the data dir cannot commit the catalog: {e.strerror}")
        if problem is not None:
            log.error("%s %s refused: %s", what, sorted({t.name for t, _ in parts}), problem)
            for entry in reversed(writers):
                table.forget_partition(entry)
            return [], _fail_accepted(results, ErrorCode.kafka_storage_error, problem)
        try:
            table.start_partitions(writers)
        except OSError as e:
            # Committed: the partitions are in the catalog; the assignment is published again
            # at the next change (the processes open them then) and a restart lays them out.
            table.io_trouble("assignment", f"the assignment could not be published: {e}")
        return writers, results

    def _wait_for(self, respond: Responder, results: list[TopicResult], writers: list) -> None:
        self.pending_creates.append(PendingCreate(respond, results, writers,
                                                  time.monotonic() + CREATE_TIMEOUT_S))
        self.check_pending()

    # -- CreatePartitions -----------------------------------------------------------------------
    @serves(CreatePartitionsRequest, late=True)
    def create_partitions(self, req: CreatePartitionsRequest, respond: Responder) -> None:
        """Kafka's ReplicationControlManager.createPartitions: a topic only grows; the new
        partitions are numbered after the existing ones, each gets its writer, and the answer
        waits until they are READY (as CreateTopics does)."""
        results: list[TopicResult] = []
        counts: dict[str, int] = {}
        current = self.store.catalog
        total = current.partition_count()
        names = [n for n, _ in req.counts]
        for name, count in req.counts:
            try:
                if names.count(name) > 1:
                    raise KafkaError(ErrorCode.invalid_request, "Duplicate topic name.")
                t = current.topics.get(name)
                if t is None:
                    raise KafkaError(ErrorCode.unknown_topic_or_partition,
                                     "This server does not host this topic-partition.")
                if count == t.partitions:
                    raise KafkaError(ErrorCode.invalid_partitions,
                                     f"Topic already has {t.partitions} partition(s).")
                if count < t.partitions:
                    raise KafkaError(ErrorCode.invalid_partitions,
                                     f"The topic {name} currently has {t.partitions} partition(s); "
                                     f"{count} would not be an increase.")
                self._check_room(total, count - t.partitions)
                total += count - t.partitions
                counts[name] = count
                results.append(TopicResult(name=name, error_code=0, topic_id=t.topic_id,
                                               num_partitions=count))
            except KafkaError as e:
                results.append(TopicResult(name=name, error_code=int(e.code),
                                               error_message=e.message))
        writers = []
        if counts and not req.validate_only:
            import msgspec
            grown = [(msgspec.structs.replace(current.topics[name], partitions=count),
                      range(current.topics[name].partitions, count)) for name, count in counts.items()]
            writers, results = self._commit_with_writers(
                grown, lambda: self.store.grow_topics(counts), results, "CreatePartitions")
            for t, new in grown if writers else ():
                log.info("topic %s grows from %d to %d partitions", t.name, new.start, new.stop)
                self.table.topic_grown(t)       # restarts see the new count
        self._wait_for(respond, results, writers)

    # -- AlterConfigs / IncrementalAlterConfigs -------------------------------------------------
    @serves(AlterConfigsRequest)
    def alter_configs(self, req: AlterConfigsRequest) -> AlterConfigsResult:
        """Each resource is checked and changed as a whole (Kafka's ConfigAdminManager and
        ConfigurationControlManager); the good ones are committed together, then published, and
        the writers apply them live."""
        current = self.store.catalog
        node = str(self.table.cfg.server.node_id)
        keys = [(c.resource_type, c.resource_name) for c in req.changes]
        results: list[ConfigResult] = []
        topics: dict[str, dict[str, str]] = {}
        broker: dict[str, dict[str, str]] = {}          # "" (default) or the node id -> set
        groups: dict[str, dict[str, str]] = {}          # KIP-848 group configs: group -> set
        metrics: dict[str, dict[str, str]] = {}         # KIP-714 CLIENT_METRICS: name -> set
        for change, key in zip(req.changes, keys):
            try:
                if keys.count(key) > 1:
                    raise KafkaError(ErrorCode.invalid_request, "Each resource must appear at most once.")
                name = change.resource_name
                if change.resource_type == RESOURCE_TOPIC:
                    if not name:
                        raise KafkaError(ErrorCode.invalid_request, "Default topic resources are not allowed.")
                    if name not in current.topics:
                        raise KafkaError(ErrorCode.unknown_topic_or_partition,
                                         "This server does not host this topic-partition.")
                    topics[name] = alter_topic_configs(self.table.cfg, current, name, change.ops,
                                                       req.incremental)
                elif change.resource_type == RESOURCE_BROKER:
                    if name and name != node:
                        if not name.lstrip("-").isdigit():
                            raise KafkaError(ErrorCode.invalid_request,
                                             f"Node id must be an integer, but it is: {name}")
                        raise KafkaError(ErrorCode.invalid_request,
                                         f"Unexpected broker id, expected {node}, but received {name}")
                    have = current.broker_node if name else current.broker_default
                    broker[name] = alter_broker_configs(have, change.ops, req.incremental)
                elif change.resource_type == RESOURCE_CLIENT_METRICS:
                    metrics[name] = client_metrics_config.alter(
                        name, current.client_metrics.get(name, {}), change.ops, req.incremental,
                        apply_config_ops)
                elif change.resource_type == RESOURCE_GROUP:
                    if not name:
                        raise KafkaError(ErrorCode.invalid_request, "Group name must not be empty.")
                    groups[name] = alter_group_configs(current.group_configs.get(name, {}), change.ops,
                                                       req.incremental, apply_config_ops,
                                                       self.table.cfg.groups)
                else:
                    raise KafkaError(ErrorCode.invalid_request,
                                     f"Unknown resource type {change.resource_type}")
                results.append(ConfigResult(0))
            except KafkaError as e:
                results.append(ConfigResult(int(e.code), e.message))
        if req.validate_only or not (topics or broker or groups or metrics):
            return AlterConfigsResult(results)
        try:
            self.store.set_configs(topics, broker.get(""), broker.get(node), groups, metrics)
        except OSError as e:
            if e.errno not in NO_SPACE:
                raise
            return AlterConfigsResult([ConfigResult(int(ErrorCode.kafka_storage_error), FULL_DISK)
                                           if r.error_code == 0 else r for r in results])
        for name, configs in topics.items():
            log.info("topic %s configs now %s", name, configs or "the defaults")
        for name, configs in broker.items():
            log.info("dynamic broker configs of %s now %s", f"node {name}" if name else "the cluster default",
                     configs or "none")
        for name, configs in groups.items():
            log.info("group %s configs now %s", name, configs or "the defaults")
        for name, configs in metrics.items():
            log.info("client metrics subscription %s now %s", name, configs or "deleted")
        self.publish()
        return AlterConfigsResult(results)

    # -- DeleteTopics ---------------------------------------------------------------------------
    @serves(DeleteTopicsRequest, late=True)
    def delete_topics(self, req: DeleteTopicsRequest, respond: Responder) -> None:
        """Answered once the writers have stopped and the directories are gone."""
        results: list[TopicResult] = []
        names: list[str] = []
        for name in req.names:
            t = self.store.catalog.topics.get(name)
            if t is None:
                results.append(TopicResult(name=name, error_code=int(ErrorCode.unknown_topic_or_partition),
                                               error_message="This server does not host this topic."))
            else:
                names.append(name)
                results.append(TopicResult(name=name, error_code=0, topic_id=t.topic_id))
        removed = self._remove_topics(names) if names else []
        if removed:
            log.info("deleting topics %s", ", ".join(t.name for t in removed))
        if names and not removed:
            results = _fail_accepted(results, ErrorCode.kafka_storage_error, FULL_DISK)
        self.publish()
        writers = []
        for t in removed:
            writers += self.table.stop_partitions(t)
        if removed:
            try:
                self.table.start_partitions([])      # the assignment without them
            except OSError as e:
                self.table.io_trouble("assignment", f"the assignment could not be published: {e}")
        self.pending_deletes.append(PendingDelete(respond, results, writers, removed))
        self.check_pending()

    def _remove_topics(self, names: list[str]) -> list[TopicInfo]:
        """Commit a DeleteTopics; on a full disk the reserve gives the catalog its room (the
        delete is what frees the disk). Nothing removed when even that fails."""
        for attempt in (1, 2):
            try:
                return self.store.remove_topics(names)
            except OSError as e:
                if e.errno not in NO_SPACE or attempt == 2 or not self._release_reserve():
                    log.error("DeleteTopics %s: the catalog cannot be written: %s", names, e)
                    break
        return []

    def _release_reserve(self) -> bool:
        try:
            return self.table.reserve.release("DeleteTopics needs room")
        except OSError as e:
            log.error("the disk reserve cannot be given back: %s", e)
            return False

    # -- what the loop checks every turn --------------------------------------------------------
    def check_pending(self) -> None:
        table = self.table
        now = time.monotonic()
        still = []
        publish = False
        done: list[PendingCreate] = []
        for pc in self.pending_creates:
            if all(table.partition_ready(e) for e in pc.writers):
                publish = publish or bool(pc.writers)
                done.append(pc)
            elif now > pc.deadline:
                pc.results = _fail_accepted(pc.results, ErrorCode.request_timed_out,
                                            "partition writers did not start in time")
                publish = True
                done.append(pc)
            else:
                still.append(pc)
        self.pending_creates = still
        if publish:
            self.publish()
        if done and table.processes_changed:
            table.write_processes()       # the answer's readers see the new writers
        for pc in done:
            pc.respond(TopicsResult(pc.results))
        still_d = []
        for pd in self.pending_deletes:
            if not all(table.partition_stopped(e) for e in pd.writers):
                still_d.append(pd)
                continue
            table.release_partitions(pd.writers)
            try:
                for t in pd.topics:
                    self.store.delete_dirs(t)
                if pd.topics:
                    table.reserve.restore(need_free=table.reserve.size)
            except OSError as e:
                # Committed: the sweep at the next start removes what is left of the directories.
                log.error("DeleteTopics: removing the deleted topics' files failed: %s", e)
            table.write_processes()       # the answer's readers see the writers gone
            pd.respond(TopicsResult(pd.results))
        self.pending_deletes = still_d

    def publish(self) -> None:
        """Publish the committed catalog to the workers. On a full runtime dir the workers keep
        the previous one (the version on the page moves only with the file) and every turn
        tries again (``unpublished``)."""
        table = self.table
        try:
            table.publish_catalog(self.store.catalog)
        except OSError as e:
            self.unpublished = True
            table.io_trouble("catalog", f"catalog version {self.store.catalog.version} not "
                                        f"published to the workers: {e}")
            return
        self.unpublished = False
        table.io_trouble("catalog", None)
        table.catalog_published(self.store.catalog.version)


def _fail_accepted(results: list[TopicResult], code: ErrorCode, message: str) -> list[TopicResult]:
    return [TopicResult(name=r.name, error_code=int(code), error_message=message)
            if r.error_code == 0 else r for r in results]
