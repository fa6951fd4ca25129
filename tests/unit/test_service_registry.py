"""The typed-service registry (appliance.service): a worker serves a ring message by one lookup of
its type; a failing method costs only its request (its own error reply); late answers go through
a responder the method keeps; answers to what the worker sent go to its answer hook."""

import pytest

from appliance import ipc
from appliance.errors import ErrorCode as E
from appliance.group.messages import (HeartbeatRequest, HeartbeatResult, JoinGroupRequest,
                                      JoinGroupResult, ListGroupsRequest, ListGroupsResult)
from appliance.service import Registry, serves
from appliance.txn.messages import EndTxnRequest, EndTxnResult, VerifyPartitionResult


class Posted(list):
    """The worker's outboxes: (destination, request id, body) as posted."""

    def __call__(self, dst, req_id, body):
        self.append((dst, req_id, body))


class Service:
    def __init__(self):
        self.held = []

    @serves(HeartbeatRequest)
    def heartbeat(self, req):
        return HeartbeatResult(E.rebalance_in_progress if req.generation_id < 3 else E.none)

    @serves(EndTxnRequest)
    def end_txn(self, req):
        raise RuntimeError("a bug")

    @serves(JoinGroupRequest, late=True)
    def join(self, req, respond):
        self.held.append(respond)

    @serves(ipc.FenceProducerRequest)
    def fence(self, req):
        return None                                    # one-way: no answer


def join_request(gid="g"):
    return JoinGroupRequest(gid, "", 10_000, 30_000, "consumer", [("range", b"m")])


@pytest.fixture
def env():
    posted = Posted()
    answers = []
    reg = Registry(Service(), post=posted, on_answer=lambda rid, body: answers.append((rid, body)))
    return reg, posted, answers


def test_dispatch_is_one_lookup_by_type_and_answers_under_the_request_id(env):
    reg, posted, _ = env
    reg.handle("fe0", ipc.encode(41, HeartbeatRequest("g", 1, "m")))
    reg.handle("fe1", ipc.encode(42, HeartbeatRequest("g", 5, "m")))
    assert posted == [("fe0", 41, HeartbeatResult(E.rebalance_in_progress)),
                      ("fe1", 42, HeartbeatResult(E.none))]
    assert set(reg.handlers) == {HeartbeatRequest, EndTxnRequest, JoinGroupRequest,
                                 ipc.FenceProducerRequest}


def test_a_method_that_raises_answers_its_requests_error_reply(env):
    reg, posted, _ = env
    reg.dispatch("fe0", 7, EndTxnRequest("t", 1, 0, True, 5))
    assert posted == [("fe0", 7, EndTxnResult(E.unknown_server_error, -1, -1))]


def test_a_request_without_handler_is_answered_at_once_with_its_error_reply(env):
    reg, posted, answers = env
    reg.dispatch("fe0", 9, ListGroupsRequest([], []))
    assert posted == [("fe0", 9, ListGroupsResult(E.unknown_server_error, []))]
    assert answers == []


def test_a_late_answer_goes_to_whoever_asked_once(env):
    reg, posted, _ = env
    svc = reg.handlers[JoinGroupRequest][0].__self__
    reg.dispatch("fe0", 1, join_request("a"))
    reg.dispatch("fe1", 2, join_request("b"))
    assert posted == [] and len(svc.held) == 2
    svc.held[1](JoinGroupResult(E.none, "m-2", 1))
    svc.held[0](JoinGroupResult(E.none, "m-1", 1))
    svc.held[0](JoinGroupResult(E.unknown_member_id))           # a second answer is dropped
    assert posted == [("fe1", 2, JoinGroupResult(E.none, "m-2", 1)),
                      ("fe0", 1, JoinGroupResult(E.none, "m-1", 1))]


def test_a_late_method_that_raises_before_answering_gets_the_error_reply():
    posted = Posted()

    class Broken:
        @serves(JoinGroupRequest, late=True)
        def join(self, req, respond):
            raise KeyError("a bug")

    Registry(Broken(), post=posted).dispatch("fe0", 3, join_request())
    assert posted == [("fe0", 3, JoinGroupResult(E.unknown_server_error))]


def test_a_one_way_request_gets_no_answer(env):
    reg, posted, _ = env
    reg.dispatch("co", 0, ipc.FenceProducerRequest(5, 2))
    assert posted == []


def test_an_answer_to_what_the_worker_sent_goes_to_its_answer_hook(env):
    reg, posted, answers = env
    reg.handle("w1.0", ipc.encode(77, VerifyPartitionResult(E.invalid_txn_state)))
    assert answers == [(77, VerifyPartitionResult(E.invalid_txn_state))] and posted == []


def test_an_undecodable_record_is_dropped(env):
    reg, posted, answers = env
    reg.handle("fe0", b"\x92\x01\x91\xa5Bogus")
    reg.handle("fe0", b"\xc1")
    assert posted == [] and answers == []


def test_contain_false_lets_the_error_stop_the_worker():
    reg = Registry(Service(), post=Posted(), contain=False)
    with pytest.raises(RuntimeError):
        reg.dispatch("fe0", 1, EndTxnRequest("t", 1, 0, True, 5))


def test_two_handlers_for_one_type_are_refused():
    class Again:
        @serves(HeartbeatRequest)
        def hb(self, req):
            return None

    with pytest.raises(ValueError, match="HeartbeatRequest"):
        Registry(Service(), Again(), post=Posted())


def test_serves_wants_a_request_type():
    with pytest.raises(TypeError):
        serves(HeartbeatResult)
