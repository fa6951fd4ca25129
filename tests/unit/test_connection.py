"""workers.frontend.connection: what reaches the client when a request goes wrong, with a
recording transport in place of the socket (no fork, no broker).

Kafka reads a connection's next request only after answering the previous one, so every request
before a bad one is answered, then the connection is closed; an answer that cannot be encoded
closes the connection instead of leaving the client waiting.
"""

from __future__ import annotations

import asyncio
import struct

import pytest

from appliance.quota.rates import ClientQuotas
from appliance.api import REGISTRY, Api, CloseConnection, load_handlers
from appliance.config import Config
from appliance.listeners import Listener
from appliance.runtime import BoundListener
from shm.metrics import MetricsTable
from workers.frontend.connection import KafkaConnection
from workers.frontend.metrics import FrontendMetrics

TEST_KEY = 18          # requests use ApiVersions' framing; the handler is swapped per test


class Transport:
    def __init__(self) -> None:
        self.written = bytearray()
        self.closed = False
        self.aborted = False
        self.reading = True

    def get_extra_info(self, name):
        return ("127.0.0.1", 1234) if name == "peername" else None

    def writelines(self, parts) -> None:
        assert not (self.closed or self.aborted), "write after close"
        for p in parts:
            self.written += p

    def write(self, data) -> None:
        self.writelines([data])

    def set_write_buffer_limits(self, high=None, low=None) -> None:
        pass

    def is_closing(self) -> bool:
        return self.closed or self.aborted

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def answers(self) -> list[int]:
        """Correlation ids of the frames written."""
        out, pos = [], 0
        while pos < len(self.written):
            (size,) = struct.unpack_from(">i", self.written, pos)
            out.append(struct.unpack_from(">i", self.written, pos + 4)[0])
            pos += 4 + size
        return out


class Broker:
    cfg = Config()
    endpoints = {"PLAINTEXT": ("127.0.0.1", 9092), "SASL_PLAINTEXT": ("127.0.0.1", 9093)}
    users: dict = {}
    quotas = ClientQuotas()        # none configured (appliance.quota.rates)

    def next_fetcher(self) -> int:
        return 0

    def scram_credentials(self, user):
        return self.users.get(user)


class Server:
    def __init__(self) -> None:
        self.broker = Broker()
        self.connections: set = set()
        self.draining = False
        self.api_ranges = {}
        self.principal_rules = []
        self.oauth_validator = None
        self.table = MetricsTable.anonymous(256)
        self.counters = FrontendMetrics(self.table)

    def connection_closed(self, conn) -> None:
        self.connections.discard(conn)


PLAINTEXT = BoundListener(Listener("PLAINTEXT", "PLAINTEXT", "127.0.0.1", 9092), -1, 9092)


def feed(conn: KafkaConnection, data: bytes) -> None:
    """What asyncio's transport does for a BufferedProtocol: the socket reads into the
    protocol's buffer, then buffer_updated."""
    while data:
        buf = conn.get_buffer(-1)
        n = min(len(buf), len(data))
        buf[:n] = data[:n]
        data = data[n:]
        conn.buffer_updated(n)


def frame(correlation: int) -> bytes:
    body = struct.pack(">hhih", TEST_KEY, 0, correlation, -1)
    return struct.pack(">i", len(body)) + body


GARBAGE = struct.pack(">i", 8) + struct.pack(">hhi", 9999, 0, 99)   # unknown api key


@pytest.fixture
def handler():
    """Install a handler for TEST_KEY v0 for the test; put the real one back after."""
    load_handlers()
    saved = REGISTRY[TEST_KEY]

    def install(fn):
        REGISTRY[TEST_KEY] = Api(TEST_KEY, "Test", 0, 0, fn)
    yield install
    REGISTRY[TEST_KEY] = saved


def connect(bound: BoundListener = PLAINTEXT) -> tuple[KafkaConnection, Transport]:
    conn = KafkaConnection(Server(), bound)
    t = Transport()
    conn.connection_made(t)
    return conn, t


def test_requests_before_garbage_in_the_same_read_are_answered_then_closed(handler):
    handler(lambda ctx, req: b"")
    conn, t = connect()
    feed(conn, frame(1) + frame(2) + GARBAGE + frame(4))
    assert t.answers() == [1, 2]
    assert t.closed and not t.aborted and not t.reading


def test_garbage_behind_a_pending_answer_closes_after_that_answer(handler):
    async def run():
        gate = asyncio.get_running_loop().create_future()

        async def slow(ctx, req):
            await gate
            return b""
        handler(slow)
        conn, t = connect()
        feed(conn, frame(1) + GARBAGE)
        await asyncio.sleep(0)
        assert t.answers() == [] and not t.closed      # the answer to 1 is still owed
        feed(conn, frame(5))                   # read no more after the bad frame
        gate.set_result(None)
        while not t.closed:
            await asyncio.sleep(0)
        assert t.answers() == [1]
    asyncio.run(run())


def test_an_answer_that_cannot_be_encoded_closes_the_connection(handler):
    """Regression: an encoding failure in an async handler's completion left the connection
    open and the client waiting for an answer forever."""
    async def run():
        calls = []

        async def unencodable(ctx, req):
            calls.append(1)
            if len(calls) == 2:
                return object()       # not bytes, not a kio entity: the encoder raises
            return b""
        handler(unencodable)
        conn, t = connect()
        feed(conn, frame(1) + frame(2) + frame(3))
        while not t.closed:
            await asyncio.sleep(0)
        assert t.answers() == [1]
    asyncio.run(run())


def test_a_handler_that_raises_closes_after_earlier_answers(handler):
    def boom(ctx, req):
        if ctx.header.correlation_id == 2:
            raise RuntimeError("bug")
        return b""
    handler(boom)
    conn, t = connect()
    feed(conn, frame(1) + frame(2) + frame(3))
    assert t.answers() == [1] and t.closed


def test_close_connection_result_closes_after_earlier_answers(handler):
    handler(lambda ctx, req: CloseConnection("acks=0 failed") if ctx.header.correlation_id == 2 else b"")
    conn, t = connect()
    feed(conn, frame(1) + frame(2) + frame(3))
    assert t.answers() == [1] and t.closed and not t.aborted


def test_a_pipeline_abandoned_before_its_handlers_ran_leaves_no_unawaited_coroutine(handler):
    """Regression (frame fuzzer, abandoned pipelines): the connection was lost while the tasks of
    its pipelined requests had not yet run once; cancelling them left each handler's coroutine
    un-awaited ("RuntimeWarning: coroutine 'handle' was never awaited", an error here)."""
    import gc

    async def slow(ctx, req):
        await asyncio.sleep(10)
        return b""
    handler(slow)

    async def scenario():
        conn, t = connect()
        feed(conn, frame(1) + frame(2) + frame(3))
        assert len(conn.tasks) == 3
        conn.connection_lost(ConnectionResetError())     # before the loop ran any of them
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert not conn.tasks
    asyncio.run(scenario())
    gc.collect()


def test_a_throttled_answer_is_sent_then_the_connection_is_muted_and_served_one_at_a_time(
        handler, monkeypatch):
    """KIP-219: the response leaves first, then nothing is read for the throttle time; a
    connection whose client a quota governs is served one request at a time, as Kafka's network
    thread serves a channel."""
    import workers.frontend.connection as connection
    from appliance.quota.model import USER
    handler(lambda ctx, req: b"")
    monkeypatch.setattr(connection, "QUOTA_EXEMPT", frozenset())    # the test key is ApiVersions'

    async def run():
        conn, t = connect()
        q = conn.broker.quotas = ClientQuotas()
        q.configure({((USER, None),): {"request_percentage": 1e-9}})     # any request is over
        feed(conn, frame(1))
        assert t.answers() == [1] and conn.throttled and not t.reading and conn.serial
        feed(conn, frame(2) + frame(3))        # what the socket still had: held, not served
        assert t.answers() == [1] and len(conn.held) == 2
        conn._unmute()                         # the throttle time has passed
        assert t.answers() == [1, 2] and conn.throttled and len(conn.held) == 1
        conn._unmute()
        assert t.answers() == [1, 2, 3] and not conn.held
        conn.unmute_timer.cancel()
    asyncio.run(run())


def test_no_quota_configured_is_not_throttled_nor_serial(handler):
    handler(lambda ctx, req: b"")
    conn, t = connect()
    feed(conn, frame(1) + frame(2))
    assert t.answers() == [1, 2] and t.reading and not conn.serial


class SlowTransport(Transport):
    """A socket that takes nothing at once: every write stays in the transport's buffer until
    ``drain``, as asyncio's does when the socket is full (high-water mark 0: pause_writing at
    every buffered write, resume_writing once it is empty)."""

    def __init__(self, conn) -> None:
        super().__init__()
        self.conn = conn
        self.writes: list[int] = []
        self.buffered = 0

    def write(self, data) -> None:
        assert not (self.closed or self.aborted), "write after close"
        assert self.buffered == 0, "written while the transport's buffer was not empty"
        self.writes.append(len(data))
        self.written += data
        self.buffered = len(data)
        self.conn.pause_writing()

    def writelines(self, parts) -> None:
        raise AssertionError("plaintext answers go through write, a chunk at a time")

    def drain(self) -> None:
        self.buffered = 0
        self.conn.resume_writing()


def test_a_large_answer_leaves_a_chunk_at_a_time_in_order_then_the_close(handler):
    """Issue 39: Python 3.11's writelines joined a whole Fetch answer (27.5 MB) into one copy
    and the transport copied what the socket did not take twice more; the answer's parts are
    now handed over SEND_CHUNK at a time, only once the last one has left, in order, and a
    close waits for the last chunk."""
    from workers.frontend.connection import SEND_CHUNK
    big = memoryview(bytes(range(256)) * (3 * SEND_CHUNK // 256 + 7))
    parts = [b"a" * 10, big, b"b" * 100, b"c" * 100]
    handler(lambda ctx, req: list(parts) if ctx.header.correlation_id == 1 else b"")
    conn = KafkaConnection(Server(), PLAINTEXT)
    t = SlowTransport(conn)
    conn.connection_made(t)
    feed(conn, frame(1) + frame(2) + GARBAGE)
    assert len(t.writes) == 1 and not t.closed       # nothing more until the socket took it
    while t.buffered:
        t.drain()
    assert max(t.writes) <= SEND_CHUNK and len(t.writes) >= 4
    assert t.answers() == [1, 2] and t.closed
    body = bytes(t.written[8:8 + 10 + len(big) + 200])     # size and correlation id first
    assert body == b"".join(bytes(p) for p in parts)
