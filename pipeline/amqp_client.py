"""A lean AMQP 1.0 client for Spark tasks: one connection, driven by the thread that uses it.

Rules:
- proton's engine (Connection, Transport, Collector) over a plain non-blocking socket, pumped by
  the caller. No reactor and no thread: proton's Python event dispatch costs ~100 us per message,
  which would make the client, not the node, the bottleneck of a write. The per-message paths
  (send, settle, receive) call proton's C binding (`cproton`) directly.
- Every wait has a deadline and fails naming the node and what was awaited.
- A producer counts a message as written only when the node settles it as accepted; any other
  outcome is kept (with the node's condition) and raised by the next `send` or `flush`.
- A consumer holds what it took unsettled until the caller accepts or releases it. Accepts use
  receiver-settle-mode second: `accept` returns once the node has settled, so the removal is
  applied (and journalled, for durable queues) when it returns.
- Never used from two threads at once.
- Security (pipeline/credentials.py): TLS is Python's `ssl` around the socket, its handshake done
  in the constructor under `timeout_ms`, the node's certificate checked against the address dialled.
  SASL stays proton's, with the one mechanism `Security.mechanism` names. proton cannot see the
  TLS around its transport, so PLAIN is allowed as "insecure" to it; that happens only over TLS or
  to a loopback node. A refused login or handshake raises an error naming the node, who we claimed
  to be, and what to change; it is not retried on another node (they share their users and CAs).
"""

from __future__ import annotations

import re
import select
import socket
import ssl
import time

import cproton as pn
from proton import Collector, Connection, Delivery, Link, Terminus, Transport

from node.net import is_loopback
from pipeline.credentials import EXTERNAL, NO_SECURITY, PLAIN, CredentialError, Security, password, \
    tls_context

READ_CHUNK_BYTES = 256 << 10  # one socket read; the transport's capacity bounds it too
PUMP_EVERY_MESSAGES = 64  # a producer moves bytes after this many sends, so settlements keep flowing
CLOSE_WAIT_S = 1.0  # how long close() waits for the node's close frame before dropping the socket

_TERMINAL = {pn.PN_ACCEPTED: "accepted", pn.PN_REJECTED: "rejected", pn.PN_RELEASED: "released",
             pn.PN_MODIFIED: "modified"}


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


_SASL_MECHANISM = re.compile(r"\[mech=([^\]]*)\]")
_BLOCKED = (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError)


def split_address(address: str) -> tuple[str, int]:
    host, _, port = address.strip().rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{address!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


def _condition_text(condition) -> tuple[str, str]:
    if condition is None:
        return "", ""
    return condition.name or "", condition.description or ""


class AmqpConnection:
    def __init__(self, address: str, timeout_ms: int, container_id: str, security: Security = NO_SECURITY):
        self.address = address
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
        self._socket = self._handshake(raw, context, host) if context is not None else raw
        self._tls = context is not None
        self._socket.setblocking(False)
        self.connection = Connection()
        self.connection.container = container_id
        self.connection.hostname = host
        self.transport = Transport()
        sasl = self.transport.sasl()
        sasl.allowed_mechs(mechanism)
        if mechanism == PLAIN:
            # proton sees no TLS (ours is around its transport); the check above keeps PLAIN to TLS or loopback
            sasl.allow_insecure_mechs = True
            self.connection.user = security.user
            self.connection.password = secret
        self.transport.bind(self.connection)
        self.collector = Collector()
        self.connection.collect(self.collector)
        self.connection.open()
        self.session = self.connection.session()
        self.session.open()
        self._transport = self.transport._impl
        self._collector = self.collector._impl
        self._links: dict = {}  # pn_link_t -> the Producer or Consumer that owns it
        self.failure: str = ""  # why the connection is unusable ("" while it is fine)
        self._failure_error: ClientError | None = None  # a refused login, raised as itself by check()
        self.closed = False

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

    # ---- moving bytes and events ---------------------------------------------------------------

    def pump(self, timeout_s: float) -> None:
        """Write what is pending, read what has arrived (waiting up to `timeout_s`), handle events."""
        self._write()
        transport = self._transport
        capacity = pn.pn_transport_capacity(transport)
        pending = pn.pn_transport_pending(transport)
        # TLS may hold decrypted bytes the socket no longer shows as readable
        buffered = self._tls and capacity > 0 and self._socket.pending() > 0
        readable, writable, _ = select.select([self._socket] if capacity > 0 else [],
                                              [self._socket] if pending > 0 else [], [],
                                              0 if buffered else max(timeout_s, 0))
        if readable or buffered:
            try:
                data = self._socket.recv(min(capacity, READ_CHUNK_BYTES))
            except _BLOCKED:
                data = None
            except ssl.SSLError as error:  # TLS 1.3: the node judges our certificate after our handshake ended
                self._tls_alert(error)
                data = None
            except OSError as error:
                self._lost(f"reading failed: {error.strerror or error}")
                data = None
            if data == b"":
                pn.pn_transport_close_tail(transport)
                self._lost(self._closed_early() or "the node closed the connection")
            elif data:
                pn.pn_transport_push(transport, data)
        if writable:
            self._write()
        self._dispatch()

    def _write(self) -> None:
        transport = self._transport
        while True:
            pending = pn.pn_transport_pending(transport)
            if pending <= 0:
                return
            # a TLS write that would block must be retried with at least the same bytes: pending only grows
            _, data = pn.pn_transport_peek(transport, min(pending, READ_CHUNK_BYTES))
            try:
                sent = self._socket.send(data)
            except _BLOCKED:
                return
            except OSError as error:
                pn.pn_transport_close_head(transport)
                self._lost(f"writing failed: {error.strerror or error}")
                return
            pn.pn_transport_pop(transport, sent)
            if sent < len(data):
                return

    def _dispatch(self) -> None:
        collector = self._collector
        links = self._links
        while True:
            event = pn.pn_collector_peek(collector)
            if not event:
                return
            kind = pn.pn_event_type(event)
            if kind == pn.PN_DELIVERY:
                delivery = pn.pn_event_delivery(event)
                owner = links.get(pn.pn_delivery_link(delivery))
                if owner is not None:
                    owner.on_delivery(delivery)
            elif kind == pn.PN_LINK_REMOTE_CLOSE or kind == pn.PN_LINK_REMOTE_DETACH:
                owner = links.get(pn.pn_event_link(event))
                if owner is not None:
                    owner.on_detached()
            elif kind == pn.PN_CONNECTION_REMOTE_CLOSE:
                name, description = _condition_text(self.connection.remote_condition)
                self._lost(f"the node closed the connection: {name} {description}".rstrip())
            elif kind == pn.PN_TRANSPORT_ERROR:
                name, description = _condition_text(self.transport.condition)
                if name == "amqp:unauthorized-access" and self._failure_error is None and not self.failure:
                    self._failure_error = self._refused_login(description)
                self._lost(f"transport error: {name} {description}".rstrip())
            pn.pn_collector_pop(collector)

    def _tls_alert(self, error: ssl.SSLError) -> None:
        why = error.reason or str(error)
        if self._failure_error is None and not self.failure:
            hint = (f"; if the node refused the client certificate {self.security.cert_file}, its tls_ca_file must "
                    f"hold the CA that signed it, and it must not have expired" if self.security.cert_file else "")
            self._failure_error = TlsFailed(f"TLS with the Grouper node at {self.address} failed: {why}{hint}")
        self._lost(f"TLS failed: {why}")

    def _closed_early(self) -> str:
        if not self.connection.state & Connection.REMOTE_UNINIT:
            return ""
        if not self._tls:
            return (f"the node closed the connection before the AMQP open; if {self.address} is the node's amqps "
                    f"port, set tls to true")
        if self.security.cert_file and self._failure_error is None and not self.failure:
            # the node's TLS refusal of our certificate arrives as a bare close under TLS 1.3
            self._failure_error = TlsFailed(
                f"the Grouper node at {self.address} closed the TLS connection before the AMQP open: it refuses a "
                f"client certificate its tls_ca_file did not sign, or one that expired (certFile "
                f"{self.security.cert_file}); the node's log says which")
        return "the node closed the TLS connection before the AMQP open (see the node's log)"

    def _lost(self, why: str) -> None:
        if not self.failure:
            self.failure = why

    def check(self) -> None:
        if self.failure and not self.closed:
            if self._failure_error is not None:
                raise self._failure_error
            raise ClientError(f"connection to the Grouper node at {self.address} failed: {self.failure}")

    def _refused_login(self, description: str) -> AuthenticationFailed:
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

    def wait(self, condition, what: str, timeout_ms: int | None = None) -> None:
        """Pump until `condition()` holds; raise naming `what` if the connection fails or time runs out."""
        timeout_ms = self.timeout_ms if timeout_ms is None else timeout_ms
        deadline = time.monotonic() + timeout_ms / 1000
        while not condition():
            self.check()
            remaining_s = deadline - time.monotonic()
            if remaining_s <= 0:
                raise ClientTimeout(f"timed out after {timeout_ms} ms waiting for {what} on the Grouper node at "
                                    f"{self.address}; raise 'timeoutMs' if the node is just slow")
            self.pump(min(remaining_s, 0.5))

    def wait_until(self, condition, deadline_s: float) -> bool:
        """Pump until `condition()` holds or the monotonic `deadline_s` passes; never raises on time."""
        while not condition():
            self.check()
            remaining_s = deadline_s - time.monotonic()
            if remaining_s <= 0:
                return False
            self.pump(min(remaining_s, 0.5))
        return True

    # ---- links -----------------------------------------------------------------------------------

    def attach(self, link, owner, what: str) -> None:
        self._links[link._impl] = owner
        link.open()
        self.wait(lambda: not (link.state & Link.REMOTE_UNINIT), f"the node to attach {what}")
        if link.state & Link.REMOTE_CLOSED or owner.detached:
            name, description = _condition_text(link.remote_condition)
            raise LinkRefused(f"the Grouper node at {self.address} refused {what}: {name or 'no condition'}"
                              f"{': ' + description if description else ''}", name)

    def close(self) -> None:
        if self.closed:
            return
        try:
            if not self.failure:
                self.connection.close()
                self.wait_until(lambda: bool(self.connection.state & Connection.REMOTE_CLOSED) or bool(self.failure),
                                time.monotonic() + CLOSE_WAIT_S)
        finally:
            self.closed = True
            self._socket.close()


class Producer:
    """One sender link with a bounded window of unsettled deliveries."""

    def __init__(self, connection: AmqpConnection, queue: str, name: str, window_messages: int):
        self.connection = connection
        self.queue = queue
        self.window_messages = window_messages
        self.sent = 0
        self.accepted = 0
        self.unsettled = 0
        self.detached = False
        self.failure: DeliveryRefused | None = None
        link = connection.session.sender(name)
        link.target.address = queue
        link.source.address = name
        link.snd_settle_mode = Link.SND_UNSETTLED
        self.link = link
        self._link = link._impl
        connection.attach(link, self, f"a producer link to queue {queue!r}")

    def send(self, payload: bytes) -> None:
        link = self._link
        if self.unsettled >= self.window_messages or pn.pn_link_credit(link) <= 0:
            self.connection.wait(self._can_send, f"credit or settlements for queue {self.queue!r}")
        if self.failure is not None:
            raise self.failure
        pn.pn_delivery(link, str(self.sent))  # the tag names the message in a refusal
        pn.pn_link_send(link, payload)
        pn.pn_link_advance(link)
        self.sent += 1
        self.unsettled += 1
        if self.sent % PUMP_EVERY_MESSAGES == 0:
            self.connection.pump(0)

    def _can_send(self) -> bool:
        if self.failure is not None or self.detached:
            return True
        return self.unsettled < self.window_messages and pn.pn_link_credit(self._link) > 0

    def flush(self) -> None:
        """Wait until the node has settled every message sent; raise if any was not accepted."""
        self.connection.wait(lambda: self.unsettled == 0 or self.detached,
                             f"the node to settle {self.unsettled} messages on queue {self.queue!r}")
        if self.failure is not None:
            raise self.failure
        if self.unsettled:
            self.on_detached()
            raise self.failure

    def on_delivery(self, delivery) -> None:
        if not pn.pn_delivery_settled(delivery):
            return  # the node always settles with the outcome; a bare state update is not one
        state = pn.pn_delivery_remote_state(delivery)
        if state == pn.PN_ACCEPTED:
            self.accepted += 1
        elif self.failure is None:
            wrapped = Delivery.wrap(delivery)
            name, description = _condition_text(wrapped.remote.condition)
            row = pn.pn_delivery_tag(delivery)
            self.failure = DeliveryRefused(
                f"the Grouper node at {self.connection.address} {_TERMINAL.get(state, 'did not accept')} message "
                f"{row} of this task (queue {self.queue!r}): {name or 'no condition'}"
                f"{': ' + description if description else ''}", name)
        pn.pn_delivery_settle(delivery)
        self.unsettled -= 1

    def on_detached(self) -> None:
        self.detached = True
        if self.failure is None:
            name, description = _condition_text(self.link.remote_condition)
            self.failure = DeliveryRefused(
                f"the Grouper node at {self.connection.address} detached the producer link of queue {self.queue!r}"
                f" with {self.unsettled} messages unsettled: {name or 'no condition'}"
                f"{': ' + description if description else ''}", name)

    def close(self) -> None:
        if not self.detached and not self.connection.failure:
            self.link.close()


class Taken:
    """A message a consumer holds: its bytes, and the unsettled delivery (None for a browser's copy)."""

    __slots__ = ("payload", "delivery", "consumer")

    def __init__(self, payload: bytes, delivery, consumer: "Consumer"):
        self.payload = payload
        self.delivery = delivery
        self.consumer = consumer


class Consumer:
    """One receiver link; credit is granted only by `drain` and `await_one`, never behind the caller's back."""

    def __init__(self, connection: AmqpConnection, queue: str, name: str, browse: bool):
        self.connection = connection
        self.queue = queue
        self.browse = browse
        self.arrived: list[Taken] = []
        self.unsettled = 0  # deliveries held (taken, not yet accepted or released and confirmed)
        self.detached = False
        link = connection.session.receiver(name)
        link.source.address = queue
        link.target.address = name
        if browse:
            link.source.distribution_mode = Terminus.DIST_MODE_COPY
        else:
            link.rcv_settle_mode = Link.RCV_SECOND
        self.link = link
        self._link = link._impl
        self._awaiting_confirm = 0
        what = f"a {'browser' if browse else 'consumer'} link on queue {queue!r}"
        connection.attach(link, self, what)

    def on_delivery(self, delivery) -> None:
        link = self._link
        if pn.pn_link_current(link) == delivery and not pn.pn_delivery_partial(delivery):
            _, payload = pn.pn_link_recv(link, pn.pn_delivery_pending(delivery))
            pn.pn_link_advance(link)
            if self.browse:
                pn.pn_delivery_settle(delivery)  # a browser's copy arrives settled; nothing to answer
                self.arrived.append(Taken(bytes(payload), None, self))
            else:
                self.unsettled += 1
                self.arrived.append(Taken(bytes(payload), delivery, self))
        elif pn.pn_delivery_settled(delivery) and self._awaiting_confirm:
            pn.pn_delivery_settle(delivery)  # the node applied our outcome: now this side forgets it
            self._awaiting_confirm -= 1
            self.unsettled -= 1

    def on_detached(self) -> None:
        self.detached = True

    def drain(self, credit: int) -> list[Taken]:
        """Everything the node can give this link now, up to `credit`: one drain round trip."""
        link = self._link
        pn.pn_link_set_drain(link, True)
        pn.pn_link_flow(link, credit)
        self.connection.wait(lambda: not pn.pn_link_draining(link) or self.detached,
                             f"the node to answer a drain on queue {self.queue!r}")
        pn.pn_link_set_drain(link, False)
        return self.take_arrived()

    def await_one(self, deadline_s: float) -> list[Taken]:
        """Wait, until the monotonic `deadline_s`, for one message; then take back any unused credit."""
        pn.pn_link_flow(self._link, 1)
        self.connection.wait_until(lambda: bool(self.arrived) or self.detached, deadline_s)
        return self.take_arrived() + (self.drain(0) if pn.pn_link_credit(self._link) > 0 else [])

    def take_arrived(self) -> list[Taken]:
        if self.detached and not self.arrived:
            name, description = _condition_text(self.link.remote_condition)
            raise LinkRefused(f"the Grouper node at {self.connection.address} detached the consumer of queue "
                              f"{self.queue!r}: {name or 'no condition'}{': ' + description if description else ''}",
                              name)
        taken, self.arrived = self.arrived, []
        return taken

    def settle(self, taken: list[Taken], state: int) -> None:
        """Send one outcome for each held delivery (in the given order); confirmed by `wait_confirmed`."""
        for item in taken:
            delivery = item.delivery
            if delivery is None:
                continue
            pn.pn_delivery_update(delivery, state)
            if state == pn.PN_ACCEPTED:
                self._awaiting_confirm += 1  # settled once the node has applied it (settle-mode second)
            else:
                pn.pn_delivery_settle(delivery)
                self.unsettled -= 1
            item.delivery = None

    def confirmed(self) -> bool:
        return self._awaiting_confirm == 0 or self.detached

    def close(self) -> None:
        if not self.detached and not self.connection.failure:
            self.link.close()


class Acquisition:
    """Messages one reader takes from a queue over one connection, held until accepted or released.

    The node caps each consumer link at its `link_unsettled_max` unsettled deliveries, so a reader
    that holds more opens more links, up to `links_max`. A message group stays on one link while it
    has unsettled messages there (exclusive and shared queues alike), so taking the links' arrivals
    in arrival order keeps each group's messages in queue order.
    """

    def __init__(self, connection: AmqpConnection, queue: str, browse: bool, link_unsettled_max: int,
                 links_max: int, name: str):
        self.connection = connection
        self.queue = queue
        self.browse = browse
        self.link_unsettled_max = link_unsettled_max
        self.links_max = links_max
        self.name = name
        self.consumers: list[Consumer] = []
        self.held: list[Taken] = []  # taken and not yet settled, in arrival order

    def _room(self, consumer: Consumer) -> int:
        return self.link_unsettled_max if self.browse else self.link_unsettled_max - consumer.unsettled

    def _consumer_with_room(self) -> Consumer | None:
        for consumer in self.consumers:
            if self._room(consumer) > 0:
                return consumer
        if len(self.consumers) >= self.links_max:
            return None
        consumer = Consumer(self.connection, self.queue, f"{self.name}-{len(self.consumers)}", self.browse)
        self.consumers.append(consumer)
        return consumer

    def take(self, count_max: int, idle_timeout_ms: int) -> list[Taken]:
        """Up to `count_max` messages: stop early when nothing more arrives within `idle_timeout_ms`
        (0: when the node has nothing available now) or when every link holds its maximum."""
        taken: list[Taken] = []
        idle_deadline_s = None
        while len(taken) < count_max:
            consumer = self._consumer_with_room()
            if consumer is None:
                break
            arrived = consumer.drain(min(self._room(consumer), count_max - len(taken)))
            if not arrived and idle_timeout_ms > 0:
                if idle_deadline_s is None:
                    idle_deadline_s = time.monotonic() + idle_timeout_ms / 1000
                if time.monotonic() < idle_deadline_s:
                    arrived = consumer.await_one(idle_deadline_s)
            if not arrived:
                break
            idle_deadline_s = None
            taken.extend(arrived)
        if not self.browse:
            self.held.extend(taken)
        return taken

    def accept(self, taken: list[Taken]) -> None:
        """Accept these messages; returns once the node has applied every accept."""
        self._settle(taken, pn.PN_ACCEPTED)
        self.connection.wait(lambda: all(c.confirmed() for c in self.consumers),
                             f"the node to confirm {len(taken)} accepts on queue {self.queue!r}")

    def release(self, taken: list[Taken]) -> None:
        """Give these messages back to the queue, in the order given (each returns to its place)."""
        self._settle(taken, pn.PN_RELEASED)
        self.connection.pump(0)

    def release_all(self) -> None:
        self.release(list(self.held))

    def _settle(self, taken: list[Taken], state: int) -> None:
        for consumer in self.consumers:
            consumer.settle([item for item in taken if item.consumer is consumer], state)
        done = {id(item) for item in taken}
        self.held = [item for item in self.held if id(item) not in done]

    def close(self) -> None:
        for consumer in self.consumers:
            consumer.close()
