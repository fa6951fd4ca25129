"""appliance.api.produce: produce requests of one connection reach the writers in the order they
came, also when one of them gives the event loop back while validating a huge request."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from appliance.api.produce import _SendOrder


async def _request(conn, name: str, yields: int, sent: list[str]) -> None:
    order = _SendOrder(conn)
    try:
        for _ in range(yields):       # validation giving the loop back, as on thousands of partitions
            order.yielding()
            await asyncio.sleep(0)
        await order.my_turn()
        sent.append(name)             # the send phase never awaits
    finally:
        order.sent()


def test_a_request_that_yields_while_validating_is_not_overtaken():
    """Regression: a produce request validating thousands of partitions gave the loop back (so
    that the frontend's heartbeat beats); the requests pipelined behind it must still reach the
    writers after it."""
    async def scenario():
        conn = SimpleNamespace(produce_order=None)
        sent: list[str] = []
        tasks = [asyncio.ensure_future(_request(conn, name, yields, sent))
                 for name, yields in (("A", 5), ("B", 0), ("C", 2), ("D", 0), ("E", 7))]
        await asyncio.gather(*tasks)
        assert sent == ["A", "B", "C", "D", "E"]
        assert conn.produce_order is None
    asyncio.run(scenario())


def test_requests_that_never_yield_cost_no_future():
    async def scenario():
        conn = SimpleNamespace(produce_order=None)
        sent: list[str] = []
        order = _SendOrder(conn)
        assert order.mine is None and conn.produce_order is None
        await _request(conn, "A", 0, sent)
        assert sent == ["A"] and conn.produce_order is None
    asyncio.run(scenario())


def test_a_cancelled_request_lets_the_next_one_go():
    async def scenario():
        conn = SimpleNamespace(produce_order=None)
        sent: list[str] = []
        a = asyncio.ensure_future(_request(conn, "A", 1000, sent))
        b = asyncio.ensure_future(_request(conn, "B", 0, sent))
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        a.cancel()
        await asyncio.gather(a, b, return_exceptions=True)
        assert sent == ["B"] and conn.produce_order is None
    asyncio.run(scenario())
