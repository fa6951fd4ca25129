"""appliance.api.produce with batches that are views of a connection's receive buffer.

The buffer is reused once the read is handled, so a request is sent to the writers before
``handle`` returns (its batches never copied), unless it gives the event loop back: one behind an
earlier request of the connection still unsent copies its batches before it returns, and one that
paces itself (thousands of partitions) copies them at its first rest. What a later read writes
into the buffer never reaches a writer.
"""

from __future__ import annotations

import asyncio
import datetime

from appliance.quota.rates import ClientQuotas
from appliance.acl.authorizer import Authorizer
from appliance.api import RequestContext
import pytest

from appliance.api import produce
from appliance.api.produce import YIELD_EVERY, handle
from appliance.catalog.model import Catalog, TopicInfo
from appliance.config import Config
from appliance.ipc import ProduceResult
from appliance.protocol.produce_request import PartitionData, ProduceRequestView, TopicData
from appliance.protocol.records import Record, build_batch
from shm.metrics import MetricsTable
from workers.frontend.metrics import FrontendMetrics


class Conn:
    principal = "User:ANONYMOUS"
    host = "127.0.0.1"

    def __init__(self) -> None:
        self.produce_order = None


class Header:
    api_key, api_version = 0, 9


class Broker:
    cfg = Config()
    catalog = Catalog(1, {"t": TopicInfo("t", b"t" * 16, 2 * YIELD_EVERY)})
    counters = FrontendMetrics(MetricsTable.anonymous(256))
    authorizer = Authorizer(False, (), False, None)
    quotas = ClientQuotas()        # none configured (appliance.quota.rates)

    def __init__(self) -> None:
        self.sent: list[tuple[int, object, bytes]] = []     # (partition, batch object, its bytes)

    def produce(self, info, partition, acks, batch, timeout_s, version, txn_id):
        self.sent.append((partition, batch, bytes(batch)))
        fut = asyncio.get_running_loop().create_future()
        fut.set_result(ProduceResult(0, base_offset=len(self.sent) - 1))
        return fut


def request(buffer: bytearray, partitions: int) -> tuple[ProduceRequestView, bytes]:
    """A request whose batches are views of ``buffer`` (as the parser makes them)."""
    batch = build_batch([Record(key=None, value=b"v" * 50)])
    buffer[:] = batch * partitions
    view = memoryview(buffer).toreadonly()
    n = len(batch)
    parts = [PartitionData(i, view[i * n:(i + 1) * n]) for i in range(partitions)]
    return ProduceRequestView(None, 1, datetime.timedelta(seconds=5), [TopicData("t", parts)]), batch


async def finish(result):
    return await result if asyncio.iscoroutine(result) else result


def test_a_small_request_is_sent_before_handle_returns_without_a_copy():
    async def scenario():
        broker, buffer = Broker(), bytearray()
        req, batch = request(buffer, 3)
        result = handle(RequestContext(broker, Conn(), Header()), req)
        # Sent already, the views themselves (no copy); only the acks are awaited.
        assert [p for p, _, _ in broker.sent] == [0, 1, 2]
        assert all(type(b) is memoryview and data == batch for _, b, data in broker.sent)
        assert isinstance(await finish(result), (bytes, list))
    asyncio.run(scenario())


@pytest.fixture
def paced(monkeypatch):
    """Every request of YIELD_EVERY partitions or more rests at its YIELD_EVERY-th."""
    monkeypatch.setattr(produce, "YIELD_AFTER_S", -1.0)


def test_a_request_of_many_partitions_that_does_not_rest_is_sent_without_a_copy():
    """Regression: every request of YIELD_EVERY partitions or more copied its batches up front
    in case it paced itself (a tenth of the frontend's CPU at 256 partitions and 1 KiB)."""
    async def scenario():
        broker, buffer = Broker(), bytearray()
        req, batch = request(buffer, 2 * YIELD_EVERY)
        result = handle(RequestContext(broker, Conn(), Header()), req)
        assert [p for p, _, _ in broker.sent] == list(range(2 * YIELD_EVERY))
        assert all(type(b) is memoryview and data == batch for _, b, data in broker.sent)
        await finish(result)
    asyncio.run(scenario())


def rest_at(monkeypatch, n: int) -> None:
    """The request rests once, at the ``n``-th look at its pace (a look before each partition
    it validates, then before each it sends)."""
    looks = iter(range(1, 1 << 30))
    monkeypatch.setattr(produce._Pace, "due", lambda self: next(looks) == n)


@pytest.mark.parametrize("where", ["validating", "sending"])
def test_a_request_that_rests_owns_its_batches_before_handle_returns(monkeypatch, where):
    async def scenario():
        broker, buffer = Broker(), bytearray()
        partitions = 6
        # Validating: at the fourth partition. Sending: after two partitions went out as views.
        rest_at(monkeypatch, 4 if where == "validating" else partitions + 3)
        req, batch = request(buffer, partitions)
        result = handle(RequestContext(broker, Conn(), Header()), req)
        assert asyncio.iscoroutine(result)
        before = 0 if where == "validating" else 2
        assert [type(b) for _, b, _ in broker.sent] == [memoryview] * before
        buffer[:] = b"\0" * len(buffer)               # the connection's next read reuses it
        await result
        assert [p for p, _, _ in broker.sent] == list(range(partitions))
        assert [type(b) for _, b, _ in broker.sent[before:]] == [bytes] * (partitions - before)
        assert all(data == batch for _, _, data in broker.sent)
    asyncio.run(scenario())


def test_a_small_request_behind_an_unsent_one_waits_its_turn_with_its_own_copy(paced):
    """The first request (many partitions) rested, and is sent by a task that has not started
    when the second one arrives in the same read: the second must neither overtake it nor keep
    views."""
    async def scenario():
        broker, conn = Broker(), Conn()
        big_buffer, small_buffer = bytearray(), bytearray()
        big, batch = request(big_buffer, YIELD_EVERY)
        small, small_batch = request(small_buffer, 1)
        first = handle(RequestContext(broker, conn, Header()), big)
        second = handle(RequestContext(broker, conn, Header()), small)
        assert asyncio.iscoroutine(first) and asyncio.iscoroutine(second) and broker.sent == []
        small_buffer[:] = b"\0" * len(small_buffer)
        tasks = [asyncio.ensure_future(first), asyncio.ensure_future(second)]
        await asyncio.gather(*tasks)
        assert [p for p, _, _ in broker.sent] == list(range(YIELD_EVERY)) + [0]
        assert [data for _, _, data in broker.sent] == [batch] * YIELD_EVERY + [small_batch]
        assert conn.produce_order is None
        # Nothing pending any more: the next small request is sent at once again.
        result = handle(RequestContext(broker, conn, Header()), request(bytearray(), 1)[0])
        assert len(broker.sent) == YIELD_EVERY + 2
        await finish(result)
    asyncio.run(scenario())
