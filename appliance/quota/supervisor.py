"""The supervisor's part of client quotas: the quota store and its published copy.

Runs in the supervisor (``appliance.supervisor.Supervisor`` builds one ``QuotaService`` at start
and serves it next to the topic administration). Owns the ``QuotaStore`` of the data dir
(``client_quotas.json``) and its published copy in the runtime dir; bumps ``quotas_version`` on
the supervisor's state page after publishing, so frontends follow (the answer to
AlterClientQuotas leaves after the publish: a request right after it is held to the new quota).
"""

from __future__ import annotations

import logging

from appliance.quota import messages, model, store
from appliance.runtime import DataDirUnusable
from appliance.service import serves

log = logging.getLogger("appliance.supervisor")


class QuotaService:
    def __init__(self, data_dir: str, topo, page) -> None:
        self.published = topo.file_path(store.PUBLISHED_FILE)
        self.page = page
        self.store = store.QuotaStore(data_dir)

    def start(self) -> None:
        """Load and publish the quotas (DataDirUnusable, exit 3, for a damaged file)."""
        try:
            self.store.load()
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise DataDirUnusable(f"the client quotas {self.store.path} cannot be read: {e}; "
                                  "restore the file from a backup (nothing in the data dir was "
                                  "changed)") from None
        store.publish(self.store.quotas, self.published)
        self.page.publish(quotas_version=self.store.version)

    @serves(messages.AlterClientQuotasRequest)
    def alter_client_quotas(self, req: messages.AlterClientQuotasRequest
                            ) -> messages.AlterClientQuotasResult:
        """AlterClientQuotas: commit, publish for the frontends, then answer."""
        before = self.store.version
        results = self.store.alter(
            [(list(e.entity), [(o.key, o.value, o.remove) for o in e.ops]) for e in req.entries],
            req.validate_only)
        if self.store.version != before:
            store.publish(self.store.quotas, self.published)
            self.page.publish(quotas_version=self.store.version)
            log.info("client quotas altered: %s", "; ".join(
                model.describe_entity(model.entity_of(e.entity)) for e, (code, _) in
                zip(req.entries, results) if code == 0))
        return messages.AlterClientQuotasResult(
            [messages.EntryResult(code, msg) for code, msg in results])
