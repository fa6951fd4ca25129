"""The supervisor's part of security: the SCRAM credential store and the published TLS
certificates.

Runs in the supervisor (``appliance.supervisor.Supervisor`` builds one ``SecurityService`` at
start, serves it next to the topic administration and hooks ``reload`` into its SIGHUP reload).
Owns the ``CredentialStore`` of the data dir (``credentials.json``) and its published copy in the
runtime dir, and the published copies of the certificate files (``tls.<n>/``); bumps
``credentials_version`` and ``tls_version`` on the supervisor's state page after publishing, so
frontends follow.
"""

from __future__ import annotations

import logging

from appliance.config import Config
from appliance.security import credentials, messages, oauthbearer, tls
from appliance.service import serves
from appliance.runtime import EXIT_CONFIG, DataDirUnusable, StartFailure

log = logging.getLogger("appliance.supervisor")


class SecurityService:
    def __init__(self, cfg: Config, data_dir: str, run_dir: str, topo, page) -> None:
        self.cfg = cfg
        self.run_dir = run_dir
        self.published = topo.file_path(credentials.PUBLISHED_FILE)
        self.page = page
        self.store = credentials.CredentialStore(data_dir)
        self.tls_listeners = any(lst.tls for lst in cfg.listeners)
        self.data_dir = data_dir

    def start(self) -> None:
        """Load and publish the credentials; publish the certificates if a listener needs them
        (StartFailure: exit 3 for an unreadable credential file, 2 for certificates)."""
        try:
            self.store.load()
        except (OSError, ValueError, KeyError) as e:
            raise DataDirUnusable(f"the SCRAM credentials {self.store.path} cannot be read: {e}; "
                                  "restore the file from a backup (nothing in the data dir was "
                                  "changed)") from None
        credentials.publish(self.store.users, self.published)
        self.page.publish(credentials_version=self.store.version)
        try:
            # Each frontend reads the JWKS itself; an unusable one is a configuration error
            # reported once, here, before any frontend starts.
            oauthbearer.JwtValidator.from_config(self.cfg.sasl)
        except oauthbearer.OAuthConfigError as e:
            raise StartFailure(f"config: sasl.oauthbearer_jwks_endpoint_url: {e}",
                               EXIT_CONFIG) from None
        if self.tls_listeners:
            try:
                tls.publish(self.cfg.tls, self.run_dir, 1)
            except tls.TlsError as e:
                raise StartFailure(str(e), EXIT_CONFIG) from None
            self.page.publish(tls_version=1)

    def reload(self, old: Config, new: Config) -> None:
        """A reload hook (``Supervisor.reload_hooks``, SIGHUP): re-read the TLS certificate, key
        and CA files named by the reloaded ``[tls]`` section; frontends pick the new ones up
        for new connections. Runs before the configuration version moves, so a frontend that
        follows it finds the new ``tls_version`` already published. A renewal that cannot be
        read, or does not make a server context, is logged and the certificates in use stay."""
        self.cfg = new
        if not self.tls_listeners:
            log.info("reload: no TLS listener, no certificates to re-read")
            return
        version = self.page.read().tls_version + 1
        try:
            tls.publish(new.tls, self.run_dir, version)
        except (tls.TlsError, OSError) as e:
            log.error("reload: keeping the certificates in use: %s", e)
            return
        self.page.publish(tls_version=version)
        log.info("reload: certificates re-read (version %d); new connections use them", version)

    @serves(messages.AlterScramCredentialsRequest)
    def alter_scram_credentials(self, req: messages.AlterScramCredentialsRequest
                                ) -> messages.AlterScramCredentialsResult:
        """AlterUserScramCredentials: commit, publish for the frontends, then answer (a login
        right after the answer sees the new credentials)."""
        results = self.store.alter(req)
        if any(r.error_code == 0 for r in results):
            credentials.publish(self.store.users, self.published)
            self.page.publish(credentials_version=self.store.version)
            log.info("SCRAM credentials altered for %s",
                     ", ".join(sorted({r.user for r in results if r.error_code == 0})))
        return messages.AlterScramCredentialsResult(results)
