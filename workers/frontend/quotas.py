"""Connection quotas of the frontends: Kafka's max.connections and max.connections.per.ip.

Runs in each frontend process (asyncio, single thread). Owns this frontend's counts: its open
client connections and those it refused (published on its state page, ``FRONTEND_PAGE_FIELDS``),
and, when a per-IP limit is configured, its connections per address (its ``shm.conntable``
table). Every frontend accepts on the same listening socket, so a limit over the whole broker
is the sum of what all frontends publish: each reads the others' pages and tables, as Kafka's
ConnectionQuotas reads its one map. Reads and accepts of different frontends are not atomic
together: two frontends accepting at the same moment may each admit the last connection a limit
allows, so the limits hold across frontends to within one connection per frontend.

Kafka's behaviour, which this follows (SocketServer's Acceptor and ConnectionQuotas):

- a connection from an address that already has its limit (``max_connections_per_ip``, or its
  entry in ``max_connections_per_ip_overrides``) is closed at once after the accept, logged
  ("Rejected connection from ...") and counted;
- at ``max_connections`` in all, the acceptor waits: nothing is accepted until a connection
  closes, and new connections wait in the kernel's listen backlog (``pause``/``slot_available``).
"""

from __future__ import annotations

import logging
import socket

from appliance.runtime import FRONTEND_PAGE_FIELDS
from shm.conntable import ConnectionTable, address_key
from shm.statepage import StalePage, StatePage

log = logging.getLogger("appliance.frontend")

UNLIMITED = 2**31 - 1


class ConnectionQuotas:
    def __init__(self, worker) -> None:
        cfg = worker.cfg.server
        self.page = worker.page
        self.max_connections = cfg.max_connections
        self.max_per_ip = cfg.max_connections_per_ip
        self.overrides = _resolve(cfg.max_connections_per_ip_overrides)
        self.connections = 0
        self.refused = self.page.read().refused_connections    # carried over a restart
        others = [fe for fe in worker.ctx.frontends if fe != worker.name]
        self.other_pages: list[StatePage] = []
        if self.max_connections < UNLIMITED:
            self.other_pages = [StatePage.open(worker.topo.page_path(fe), FRONTEND_PAGE_FIELDS,
                                               readonly=True) for fe in others]
        self.table: ConnectionTable | None = None
        self.other_tables: list[ConnectionTable] = []
        if cfg.limits_connections_per_ip:
            self.table = ConnectionTable.open(worker.topo.conns_path(worker.name), owner=True)
            self.other_tables = [ConnectionTable.open(worker.topo.conns_path(fe)) for fe in others]
        self.publish()

    def publish(self) -> None:
        self.page.publish(connections=self.connections, refused_connections=self.refused)

    def slot_available(self) -> bool:
        """Whether the broker is below max_connections (over every frontend)."""
        if self.max_connections >= UNLIMITED:
            return True
        total = self.connections
        for page in self.other_pages:
            try:
                total += page.read().connections
            except StalePage:
                pass            # a frontend that died mid-publish holds no connection now
        return total < self.max_connections

    def admit(self, host: str) -> tuple[bytes | None, int]:
        """Count a new connection from ``host``. Returns (its key, 0) when admitted, or
        (None, the limit it is over) when it must be closed (counted as refused)."""
        key = None
        if self.table is not None:
            try:
                key = address_key(host)
            except ValueError:
                key = None                  # not an IP peer (AF_UNIX): not limited per address
            if key is not None:
                limit = self.overrides.get(key, self.max_per_ip)
                have = self.table.counts.get(key, 0) + sum(t.count(key) for t in self.other_tables)
                if have >= limit:
                    self.refused += 1
                    self.publish()
                    return None, limit
                self.table.add(key, 1)
        self.connections += 1
        self.publish()
        return key or b"", 0

    def release(self, key: bytes | None) -> None:
        """A connection admitted with ``key`` has closed."""
        if key is None:
            return
        if key and self.table is not None:
            self.table.add(key, -1)
        self.connections -= 1
        self.publish()

    def close(self) -> None:
        for page in self.other_pages:
            page.close()
        for t in [self.table, *self.other_tables]:
            if t is not None:
                t.close()


def _resolve(overrides: dict[str, int]) -> dict[bytes, int]:
    """Override keys as table keys; a host name stands for every address it resolves to (Kafka
    resolves it the same way, once)."""
    out: dict[bytes, int] = {}
    for host, limit in overrides.items():
        try:
            out[address_key(host)] = limit
            continue
        except ValueError:
            pass
        try:
            infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
        except OSError as e:
            log.warning("server.max_connections_per_ip_overrides: %s does not resolve (%s); "
                        "its override is not applied", host, e)
            continue
        for info in infos:
            out[address_key(info[4][0])] = limit
    return out
