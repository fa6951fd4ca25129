"""The ACLs: durable in the data dir, owned by the supervisor, published to the frontends.

``AclStore`` and ``AclService`` run in the supervisor, which alone reads and writes
``<data_dir>/acls.json`` (replaced atomically: write, fsync, rename, fsync the directory; the
rename is the commit point of CreateAcls and DeleteAcls). After each change it publishes the
whole set for the other processes (``acls.msgpack`` in the runtime dir, replaced atomically) and
only then bumps ``acl_version`` on its state page, so that a frontend that sees the new version
finds the new file. The answer to CreateAcls/DeleteAcls leaves after both, so a client that got
it is checked against the new ACLs on every connection, as the catalog is published before
CreateTopics answers.

``AclView`` runs in each frontend: called once per authorization, it costs one read of the
supervisor page's sequence number while nothing changed, and reloads the snapshot when the ACL
version moved (``appliance.acl.authorizer.Authorizer`` then drops its decision cache).

Bounds (so that no answer outgrows its ring, where a too large message would stop the
supervisor): one operation changes at most ``MAX_ACLS_PER_OPERATION`` ACLs, Kafka's controller's
limit (a larger DeleteAcls deletes nothing and says so; the frontends send CreateAcls in chunks
of at most ``CREATE_CHUNK`` ACLs), an error message carries at most ``MESSAGE_MAX`` characters,
and a DeleteAcls whose answer (every ACL each filter matched) would not fit ``reply_bytes`` is
refused the same way.

The file names each field as Kafka's tools do (``"operation": "Read"``, ``"resource_type":
"TransactionalId"``), so that it reads like ``kafka-acls.sh --list``; an unreadable file stops the
start (exit 3) rather than run with fewer ACLs than were granted and denied.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Callable, Iterable

import msgspec

from appliance.errors import ErrorCode
from appliance.durable import atomic_write, verify_checksum, with_checksum
from appliance.service import serves
from appliance.runtime import DataDirUnusable

from .authorizer import AclSnapshot
from .messages import (AclCreateResult, AclDeleteResult, CreateAclsRequest, CreateAclsResult,
                       DeleteAclsRequest, DeleteAclsResult)
from .model import (AclBinding, operation_name, parse_operation, parse_pattern_type,
                    parse_permission, parse_resource_type, pattern_name, permission_name,
                    resource_type_name, validate_filter, validate_new_acl)

log = logging.getLogger("appliance.acl")

ACL_FILE = "acls.json"
PUBLISHED_FILE = "acls.msgpack"
MAX_ACLS_PER_OPERATION = 10000       # Kafka's QuorumController.MAX_RECORDS_PER_USER_OP
CREATE_CHUNK = 200                   # ACLs per CreateAclsRequest (frontend -> supervisor)
MESSAGE_MAX = 200                    # characters of an error message (they may quote input)


def _to_json(acl: AclBinding) -> dict:
    return {"resource_type": resource_type_name(acl.resource_type),
            "resource_name": acl.resource_name, "pattern_type": pattern_name(acl.pattern_type),
            "principal": acl.principal, "host": acl.host,
            "operation": operation_name(acl.operation),
            "permission_type": permission_name(acl.permission_type)}


def _from_json(d: dict) -> AclBinding:
    acl = AclBinding(int(parse_resource_type(d["resource_type"])), str(d["resource_name"]),
                     int(parse_pattern_type(d["pattern_type"])), str(d["principal"]),
                     str(d["host"]), int(parse_operation(d["operation"])),
                     int(parse_permission(d["permission_type"])))
    bad = validate_new_acl(acl)
    if bad is not None:
        raise ValueError(bad[1])
    return acl


class AclStore:
    """The supervisor's ACLs. Single-threaded, supervisor process only."""

    def __init__(self, data_dir: str) -> None:
        self.path = os.path.join(data_dir, ACL_FILE)
        self.snapshot = AclSnapshot()

    def load(self) -> AclSnapshot:
        if not os.path.exists(self.path):
            return self.snapshot
        try:
            with open(self.path, "rb") as f:
                raw = verify_checksum(json.load(f))
            acls = [_from_json(d) for d in raw["acls"]]
            version = int(raw["version"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise DataDirUnusable(f"{self.path} cannot be read: {e}") from None
        self.snapshot = AclSnapshot(version, acls)
        return self.snapshot

    def _commit(self, acls: Iterable[AclBinding]) -> AclSnapshot:
        new = AclSnapshot(self.snapshot.version + 1, acls)
        raw = {"version": new.version, "acls": [_to_json(a) for a in new.acls]}
        atomic_write(self.path, json.dumps(with_checksum(raw), indent=1).encode())
        self.snapshot = new
        return new

    def create(self, acls: list[AclBinding]) -> list[AclCreateResult]:
        """Kafka's CreateAcls: each ACL is checked on its own; the valid ones are added (one
        already present is a success that changes nothing) in one commit."""
        results: list[AclCreateResult] = []
        current = set(self.snapshot.acls)
        new = set(current)
        for acl in acls:
            bad = validate_new_acl(acl)
            if bad is not None:
                results.append(AclCreateResult(int(bad[0]), bad[1][:MESSAGE_MAX]))
                continue
            new.add(acl)
            results.append(AclCreateResult())
        if new != current:
            try:
                self._commit(new)
            except OSError as e:
                # Nothing committed: every ACL that would have been added fails.
                log.error("CreateAcls: %s cannot be written: %s", self.path, e)
                failed = AclCreateResult(int(ErrorCode.kafka_storage_error),
                                         f"the ACLs cannot be stored: {e.strerror}")
                results = [failed if r.error_code == 0 else r for r in results]
        return results

    def delete(self, filters, reply_bytes: int = 1 << 62) -> list[AclDeleteResult]:
        """Kafka's DeleteAcls: each filter answers the ACLs it matched; all of them go in one
        commit (an ACL two filters match is listed by both). Nothing is deleted when that would
        be more than MAX_ACLS_PER_OPERATION ACLs, or an answer of more than ``reply_bytes``."""
        results: list[AclDeleteResult] = []
        gone: set[AclBinding] = set()
        for f in filters:
            bad = validate_filter(f)
            if bad is not None:
                results.append(AclDeleteResult(int(bad[0]), bad[1]))
                continue
            matched = self.snapshot.matching(f)
            gone.update(matched)
            results.append(AclDeleteResult(0, None, matched))
        if len(gone) > MAX_ACLS_PER_OPERATION or (
                gone and len(_encoder.encode(results)) > reply_bytes):
            # Kafka's controller: "Cannot remove more than 10000 acls in a single delete
            # operation" (a BoundedListTooLongException, UNKNOWN_SERVER_ERROR for the client).
            refused = AclDeleteResult(int(ErrorCode.unknown_server_error), (
                f"Cannot remove more than {MAX_ACLS_PER_OPERATION} acls in a single delete "
                f"operation ({len(gone)} matched); narrow the filters")[:MESSAGE_MAX])
            return [refused if r.error_code == 0 else r for r in results]
        if gone:
            try:
                self._commit(a for a in self.snapshot.acls if a not in gone)
            except OSError as e:
                log.error("DeleteAcls: %s cannot be written: %s", self.path, e)
                failed = AclDeleteResult(int(ErrorCode.kafka_storage_error),
                                         f"the ACLs cannot be stored: {e.strerror}")
                results = [failed if r.error_code == 0 else r for r in results]
        return results


class AclService:
    """The supervisor's CreateAcls/DeleteAcls service: change, commit, publish, then answer."""

    def __init__(self, store: AclStore, published_path: str,
                 publish_version: Callable[[int], None], reply_bytes: int = 1 << 62) -> None:
        self.store = store
        self.published_path = published_path
        self._publish_version = publish_version
        self.reply_bytes = reply_bytes          # the largest answer the rings to frontends take

    def publish(self) -> None:
        publish(self.store.snapshot, self.published_path)
        self._publish_version(self.store.snapshot.version)

    @serves(CreateAclsRequest)
    def create_acls(self, req: CreateAclsRequest) -> CreateAclsResult:
        if len(req.acls) > CREATE_CHUNK:
            # The frontends never send more (CreateAcls handler); an answer this long might not
            # fit the ring back.
            return req.error_reply(ErrorCode.invalid_request)
        before = self.store.snapshot
        results = self.store.create(req.acls)
        if self.store.snapshot is not before:
            self.publish()
        return CreateAclsResult(results)

    @serves(DeleteAclsRequest)
    def delete_acls(self, req: DeleteAclsRequest) -> DeleteAclsResult:
        before = self.store.snapshot
        results = self.store.delete(req.filters, self.reply_bytes)
        if self.store.snapshot is not before:
            self.publish()
        return DeleteAclsResult(results)


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(tuple[int, list[AclBinding]])


def publish(snapshot: AclSnapshot, path: str) -> None:
    """Write the snapshot for the frontends (runtime dir, tmpfs: no fsync)."""
    atomic_write(path, _encoder.encode((snapshot.version, list(snapshot.acls))), sync=False)


def read_published(path: str) -> AclSnapshot:
    with open(path, "rb") as f:
        version, acls = _decoder.decode(f.read())
    return AclSnapshot(version, acls)


class AclView:
    """A frontend's view of the published ACLs: ``view()`` is the current snapshot."""

    __slots__ = ("path", "_page", "_seq", "_version", "snapshot")

    def __init__(self, path: str, supervisor_page) -> None:
        self.path = path
        self._page = supervisor_page
        self._seq = -1
        self._version = -1
        self.snapshot = AclSnapshot()

    def __call__(self) -> AclSnapshot:
        seq = self._page.seq
        if seq == self._seq:
            return self.snapshot
        version = self._page.read().acl_version
        if version != self._version:
            try:
                self.snapshot = read_published(self.path)
            except FileNotFoundError:
                return self.snapshot          # not published yet: look again next time
            self._version = version
        self._seq = seq
        return self.snapshot
