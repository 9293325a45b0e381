"""The pipeline's AMQP 1.0 client: node/client's blocking connection, as Spark's options describe it.

Rules:
- The client is node/client's (connection.py, links.py, acquisition.py: proton's C engine through
  node/amqp/engine.py, one connection driven by the thread that uses it, every wait bounded, a
  sender's window of unsettled sends, a receiver holding until accept or release, accepts confirmed
  with receiver-settle-mode second). This module is what the pipeline adds: who the client is
  (pipeline/security.py `Security`), how it dials and wraps TLS, and errors worded in the pipeline's
  options (tls, caFile, certFile, passwordFile, timeoutMs) naming what to change.
- Security: TLS is Python's `ssl` around the socket, its handshake done in the constructor under
  `timeout_ms`, the node's certificate checked against the address dialled. SASL stays proton's, with
  the one mechanism `Security.mechanism` names. proton cannot see the TLS around its transport, so
  PLAIN is allowed as "insecure" to it; that happens only over TLS or to a loopback node. A refused
  login or handshake raises an error naming the node, who we claimed to be, and what to change; it is
  not retried on another node (they share their users and CAs).
- Never used from two threads at once.
"""

from __future__ import annotations

import re
import socket
import ssl

from node.amqp.engine import lib
from node.client.acquisition import Acquisition
from node.client.connection import (AuthenticationFailed, ClientError, ClientTimeout, Connection, DeliveryRefused,
                                    LinkRefused, NodeUnreachable, TlsFailed)
from node.client.endpoint import Endpoint
from node.client.links import Receiver, Sender, Taken
from node.net import is_loopback
from pipeline.security import EXTERNAL, NO_SECURITY, PLAIN, CredentialError, Security, password, tls_context

# the client's names the pipeline and its tests reach here
__all__ = ["AmqpConnection", "Acquisition", "Receiver", "Sender", "Taken", "ClientError", "NodeUnreachable",
           "LinkRefused", "DeliveryRefused", "ClientTimeout", "AuthenticationFailed", "TlsFailed", "split_address"]

_SASL_MECHANISM = re.compile(r"\[mech=([^\]]*)\]")


def split_address(address: str) -> tuple[str, int]:
    host, _, port = address.strip().rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{address!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


class AmqpConnection(Connection):
    """A connection to one Grouper node as the pipeline's options describe it (`Security`)."""

    timeout_hint = "raise 'timeoutMs' if the node is just slow"

    def __init__(self, address: str, timeout_ms: int, container_id: str, security: Security = NO_SECURITY):
        self.address = address  # for the TLS handshake's errors, before the connection is made
        self.timeout_ms = timeout_ms
        self.security = security
        host, port = split_address(address)
        mechanism = security.mechanism
        if mechanism == PLAIN and not security.tls and not is_loopback(host):
            raise ClientError(f"refusing to send the password of user {security.user!r} unencrypted to the Grouper "
                              f"node at {address}; set tls to true and use the node's amqps port")
        try:
            secret = password(security) if mechanism == PLAIN else ""
            context = tls_context(security) if security.tls else None
        except CredentialError as error:
            raise ClientError(f"grouper option {error.option!r} on {socket.gethostname()}: {error.problem}") from None
        try:
            raw = socket.create_connection((host, port), timeout=timeout_ms / 1000)
        except OSError as error:
            raise NodeUnreachable(f"cannot connect to the Grouper node at {address}: {error.strerror or error}; "
                                  f"check that the node runs and that 'nodes' names its AMQP address") from None
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock = self._handshake(raw, context, host) if context is not None else raw
        collector = lib.pn_collector()
        # proton sees no TLS (ours is around its transport); the check above keeps PLAIN to TLS or loopback
        endpoint = Endpoint(sock, host, port, container_id, collector, mechanism,
                            security.user if mechanism == PLAIN else "", secret)
        super().__init__(endpoint, collector, address, timeout_ms)

    def _handshake(self, raw: socket.socket, context: ssl.SSLContext, host: str) -> ssl.SSLSocket:
        """TLS on the connected socket, blocking for at most timeout_ms (the socket's timeout)."""
        address, files = self.address, self._tls_files()
        certificate_hint = (f"; a node that asks for client certificates refuses one its tls_ca_file did not sign "
                            f"(certFile {self.security.cert_file})" if self.security.cert_file else "")
        try:
            return context.wrap_socket(raw, server_hostname=host)
        except ssl.SSLCertVerificationError as error:
            raw.close()
            raise TlsFailed(f"TLS with the Grouper node at {address} failed: its certificate was not accepted "
                            f"({error.verify_message}); {files} must hold the CA that signed the node's certificate, "
                            f"and the certificate must name {host} (a DNS or IP subject alternative name)") from None
        except ssl.SSLError as error:
            raw.close()
            raise TlsFailed(f"TLS with the Grouper node at {address} failed: {error.reason or error}; is {address} "
                            f"the node's amqps port (the node prints 'amqps: HOST:PORT')?{certificate_hint}") from None
        except (TimeoutError, socket.timeout):
            raw.close()
            raise NodeUnreachable(f"the Grouper node at {address} did not finish the TLS handshake within "
                                  f"{self.timeout_ms} ms; is it the node's amqps port?") from None
        except OSError as error:
            raw.close()
            raise TlsFailed(f"TLS with the Grouper node at {address} failed: the node closed the connection "
                            f"({error.strerror or error}); is {address} the node's amqps port (the node prints "
                            f"'amqps: HOST:PORT')?{certificate_hint}") from None

    def _tls_files(self) -> str:
        return f"caFile {self.security.ca_file}" if self.security.ca_file else "the system's CAs (no caFile given)"

    def tls_alert(self, error: ssl.SSLError) -> TlsFailed:
        hint = (f"; if the node refused the client certificate {self.security.cert_file}, its tls_ca_file must "
                f"hold the CA that signed it, and it must not have expired" if self.security.cert_file else "")
        return TlsFailed(f"TLS with the Grouper node at {self.address} failed: {error.reason or error}{hint}")

    def closed_early(self) -> str:
        if not self._remote_uninit():
            return ""
        if not self.endpoint.tls:
            return (f"the node closed the connection before the AMQP open; if {self.address} is the node's amqps "
                    f"port, set tls to true")
        if self.security.cert_file and self.failure_error is None and not self.failure:
            # the node's TLS refusal of our certificate arrives as a bare close under TLS 1.3
            self.failure_error = TlsFailed(
                f"the Grouper node at {self.address} closed the TLS connection before the AMQP open: it refuses a "
                f"client certificate its tls_ca_file did not sign, or one that expired (certFile "
                f"{self.security.cert_file}); the node's log says which")
        return "the node closed the TLS connection before the AMQP open (see the node's log)"

    def refused_login(self, description: str) -> AuthenticationFailed:
        """What to tell the user when the node refused the SASL exchange (proton says which mechanism)."""
        found = _SASL_MECHANISM.search(description)
        chosen = found.group(1) if found else ""
        security, address = self.security, self.address
        head = f"the Grouper node at {address} refused the login of {security.describe()}"
        if chosen.lower() == "none":  # the node offered nothing this client allows
            if security.mechanism == PLAIN:
                hint = ("the node offers PLAIN only over TLS, or from this host when it runs with "
                        "--sasl-plain-on-loopback: set tls to true and use its amqps port")
            elif security.mechanism == EXTERNAL:
                hint = ("the node offers EXTERNAL only on its amqps port, with --tls-ca-file set, for a certificate "
                        "that CA signed")
            else:
                hint = ("the node has a users file and takes no anonymous clients: set user and passwordFile (or "
                        "passwordEnv), or certFile and keyFile")
            return AuthenticationFailed(f"{head}: it offers no mechanism this client may use; {hint}")
        if security.mechanism == PLAIN:
            source = (f"passwordFile {security.password_file}" if security.password_file
                      else f"passwordEnv {security.password_env}")
            hint = (f"the password or the user is wrong: check the password in {source} and that the node's users "
                    f"file has {security.user!r} (grouper user list; grouper user passwd sets a new password)")
        elif security.mechanism == EXTERNAL:
            hint = ("the certificate's subject common name must be a user in the node's users file "
                    "(grouper user add NAME)")
        else:
            hint = "give credentials: user and passwordFile (or passwordEnv), or certFile and keyFile"
        return AuthenticationFailed(f"{head} ({description or 'authentication failed'}): {hint}")
