"""TLS for SSL and SASL_SSL listeners: the server's SSL context and the certificates behind it.

Owns, in the supervisor, the published copy of the certificate material: ``[tls]`` names the
broker's certificate chain, its key and the CA file; the supervisor reads them at start and again
on SIGHUP, checks that they make a working server context, and only then publishes them into the
runtime dir as ``tls.<n>/`` (cert.pem, key.pem, ca.pem) and bumps ``tls_version`` on its state
page. Frontends build their SSL context from the published copy of the version on the page, at
start and whenever the version moves: a renewed certificate needs no restart, new connections get
it, open connections keep the one they started with (as Kafka's dynamic keystore update does).
A file that is missing or does not make a context stops a start (exit 2); on SIGHUP it is logged
and the certificates in use stay.

Settings (Kafka's names in brackets): ``min_version`` [ssl.enabled.protocols], ``ciphers``
[ssl.cipher.suites] for TLS 1.2 (TLS 1.3 suites are OpenSSL's), ``client_auth``
[ssl.client.auth]: none, requested (a certificate is asked for, and verified against ``ca_file``
when sent), required.
"""

from __future__ import annotations

import os
import shutil
import ssl

from appliance.config import TlsConfig
from appliance.durable import atomic_write

PUBLISHED_PREFIX = "tls."
_FILES = (("cert_file", "cert.pem"), ("key_file", "key.pem"), ("ca_file", "ca.pem"))
_VERSIONS = {"TLSv1.2": ssl.TLSVersion.TLSv1_2, "TLSv1.3": ssl.TLSVersion.TLSv1_3}
_VERIFY = {"none": ssl.CERT_NONE, "requested": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}


class TlsError(Exception):
    """Certificate material that cannot be read or does not make a server context; the message
    names the ``tls.*`` key."""


def server_context(tls: TlsConfig, cert_file: str, key_file: str, ca_file: str) -> ssl.SSLContext:
    """A server-side SSL context from these files and the ``[tls]`` settings."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = _VERSIONS[tls.min_version]
    try:
        ctx.load_cert_chain(cert_file, key_file, password=tls.key_password or None)
    except (OSError, ssl.SSLError, ValueError) as e:
        raise TlsError(f"tls.cert_file / tls.key_file: cannot load the certificate and its key: "
                       f"{_why(e)}") from None
    if ca_file:
        try:
            ctx.load_verify_locations(cafile=ca_file)
        except (OSError, ssl.SSLError, ValueError) as e:
            raise TlsError(f"tls.ca_file: cannot load the CA certificates: {_why(e)}") from None
    ctx.verify_mode = _VERIFY[tls.client_auth]
    if tls.ciphers:
        try:
            ctx.set_ciphers(tls.ciphers)
        except ssl.SSLError as e:
            raise TlsError(f"tls.ciphers: {_why(e)}") from None
    return ctx


def _why(e: Exception) -> str:
    if isinstance(e, OSError) and e.strerror and not isinstance(e, ssl.SSLError):
        return f"{e.filename or ''}: {e.strerror}".lstrip(": ")
    return str(e)


def published_dir(run_dir: str, version: int) -> str:
    return os.path.join(run_dir, f"{PUBLISHED_PREFIX}{version}")


def publish(tls: TlsConfig, run_dir: str, version: int) -> None:
    """Supervisor: copy the configured files into ``tls.<version>/`` after checking that the very
    bytes copied make a server context; TlsError (nothing published) otherwise. Older copies
    than the previous one are removed."""
    final = published_dir(run_dir, version)
    tmp = final + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp, mode=0o700)
    try:
        for key, name in _FILES:
            src = getattr(tls, key)
            if not src:
                continue
            try:
                with open(src, "rb") as f:
                    data = f.read()
            except OSError as e:
                raise TlsError(f"tls.{key}: {src}: {e.strerror}") from None
            atomic_write(os.path.join(tmp, name), data, sync=False, mode=0o600)
        server_context(tls, *_paths(tls, tmp))
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for entry in os.listdir(run_dir):
        if entry.startswith(PUBLISHED_PREFIX) and entry[len(PUBLISHED_PREFIX):].isdigit():
            if int(entry[len(PUBLISHED_PREFIX):]) < version - 1:
                shutil.rmtree(os.path.join(run_dir, entry), ignore_errors=True)


def _paths(tls: TlsConfig, directory: str) -> tuple[str, str, str]:
    return tuple(os.path.join(directory, name) if getattr(tls, key) else ""
                 for key, name in _FILES)


def load_published(tls: TlsConfig, run_dir: str, version: int) -> ssl.SSLContext:
    """Frontends: the server context of the published copy ``version``."""
    return server_context(tls, *_paths(tls, published_dir(run_dir, version)))
