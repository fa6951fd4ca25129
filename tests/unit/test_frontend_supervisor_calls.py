"""workers.frontend.broker.Broker.call_supervisor: a supervisor that does not answer in time is a
REQUEST_TIMED_OUT answer, not an exception (no fork: a recording channel stands in for the ring).

Regression: a 1,024-partition CreateTopics kept the supervisor forking writers for longer than the
frontend's 70 s wait; the TimeoutError reached the connection, which closed the client's
connection instead of answering (Kafka answers REQUEST_TIMED_OUT when its controller is slower
than the request, and the topic is still created)."""

from __future__ import annotations

import asyncio
import itertools

from appliance import ipc
from appliance.catalog.messages import CreateTopicsRequest, NewTopic
from appliance.errors import ErrorCode
from workers.frontend.broker import Broker


class Channel:
    def __init__(self) -> None:
        self.sent: list[bytes] = []

    def send(self, raw: bytes) -> None:
        self.sent.append(raw)


def _broker(loop) -> Broker:
    b = object.__new__(Broker)          # only what call_supervisor touches
    b.loop = loop
    b.futures = {}
    b._ids = itertools.count(1)
    b.supervisor = Channel()
    return b


def test_create_topics_the_supervisor_does_not_answer_in_time_is_request_timed_out():
    async def run():
        b = _broker(asyncio.get_running_loop())
        req = CreateTopicsRequest([NewTopic("a", 1), NewTopic("b", 2)])
        resp = await b.call_supervisor(req, 0.01)
        assert len(b.supervisor.sent) == 1 and not b.futures
        return resp
    resp = asyncio.run(run())
    assert [(r.name, r.error_code) for r in resp.results] == [
        ("a", int(ErrorCode.request_timed_out)), ("b", int(ErrorCode.request_timed_out))]


def test_an_answer_in_time_is_returned():
    async def run():
        b = _broker(asyncio.get_running_loop())
        call = asyncio.ensure_future(b.call_supervisor(CreateTopicsRequest([NewTopic("a", 1)]), 5))
        await asyncio.sleep(0)
        req_id, _ = ipc.decode(b.supervisor.sent[0])
        b.futures.pop(req_id).set_result("answer")
        return await call
    assert asyncio.run(run()) == "answer"
