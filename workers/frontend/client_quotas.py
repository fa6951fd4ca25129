"""The frontend's shell around its client quota accounting (``appliance.quota.rates``).

Runs in each frontend process (asyncio, single thread). Owns this frontend's ``ClientQuotas``
(its share of every quota sensor), its view of the quota configs the supervisor publishes
(``appliance.quota.store.QuotasView``, followed through ``quotas_version`` on the supervisor's
page) and its published usage, ``quota_usage.fe<i>.msgpack`` in the runtime dir, which the other
frontends read to count a client across frontends and the metrics collector reads for the
per-entity metrics. All of it only while some quota is configured: with none, ``any`` is False
and the connections ask nothing per request.
"""

from __future__ import annotations

import logging
import os
import time

from appliance.quota import store
from appliance.quota.rates import PUBLISH_S, USAGE_PREFIX, ClientQuotas

log = logging.getLogger("appliance.frontend")


def usage_path(topo, frontend: str) -> str:
    return topo.file_path(USAGE_PREFIX + frontend + ".msgpack")


class QuotaShell:
    def __init__(self, worker, cfg) -> None:
        self.topo = worker.topo
        self.name = worker.ctx.name
        self.others = [fe for fe in worker.ctx.frontends if fe != self.name]
        self.quotas = ClientQuotas(cfg.window_num, cfg.window_size_seconds)
        self.view = store.QuotasView(self.topo.file_path(store.PUBLISHED_FILE),
                                     lambda: worker.sup_page.read().quotas_version)
        self._seen: dict[str, int] = {}
        self._next = 0.0
        self._configured = -1          # the view's version the accounting was configured from
        self.refresh()

    def settings(self, cfg) -> None:
        self.quotas.settings(cfg.window_num, cfg.window_size_seconds)

    def refresh(self) -> None:
        # By version, not by get()'s "changed": another reader of the view (DescribeClientQuotas)
        # took that flag, and the accounting kept the old table until the next change
        # (regression: a quota described before the frontend's tick was never enforced).
        table, _ = self.view.get()
        if self.view.version != self._configured:
            self._configured = self.view.version
            self.quotas.configure(table)

    def current(self):
        """The quota table this frontend enforces, brought up to date first."""
        self.refresh()
        return self.view.quotas

    def tick(self, now: float) -> None:
        """Every frontend tick: follow the published quotas; every PUBLISH_S, publish this
        frontend's samples when they changed and read the others' that changed."""
        self.refresh()
        if now < self._next:
            return
        self._next = now + PUBLISH_S
        q = self.quotas
        if not q.any and not q.sensors and not q.others:
            return
        now_ms = int(time.monotonic() * 1000)
        if q.dirty or q.sensors:
            path = usage_path(self.topo, self.name)
            try:
                with open(path + ".tmp", "wb") as f:
                    f.write(q.snapshot(now_ms))
                os.replace(path + ".tmp", path)       # tmpfs: no fsync
            except OSError as e:
                log.warning("quota usage not published: %s", e)
        for fe in self.others:
            path = usage_path(self.topo, fe)
            try:
                st = os.stat(path)
            except FileNotFoundError:
                if self._seen.pop(fe, None) is not None:
                    q.merge(fe, None)
                continue
            if self._seen.get(fe) == st.st_mtime_ns:
                continue
            try:
                with open(path, "rb") as f:
                    data = f.read()
            except OSError:
                continue
            self._seen[fe] = st.st_mtime_ns
            q.merge(fe, data)
