"""Typed services: how a worker serves the requests its rings bring.

Imported by every worker that serves ring requests (coordinator, fetchers, partition writers, the
supervisor); owns nothing but each worker's table of handlers. A *service* is any object whose
methods carry ``@serves(RequestType)``; ``Registry(*services, post=...)`` collects them, and
serving a message is one dict lookup by its type (as Kafka's KafkaApis picks a handler by API key):

    ring --bytes--> Registry.handle(src, raw) --decode--> (request id, body)
                         |  handlers[type(body)]
                         v
              method(body) -> result           plain: the result is posted back at once
              method(body, respond)            late=True: ``respond(result)`` now or later
                         |
                         +--> post(src, request id, result)  (the worker's outbox to ``src``)

Late answers are JoinGroup and SyncGroup (answered when the rebalance completes), a parked Fetch
long-poll, a CreateTopics waiting for its writers, a marker waiting for its group commit, an
AddPartitionsToTxn waiting for the markers of its producer's previous transaction: the
method keeps the ``Responder`` and calls it exactly once. A method that raises costs only its
request: the caller gets ``body.error_reply(UNKNOWN_SERVER_ERROR)`` (Kafka's getErrorResponse),
unless the worker asked for errors to propagate (``contain=False``: the partition writer and the
supervisor, which stop rather than go on with state they can no longer trust). A message that is
not a ``Request`` is the answer to something this worker sent: it goes to ``on_answer(request
id, body)``.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from appliance import ipc
from appliance.errors import ErrorCode
from appliance.ipc import Message, Request

__all__ = ["serves", "Responder", "Registry"]

log = logging.getLogger("appliance.service")

Post = Callable[[str, int, Message], None]


def serves(request_type: type[Request], *, late: bool = False) -> Callable:
    """Mark a method as the handler of ``request_type``: called as ``method(request)`` returning
    the answer (None: no answer), or with ``late=True`` as ``method(request, respond)``."""
    if not (isinstance(request_type, type) and issubclass(request_type, Request)):
        raise TypeError(f"@serves wants a Request subclass, not {request_type!r}")

    def mark(fn: Callable) -> Callable:
        fn.__serves__ = (request_type, late)
        return fn
    return mark


class Responder:
    """Answers one request, once: to the worker ``src`` under its request id."""

    __slots__ = ("src", "req_id", "_post", "done")

    def __init__(self, post: Post, src: str, req_id: int) -> None:
        self.src = src
        self.req_id = req_id
        self._post = post
        self.done = False

    def __call__(self, result: Message | None) -> None:
        if self.done:
            log.error("second answer to request %d from %s dropped", self.req_id, self.src)
            return
        self.done = True
        if result is not None:
            self._post(self.src, self.req_id, result)


class Registry:
    def __init__(self, *services: Any, post: Post,
                 on_answer: Callable[[int, Message], None] | None = None,
                 contain: bool = True) -> None:
        self._post = post
        self._on_answer = on_answer
        self._contain = contain
        self.handlers: dict[type, tuple[Callable, bool]] = {}
        for service in services:
            for name in dir(type(service)):
                mark = getattr(getattr(type(service), name, None), "__serves__", None)
                if mark is None:
                    continue
                request_type, late = mark
                if request_type in self.handlers:
                    raise ValueError(f"two handlers for {request_type.__name__}")
                self.handlers[request_type] = (getattr(service, name), late)

    def handle(self, src: str, raw: bytes | memoryview) -> None:
        """Decode one envelope from ``src`` and serve it."""
        try:
            req_id, body = ipc.decode(raw)
        except Exception:
            log.exception("undecodable message from %s dropped", src)
            return
        self.dispatch(src, req_id, body)

    def dispatch(self, src: str, req_id: int, body: Message) -> None:
        entry = self.handlers.get(type(body))
        if entry is None:
            if not isinstance(body, Request) and self._on_answer is not None:
                self._on_answer(req_id, body)
                return
            # A message this worker has no handler for is a bug in the sender's routing: answer
            # at once rather than let the sender wait for its timeout.
            log.error("unexpected %s from %s", type(body).__name__, src)
            if isinstance(body, Request):
                Responder(self._post, src, req_id)(body.error_reply(ErrorCode.unknown_server_error))
            return
        method, late = entry
        respond = Responder(self._post, src, req_id)
        if not self._contain:
            self._call(method, late, body, respond)
            return
        try:
            self._call(method, late, body, respond)
        except Exception:
            log.exception("%s %d from %s failed", type(body).__name__, req_id, src)
            if not respond.done:
                respond(body.error_reply(ErrorCode.unknown_server_error))

    @staticmethod
    def _call(method: Callable, late: bool, body: Message, respond: Responder) -> None:
        if late:
            method(body, respond)
        else:
            respond(method(body))
