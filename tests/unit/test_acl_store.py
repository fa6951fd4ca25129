"""The supervisor's ACL store: CreateAcls/DeleteAcls rules, durability, publication."""

import json
import os

import pytest

from appliance.acl.messages import CreateAclsRequest, DeleteAclsRequest
from appliance.acl.model import (AclBinding, AclFilter, AclOperation as O, AclPermissionType as A,
                                 PatternType as P, ResourceType as R)
from appliance.acl.store import ACL_FILE, AclService, AclStore, AclView, publish, read_published
from appliance.runtime import SUPERVISOR_PAGE_FIELDS, DataDirUnusable
from shm.statepage import StatePage


def acl(name="orders", op=O.READ, perm=A.ALLOW, rtype=R.TOPIC, pattern=P.LITERAL,
        principal="User:alice"):
    return AclBinding(int(rtype), name, int(pattern), principal, "*", int(op), int(perm))


def test_create_is_durable_and_idempotent(tmp_path):
    s = AclStore(str(tmp_path))
    assert [r.error_code for r in s.create([acl(), acl("g", rtype=R.GROUP)])] == [0, 0]
    v = s.snapshot.version
    assert [r.error_code for r in s.create([acl()])] == [0]       # already there: a success
    assert s.snapshot.version == v                                  # and no new commit
    again = AclStore(str(tmp_path)).load()
    assert set(again.acls) == {acl(), acl("g", rtype=R.GROUP)} and again.version == v
    on_disk = json.loads((tmp_path / ACL_FILE).read_text())
    assert {"resource_type": "Topic", "resource_name": "orders", "pattern_type": "LITERAL",
            "principal": "User:alice", "host": "*", "operation": "Read",
            "permission_type": "Allow"} in on_disk["acls"]


def test_invalid_acls_are_refused_one_by_one(tmp_path):
    s = AclStore(str(tmp_path))
    results = s.create([acl(rtype=R.CLUSTER, name="other"), acl(), acl(pattern=P.MATCH)])
    assert [r.error_code for r in results] == [42, 0, 42]          # INVALID_REQUEST
    assert "kafka-cluster" in results[0].error_message
    assert s.snapshot.acls == (acl(),)


def test_delete_answers_each_filter_with_what_it_matched(tmp_path):
    s = AclStore(str(tmp_path))
    s.create([acl(), acl("ord", pattern=P.PREFIXED), acl("g", rtype=R.GROUP)])
    results = s.delete([AclFilter(R.TOPIC, "orders", P.MATCH), AclFilter(R.TOPIC)])
    assert set(results[0].deleted) == {acl(), acl("ord", pattern=P.PREFIXED)}
    assert set(results[1].deleted) == {acl(), acl("ord", pattern=P.PREFIXED)}
    assert AclStore(str(tmp_path)).load().acls == (acl("g", rtype=R.GROUP),)
    assert s.delete([AclFilter(operation=0)])[0].error_code == 42


def test_unwritable_store_changes_nothing(tmp_path):
    s = AclStore(str(tmp_path / "gone"))       # its directory does not exist: the write fails
    results = s.create([acl()])
    assert results[0].error_code == 56                              # KAFKA_STORAGE_ERROR
    assert s.snapshot.acls == ()


def test_unreadable_file_stops_the_start(tmp_path):
    (tmp_path / ACL_FILE).write_text('{"version": 1, "acls": [{"resource_type": "Topic"}]}')
    with pytest.raises(DataDirUnusable):
        AclStore(str(tmp_path)).load()
    (tmp_path / ACL_FILE).write_text("not json")
    with pytest.raises(DataDirUnusable):
        AclStore(str(tmp_path)).load()


def test_service_publishes_before_answering_and_the_view_follows(tmp_path):
    page = StatePage.create(str(tmp_path / "page"), SUPERVISOR_PAGE_FIELDS)
    reader = StatePage.open(str(tmp_path / "page"), SUPERVISOR_PAGE_FIELDS, readonly=True)
    path = str(tmp_path / "acls.msgpack")
    svc = AclService(AclStore(str(tmp_path)), path, lambda v: page.publish(acl_version=v))
    view = AclView(path, reader)
    assert view().acls == ()                                         # nothing published yet
    svc.publish()
    first = view()
    assert first.acls == () and view() is first                      # unchanged: same snapshot
    r = svc.create_acls(CreateAclsRequest([acl()]))
    assert r.results[0].error_code == 0
    assert view().acls == (acl(),)                                   # visible once answered
    r = svc.delete_acls(DeleteAclsRequest([AclFilter()]))
    assert r.results[0].deleted == [acl()] and view().acls == ()
    assert read_published(path).version == svc.store.snapshot.version
    page.close()
    reader.close()


def test_published_snapshot_round_trips(tmp_path):
    s = AclStore(str(tmp_path))
    s.create([acl(), acl("t", op=O.TWO_PHASE_COMMIT, rtype=R.TRANSACTIONAL_ID)])
    publish(s.snapshot, str(tmp_path / "p"))
    assert read_published(str(tmp_path / "p")).acls == s.snapshot.acls
    assert os.path.exists(tmp_path / "p")


def test_delete_refuses_an_answer_too_large_and_deletes_nothing(tmp_path):
    s = AclStore(str(tmp_path))
    s.create([acl(f"topic-{i}") for i in range(50)])
    refused = s.delete([AclFilter()], reply_bytes=500)
    assert refused[0].error_code == -1 and refused[0].deleted == []      # UNKNOWN_SERVER_ERROR
    assert len(s.snapshot) == 50
    assert len(s.delete([AclFilter()], reply_bytes=1 << 20)[0].deleted) == 50


def test_service_refuses_a_create_chunk_above_the_bound(tmp_path):
    from appliance.acl.store import CREATE_CHUNK
    svc = AclService(AclStore(str(tmp_path)), str(tmp_path / "p"), lambda v: None)
    r = svc.create_acls(CreateAclsRequest([acl(f"t{i}") for i in range(CREATE_CHUNK + 1)]))
    assert {x.error_code for x in r.results} == {42}
    assert len(svc.store.snapshot) == 0
