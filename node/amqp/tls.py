"""TLS for the AMQP listener: the server context, its reload, and who a client certificate names.

Rules:
- TLS 1.2 or later, with Python's defaults for ciphers. With tls_ca_file, clients are asked for a
  certificate (optional: SCRAM and PLAIN still work without one); one that does not chain to those
  CAs, or has expired, fails the handshake.
- Reloading loads the files into the same context: handshakes from then on use the new certificate,
  connections already open keep theirs. Files that do not load, or do not match each other, keep
  the old ones in force (they are tried in a context of their own first).
  CAs are added to the ones loaded before, never dropped: a CA taken out of tls_ca_file is trusted
  until the node restarts (OpenSSL has no way to remove one from a live context).
- A client certificate names its user by its subject's common name (SASL EXTERNAL).
"""

from __future__ import annotations

import logging
import ssl

from node.config import files_stamp as config_files_stamp
from node.core.errors import InvalidConfig

log = logging.getLogger("grouper.tls")


def server_context(config) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    _load(context, config)
    return context


def _load(context: ssl.SSLContext, config) -> None:
    try:
        context.load_cert_chain(config.tls_cert_file, config.tls_key_file)
    except (OSError, ssl.SSLError) as error:
        raise InvalidConfig("tls_cert_file", f"cannot load {config.tls_cert_file} with key {config.tls_key_file}: "
                                             f"{error}") from None
    if config.tls_ca_file:
        try:
            context.load_verify_locations(cafile=config.tls_ca_file)
        except (OSError, ssl.SSLError) as error:
            raise InvalidConfig("tls_ca_file", f"cannot load {config.tls_ca_file}: {error}") from None
        context.verify_mode = ssl.CERT_OPTIONAL


def read_pem(path: str, key: str) -> bytes:
    """A PEM file's bytes for gRPC's credentials; InvalidConfig naming the setting `key` if unreadable."""
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError as error:
        raise InvalidConfig(key, f"cannot read {path}: {error.strerror or error}") from None


def files_stamp(config) -> tuple:
    return config_files_stamp((config.tls_cert_file, config.tls_key_file, config.tls_ca_file))


def reload(context: ssl.SSLContext, config) -> bool:
    """Load the certificate, key and CAs again; False (logged) if they do not load."""
    try:
        # first into a context of its own: a load_cert_chain that fails on the key (a certificate
        # replaced before its key, or the wrong key) has already put the new certificate into the
        # context and dropped its key, so every handshake after it would fail
        _load(ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER), config)
        _load(context, config)
    except InvalidConfig as error:
        log.error("TLS files not reloaded, the ones loaded before stay in force: %s", error.description)
        return False
    log.info("TLS certificate reloaded from %s", config.tls_cert_file)
    return True


def certificate_identity(ssl_object) -> str | None:
    """The verified client certificate's subject common name, or None without one."""
    if ssl_object is None:
        return None
    certificate = ssl_object.getpeercert()
    if not certificate:
        return None
    for rdn in certificate.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return value
    return None
