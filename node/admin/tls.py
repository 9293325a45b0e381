"""TLS for the admin gRPC port: the server's credentials (read again when their files change), a
client's credentials, and who a client certificate names.

Rules:
- Off unless admin_tls_cert_file and admin_tls_key_file are set. Admin TLS is a setting of its own,
  never inherited from the AMQP listener's tls_* files: give the same paths to share a certificate.
- With admin_tls_ca_file every client must show a certificate those CAs signed: gRPC's Python server
  can ask for a client certificate only as a requirement. The certificate's subject CN is the caller
  unless the call carries credentials. The peers' forwarding shares the port, so nodes show theirs too.
- Files are checked when the node starts (a bad one names its setting) and again at each new
  connection's handshake: changed files are loaded for the handshakes from then on, open connections
  keep theirs. Files that no longer load keep the old ones in force, logged once per change.
"""

from __future__ import annotations

import logging
import ssl
import threading

import grpc

from node.amqp.tls import read_pem
from node.config import files_stamp
from node.core.errors import InvalidConfig

log = logging.getLogger("grouper.admin.tls")

COMMON_NAME_KEY = "x509_common_name"  # gRPC's auth context key of a verified client certificate's CN


def _check(cert_file: str, key_file: str, ca_file: str) -> None:
    """gRPC would only fail at the first handshake, without naming a file: load them with ssl first."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(cert_file, key_file)
    except (OSError, ssl.SSLError) as error:
        raise InvalidConfig("admin_tls_cert_file", f"cannot load {cert_file} with key {key_file}: {error}") from None
    if ca_file:
        try:
            context.load_verify_locations(cafile=ca_file)
        except (OSError, ssl.SSLError) as error:
            raise InvalidConfig("admin_tls_ca_file", f"cannot load {ca_file}: {error}") from None




class ServerFiles:
    """The admin port's certificate, key and CAs, and gRPC credentials that follow their changes."""

    def __init__(self, cert_file: str, key_file: str, ca_file: str = ""):
        self._paths = (cert_file, key_file, ca_file)
        self._lock = threading.Lock()  # gRPC may ask from several threads at once
        self._stamp = files_stamp(self._paths)
        self._failed_stamp = None
        self._initial = self._configuration()

    @classmethod
    def from_config(cls, config) -> "ServerFiles | None":
        if not config.admin_tls_cert_file:
            return None
        return cls(config.admin_tls_cert_file, config.admin_tls_key_file, config.admin_tls_ca_file)

    @property
    def client_certificates_required(self) -> bool:
        return bool(self._paths[2])

    def _configuration(self) -> grpc.ServerCertificateConfiguration:
        cert_file, key_file, ca_file = self._paths
        _check(cert_file, key_file, ca_file)
        return grpc.ssl_server_certificate_configuration(
            [(read_pem(key_file, "admin_tls_key_file"), read_pem(cert_file, "admin_tls_cert_file"))],
            root_certificates=read_pem(ca_file, "admin_tls_ca_file") if ca_file else None)

    def credentials(self) -> grpc.ServerCredentials:
        return grpc.dynamic_ssl_server_credentials(self._initial, self._fetch,
                                                   require_client_authentication=self.client_certificates_required)

    def _fetch(self) -> grpc.ServerCertificateConfiguration | None:
        """gRPC calls this before each handshake: a new configuration when the files changed, else None."""
        stamp = files_stamp(self._paths)
        if stamp == self._stamp:
            return None
        with self._lock:
            if stamp == self._stamp or stamp == self._failed_stamp:
                return None
            try:
                configuration = self._configuration()
            except InvalidConfig as error:
                self._failed_stamp = stamp
                log.error("admin TLS files not reloaded, the ones loaded before stay in force: %s", error.description)
                return None
            self._stamp, self._failed_stamp = stamp, None
        log.info("admin TLS certificate reloaded from %s", self._paths[0])
        return configuration


def channel_credentials(ca_file: str = "", cert_file: str = "", key_file: str = "", *,
                        keys: tuple[str, str, str] = ("--ca", "--cert", "--key")) -> grpc.ChannelCredentials:
    """A client's TLS: trust `ca_file` (else the system's CAs), show `cert_file` when given.
    `keys` name the flags or settings in errors."""
    if bool(cert_file) != bool(key_file):
        raise InvalidConfig(keys[1] if not cert_file else keys[2], f"a client certificate needs both {keys[1]} "
                                                                   f"and {keys[2]}")
    return grpc.ssl_channel_credentials(
        root_certificates=read_pem(ca_file, keys[0]) if ca_file else None,
        private_key=read_pem(key_file, keys[2]) if key_file else None,
        certificate_chain=read_pem(cert_file, keys[1]) if cert_file else None)


def peer_channel_credentials(config) -> grpc.ChannelCredentials | None:
    """How this node dials the other members' admin ports when admin TLS is on (a cluster then has
    cluster TLS too): their certificates chain to admin_tls_ca_file or cluster_tls_ca_file, and
    when the members ask for client certificates this node shows its own admin certificate."""
    if not config.admin_tls_cert_file:
        return None
    roots = b"".join(read_pem(path, key) + b"\n" for path, key in ((config.admin_tls_ca_file, "admin_tls_ca_file"),
                                                                (config.cluster_tls_ca_file, "cluster_tls_ca_file"))
                     if path)
    shows_certificate = bool(config.admin_tls_ca_file)
    return grpc.ssl_channel_credentials(
        root_certificates=roots or None,
        private_key=read_pem(config.admin_tls_key_file, "admin_tls_key_file") if shows_certificate else None,
        certificate_chain=read_pem(config.admin_tls_cert_file, "admin_tls_cert_file") if shows_certificate else None)


def certificate_user(auth_context: dict) -> str | None:
    """The verified client certificate's subject CN from a call's auth context, or None without one."""
    names = auth_context.get(COMMON_NAME_KEY) or ()
    return names[0].decode("utf-8", "replace") if names else None
