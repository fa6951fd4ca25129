"""CreateTopics and DeleteTopics in the supervisor: the catalog's commit, the new writers' rings
and processes, the deleted ones' removal, and the published catalog.

Runs in the supervisor process only (a mixin of ``appliance.supervisor.Supervisor``, which owns
the state used here: the worker table, the runtime dir's topology, the catalog store, the disk
reserve). Frontends send the requests through their admin rings; each is answered late, once its
writers are READY (create) or stopped and their files gone (delete).

Nothing here stops the supervisor on an I/O error: a catalog commit that fails (a full data dir,
after the disk reserve was given back for a DeleteTopics) or a runtime dir without room for the
new partitions' rings answers KAFKA_STORAGE_ERROR, as Kafka answers a write to a full log dir, and
leaves the catalog and the runtime dir as they were.
"""

from __future__ import annotations

import logging
import signal
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from . import catalog as cat
from . import ipc
from .errors import ErrorCode, KafkaError
from .runtime import writer_name
from .service import Responder, serves
from .startup import NO_SPACE
from .topic_config import validate_topic_configs

if TYPE_CHECKING:
    from .supervisor import WorkerSpec

log = logging.getLogger("appliance.supervisor")


@dataclass
class PendingCreate:
    respond: Responder
    results: list[cat.TopicResult]
    writers: list["WorkerSpec"]
    deadline: float


@dataclass
class PendingDelete:
    respond: Responder
    results: list[cat.TopicResult]
    writers: list["WorkerSpec"]
    topics: list[cat.TopicInfo]


class TopicAdmin:
    """The supervisor's admin requests (see the module docstring)."""

    # -- admin requests (frontends -> supervisor) -----------------------------------------------
    def _serve_admin(self) -> None:
        for src, ring in self.mailbox.inputs.items():
            while (raw := ring.get()) is not None:
                self.registry.handle(src, raw)

    @serves(cat.CreateTopicsRequest, late=True)
    def _create_topics(self, req: cat.CreateTopicsRequest, respond: Responder) -> None:
        """Answered once the new writers are READY (or after 60 s)."""
        results: list[cat.TopicResult] = []
        accepted: list[cat.TopicInfo] = []
        current = self.store.catalog
        total = current.partition_count()
        seen: set[str] = set()
        for nt in req.topics:
            try:
                if nt.name in seen:
                    raise KafkaError(ErrorCode.invalid_request,
                                     f"Duplicate topic name {nt.name} in CreateTopics")
                seen.add(nt.name)
                cat.check_topic_name(nt.name)
                if nt.name in cat.INTERNAL_TOPICS:
                    raise KafkaError(ErrorCode.invalid_topic_exception,
                                     f"{nt.name} is an internal topic of the appliance")
                if nt.name in current.topics:
                    raise KafkaError(ErrorCode.topic_already_exists,
                                     f"Topic '{nt.name}' already exists.")
                parts = nt.num_partitions if nt.num_partitions != -1 else self.cfg.topics.default_partitions
                if parts <= 0:
                    raise KafkaError(ErrorCode.invalid_partitions,
                                     "Number of partitions must be larger than 0.")
                if total + parts > self.cfg.topics.max_partitions:
                    raise KafkaError(ErrorCode.policy_violation,
                                     f"Creating {parts} partitions would exceed topics.max_partitions "
                                     f"= {self.cfg.topics.max_partitions}")
                configs = validate_topic_configs(dict(nt.configs))
                info = cat.TopicInfo(name=nt.name, topic_id=cat.new_topic_id(), partitions=parts,
                                     configs=configs)
                total += parts
                accepted.append(info)
                results.append(cat.TopicResult(name=nt.name, error_code=0, topic_id=info.topic_id,
                                               num_partitions=parts, configs=configs))
            except KafkaError as e:
                results.append(cat.TopicResult(name=nt.name, error_code=int(e.code),
                                               error_message=e.message))
        writers: list[WorkerSpec] = []
        if accepted and not req.validate_only:
            # The new writers' rings and pages first (they get their memory when made), then the
            # commit: a runtime dir or a data dir without room refuses the topics, as Kafka refuses
            # a write to a full log dir, and leaves nothing behind.
            problem = None
            try:
                for t in accepted:
                    for p in range(t.partitions):
                        writers.append(self._add_writer(t, p))
            except OSError as e:
                problem = f"the runtime dir has no room for the new partitions' rings: {e.strerror}"
            if problem is None:
                try:
                    self.store.add_topics(accepted)
                except OSError as e:
                    problem = f"the data dir cannot commit the catalog: {e.strerror}"
            if problem is not None:
                log.error("CreateTopics %s refused: %s", [t.name for t in accepted], problem)
                for spec in writers:
                    self._forget_worker(spec)
                writers = []
                results = [cat.TopicResult(name=r.name, error_code=int(ErrorCode.kafka_storage_error),
                                           error_message=problem)
                           if r.error_code == 0 else r for r in results]
            for spec in writers:
                self._spawn(spec)
        self.pending_creates.append(PendingCreate(respond, results, writers,
                                                  time.monotonic() + 60.0))
        self._check_pending()

    def _forget_worker(self, spec: WorkerSpec) -> None:
        """Remove a worker that is not running from the table, with its runtime-dir files."""
        if spec.page is not None:
            spec.page.close()
            spec.page = None
        self.topo.remove_endpoint(spec.name)
        if self.workers.pop(spec.name, None) is not None:
            self.free_slots.append(spec.heartbeat_slot)

    @serves(cat.DeleteTopicsRequest, late=True)
    def _delete_topics(self, req: cat.DeleteTopicsRequest, respond: Responder) -> None:
        """Answered once the writers have stopped and the directories are gone."""
        results: list[cat.TopicResult] = []
        names: list[str] = []
        for name in req.names:
            t = self.store.catalog.topics.get(name)
            if t is None:
                results.append(cat.TopicResult(name=name, error_code=int(ErrorCode.unknown_topic_or_partition),
                                               error_message="This server does not host this topic."))
            else:
                names.append(name)
                results.append(cat.TopicResult(name=name, error_code=0, topic_id=t.topic_id))
        removed = self._remove_topics(names) if names else []
        if names and not removed:
            results = [cat.TopicResult(name=r.name, error_code=int(ErrorCode.kafka_storage_error),
                                       error_message="the data dir's file system is full")
                       if r.error_code == 0 else r for r in results]
        self._publish_catalog()
        writers = []
        for t in removed:
            for p in range(t.partitions):
                spec = self.workers[writer_name(t.topic_id, p)]
                spec.removed = True
                if spec.pid is not None:
                    self.kill(spec.pid, signal.SIGTERM)
                writers.append(spec)
        self.pending_deletes.append(PendingDelete(respond, results, writers, removed))
        self._check_pending()

    def _remove_topics(self, names: list[str]) -> list[cat.TopicInfo]:
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
            return self.reserve.release("DeleteTopics needs room")
        except OSError as e:
            log.error("the disk reserve cannot be given back: %s", e)
            return False

    def _check_pending(self) -> None:
        now = time.monotonic()
        still = []
        publish = False
        done: list[PendingCreate] = []
        for pc in self.pending_creates:
            if all(self._writer_ready(s) for s in pc.writers):
                publish = publish or bool(pc.writers)
                done.append(pc)
            elif now > pc.deadline:
                pc.results = [cat.TopicResult(name=r.name, error_code=int(ErrorCode.request_timed_out),
                                              error_message="partition writers did not start in time")
                              if r.error_code == 0 else r for r in pc.results]
                publish = True
                done.append(pc)
            else:
                still.append(pc)
        self.pending_creates = still
        if publish:
            self._publish_catalog()
        for pc in done:
            pc.respond(cat.TopicsResult(pc.results))
        still_d = []
        for pd in self.pending_deletes:
            if any(s.pid is not None for s in pd.writers):
                still_d.append(pd)
                continue
            for s in pd.writers:
                self.topo.remove_endpoint(s.name)
                self.workers.pop(s.name, None)
                self.free_slots.append(s.heartbeat_slot)
            try:
                for t in pd.topics:
                    self.store.delete_dirs(t)
                if pd.topics:
                    self.reserve.restore(need_free=self.reserve.size)
            except OSError as e:
                # Committed: the sweep at the next start removes what is left of the directories.
                log.error("DeleteTopics: removing the deleted topics' files failed: %s", e)
            self._write_processes()
            pd.respond(cat.TopicsResult(pd.results))
        self.pending_deletes = still_d

    def _publish_catalog(self) -> None:
        """Publish the committed catalog to the workers. On a full runtime dir the workers keep
        the previous one (the version on the page moves only with the file) and every turn
        tries again."""
        try:
            cat.publish(self.store.catalog, self.topo.file_path(cat.PUBLISHED_FILE))
        except OSError as e:
            self._catalog_unpublished = True
            self._io_trouble("catalog", f"catalog version {self.store.catalog.version} not "
                                        f"published to the workers: {e}")
            return
        self._catalog_unpublished = False
        self._io_trouble("catalog", None)
        self.page.publish(catalog_version=self.store.catalog.version)

    def _reply(self, dst: str, req_id: int, body: ipc.Message) -> None:
        # A full ring (a slow or restarting frontend) queues the reply; every turn retries it.
        box = self.outboxes[dst]
        box.post(ipc.encode(req_id, body))
        box.flush()

