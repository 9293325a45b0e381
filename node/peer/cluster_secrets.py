"""The cluster's secrets, as a node holds them: its cluster TLS files in force, the raft secret, and when a
node must have them.

Rules:
- Cluster TLS is three PEM files: this node's certificate, its key and the cluster CA, checked at
  start by node/peer/node_certificate.py, so a wrong file stops the node with the file named instead
  of failing every handshake later.
- The files are read again when they change (checked at most once per RELOAD_CHECK_INTERVAL_S, on
  each new peer connection and each forwarding attempt): new connections use the new files, open
  ones keep theirs. A change that does not check out (a key written before its certificate) keeps
  the files in force, logged once per change.
- The raft secret file holds one secret per line: the first encrypts, every one is accepted, so a
  secret is rotated member by member without the raft cluster losing its majority.
- `insecure_cluster_refusal` is the secure-by-default rule, pure: every node with peers needs a raft
  secret, whatever its host, users or allow_anonymous (without one, pysyncobj unpickles whatever
  reaches the raft port: anyone who reaches it runs code in the node, loopback included, as any
  local user reaches 127.0.0.1); a node that has users and serves a cluster on a non-loopback host
  needs cluster TLS too. Only `allow_insecure_cluster` lets such a node start, and it says so loudly.
"""

from __future__ import annotations

import datetime
import logging
import sys
import threading
import time

import grpc

from node.amqp.tls import read_pem
from node.config import files_stamp
from node.core.errors import GrouperError, InvalidConfig
from node.net import is_loopback
from node.peer.node_certificate import TlsMaterial, read_tls_material

log = logging.getLogger("grouper.peer")

RELOAD_CHECK_INTERVAL_S = 1.0  # how often the TLS files' stamps are compared, at most
RAFT_SECRET_CHARS_MIN = 16  # a shorter secret is refused: the key is derived from it with a fixed salt
RAFT_SECRETS_MAX = 4  # lines of the raft secret file: the current secret and the ones still accepted
RAFT_SECRET_FILE_BYTES_MAX = 4096  # a larger file is not a secret file


class ClusterTls:
    """The cluster TLS files in force; any thread. `generation` grows each time new files are taken."""

    def __init__(self, cert_file: str, key_file: str, ca_file: str, server_name: str = "",
                 clock=time.monotonic):
        self.paths = (cert_file, key_file, ca_file)
        self.server_name = server_name  # checked in every peer's certificate instead of the host dialled
        self._clock = clock
        self._lock = threading.Lock()
        self._stamps = files_stamp(self.paths)
        self.material: TlsMaterial = read_tls_material(*self.paths, now=_utc_now())
        self.generation = 1
        self._checked_s = clock()
        self._bad_stamps = None

    @classmethod
    def from_config(cls, config) -> "ClusterTls | None":
        if not config.cluster_tls_cert_file:
            return None
        return cls(config.cluster_tls_cert_file, config.cluster_tls_key_file, config.cluster_tls_ca_file,
                   config.cluster_tls_server_name)

    def refresh(self) -> bool:
        """Takes the files again if they changed since the last look; True if new material is in force."""
        with self._lock:
            now_s = self._clock()
            if now_s - self._checked_s < RELOAD_CHECK_INTERVAL_S:
                return False
            self._checked_s = now_s
            stamps = files_stamp(self.paths)
            if stamps == self._stamps or stamps == self._bad_stamps:
                return False
            try:
                material = read_tls_material(*self.paths, now=_utc_now())
            except InvalidConfig as error:
                self._bad_stamps = stamps
                log.error("the cluster TLS files changed but do not check out (%s); the ones read before stay "
                          "in force", error)
                return False
            self._stamps, self._bad_stamps = stamps, None
            self.material = material
            self.generation += 1
        log.info("cluster TLS files reloaded: certificate CN %s, valid until %s UTC; new peer connections use "
                 "them", material.common_name, f"{material.not_after:%Y-%m-%d %H:%M}")
        return True

    def current_generation(self) -> int:
        self.refresh()
        return self.generation

    # ---- gRPC ------------------------------------------------------------------------------------

    def channel_credentials(self) -> grpc.ChannelCredentials:
        material = self.material
        return grpc.ssl_channel_credentials(root_certificates=material.ca_certificates,
                                            private_key=material.private_key,
                                            certificate_chain=material.certificate_chain)

    def channel_options(self) -> list[tuple[str, object]]:
        return [("grpc.ssl_target_name_override", self.server_name)] if self.server_name else []

    def server_credentials(self) -> grpc.ServerCredentials:
        """Mutual TLS, client certificate required and verified against the CA; the files are looked
        at again before each new connection's handshake."""
        return grpc.dynamic_ssl_server_credentials(self._server_configuration(), self._server_configuration_if_new,
                                                   require_client_authentication=True)

    def _server_configuration(self) -> grpc.ServerCertificateConfiguration:
        material = self.material
        return grpc.ssl_server_certificate_configuration([(material.private_key, material.certificate_chain)],
                                                         root_certificates=material.ca_certificates)

    def _server_configuration_if_new(self):
        try:
            return self._server_configuration() if self.refresh() else None
        except Exception:  # never let a reload take the listener down: keep the configuration in force
            log.exception("reloading the cluster TLS files for the peer listener failed")
            return None


def _utc_now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


# ---- the raft secret --------------------------------------------------------------------------

def parse_raft_secrets(text: str, path: str) -> tuple[str, ...]:
    secrets = tuple(line.strip() for line in text.splitlines() if line.strip())
    if not secrets:
        raise InvalidConfig("raft_secret_file", f"{path} holds no secret: write one line of at least "
                                                f"{RAFT_SECRET_CHARS_MIN} random characters "
                                                f"(`openssl rand -base64 32`)")
    if len(secrets) > RAFT_SECRETS_MAX:
        raise InvalidConfig("raft_secret_file", f"{path} holds {len(secrets)} secrets; at most {RAFT_SECRETS_MAX} "
                                                f"(the current one first, then those still accepted)")
    for number, secret in enumerate(secrets, 1):
        if len(secret) < RAFT_SECRET_CHARS_MIN:
            raise InvalidConfig("raft_secret_file", f"{path}: secret {number} has {len(secret)} characters; use at "
                                                    f"least {RAFT_SECRET_CHARS_MIN} random ones "
                                                    f"(`openssl rand -base64 32`)")
    return secrets


def read_raft_secrets(path: str) -> tuple[str, ...]:
    if sys.flags.optimize:
        # pysyncobj checks each message's connection nonce and timestamp with `assert`, which -O removes
        raise InvalidConfig("raft_secret_file", "python -O drops the checks pysyncobj makes on encrypted raft "
                                                "messages; run the node without -O")
    data = read_pem(path, "raft_secret_file")
    if len(data) > RAFT_SECRET_FILE_BYTES_MAX:
        raise InvalidConfig("raft_secret_file", f"{path} is {len(data)} bytes; a secret file is at most "
                                                f"{RAFT_SECRET_FILE_BYTES_MAX}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidConfig("raft_secret_file", f"{path} is not UTF-8 text") from None
    return parse_raft_secrets(text, path)


# ---- secure by default ------------------------------------------------------------------------

def describe(tls: ClusterTls | None, raft_secrets: tuple[str, ...]) -> str:
    """The banner's `cluster security:` line."""
    if tls is None and not raft_secrets:
        return ("open (--allow-insecure-cluster): forwarding (on the admin port) and raft take no credentials; "
                f"{RAFT_UNAUTHENTICATED}")
    forwarding = (f"forwarding over mutual TLS as {tls.material.common_name}" if tls is not None
                  else "forwarding signed with a key from the raft secret (on the admin port)")
    raft = (f"raft encrypted ({len(raft_secrets)} secret{'s' if len(raft_secrets) > 1 else ''} accepted)"
            if raft_secrets else f"(--allow-insecure-cluster) {RAFT_UNAUTHENTICATED}")
    return f"{forwarding}; {raft}"


RAFT_UNAUTHENTICATED = ("raft traffic is unauthenticated: any process reaching the raft port can run code in this "
                        "node")
RAFT_SECRET_HOWTO = ("make a secret readable only by the node's user with `(umask 077; openssl rand -base64 32 > "
                     "raft.secret)` and give every node the same file with --raft-secret-file raft.secret "
                     "(raft_secret_file; `grouper up` makes one for its nodes)")


def insecure_cluster_refusal(config, users_database: bool) -> str | None:
    """Why this node must not start as configured, or None. Pure: config fields and one fact in."""
    if not config.peer_list() or config.allow_insecure_cluster:
        return None
    needs_tls = users_database and not is_loopback(config.host) and not config.cluster_tls_cert_file
    if config.raft_secret_file and not needs_tls:
        return None
    if not needs_tls:
        return (f"this node serves a raft cluster (--peers) but has no raft secret (raft_secret_file): without one "
                f"any process reaching its raft port {config.host}:{config.raft_port}, a local user's included, "
                f"could run code in this node (pysyncobj unpickles what arrives). To fix it, {RAFT_SECRET_HOWTO}; "
                f"or pass --allow-insecure-cluster (allow_insecure_cluster) to run it unauthenticated anyway")
    missing = ["cluster TLS (cluster_tls_cert_file, cluster_tls_key_file, cluster_tls_ca_file)"]
    if not config.raft_secret_file:
        missing.append("raft secret (raft_secret_file)")
    return (f"this node has users and serves a cluster on {config.host}, but it has no {' and no '.join(missing)}: "
            f"any process reaching its peer or raft port could forward messages or join the raft cluster. Make "
            f"certificates with `grouper certs dev --dir certs --nodes NAME,...` and a secret with `(umask 077; "
            f"openssl rand -base64 32 > raft.secret)` (README: Security, Between nodes), or pass "
            f"--allow-insecure-cluster if only the nodes can reach those ports")


def check_cluster_security(config, users_database: bool) -> None:
    """At start: refuse (GrouperError) what insecure_cluster_refusal names; warn, once, of a raft cluster run
    without a raft secret because --allow-insecure-cluster said so."""
    refusal = insecure_cluster_refusal(config, users_database)
    if refusal:
        raise GrouperError(refusal)
    if config.peer_list() and not config.raft_secret_file:
        log.error("INSECURE (--allow-insecure-cluster): this node serves a raft cluster without a raft secret; "
                  "%s (%s:%d). Give every node --raft-secret-file", RAFT_UNAUTHENTICATED, config.host,
                  config.raft_port)
