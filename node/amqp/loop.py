"""The engine loop: the node's AMQP adapter, driving proton's C engine from one asyncio loop.

Engine loop thread only (other threads enter through `bridge`). Rules:
- One wake-up is one batch: bytes read are pushed into proton as they arrive; then, once per loop
  iteration, the events of every connection are drained in one pass and turned into core calls, the
  core's effects into proton calls, the batch's settlements and journal unit are issued, and every
  connection with something to send writes it in one socket write.
- No proton Python object (Container, Event, Link, Delivery) exists here: links and deliveries are
  pointers, and what the node knows of them lives in `links.Consumer` / `links.Producer` records.
  The core sees consumer ids and delivery ids (ints, also the delivery tags).
- Engine objects are freed here: a link when both ends have detached, a session when both have
  ended, a connection's transport and connection once its socket is gone and its last events drained.
- A producer's delivery is settled as accepted only after the message is in its queue and, for a
  durable queue, its journal batch is on disk; either way at the end of a batch, so many
  settlements share a disposition frame. Refusals are rejections with a condition, at once.
- A durable send is in the broker (and may be delivered) before its batch is on disk. If the batch
  fails, the core takes back what no consumer has seen (Broker.take_back) and the producer is refused;
  a send a consumer already has is refused with a description saying its outcome is unknown.
- A consumer's outcome that removes a message is settled only once the removal is on disk: settling
  promises the message is gone for good. If the batch fails, the delivery is left unsettled and the
  consumer's link is detached with the failure's condition (a restart would deliver it again).
- Journal records nobody waits for (a removal its consumer settled first, a presettled send) promise
  nothing: they are held back from the writer until a batch has a waiter, the next tick or
  JOURNAL_HELD_MAX_BYTES, and a unit nobody waits for is reported only with a later one. At moderate
  rates each message makes batches of its own, and each would otherwise cost an fsync and a wake-up.
- A queue at its depth limit rejects with amqp:resource-limit-exceeded rather than withholding
  credit: a link may carry messages for several queues (anonymous relay), and a rejection tells
  the producer at once which message failed and why.
- A link the node refuses gets an attach whose terminus is null (the source of a consumer, the
  target of a producer), then a detach with the condition (AMQP 1.0, 2.6.3).
- A link the client detaches without closing it (closed=false, a suspended link) ends its consumer
  at once, as a closed one does: its unsettled messages are released in order and its groups freed.
  The node keeps no suspended link to resume; a client that attaches again is a new consumer.
- A send to a multicast address is copied to each of its subscription queues (node/core/addresses.py)
  after every copy passed the checks that refuse a send (group id, depth, journal), and is settled once,
  after its last copy. A copy refused later (at its group's node) rejects the send; the other copies stay.
  With no subscription it is accepted and discarded, as Artemis does.
- A subscription a topic attach made is deleted when its link ends, unless the link asked for a durable
  one (expiry policy never): that one goes only when the client closes the link (unsubscribes).
- A traced queue's sends, deliveries and outcomes are told to the tracer (node/amqp/tracer.py) as they
  happen here; its lines leave for the trace writer's thread once per batch. An untraced queue costs a
  settings lookup per delivery and nothing else.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
import time

from node.amqp import codec
from node.amqp.bridge import Bridge
from node.amqp.conditions import RESOURCE_DELETED, RESOURCE_LIMIT, condition_for
from node.amqp.connection import Connection
from node.amqp.gate import Gate
from node.amqp.engine import (ACCEPTED, CONNECTION_REMOTE_CLOSE, CONNECTION_REMOTE_OPEN, DELIVERY, LINK_FLOW,
                              LINK_REMOTE_CLOSE, LINK_REMOTE_DETACH, LINK_REMOTE_OPEN, LOCAL_ACTIVE, LOCAL_UNINIT,
                              MODIFIED, REJECTED, RELEASED, SESSION_REMOTE_CLOSE, SESSION_REMOTE_OPEN,
                              TRANSPORT, TRANSPORT_CLOSED, TRANSPORT_ERROR, condition_text, ffi, lib,
                              set_condition, symbols, text)
from node.amqp.links import DURABLE, TEMPORARY, Consumer, FanOut, Producer
from node.amqp.tracer import Tracer
from node.amqp.executor import EffectExecutor
from node.core.durability import CONSUMER, Durability
from node.core.access import Permission
from node.core.address_settings import split_address
from node.core.addresses import (EXISTING_QUEUE_CAPABILITY, TOPIC_CAPABILITY, SendTally, no_such_queue, split_fqqn,
                                 subscription_name)
from node.core.effects import DetachConsumer, Removed
from node.core.shell import NodeShell
from node.core.outbound import OUTBOUND_PREFIX
from node.core.errors import AlreadyExists, GrouperError, NotFound, ResourceLimitExceeded
from node.core.message import Message, Outcome
from node.store.failures import JournalFailure

log = logging.getLogger("grouper.amqp")

# TTL expiry, delayed dispatch and heartbeats run at least this often; redelivery delays do not wait
# for it: each Delayed effect sets a timer at its deadline (_redelivery_due), so they resolve to ~1 ms
TICK_INTERVAL_S = 0.1
JOURNAL_RETRY_INTERVAL_MS = 1000  # after a failed journal write, durable sends are refused this long
MESSAGE_SIZE_MAX_BYTES = 16 << 20  # larger incoming messages are rejected with amqp:resource-limit-exceeded
# bytes proton buffers per session before the node reads them: the session's incoming window is this
# over the max frame size (32 KiB by default: 256 frames), which stops a client sending more
SESSION_INCOMING_MAX_BYTES = 8 << 20
OUTPUT_MAX_BYTES = 4 << 20  # socket output buffered per connection before its input is no longer read
OUTPUT_CHUNK_BYTES = 1 << 20  # one copy out of proton's output buffer
RECEIVE_BUFFER_BYTES = 64 << 10  # first size of the buffer incoming messages are copied through
SHUTDOWN_GRACE_S = 0.3  # time for close frames to leave before the loop stops
# journal records nobody waits for (removals a consumer settled first, presettled sends) are held back
# from the writer until a batch has a waiter, the next tick, or this much is held: at moderate rates
# each message would otherwise cost the writer a wake-up and an fsync of its own
JOURNAL_HELD_MAX_BYTES = 1 << 20

SND_SETTLED = lib.PN_SND_SETTLED
DIST_MODE_COPY = lib.PN_DIST_MODE_COPY
UNSPECIFIED = lib.PN_UNSPECIFIED


def new_event_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop  # about a third of asyncio's cost per wake-up
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


class AmqpServer:
    def __init__(self, broker, journal, config, clock_ms, security, tls_context=None):
        self.broker = broker
        if broker.dead_letter_stamp is None:  # dead letters record their original queue and why, in AMQP
            broker.dead_letter_stamp = codec.stamp_dead_letter
        self._redelivery_timer_ms: int | None = None  # the earliest redelivery deadline a timer is set for
        self.journal = journal  # None: no journal (every queue behaves as non-durable)
        self.config = config
        self.clock_ms = clock_ms
        self.loop = new_event_loop()
        self.bridge = Bridge(self._wake_from_thread, lambda: self.loop.call_soon(self._drain_bridge))
        self.gate = Gate(security, self.loop, clock_ms, config, tls_context)
        self.cluster = None  # node.cluster.ClusterLink when this node is one of several
        self.stopping = False
        self.consumers: dict[int, Consumer] = {}
        self.producers: dict[int, Producer] = {}
        self._container_id = f"grouper-{os.getpid()}".encode()
        self._collector = lib.pn_collector()
        self._listeners: list = []
        self._thread = None
        self._by_pointer: dict = {}  # pn_connection pointer -> Connection (until released)
        self._accepted: dict[int, Connection] = {}  # connection key -> Connection, within connections_max
        self._links: dict = {}  # pn_link pointer -> Consumer or Producer, while the link is attached
        self._next_link_id = 1
        self._next_connection_key = 1
        self._dirty: set = set()  # connections with something to send
        self._receiving: set = set()  # producers that took messages this batch: credit topped up at its end
        self._lost: list = []  # connections whose sockets are gone: released after the batch
        self._backlogged: set = set()  # connections with input waiting for the next batch (connection.py)
        self._batch_due = False
        self._credit_withheld = False  # a producer's credit waits for the journal's backlog to shrink
        self._journal_due = False  # the tick asks for held journal records to go to the writer
        self._output_buffer = ffi.new("char[]", OUTPUT_CHUNK_BYTES)
        self._receive_buffer = ffi.new("char[]", RECEIVE_BUFFER_BYTES)
        self._receive_buffer_bytes = RECEIVE_BUFFER_BYTES
        # the commit cycle (node/core/shell.py): what waits for the journal, when sends are accepted; a
        # cluster link puts its protocol in (node/cluster.py)
        self.durability = Durability(JOURNAL_RETRY_INTERVAL_MS)
        self.shell = NodeShell(broker, self.durability, journalled=journal is not None)
        self.carry = EffectExecutor(self).table  # effect type -> how this loop carries it out; a cluster adds its own
        # subscription queues the config declares: their groups are routed cluster-wide like any queue's,
        # as are those an attach made once their cluster-wide definition is in (every node holds them then)
        self._declared_subscriptions = {settings.name for settings in config.queues if settings.address}
        self.unrouted: dict[str, int] = {}  # multicast address -> sends accepted and discarded: no subscription
        self.tracer = Tracer(config.node_id, broker, None, clock_ms)  # the runtime gives it its writer
        self._handlers = {
            DELIVERY: self._on_delivery,
            LINK_FLOW: self._on_link_flow,
            TRANSPORT: self._on_transport,
            CONNECTION_REMOTE_OPEN: self._on_connection_remote_open,
            SESSION_REMOTE_OPEN: self._on_session_remote_open,
            LINK_REMOTE_OPEN: self._on_link_remote_open,
            LINK_REMOTE_CLOSE: self._on_link_remote_close,
            LINK_REMOTE_DETACH: self._on_link_remote_close,
            SESSION_REMOTE_CLOSE: self._on_session_remote_close,
            CONNECTION_REMOTE_CLOSE: self._on_connection_remote_close,
            TRANSPORT_ERROR: self._on_transport_error,
            TRANSPORT_CLOSED: self._on_transport_closed,
        }

    # ---- lifecycle (the caller's thread, before `start` and after `stop`) ---------------------

    def listen(self, host: str, port: int, tls: bool = False) -> int:
        """Bind an AMQP listener, over TLS if `tls`; returns the port (port 0 picks one). Raises OSError
        if it cannot."""
        if tls:
            return self._listen_tls(host, port)
        listener = self.loop.run_until_complete(self.loop.create_server(
            lambda: self._new_connection(False), host, port, reuse_address=True, backlog=1024))
        self._listeners.append(listener)
        return listener.sockets[0].getsockname()[1]

    def _listen_tls(self, host: str, port: int) -> int:
        """The TLS listener accepts here, so that a socket is admitted (counted toward its address's
        connections_per_address_max) before its handshake, and released if the handshake fails:
        asyncio's own TLS server shows the protocol nothing before the handshake has succeeded."""
        family, kind, protocol, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                                flags=socket.AI_PASSIVE)[0]
        listener = socket.socket(family, kind, protocol)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(address)
            listener.listen(1024)
            listener.setblocking(False)
        except OSError:
            listener.close()
            raise
        self._listeners.append(_TlsListener(listener, self.loop.create_task(self._accept_tls(listener))))
        return listener.getsockname()[1]

    async def _accept_tls(self, listener: socket.socket) -> None:
        while not self.stopping:
            try:
                client, address = await self.loop.sock_accept(listener)
            except OSError:  # the listener closed: the node is stopping
                return
            except asyncio.CancelledError:
                return
            if self.gate.admit_tls(address[0]):
                self.loop.create_task(self._handshake_tls(client, address[0]))
            else:
                client.close()

    async def _handshake_tls(self, client: socket.socket, host: str) -> None:
        connection = self._new_connection(True)
        connection.admitted = True  # by admit_tls
        try:
            await self.loop.connect_accepted_socket(
                lambda: connection, client, ssl=self.gate.tls_context,
                ssl_handshake_timeout=self.config.handshake_timeout_ms / 1000)
        except Exception as error:  # noqa: BLE001 - however the handshake fails (SSL, timeout, reset), it ends here
            client.close()
            connection.admitted = False
            self.gate.tls_failed(host, error)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="engine", daemon=True)
        self._thread.start()

    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stop(self, wait_s: float) -> None:
        """Close every connection (their close frames get SHUTDOWN_GRACE_S to leave), then stop the loop."""
        if not self.is_alive():
            return
        self.bridge.post(self._shutdown)
        self._thread.join(wait_s)

    def _run(self) -> None:
        self.bridge.loop_thread_id = threading.get_ident()
        asyncio.set_event_loop(self.loop)
        self.loop.set_exception_handler(_stop_on_bug)
        self.loop.call_later(TICK_INTERVAL_S, self._tick)
        self.wake()  # journals the declarations made during recovery
        try:
            self.loop.run_forever()
        except BaseException:
            log.exception("the engine loop stopped on an unexpected error")
            os._exit(70)  # a broken invariant: stop the process, the supervisor restarts it

    def _shutdown(self) -> None:
        self.stopping = True
        for listener in self._listeners:
            listener.close()
        self.close_connections()
        self.loop.call_later(SHUTDOWN_GRACE_S, self._stop_loop)

    def _stop_loop(self) -> None:
        self.bridge.close()
        for connection in list(self._by_pointer.values()):
            connection.close_socket()
        self.loop.stop()

    def _new_connection(self, tls: bool) -> Connection:
        return Connection(self, self._collector, self._container_id, OUTPUT_MAX_BYTES, tls)

    def made(self, connection: Connection) -> None:
        """A socket is ready (over TLS: its handshake succeeded) and its proton objects exist."""
        self._by_pointer[connection.connection] = connection

    # ---- wake-ups ----------------------------------------------------------------------------

    def touched(self, connection: Connection) -> None:
        """A connection has new input or room for output: it takes part in the next batch."""
        self._dirty.add(connection)
        self.wake()

    def wake(self) -> None:
        if not self._batch_due:
            self._batch_due = True
            self.loop.call_soon(self._batch_if_due)

    def backlogged(self, connection: Connection) -> None:
        self._backlogged.add(connection)
        self.wake()

    def lost(self, connection: Connection) -> None:
        self.gate.lost(connection)
        self._lost.append(connection)
        self.wake()

    def _wake_from_thread(self) -> None:  # any thread: the bridge has closures waiting
        self.loop.call_soon_threadsafe(self._drain_bridge)

    def _drain_bridge(self) -> None:
        self.bridge.drain()
        # what the closures did goes out in this wake-up, not after another turn of the loop (a wake-up
        # from another thread, a journal report above all, is the whole batch at moderate rates)
        self._batch()

    def _batch_if_due(self) -> None:
        if self._batch_due:  # else a batch has run since this call was scheduled
            self._batch()

    def _tick(self) -> None:
        if self.stopping:
            return
        now_ms = self.clock_ms()
        self.execute(self.shell.tick(now_ms))
        if self.cluster is not None:
            self.cluster.tick(now_ms)
        self.gate.tick(now_ms)
        if self.tracer.lines:  # what an admin call or the tick traced outside a batch
            self.tracer.flush()
        if self.journal is not None and self.journal.pending_bytes():
            self._journal_due = True
        heartbeat_ms = int(time.monotonic() * 1000)
        for connection in self._accepted.values():
            connection.tick(heartbeat_ms)
            self._dirty.add(connection)  # a heartbeat frame comes with no event to say so
        self.wake()
        self.loop.call_later(TICK_INTERVAL_S, self._tick)

    # ---- one batch ---------------------------------------------------------------------------

    def _batch(self) -> None:
        self._batch_due = False
        if self._backlogged:
            backlogged, self._backlogged = self._backlogged, set()
            for connection in backlogged:
                if connection.push_backlog():
                    self._backlogged.add(connection)
                self._dirty.add(connection)
        self._drain_events()
        self._end_batch()
        self._drain_events()  # what the batch's settlements and journal unit stirred up
        buffer = self._output_buffer
        dirty, self._dirty = self._dirty, set()
        for connection in dirty:
            connection.flush(buffer, OUTPUT_CHUNK_BYTES)
        if self.tracer.lines:
            self.tracer.flush()
        if self.journal is not None:
            self.journal.wake_writer()  # now that the batch is out: the writer gets the GIL at once
        if self._lost:
            lost, self._lost = self._lost, []
            for connection in lost:
                self._forget_connection(connection)
            self._drain_events()  # the closed transports' last events refer to their objects
            for connection in lost:
                self._by_pointer.pop(connection.connection, None)
                self._dirty.discard(connection)
                self._backlogged.discard(connection)
                connection.release()

    def _drain_events(self) -> None:
        collector = self._collector
        handlers = self._handlers
        peek, pop, event_type = lib.pn_collector_peek, lib.pn_collector_pop, lib.pn_event_type
        event = peek(collector)
        while event:
            handler = handlers.get(event_type(event))
            if handler is not None:
                handler(event)
            pop(collector)
            event = peek(collector)

    def _end_batch(self) -> None:
        if self._receiving:
            # in bulk, once the window is half used: one flow frame per producer per batch at most
            receiving, self._receiving = self._receiving, set()
            for producer in receiving:
                if producer.alive:
                    self._top_up(producer)
        # non-durable sends accepted, declarations journalled, the cluster protocol's batch; then the unit
        shell = self.shell
        now_ms = self.clock_ms()
        self.execute(shell.end_batch(now_ms))
        journal = self.journal
        if journal is None:
            self.execute(shell.batch_ended(None, now_ms))
            return
        report = shell.waiting or self._credit_withheld
        if report or self._journal_due or journal.pending_bytes() >= JOURNAL_HELD_MAX_BYTES:
            # a unit nobody waits for is reported only with a later one (journal.py): no wake-up for it
            ticket = journal.flush(report=report, wake=False)
            self._journal_due = False
            self.execute(shell.batch_ended(ticket, now_ms))
        # else nothing waits for this batch's records: held for a later unit or the tick

    # ---- the journal writer's reports (through the bridge) -----------------------------------

    def journal_durable(self, ticket: int) -> None:
        """Every record up to `ticket` is on disk."""
        self.execute(self.shell.durable(ticket, self.clock_ms()))
        if self._credit_withheld:  # while the journal's backlog was full
            self._credit_withheld = False
            self._top_up_all()

    def journal_bodies(self, queue: str, bodies: dict) -> None:
        """Paged-out bodies the journal read back: dispatch goes on with them."""
        self.apply(self.broker.page_in(queue, bodies, self.clock_ms()))

    def journal_records(self, queue: str, records: dict) -> None:
        """Records the journal read back whole: a cold tail's join the warm part; an outbound channel's
        (node/core/outbound.py) go to their owner's forwarder."""
        if queue.startswith(OUTBOUND_PREFIX):
            self.cluster.outbound_read(queue, records)
            return
        if self.cluster is not None and self.cluster.cold_records(queue, records):
            return  # a sweep's, for groups moving away
        self.apply(self.broker.promote(queue, records, self.clock_ms()))

    def journal_failed(self, ticket: int, reason: JournalFailure) -> None:
        """The batch ending at `ticket` could not be written: take back its sends, refuse their producers
        (node/core/shell.py)."""
        self.execute(self.shell.failed(ticket, reason, self.clock_ms()))

    # ---- connections and sessions ------------------------------------------------------------

    def _connection_of(self, event) -> Connection | None:
        return self._by_pointer.get(lib.pn_event_connection(event))

    def _on_transport(self, event) -> None:
        connection = self._connection_of(event)
        if connection is not None:
            self._dirty.add(connection)

    def _on_connection_remote_open(self, event) -> None:
        connection = self._connection_of(event)
        if connection is None:
            return
        pointer = connection.connection
        self._dirty.add(connection)
        if len(self._accepted) >= self.config.connections_max or self.stopping:
            lib.pn_connection_open(pointer)
            reason = ("the node is shutting down" if self.stopping else
                      f"this node accepts at most {self.config.connections_max} connections (connections_max)")
            set_condition(lib.pn_connection_condition(pointer), RESOURCE_LIMIT, reason)
            lib.pn_connection_close(pointer)
            return
        connection.key = self._next_connection_key
        self._next_connection_key += 1
        self.gate.opened(connection)
        self._accepted[connection.key] = connection
        if lib.pn_connection_state(pointer) & LOCAL_UNINIT:
            lib.pn_connection_open(pointer)

    def _on_session_remote_open(self, event) -> None:
        session = lib.pn_event_session(event)
        if lib.pn_session_state(session) & LOCAL_UNINIT:
            lib.pn_session_set_incoming_capacity(session, SESSION_INCOMING_MAX_BYTES)
            lib.pn_session_open(session)

    def _on_session_remote_close(self, event) -> None:
        session = lib.pn_event_session(event)
        connection = self._connection_of(event)
        if connection is not None:
            for state in [state for state in connection.links if lib.pn_link_session(state.link) == session]:
                self._forget_link(state)
        if lib.pn_session_state(session) & LOCAL_ACTIVE:
            lib.pn_session_close(session)
        lib.pn_session_free(session)  # with its links, which no record names any more

    def _on_connection_remote_close(self, event) -> None:
        connection = self._connection_of(event)
        if connection is None:
            return
        self._forget_connection(connection)
        self._dirty.add(connection)
        if lib.pn_connection_state(connection.connection) & LOCAL_ACTIVE:
            lib.pn_connection_close(connection.connection)

    def _on_transport_error(self, event) -> None:
        connection = self._connection_of(event)
        if connection is None or connection.error_logged:
            return  # proton reports a broken connection more than once
        connection.error_logged = True
        reason = condition_text(lib.pn_transport_condition(lib.pn_event_transport(event)))
        log.info("connection %s dropped: %s", connection.peer, reason or "no reason given")

    def _on_transport_closed(self, event) -> None:
        connection = self._connection_of(event)
        if connection is not None:
            self._forget_connection(connection)
            self._dirty.add(connection)

    def _forget_connection(self, connection: Connection) -> None:
        if not connection.key:
            return
        self._accepted.pop(connection.key, None)
        connection.key = 0
        states = sorted(connection.links, key=lambda state: state.id)
        connection.links.clear()
        now_ms = self.clock_ms()
        for state in states:
            state.alive = False
            self._links.pop(state.link, None)
            if state.producer:
                self.producers.pop(state.id, None)
            elif self.consumers.pop(state.id, None) is not None:
                self.tracer.detached(state.id, state.label, "connection closed")
                self.apply(self.broker.detach_consumer(state.id, now_ms))
                if state.subscription == TEMPORARY:
                    self._unsubscribe(state.queue)

    def close_connections(self) -> None:
        for connection in list(self._by_pointer.values()):
            if not connection.released and lib.pn_connection_state(connection.connection) & LOCAL_ACTIVE:
                lib.pn_connection_close(connection.connection)
                self._dirty.add(connection)
        self.wake()

    # ---- links -------------------------------------------------------------------------------

    def _on_link_remote_open(self, event) -> None:
        link = lib.pn_event_link(event)
        connection = self._connection_of(event)
        if connection is None or not connection.key:
            return  # the connection was refused
        self._dirty.add(connection)
        lib.pn_terminus_copy(lib.pn_link_source(link), lib.pn_link_remote_source(link))
        lib.pn_terminus_copy(lib.pn_link_target(link), lib.pn_link_remote_target(link))
        sender = lib.pn_link_is_sender(link)
        try:
            if sender:
                self._open_consumer(link, connection)
            else:
                self._open_producer(link, connection)
        except GrouperError as error:
            # AMQP 1.0, 2.6.3: the terminus the client asked for is null in our attach, then the detach says why
            lib.pn_terminus_set_type(lib.pn_link_source(link) if sender else lib.pn_link_target(link), UNSPECIFIED)
            lib.pn_link_open(link)
            self._close_link(link, condition_for(error))

    def _open_consumer(self, link, connection: Connection) -> None:
        source = lib.pn_link_remote_source(link)
        address = text(lib.pn_terminus_get_address(source))
        if not address:
            raise NotFound("a consumer link needs a source address naming a queue")
        now_ms = self.clock_ms()
        browse = lib.pn_terminus_get_distribution_mode(source) == DIST_MODE_COPY
        permission = Permission.BROWSE if browse else Permission.CONSUME
        consumer_id = self._next_id()
        subscribed = self._subscription(link, connection, address, permission, consumer_id)
        if subscribed is not None:
            queue, subscription = subscribed
        else:
            create = EXISTING_QUEUE_CAPABILITY not in symbols(lib.pn_terminus_capabilities(source))
            queue, subscription = self._authorized_queue(connection, address, permission, create), ""
        address = queue.settings.name  # without the address's parameters
        try:
            effects = self.broker.attach_consumer(address, consumer_id, browse, now_ms,
                                                  self.config.link_unsettled_max)
        except GrouperError:
            if subscription == TEMPORARY:
                self._unsubscribe(address)
            raise
        presettled = lib.pn_link_remote_snd_settle_mode(link) == SND_SETTLED
        label = f"{text(lib.pn_connection_remote_container(connection.connection)) or ''}/" \
                f"{text(lib.pn_link_name(link)) or ''}"
        state = Consumer(consumer_id, link, connection, address, browse, presettled,
                         queue.settings.group_first_key, label)
        state.subscription = subscription
        self.consumers[consumer_id] = state
        self._links[link] = state
        connection.links.add(state)
        lib.pn_link_set_snd_settle_mode(link, lib.pn_link_remote_snd_settle_mode(link))
        lib.pn_link_set_rcv_settle_mode(link, lib.pn_link_remote_rcv_settle_mode(link))
        lib.pn_link_open(link)
        if queue.settings.trace and not browse:
            self.tracer.attached(consumer_id, label, address)
        self.apply(effects)
        if lib.pn_link_credit(link):
            self._credit(state)

    def _subscription(self, link, connection: Connection, address: str, permission: Permission,
                      consumer_id: int):
        """(queue, Consumer.subscription) when a consumer's `address` names a subscription: ADDRESS::QUEUE,
        or a multicast address (or any unknown one with the topic capability), which subscribes the link
        through a queue of its own, created here if need be. None: `address` names a queue."""
        broker = self.broker
        if address in broker.queues:
            return None  # a queue whose name has '::' in it is still reached by that name
        access = self.gate.security.access
        user = connection.user
        fqqn = split_fqqn(address)
        if fqqn is not None:
            name, queue_name = fqqn
            access.check(user, permission, queue_name)
            queue = broker.queues.get(queue_name)
            if queue is not None:
                if queue.settings.address != name:
                    bound = f"subscribes to {queue.settings.address!r}" if queue.settings.address else "is an anycast queue"
                    raise AlreadyExists(f"queue {queue_name!r} {bound}, not to address {name!r}: attach to "
                                        f"{queue.settings.address or queue_name}{'::' + queue_name if queue.settings.address else ''}")
                return queue, ""
            self._check_multicast(name)
            access.check(user, Permission.CREATE, queue_name)
            return broker.subscribe(name, queue_name), ""  # as Artemis auto-creates a queue named by its FQQN
        source = lib.pn_link_remote_source(link)
        topic = TOPIC_CAPABILITY in symbols(lib.pn_terminus_capabilities(source))
        if not (topic or broker.addresses.is_multicast(address)):
            return None
        if "?" in address:
            raise NotFound(f"{address!r}: a subscription takes its settings from the address settings; attach to "
                           f"the address without parameters")
        access.check(user, permission, address)
        durable = lib.pn_terminus_get_expiry_policy(source) == lib.PN_EXPIRE_NEVER
        container = text(lib.pn_connection_remote_container(connection.connection)) or ""
        name = subscription_name(container, text(lib.pn_link_name(link)) or "", durable, consumer_id)
        queue = broker.queues.get(name)
        if queue is not None:  # a durable subscription attached again
            if queue.settings.address != address:
                raise AlreadyExists(f"subscription queue {name!r} (container id '.' link name) exists for "
                                    f"{queue.settings.address or 'no address'!r}, not {address!r}: use another "
                                    f"link name, or detach with close to end that subscription")
            return queue, DURABLE
        self._check_multicast(address)
        access.check(user, Permission.CREATE, address)
        return broker.subscribe(address, name, durable=durable), DURABLE if durable else TEMPORARY

    def _check_multicast(self, address: str) -> None:
        """`address` can take a new subscription: multicast already, or unknown (becoming multicast, as
        Artemis auto-creates an address) when auto-create is on."""
        if self.broker.addresses.is_multicast(address):
            return
        if address in self.broker.queues:
            raise AlreadyExists(f"{address!r} is an anycast queue, not a multicast address: consume it by its "
                                f"name, without ADDRESS::QUEUE or the topic capability")
        if not self.broker.auto_create:
            raise NotFound(f"no multicast address {address!r} on this node and auto-create is off: declare it "
                           f"with an [[address]] table")

    def _unsubscribe(self, name: str) -> None:
        """Delete a subscription queue its link made, once no consumer is left on it."""
        queue = self.broker.queues.get(name)
        if queue is None or queue.consumers:
            return
        durable = queue.settings.durable
        self.apply(self.broker.unsubscribe(name))  # in a cluster, on every node (node/core/cluster/definitions.py)
        if durable and self.journal is not None:
            self.journal.delete(name)

    def _open_producer(self, link, connection: Connection) -> None:
        target = lib.pn_link_remote_target(link)
        address = text(lib.pn_terminus_get_address(target))
        if address and self.broker.addresses.is_multicast(address):  # copied to its subscriptions
            self.gate.security.access.check(connection.user, Permission.SEND, address)
        elif address:  # messages to 'orders?group-buckets=8' go to orders
            create = EXISTING_QUEUE_CAPABILITY not in symbols(lib.pn_terminus_capabilities(target))
            address = self._authorized_queue(connection, address, Permission.SEND, create).settings.name
        state = Producer(self._next_id(), link, connection, address or None)
        self.producers[state.id] = state
        self._links[link] = state
        connection.links.add(state)
        lib.pn_link_set_max_message_size(link, MESSAGE_SIZE_MAX_BYTES)
        lib.pn_link_set_rcv_settle_mode(link, lib.pn_link_remote_rcv_settle_mode(link))
        lib.pn_link_open(link)
        lib.pn_link_flow(link, self.config.producer_credit_window)

    def _authorized_queue(self, connection: Connection, address: str, permission: Permission, create: bool = True):
        """The queue `address` names, if the connection's user holds `permission` on it, and may create
        it when it does not exist yet (and `create`: the link did not ask for an existing queue only);
        raises Unauthorized (or NotFound) otherwise. The address's
        parameters ('orders?group-buckets=1024') shape a queue created here, and must match an existing
        one; permissions are decided on the queue name alone, so parameters never widen them."""
        # a queue declared with a '?' in its name is still reached by that name
        name, parameters = (address, {}) if address in self.broker.queues else split_address(address)
        access = self.gate.security.access
        fqqn = split_fqqn(name) if name not in self.broker.queues else None
        if fqqn is not None:  # one subscription of a multicast address, which must exist (Artemis's FQQN)
            multicast, name = fqqn
            queue = self.broker.queues.get(name)
            if queue is None or queue.settings.address != multicast or parameters:
                raise NotFound(f"{address!r}: no subscription queue {name!r} of address {multicast!r} on this node"
                               f"{' (parameters are not taken here)' if parameters else ''}")
            access.check(connection.user, permission, name)
            return queue
        access.check(connection.user, permission, name)
        if name not in self.broker.queues and not create:
            # only names the user may use this way are offered: the refusal tells no other queue's name
            raise NotFound(no_such_queue(name, (other for other in self.broker.queues
                                                if access.allows(connection.user, permission, other))))
        if name not in self.broker.queues and self.broker.auto_create:
            access.check(connection.user, Permission.CREATE, name)
        return self.broker.queue(name, create=True, parameters=parameters)

    def _next_id(self) -> int:
        link_id = self._next_link_id
        self._next_link_id += 1
        return link_id

    def _on_link_remote_close(self, event) -> None:
        """A detach from the client, closed or not: the link ends here either way (see the header)."""
        link = lib.pn_event_link(event)
        state = self._links.get(link)
        if state is not None:
            self._forget_link(state)
            if getattr(state, "subscription", "") == DURABLE and lib.pn_event_type(event) == LINK_REMOTE_CLOSE:
                self._unsubscribe(state.queue)  # closed, not detached: the client ends its subscription
        connection = self._connection_of(event)
        if connection is not None:
            self._dirty.add(connection)
        if lib.pn_link_state(link) & LOCAL_ACTIVE:
            if lib.pn_event_type(event) == LINK_REMOTE_DETACH:
                lib.pn_link_detach(link)  # answered in kind: the client may mean to attach again
            else:
                lib.pn_link_close(link)
        lib.pn_link_free(link)

    def _forget_link(self, state) -> None:
        """The link has ended: no record names it any more, and the core lets go of its consumer."""
        self._unlink(state)
        if state.producer:
            self.producers.pop(state.id, None)
        elif self.consumers.pop(state.id, None) is not None:
            self.tracer.detached(state.id, state.label)
            self.apply(self.broker.detach_consumer(state.id, self.clock_ms()))
            if state.subscription == TEMPORARY:
                self._unsubscribe(state.queue)

    def _unlink(self, state) -> None:
        state.alive = False
        self._links.pop(state.link, None)
        state.connection.links.discard(state)

    def _close_link(self, link, condition) -> None:
        """Detach a link from this side, if it is open here; it is freed when the client's detach arrives."""
        if not lib.pn_link_state(link) & LOCAL_ACTIVE:
            return
        name, description = condition
        set_condition(lib.pn_link_condition(link), name, description)
        lib.pn_link_close(link)

    def _detach(self, effect: DetachConsumer) -> None:
        state = self.consumers.pop(effect.consumer_id, None)
        if state is None:
            return
        self._unlink(state)  # the core has dropped the consumer already
        self.tracer.detached(state.id, state.label, condition_for(effect.error)[0])
        self._close_link(state.link, condition_for(effect.error))
        self._dirty.add(state.connection)

    def detach_producers_of(self, queue_name: str) -> None:
        """A deleted queue's producers are detached too, so they learn it is gone."""
        for state in [state for state in self.producers.values() if state.address == queue_name]:
            self._forget_link(state)
            self._close_link(state.link, (RESOURCE_DELETED, f"queue {queue_name!r} was deleted"))
            self._dirty.add(state.connection)

    # ---- flow --------------------------------------------------------------------------------

    def _on_link_flow(self, event) -> None:
        state = self._links.get(lib.pn_event_link(event))
        if state is not None and not state.producer:
            self._credit(state)

    def _credit(self, state: Consumer) -> None:
        link = state.link
        self.apply(self.broker.set_credit(state.id, lib.pn_link_credit(link), self.clock_ms()))
        if lib.pn_link_get_drain(link) and lib.pn_link_credit(link) > 0:
            lib.pn_link_drained(link)
            self.apply(self.broker.set_credit(state.id, 0, self.clock_ms()))
        self._dirty.add(state.connection)

    def _top_up(self, state: Producer) -> None:
        window = self.config.producer_credit_window
        credit = lib.pn_link_credit(state.link)
        if credit * 2 >= window:
            return
        if self.journal is not None and self.journal.backlog_full():
            self._credit_withheld = True  # the batch's unit asks for a report, so journal_durable comes
            return  # the disk is behind: withhold credit until journal_durable tops up again
        lib.pn_link_flow(state.link, window - credit)
        self._dirty.add(state.connection)

    def _top_up_all(self) -> None:
        for state in self.producers.values():
            self._top_up(state)

    # ---- deliveries --------------------------------------------------------------------------

    def _on_delivery(self, event) -> None:
        delivery = lib.pn_event_delivery(event)
        state = self._links.get(lib.pn_delivery_link(delivery))
        if state is None:
            return  # a link the node has let go of; proton frees its deliveries with it
        if state.producer:
            self._receive(state, delivery)
        elif lib.pn_delivery_updated(delivery):
            self._disposition(state, delivery)

    def _receive(self, producer: Producer, delivery) -> None:
        link = producer.link
        if lib.pn_link_current(link) != delivery:
            return  # an update of a delivery already taken (the producer settling it)
        if lib.pn_delivery_aborted(delivery):
            lib.pn_delivery_settle(delivery)
            return
        size = lib.pn_delivery_pending(delivery)
        if size > self._receive_buffer_bytes:
            self._receive_buffer_bytes = max(size, self._receive_buffer_bytes * 2)
            self._receive_buffer = ffi.new("char[]", self._receive_buffer_bytes)
        count = max(lib.pn_link_recv(link, self._receive_buffer, size), 0)
        if lib.pn_delivery_partial(delivery):
            # more frames to come. proton advertises max-message-size but buffers whatever comes, so
            # the part so far is read out (freeing the session's incoming window: proton holds at most
            # SESSION_INCOMING_MAX_BYTES) and held here, up to the size limit; past it, the rest is
            # read and dropped, and the message rejected once its last frame is in
            producer.size_bytes += count
            if producer.size_bytes <= MESSAGE_SIZE_MAX_BYTES:
                producer.partial += ffi.buffer(self._receive_buffer, count)
            elif producer.partial:
                producer.partial = bytearray()
            return
        if producer.size_bytes > MESSAGE_SIZE_MAX_BYTES:
            size_bytes, producer.size_bytes = producer.size_bytes + count, 0
            lib.pn_link_advance(link)
            self._receiving.add(producer)
            self.refuse((producer, delivery), _too_large(size_bytes))
            return
        producer.size_bytes = 0
        payload = ffi.unpack(self._receive_buffer, count)
        if producer.partial:
            payload, producer.partial = bytes(producer.partial + payload), bytearray()
        lib.pn_link_advance(link)
        self._receiving.add(producer)
        producer_settled = lib.pn_delivery_settled(delivery)  # the producer sent it presettled
        incoming = (producer, delivery)
        now_ms = self.clock_ms()
        try:
            if len(payload) > MESSAGE_SIZE_MAX_BYTES:
                raise _too_large(len(payload))
            address = producer.address
            if address is not None and self.broker.addresses.is_multicast(address):  # authorized at attach
                self._fan_out(incoming, address, payload, producer_settled, now_ms)
                return
            queue = self.broker.queue(address, create=True) if address else None  # authorized at attach
            arrival = codec.read_arrival(payload, queue.settings.group_header if queue else "", now_ms)
            if queue is None:
                if not arrival.address:
                    raise NotFound("anonymous link: the message's 'to' field must name a queue")
                if self.broker.addresses.is_multicast(arrival.address):
                    self.gate.security.access.check(producer.connection.user, Permission.SEND, arrival.address)
                    self._fan_out(incoming, arrival.address, payload, producer_settled, now_ms)
                    return
                queue = self._authorized_queue(producer.connection, arrival.address, Permission.SEND)
                if queue.settings.group_header:
                    arrival = codec.read_arrival(payload, queue.settings.group_header, now_ms)
            if queue.settings.trace:
                self.tracer.send_arrived(delivery, queue.settings.name, arrival.group_id, payload, now_ms)
            durable = queue.settings.durable and self.journal is not None
            if durable and self.durability.refusing(now_ms):
                raise _journal_down(self.durability.failure)
            message = Message(payload, arrival.group_id, expires_at_ms=arrival.expires_at_ms,
                              closes_group=arrival.closes_group)
            if self.cluster is not None:
                queue.check_group_id(message.group_id)  # refused here, before a route is proposed
                route_key = queue.route_key(message.group_id)
                if route_key is not None:
                    self.cluster.arrive(incoming, queue.settings.name, route_key, message, durable,
                                        producer_settled, now_ms)
                    return
        except GrouperError as error:
            self.refuse(incoming, error)
        else:
            self.enqueue_local(incoming, queue.settings.name, message, durable, producer_settled, now_ms)

    def _fan_out(self, incoming, address: str, payload: bytes, producer_settled: bool, now_ms: int) -> None:
        """Copy a send to every subscription queue of multicast `address`. Raises, copying nothing, when
        any copy would be refused here (see the header)."""
        copies = self.broker.copies(address, len(payload),
                                    lambda header: codec.read_arrival(payload, header, now_ms))
        if not copies:
            self.unrouted[address] = self.unrouted.get(address, 0) + 1
            log.debug("multicast address %s has no subscription: a message sent to it is discarded", address)
            self.accept_when_stored(incoming, False, producer_settled)
            return
        durable_any = self.journal is not None and any(queue.settings.durable for queue, _ in copies)
        if durable_any and self.durability.refusing(now_ms):
            raise _journal_down(self.durability.failure)
        fan_out = FanOut(incoming[0], SendTally(len(copies)))
        for queue, arrival in copies:
            durable = queue.settings.durable and self.journal is not None
            part = (fan_out, incoming[1])
            message = Message(payload, arrival.group_id, expires_at_ms=arrival.expires_at_ms,
                              closes_group=arrival.closes_group)
            name = queue.settings.name
            if queue.settings.trace:  # one send line per traced copy, settled with the send
                self.tracer.send_arrived(incoming[1], name, arrival.group_id, payload, now_ms)
            if self.cluster is not None and (name in self._declared_subscriptions or self.cluster.defines(name)):
                route_key = queue.route_key(message.group_id)
                if route_key is not None:
                    self.cluster.arrive(part, name, route_key, message, durable, producer_settled, now_ms)
                    continue
            self.enqueue_local(part, name, message, durable, producer_settled, now_ms)

    # ---- sends into the node shell (node/core/shell.py); the names the connection and link code call ----

    def enqueue_local(self, incoming, queue_name, message, durable, producer_settled, now_ms) -> None:
        self.execute(self.shell.enqueue_local(incoming, queue_name, message, durable, producer_settled, now_ms))

    def accept_when_stored(self, incoming, durable, producer_settled, stored=None) -> None:
        """`stored`: the (queue name, Message) the send put in the broker, taken back if its batch fails."""
        accepted = self.shell.accept_when_stored(incoming, durable, producer_settled, stored)
        if accepted:
            self.execute(accepted)

    def after_flush(self, fn) -> None:
        """Call fn(None) once everything journalled so far is on disk, fn(reason) if it failed."""
        self.shell.after_flush(fn)

    def refuse(self, incoming, error: BaseException) -> None:
        self.execute(self.shell.refuse(incoming, error))

    def _settle_send(self, incoming, condition: tuple | None = None, accept: bool = True) -> None:
        """Settle a producer's delivery: accepted (`condition` None; `accept` False when the producer
        settled it first, so no outcome goes back) or rejected with `condition` (name, description).
        A fanned-out send is settled when its last copy reports here, rejected if any copy was."""
        producer, delivery = incoming
        if type(producer) is FanOut:
            if not producer.tally.settle(condition):
                return
            producer, condition = producer.producer, producer.tally.refusal
        if self.tracer.sends:
            self.tracer.send_settled(delivery, condition)
        if not producer.alive:
            return
        if condition is not None:
            self._reject(producer, delivery, *condition)
            return
        if accept:
            lib.pn_delivery_update(delivery, ACCEPTED)
        lib.pn_delivery_settle(delivery)
        self._dirty.add(producer.connection)

    def _reject(self, producer: Producer, delivery, name: str, description: str) -> None:
        set_condition(lib.pn_disposition_condition(lib.pn_delivery_local(delivery)), name, description)
        lib.pn_delivery_update(delivery, REJECTED)
        lib.pn_delivery_settle(delivery)
        self._dirty.add(producer.connection)

    def _disposition(self, consumer: Consumer, delivery) -> None:
        delivery_id = consumer.unsettled.get(delivery)
        if delivery_id is None:
            return  # settled here already (a browser's copy, or an outcome taken before)
        remote = lib.pn_delivery_remote_state(delivery)
        settled = lib.pn_delivery_settled(delivery)
        if remote == ACCEPTED:
            outcome, failed = Outcome.ACCEPTED, False
        elif remote == REJECTED:
            outcome, failed = Outcome.REJECTED, False
        elif remote == RELEASED:
            outcome, failed = Outcome.RELEASED, False
        elif remote == MODIFIED:
            outcome, failed = Outcome.MODIFIED, bool(lib.pn_disposition_is_failed(lib.pn_delivery_remote(delivery)))
        elif settled:
            outcome, failed = Outcome.ACCEPTED, False  # settled with no outcome: the default, accepted
        else:
            return  # a non-terminal state (received): wait for the outcome
        del consumer.unsettled[delivery]
        effects = self.broker.settle(consumer.id, delivery_id, outcome, self.clock_ms(), failed)
        if self.tracer.deliveries:
            self.tracer.delivery_settled(consumer.id, delivery, outcome.value,
                                         not settled and any(type(effect) is Removed for effect in effects))
        if not settled and any(type(effect) is Removed for effect in effects):
            self.durability.wait((consumer, delivery), CONSUMER)  # settled once the removal is on disk
        else:
            lib.pn_delivery_settle(delivery)
        self._dirty.add(consumer.connection)
        self.apply(effects)

    # ---- effects -----------------------------------------------------------------------------

    def apply(self, effects: list) -> None:
        """Carry out the broker's `effects` (after the declarations made meanwhile)."""
        self.execute(self.shell.broker_effects(effects))

    def execute(self, effects: list) -> None:
        """Carry out what the node shell returned, in order, through the one table (node/amqp/executor.py);
        what a delivery adds (a presettled consumer's outcome) is carried out after the rest."""
        carry = self.carry
        index = 0
        while index < len(effects):
            effect = effects[index]
            index += 1
            more = carry[type(effect)](effect)
            if more:
                effects.extend(more)

    def _redeliver_at(self, until_ms: int) -> None:
        if self._redelivery_timer_ms is not None and self._redelivery_timer_ms <= until_ms:
            return  # an earlier timer is set; when it fires it sets the next one
        self._redelivery_timer_ms = until_ms
        self.loop.call_later(max(0, until_ms - self.clock_ms()) / 1000, self._redelivery_due, until_ms)

    def _redelivery_due(self, until_ms: int) -> None:
        if self.stopping or self._redelivery_timer_ms != until_ms:
            return  # superseded by an earlier timer, which took over
        self._redelivery_timer_ms = None
        now_ms = self.clock_ms()
        self.execute(self.shell.tick(now_ms))
        next_ms = self.broker.next_deadline_ms()  # later delays, and any other deadline: harmless
        if next_ms is not None and next_ms > now_ms:
            self._redeliver_at(next_ms)
        self.wake()

    # ---- what other parts of the node read ---------------------------------------------------

    def consumer_counts(self) -> dict[str, int]:
        """Consumers (browsers excluded) per queue: where the cluster should route new groups."""
        counts: dict[str, int] = {}
        for state in self.consumers.values():
            if not state.browse:
                counts[state.queue] = counts.get(state.queue, 0) + 1
        return counts

    def engine_objects(self) -> dict[str, int]:
        """What the loop holds of proton's objects, for the soak's leak check."""
        return {"connections": len(self._by_pointer), "links": len(self._links),
                "unsettled_deliveries": sum(len(state.unsettled) for state in self.consumers.values())}


class _TlsListener:
    """The TLS listener's socket and the task accepting on it; closed like asyncio's servers."""

    def __init__(self, listener: socket.socket, accepting: asyncio.Task):
        self.listener = listener
        self.accepting = accepting

    def close(self) -> None:
        self.accepting.cancel()
        self.listener.close()


def _stop_on_bug(loop, context: dict) -> None:
    """asyncio logs an exception escaping a callback and carries on; here that is a broken invariant
    (the core and proton's objects may disagree from then on): stop, and let the supervisor restart
    the node. A socket's own failure (OSError) is the peer's business and only logged."""
    error = context.get("exception")
    if error is None or isinstance(error, OSError):
        loop.default_exception_handler(context)
        return
    log.critical("the engine loop stopped on an unexpected error: %s", context.get("message"), exc_info=error)
    logging.shutdown()
    os._exit(70)


def _too_large(size_bytes: int) -> GrouperError:
    return ResourceLimitExceeded(f"message is {size_bytes} bytes; this node accepts at most "
                                 f"{MESSAGE_SIZE_MAX_BYTES} bytes per message")


def _journal_down(reason: str) -> GrouperError:
    return ResourceLimitExceeded(f"the node cannot store messages right now ({reason}); retry later")
