"""A blocking AMQP 1.0 connection: one endpoint, pumped by the one thread that uses it.

Rules:
- The socket, transport and session are node/client/endpoint.py's `Endpoint` (proton's C engine
  through node/amqp/engine.py). No reactor and no thread: proton's Python event dispatch costs
  ~100 us per message, which would make the client, not the node, the bottleneck.
- Every wait has a deadline and fails naming the node and what was awaited (`ClientTimeout`, with
  the caller's `timeout_hint`).
- The first failure is kept (`failure`) and raised by the next `check`, as the error a subclass made
  for it (a refused login, a TLS alert) or as `ClientError`. A subclass words those: `refused_login`,
  `tls_alert` and `closed_early` are its hooks (pipeline/amqp_client.py words them for Spark options).
- Links register an owner with `attach`; the owner gets `on_delivery(delivery)` and `on_detached()`.
- After `close` the proton objects are freed: nothing may touch a delivery of this connection again
  (`check_open` guards the callers that hold deliveries).
- Never used from two threads at once.
"""

from __future__ import annotations

import select
import ssl
import time

from node.amqp.engine import (CONNECTION_REMOTE_CLOSE, DELIVERY, LINK_REMOTE_CLOSE, LINK_REMOTE_DETACH,
                              TRANSPORT_ERROR, ffi, lib)
from node.client.endpoint import OUTPUT_CHUNK_BYTES, Endpoint, condition_parts

WAIT_SLICE_S = 0.5  # the longest single select of a wait: how often deadlines are looked at
CLOSE_WAIT_S = 1.0  # how long close() waits for the node's close frame before dropping the socket


class ClientError(Exception):
    """Something between this client and a node failed; the message names the node."""


class NodeUnreachable(ClientError):
    pass


class LinkRefused(ClientError):
    def __init__(self, message: str, condition: str):
        super().__init__(message)
        self.condition = condition


class DeliveryRefused(ClientError):
    def __init__(self, message: str, condition: str):
        super().__init__(message)
        self.condition = condition


class ClientTimeout(ClientError):
    pass


class AuthenticationFailed(ClientError):
    """The node refused the SASL login: wrong credentials, or no mechanism both sides allow."""


class TlsFailed(ClientError):
    """The TLS handshake failed: the node's certificate, the client's, or not a TLS port."""


def condition_words(condition) -> str:
    """'name: description' of a condition, 'no condition' when none is set."""
    name, description = condition_parts(condition)
    return f"{name or 'no condition'}{': ' + description if description else ''}"


class Connection:
    """One connection to the node at `address`; see the module's rules."""

    timeout_hint = "raise the timeout if the node is just slow"

    def __init__(self, endpoint: Endpoint, collector, address: str, timeout_ms: int):
        self.endpoint = endpoint
        self.address = address
        self.timeout_ms = timeout_ms
        self.session = endpoint.session
        self._collector = collector
        self._buffer = ffi.new("char[]", OUTPUT_CHUNK_BYTES)
        self._links: dict = {}  # pn_link_t -> the Sender or Receiver that owns it
        self.failure: str = ""  # why the connection is unusable ("" while it is fine)
        self.failure_error: ClientError | None = None  # a refused login or TLS, raised as itself by check()
        self.closed = False

    # ---- the subclass's wording ------------------------------------------------------------------

    def refused_login(self, description: str) -> ClientError:
        return AuthenticationFailed(f"the Grouper node at {self.address} refused the login: {description}")

    def tls_alert(self, error: ssl.SSLError) -> ClientError:
        return TlsFailed(f"TLS with the Grouper node at {self.address} failed: {error.reason or error}")

    def closed_early(self) -> str:
        """Why the node closed the socket before the AMQP open ('' once it had opened)."""
        return "" if not self._remote_uninit() else "the node closed the connection before the AMQP open"

    def _remote_uninit(self) -> bool:
        return bool(lib.pn_connection_state(self.endpoint.connection) & lib.PN_REMOTE_UNINIT)

    # ---- moving bytes and events ---------------------------------------------------------------

    def pump(self, timeout_s: float) -> None:
        """Write what is pending, read what has arrived (waiting up to `timeout_s`), handle events."""
        self.check_open()
        self._write()
        endpoint, transport = self.endpoint, self.endpoint.transport
        capacity = lib.pn_transport_capacity(transport)
        pending = lib.pn_transport_pending(transport)
        # TLS may hold decrypted bytes the socket no longer shows as readable
        buffered = capacity > 0 and endpoint.buffered()
        readable, writable, _ = select.select([endpoint.socket] if capacity > 0 else [],
                                              [endpoint.socket] if pending > 0 else [], [],
                                              0 if buffered else max(timeout_s, 0))
        if readable or buffered:
            self._read()
        if writable:
            self._write()
        self._dispatch()

    def _read(self) -> None:
        endpoint = self.endpoint
        error_before, ended_before = endpoint.socket_error, endpoint.ended
        endpoint.read(once=True)
        error = endpoint.socket_error
        if error is not error_before:
            if isinstance(error, ssl.SSLError):  # TLS 1.3: the node judges our certificate after our handshake
                if self.failure_error is None and not self.failure:
                    self.failure_error = self.tls_alert(error)
                self._lost(f"TLS failed: {error.reason or error}")
            else:
                self._lost(f"reading failed: {error.strerror or error}")
        elif endpoint.ended and not ended_before:
            self._lost(self.closed_early() or "the node closed the connection")

    def _write(self) -> None:
        endpoint = self.endpoint
        error_before = endpoint.socket_error
        endpoint.write(self._buffer)
        if endpoint.socket_error is not error_before:
            self._lost(f"writing failed: {endpoint.socket_error.strerror or endpoint.socket_error}")

    def _dispatch(self) -> None:
        collector, links = self._collector, self._links
        while True:
            event = lib.pn_collector_peek(collector)
            if not event:
                return
            kind = lib.pn_event_type(event)
            if kind == DELIVERY:
                delivery = lib.pn_event_delivery(event)
                owner = links.get(lib.pn_delivery_link(delivery))
                if owner is not None:
                    owner.on_delivery(delivery)
            elif kind == LINK_REMOTE_CLOSE or kind == LINK_REMOTE_DETACH:
                owner = links.get(lib.pn_event_link(event))
                if owner is not None:
                    owner.on_detached()
            elif kind == CONNECTION_REMOTE_CLOSE:
                name, description = condition_parts(lib.pn_connection_remote_condition(self.endpoint.connection))
                self._lost(f"the node closed the connection: {name} {description}".rstrip())
            elif kind == TRANSPORT_ERROR:
                name, description = condition_parts(lib.pn_transport_condition(self.endpoint.transport))
                if name == "amqp:unauthorized-access" and self.failure_error is None and not self.failure:
                    self.failure_error = self.refused_login(description)
                self._lost(f"transport error: {name} {description}".rstrip())
            lib.pn_collector_pop(collector)

    def _lost(self, why: str) -> None:
        if not self.failure:
            self.failure = why

    def check(self) -> None:
        if self.failure and not self.closed:
            if self.failure_error is not None:
                raise self.failure_error
            raise ClientError(f"connection to the Grouper node at {self.address} failed: {self.failure}")

    def check_open(self) -> None:
        if self.closed:
            raise ClientError(f"the connection to the Grouper node at {self.address} was closed by this client")

    def wait(self, condition, what: str, timeout_ms: int | None = None) -> None:
        """Pump until `condition()` holds; raise naming `what` if the connection fails or time runs out."""
        timeout_ms = self.timeout_ms if timeout_ms is None else timeout_ms
        deadline = time.monotonic() + timeout_ms / 1000
        while not condition():
            self.check()
            remaining_s = deadline - time.monotonic()
            if remaining_s <= 0:
                raise ClientTimeout(f"timed out after {timeout_ms} ms waiting for {what} on the Grouper node at "
                                    f"{self.address}; {self.timeout_hint}")
            self.pump(min(remaining_s, WAIT_SLICE_S))

    def wait_until(self, condition, deadline_s: float) -> bool:
        """Pump until `condition()` holds or the monotonic `deadline_s` passes; never raises on time."""
        while not condition():
            self.check()
            remaining_s = deadline_s - time.monotonic()
            if remaining_s <= 0:
                return False
            self.pump(min(remaining_s, WAIT_SLICE_S))
        return True

    # ---- links -----------------------------------------------------------------------------------

    def attach(self, link, owner, what: str) -> None:
        self._links[link] = owner
        lib.pn_link_open(link)
        self.wait(lambda: not (lib.pn_link_state(link) & lib.PN_REMOTE_UNINIT), f"the node to attach {what}")
        if lib.pn_link_state(link) & lib.PN_REMOTE_CLOSED or owner.detached:
            name, _ = condition_parts(lib.pn_link_remote_condition(link))
            raise LinkRefused(f"the Grouper node at {self.address} refused {what}: "
                              f"{condition_words(lib.pn_link_remote_condition(link))}", name)

    def close(self) -> None:
        if self.closed:
            return
        try:
            if not self.failure:
                lib.pn_connection_close(self.endpoint.connection)
                self.wait_until(lambda: bool(lib.pn_connection_state(self.endpoint.connection) & lib.PN_REMOTE_CLOSED)
                                or bool(self.failure), time.monotonic() + CLOSE_WAIT_S)
        finally:
            self.closed = True
            self._links.clear()
            self.endpoint.release()
            lib.pn_collector_free(self._collector)
