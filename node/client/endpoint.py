"""One AMQP connection of the client: a socket, proton's C transport and connection, one session.

Rules:
- proton's C engine through `node.amqp.engine` (`lib`, `ffi`) only, never proton's Python classes.
  Client-mode transports; SASL is proton's with the mechanisms the caller names, or none at all when
  the caller did the SASL exchange itself on the socket (node/tools/handshake.py).
- `Endpoint` takes a connected socket (TLS already wrapped round it, if any): how to dial, log in and
  word a failure is the caller's policy. `connect` is the load generators' policy (`grouper perf`,
  bench/): a target with a url and credentials, SCRAM-SHA-256 where the node offers it.
- Security: TLS is Python's `ssl` around the socket (handshake blocking, bounded by
  HANDSHAKE_TIMEOUT_S, the broker's certificate checked against the host dialled). SASL PLAIN with a
  user, which proton must be told to allow as "insecure" (it cannot see our TLS): only over TLS or to
  a loopback broker.
- Pointers are proton's: `release` frees them, after which the endpoint is never used again.
"""

from __future__ import annotations

import socket
import ssl
from urllib.parse import unquote, urlsplit

from node.amqp.engine import CONNECTION_REMOTE_CLOSE, TRANSPORT_ERROR, condition_text, ffi, lib, text
from node.net import is_loopback
from node.tools.handshake import HandshakeRefused, NotAmqp, authenticate, not_amqp_text

READ_BYTES = 256 << 10  # one socket read at most
OUTPUT_CHUNK_BYTES = 1 << 20  # one copy out of proton's output buffer
HANDSHAKE_TIMEOUT_S = 10.0  # TCP connect and TLS handshake, each
_BLOCKED = (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError)


class LeanError(Exception):
    """The broker refused or dropped something; the text says what and names the broker's condition."""


def credentials(target) -> tuple[str, str]:
    """(user, password) for SASL PLAIN: the target's own fields, else the url's; ("", "") for none."""
    if getattr(target, "user", ""):
        return target.user, target.password
    parts = urlsplit(target.url if "//" in target.url else f"amqp://{target.url}")
    if parts.username is None:
        return "", ""
    return unquote(parts.username), unquote(parts.password or "")


def tls_context(ca_file: str = "") -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=ca_file or None)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


def condition_parts(condition) -> tuple[str, str]:
    """(name, description) of a condition proton holds; ("", "") when none is set."""
    if condition == ffi.NULL or not lib.pn_condition_is_set(condition):
        return "", ""
    return text(lib.pn_condition_get_name(condition)) or "", text(lib.pn_condition_get_description(condition)) or ""


def problem(kind: int, event) -> str:
    """The broker's reason for an event that ends a link, connection or transport ('' if none)."""
    if kind == TRANSPORT_ERROR:
        return condition_text(lib.pn_transport_condition(lib.pn_event_transport(event))) or "transport error"
    if kind == CONNECTION_REMOTE_CLOSE:
        reason = condition_text(lib.pn_connection_remote_condition(lib.pn_event_connection(event)))
        return f"connection closed by the broker: {reason}" if reason else ""
    reason = condition_text(lib.pn_link_remote_condition(lib.pn_event_link(event)))
    return f"link detached by the broker: {reason}" if reason else ""


class Endpoint:
    """One socket, its transport and connection; `collector` is the caller's, shared or not."""

    def __init__(self, sock: socket.socket, host: str, port: int, container_id: str, collector,
                 mechanisms: str | None, user: str = "", password: str = ""):
        """`mechanisms`: the SASL mechanisms proton may use (None: no SASL layer, the caller logged in)."""
        self.host, self.port = host, port
        self.socket = sock
        self.tls = isinstance(sock, ssl.SSLSocket)
        self.transport = lib.pn_transport()
        self.connection = lib.pn_connection()
        if mechanisms is not None:
            sasl = lib.pn_sasl(self.transport)
            if user:
                lib.pn_connection_set_user(self.connection, user.encode())
                lib.pn_connection_set_password(self.connection, password.encode())
                # proton cannot see our TLS; the callers keep PLAIN to TLS or loopback
                lib.pn_sasl_set_allow_insecure_mechs(sasl, True)
            lib.pn_sasl_allowed_mechs(sasl, mechanisms.encode())
        lib.pn_connection_set_container(self.connection, container_id.encode())
        lib.pn_connection_set_hostname(self.connection, host.encode())
        lib.pn_connection_collect(self.connection, collector)
        lib.pn_transport_bind(self.transport, self.connection)
        self.socket.setblocking(False)
        self.closed = False  # the socket is gone or proton's input and output are both over
        self.error = ""
        self.socket_error: OSError | None = None  # what ended the socket, if a read or write failed
        self.ended = False  # the peer closed its side of the socket
        lib.pn_connection_open(self.connection)
        self.session = lib.pn_session(self.connection)
        lib.pn_session_open(self.session)

    def sender(self, name: str, address: str, open_now: bool = True):
        """A sender link to `address`; `open_now=False` leaves the attach to the caller (modes first)."""
        return self._link(lib.pn_sender(self.session, name.encode()), name, address, open_now)

    def receiver(self, name: str, address: str, open_now: bool = True):
        return self._link(lib.pn_receiver(self.session, name.encode()), address, name, open_now)

    @staticmethod
    def _link(link, source: str, target: str, open_now: bool):
        lib.pn_terminus_set_address(lib.pn_link_source(link), source.encode())
        lib.pn_terminus_set_address(lib.pn_link_target(link), target.encode())
        if open_now:
            lib.pn_link_open(link)
        return link

    def read(self, once: bool = False) -> None:
        """Move what the socket has into the transport (the transport's capacity bounds a read);
        `once`: one socket read at most, so each read's events can be handled before the next."""
        while True:
            capacity = lib.pn_transport_capacity(self.transport)
            if capacity <= 0:
                return
            try:
                data = self.socket.recv(min(capacity, READ_BYTES))
            except _BLOCKED:
                return
            except OSError as error:
                self._lose(f"read failed: {error}", error)
                return
            if not data:
                self.ended = True
                lib.pn_transport_close_tail(self.transport)
                return
            lib.pn_transport_push(self.transport, data, len(data))
            if once or not self.buffered():
                return

    def buffered(self) -> bool:
        """TLS holds decrypted bytes the socket no longer shows as readable."""
        return self.tls and self.socket.pending() > 0

    def write(self, buffer) -> bool:
        """Send what proton has; True while bytes are left over for when the socket drains."""
        transport = self.transport
        while True:
            pending = lib.pn_transport_pending(transport)
            if pending < 0:
                self.closed = lib.pn_transport_closed(transport)
                return False
            if pending == 0:
                return False
            # a TLS write that would block is retried with at least the same bytes: pending only grows
            count = lib.pn_transport_peek(transport, buffer, min(pending, OUTPUT_CHUNK_BYTES))
            try:
                sent = self.socket.send(ffi.buffer(buffer, count))
            except _BLOCKED:
                return True
            except OSError as error:
                self._lose(f"write failed: {error}", error)
                return False
            lib.pn_transport_pop(transport, sent)
            if sent < count:
                return True

    def _lose(self, why: str, error: OSError) -> None:
        self.error = self.error or why
        self.socket_error = self.socket_error or error
        lib.pn_transport_close_tail(self.transport)
        lib.pn_transport_close_head(self.transport)
        self.closed = True

    def close(self) -> None:
        lib.pn_connection_close(self.connection)

    def release(self) -> None:
        self.socket.close()
        lib.pn_transport_unbind(self.transport)
        lib.pn_decref(self.transport)  # the binding has no pn_transport_free
        lib.pn_connection_release(self.connection)


def connect(target, container_id: str, collector) -> Endpoint:
    """The load generators' connection to `target` (url, user, password, tls, ca_file, sasl_mechs). With
    a user on a plain connection and no mechanism imposed, the SASL exchange is node/tools/handshake.py's
    (SCRAM-SHA-256 where the node offers it) and the transport has no SASL layer."""
    url = target.url
    parts = urlsplit(url if "//" in url else f"amqp://{url}")
    host, port = parts.hostname or "127.0.0.1", parts.port or 5672
    user, password = credentials(target)
    tls = bool(getattr(target, "tls", False))
    if user and not tls and not is_loopback(host):
        raise LeanError(f"refusing to send the password of {user!r} unencrypted to {host}; use --tls")
    context = tls_context(getattr(target, "ca_file", "")) if tls else None
    own_sasl = bool(user) and not tls and not target.sasl_mechs
    sock = socket.create_connection((host, port), timeout=HANDSHAKE_TIMEOUT_S)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if own_sasl:
        try:
            authenticate(sock, user, password)
        except (NotAmqp, HandshakeRefused) as error:
            sock.close()
            refusal = (not_amqp_text(host, port, error.looks_like) if isinstance(error, NotAmqp)
                       else f"the node at {host}:{port} did not let {user!r} in: {error}")
            raise LeanError(refusal) from None
    if context is not None:
        try:
            sock = context.wrap_socket(sock, server_hostname=host)
        except (ssl.SSLError, OSError) as error:
            sock.close()
            raise LeanError(f"TLS with {host}:{port} failed: {error}") from None
    mechanisms = None if own_sasl else (target.sasl_mechs or ("PLAIN" if user else "ANONYMOUS"))
    return Endpoint(sock, host, port, container_id, collector, mechanisms, user, password)
