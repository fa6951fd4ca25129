"""The SCRAM credential store: which users exist and their credentials per mechanism.

Owned (read-write) by the supervisor alone while the appliance runs, following the topic
catalog's pattern: durable as ``<data_dir>/credentials.json`` (mode 0600, replaced atomically:
write, fsync, rename, fsync the directory), published to the runtime dir as
``credentials.msgpack`` for the frontends, whose ``CredentialsView`` reloads it when the
``credentials_version`` of the supervisor's state page moves. Frontends change it by sending
``AlterScramCredentialsRequest`` (AlterUserScramCredentials, key 51) to the supervisor, which
serves it here (``alter``) with the rules of Kafka's controller (ScramControlManager).

Offline (``appliance users`` without ``--bootstrap-server``, as ``kafka-storage format
--add-scram`` does before a first start) the CLI is the owner instead: it takes the data dir's
lock (``<data_dir>/.lock``, the one a running supervisor holds), so the two never write at once.

Only credentials are stored (salt, stored key, server key, iterations); a password never is.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import fcntl
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass

import msgspec

from appliance.errors import ErrorCode
from appliance.security.messages import AlterScramCredentialsRequest, Deletion, Upsertion, UserResult
from appliance.durable import atomic_write, verify_checksum, with_checksum
from appliance.security.scram import (BY_TYPE, MAX_ITERATIONS, MIN_ITERATIONS, ScramCredential,
                                      from_salted_password)

CREDENTIALS_FILE = "credentials.json"
PUBLISHED_FILE = "credentials.msgpack"
LOCK_FILE = ".lock"

# user -> mechanism name -> credential
Users = dict[str, dict[str, ScramCredential]]


@dataclass
class _Error:
    code: ErrorCode
    message: str


def _check_name_and_mechanism(name: str, mechanism: int) -> _Error | None:
    if not name:
        return _Error(ErrorCode.unacceptable_credential, "Username must not be empty")
    if mechanism not in BY_TYPE:
        return _Error(ErrorCode.unsupported_sasl_mechanism, "Unknown SCRAM mechanism")
    return None


def alter(users: Users, req: AlterScramCredentialsRequest) -> tuple[Users, list[UserResult]]:
    """Kafka's controller rules (ScramControlManager.alterCredentials): a user named twice in
    one request is DUPLICATE_RESOURCE, deleting a credential that is not there
    RESOURCE_NOT_FOUND, an iteration count outside 4096..16384 UNACCEPTABLE_CREDENTIAL. Returns
    the new users and the results (successful deletions, successful upsertions, then errors)."""
    to_delete: dict[str, Deletion] = {}
    to_upsert: dict[str, Upsertion] = {}
    errors: dict[str, _Error] = {}
    for d in req.deletions:
        if d.name in errors:
            continue
        if to_delete.pop(d.name, None) is not None:
            errors[d.name] = _Error(ErrorCode.duplicate_resource,
                                    "A user credential cannot be altered twice in the same request")
            continue
        err = _check_name_and_mechanism(d.name, d.mechanism)
        if err is None and BY_TYPE[d.mechanism] not in users.get(d.name, {}):
            err = _Error(ErrorCode.resource_not_found,
                         "Attempt to delete a user credential that does not exist")
        if err is not None:
            errors[d.name] = err
        else:
            to_delete[d.name] = d
    for u in req.upsertions:
        if u.name in errors:
            continue
        if to_delete.pop(u.name, None) is not None or to_upsert.pop(u.name, None) is not None:
            errors[u.name] = _Error(ErrorCode.duplicate_resource,
                                    "A user credential cannot be altered twice in the same request")
            continue
        err = _check_name_and_mechanism(u.name, u.mechanism)
        if err is None and u.iterations < MIN_ITERATIONS:
            err = _Error(ErrorCode.unacceptable_credential, "Too few iterations")
        elif err is None and u.iterations > MAX_ITERATIONS:
            err = _Error(ErrorCode.unacceptable_credential, "Too many iterations")
        if err is not None:
            errors[u.name] = err
        else:
            to_upsert[u.name] = u
    new = {name: dict(creds) for name, creds in users.items()}
    results = []
    for d in to_delete.values():
        creds = new.get(d.name, {})
        creds.pop(BY_TYPE[d.mechanism], None)
        if not creds:
            new.pop(d.name, None)
        results.append(UserResult(d.name, 0))
    for u in to_upsert.values():
        mech = BY_TYPE[u.mechanism]
        new.setdefault(u.name, {})[mech] = from_salted_password(mech, u.salt, u.salted_password,
                                                               u.iterations)
        results.append(UserResult(u.name, 0))
    for name, e in errors.items():
        results.append(UserResult(name, int(e.code), e.message))
    return new, results


# -- the durable file ------------------------------------------------------------------------------

def _b64(b: bytes) -> str:
    return base64.b64encode(b).decode()


class CredentialStore:
    """``<data_dir>/credentials.json``; the supervisor's (or the offline CLI's, under the data
    dir's lock). Single-threaded."""

    def __init__(self, data_dir: str) -> None:
        self.path = os.path.join(data_dir, CREDENTIALS_FILE)
        self.version = 0
        self.users: Users = {}

    def load(self) -> Users:
        try:
            with open(self.path, "rb") as f:
                raw = verify_checksum(json.load(f))
        except FileNotFoundError:
            return self.users
        self.version = int(raw.get("version", 0))
        self.users = {
            name: {mech: ScramCredential(base64.b64decode(c["salt"]),
                                         base64.b64decode(c["stored_key"]),
                                         base64.b64decode(c["server_key"]), int(c["iterations"]))
                   for mech, c in creds.items()}
            for name, creds in raw.get("users", {}).items()}
        return self.users

    def save(self, users: Users) -> None:
        """Commit ``users`` (the commit point of an alteration); OSError leaves the old file."""
        raw = {"version": self.version + 1,
               "users": {name: {mech: {"salt": _b64(c.salt), "stored_key": _b64(c.stored_key),
                                       "server_key": _b64(c.server_key),
                                       "iterations": c.iterations}
                                for mech, c in sorted(creds.items())}
                         for name, creds in sorted(users.items())}}
        atomic_write(self.path, json.dumps(with_checksum(raw), indent=1).encode(), mode=0o600)
        self.version += 1
        self.users = users

    def alter(self, req: AlterScramCredentialsRequest) -> list[UserResult]:
        new, results = alter(self.users, req)
        if any(r.error_code == 0 for r in results):
            try:
                self.save(new)
            except OSError as e:
                if e.errno not in (errno.ENOSPC, errno.EDQUOT):
                    raise
                return [UserResult(r.user, int(ErrorCode.kafka_storage_error),
                                   "the data dir's file system is full")
                        if r.error_code == 0 else r for r in results]
        return results


def publish(users: Users, path: str) -> None:
    """Write the credentials for the frontends (runtime dir, tmpfs, owner-only)."""
    atomic_write(path, msgspec.msgpack.encode(users), sync=False, mode=0o600)


def read_published(path: str) -> Users:
    with open(path, "rb") as f:
        return msgspec.msgpack.decode(f.read(), type=Users)


class CredentialsView:
    """A frontend's read-only view; reloads when the supervisor's page shows a new version."""

    def __init__(self, path: str, version_source) -> None:
        self.path = path
        self._version_source = version_source
        self.users: Users = {}
        self._seen = -1

    def get(self) -> Users:
        v = self._version_source()
        if v != self._seen:
            try:
                self.users = read_published(self.path)
            except FileNotFoundError:
                return self.users
            self._seen = v
        return self.users


# -- offline ownership --------------------------------------------------------------------------

class DataDirInUse(Exception):
    """A running appliance holds the data dir's lock."""


class DamagedStore(Exception):
    """The credential file does not parse or match its checksum (the message names it)."""


@contextlib.contextmanager
def offline_store(data_dir: str) -> Iterator[CredentialStore]:
    """The store of a data dir no appliance is running on, under its lock (made if missing)."""
    os.makedirs(data_dir, exist_ok=True)
    fd = os.open(os.path.join(data_dir, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise DataDirInUse(f"an appliance is running on {data_dir} (it holds {LOCK_FILE}): "
                               f"manage users online with --bootstrap-server") from None
        store = CredentialStore(data_dir)
        try:
            store.load()
        except (ValueError, KeyError, TypeError) as e:
            # A damaged file (issue 34) is never written over: the operator restores it.
            raise DamagedStore(f"the SCRAM credentials {store.path} cannot be read: {e}; restore "
                               "the file from a backup") from None
        yield store
    finally:
        os.close(fd)

