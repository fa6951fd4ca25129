"""appliance.http: the request parser and the keep-alive connection loop that the metrics server
and the console both serve with. The loop runs on asyncio streams over an in-process socket
pair (no process, no port): requests one after another on one connection, a 405 that keeps it,
a head that cannot be read closing it, a handler's bug costing one request a 500."""

from __future__ import annotations

import asyncio
import logging
import re
import socket

import pytest

from appliance.http import (BadRequest, Response, encode, not_allowed, parse_head,
                            serve_connection)

log = logging.getLogger("test_http")


def test_keep_alive_follows_the_version_and_the_connection_header():
    for head, keep in [(b"GET / HTTP/1.1\r\n\r\n", True),
                       (b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n", False),
                       (b"GET / HTTP/1.0\r\n\r\n", False),
                       (b"GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n", True)]:
        assert parse_head(head)[0].keep_alive is keep, head


def test_a_body_longer_than_the_workers_limit_is_refused_413():
    parse_head(b"GET / HTTP/1.1\r\nContent-Length: 100\r\n\r\n", max_body=100)
    with pytest.raises(BadRequest) as e:
        parse_head(b"GET / HTTP/1.1\r\nContent-Length: 101\r\n\r\n", max_body=100)
    assert e.value.status == 413


def test_a_method_not_served_is_405_with_its_allow_list():
    req, _ = parse_head(b"DELETE /x HTTP/1.1\r\n\r\n")
    r = not_allowed(req, ("GET", "HEAD"))
    assert r.status == 405 and ("Allow", "GET, HEAD") in r.headers and r.body == b"only GET and HEAD\n"
    assert not_allowed(parse_head(b"HEAD / HTTP/1.1\r\n\r\n")[0], ("GET", "HEAD")) is None


def test_a_head_answer_has_the_bodys_length_and_no_body():
    out = encode(Response(200, b"12345"), True, head_only=True, fixed=[("X-A", "b")])
    assert out.endswith(b"\r\n\r\n") and b"Content-Length: 5\r\n" in out and b"X-A: b\r\n" in out


def _exchange(handle, sent: bytes, methods=("GET", "HEAD")) -> bytes:
    """Everything the loop answers to ``sent`` until it closes the connection."""
    async def run() -> bytes:
        ours, theirs = socket.socketpair()
        reader, writer = await asyncio.open_connection(sock=theirs)
        served = asyncio.ensure_future(serve_connection(
            reader, writer, handle, methods=methods, stopping=lambda: False, log=log,
            fixed=[("X-Worker", "test")], idle_s=5))
        r, w = await asyncio.open_connection(sock=ours)
        w.write(sent)
        await w.drain()
        got = await asyncio.wait_for(r.read(), 5)      # until the loop closes
        await served
        w.close()
        return got
    return asyncio.run(run())


def _statuses(got: bytes) -> list[int]:
    return [int(m) for m in re.findall(rb"HTTP/1\.1 (\d{3}) ", got)]


def test_requests_follow_each_other_on_one_connection_until_one_asks_to_close():
    seen = []

    def handle(req):
        seen.append((req.method, req.path))
        if req.path == "/bug":
            raise RuntimeError("a bug")
        return Response.text(200, f"page {req.path}\n")

    got = _exchange(handle, b"GET /a HTTP/1.1\r\n\r\n"
                            b"DELETE /a HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc"
                            b"GET /bug HTTP/1.1\r\n\r\n"
                            b"HEAD /b HTTP/1.1\r\n\r\n"
                            b"GET /c HTTP/1.1\r\nConnection: close\r\n\r\n"
                            b"GET /never HTTP/1.1\r\n\r\n")
    assert _statuses(got) == [200, 405, 500, 200, 200]
    assert seen == [("GET", "/a"), ("GET", "/bug"), ("HEAD", "/b"), ("GET", "/c")]
    assert got.count(b"X-Worker: test\r\n") == 5 and b"Allow: GET, HEAD\r\n" in got
    assert b"page /a\n" in got and b"page /b\n" not in got and got.endswith(b"page /c\n")


def test_a_head_that_cannot_be_read_is_answered_400_and_the_connection_closed():
    got = _exchange(lambda req: Response.text(200, "no\n"),
                    b"NOT HTTP\r\n\r\nGET / HTTP/1.1\r\n\r\n")
    assert _statuses(got) == [400] and b"Connection: close\r\n" in got
    assert got.endswith(b"bad request line\n")
