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
  durable message of a durable queue, its journal batch is on disk; either way at the end of a batch,
  so many settlements share a disposition frame. Refusals are rejections with a condition, at once.
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
- What happens between batches lives in one collaborator each, made here and sharing this server's
  state (they read and write its fields; the batch cycle owns them): `listener` (sockets, TLS
  accept), `connections` (connection, session and transport events), `link_attach` (attach,
  permissions, subscriptions), `link_table` (events on attached links, detach), `incoming` (sends in,
  their settlement, producer credit), `outgoing` (consumer credit and outcomes), `thread` (the loop's
  thread, start and stop). Each module's header states its own rules.
- This module is longer than 300 lines because the batch cycle (`_batch`, `_end_batch`, `_tick`), the
  journal writer's reports and the doors into the node shell stay together: they are the loop's one
  turn. What each effect does is node/amqp/executor.py's; what the commit cycle decides is
  node/core/shell.py's.
- A traced queue's sends, deliveries and outcomes are told to the tracer (node/amqp/tracer.py) as they
  happen here; its lines leave for the trace writer's thread once per batch. An untraced queue costs a
  settings lookup per delivery and nothing else.
"""

from __future__ import annotations

import logging
import os
import time

from node.amqp import codec
from node.amqp.bridge import Bridge
from node.amqp.connection import Connection
from node.amqp.connections import Connections
from node.amqp.coordinator import Coordinator
from node.amqp.gate import Gate
from node.amqp.engine import (CONNECTION_REMOTE_CLOSE, CONNECTION_REMOTE_OPEN, DELIVERY, LINK_FLOW, LINK_REMOTE_CLOSE,
                              LINK_REMOTE_DETACH, LINK_REMOTE_OPEN, SESSION_REMOTE_CLOSE, SESSION_REMOTE_OPEN,
                              TRANSPORT, TRANSPORT_CLOSED, TRANSPORT_ERROR, ffi, lib)
from node.amqp.engine_thread import EngineThread, new_event_loop
from node.amqp.incoming import Incoming
from node.amqp.link_attach import LinkAttach
from node.amqp.link_table import LinkTable
from node.amqp.links import Consumer, Producer
from node.amqp.listener import Listener
from node.amqp.outgoing import Outgoing
from node.amqp.tracer import Tracer
from node.amqp.executor import EffectExecutor
from node.core.durability import Durability
from node.core.cluster.outbound import OUTBOUND_PREFIX
from node.core.shell import NodeShell
from node.store.failures import JournalFailure

log = logging.getLogger("grouper.amqp")

# TTL expiry, delayed dispatch and heartbeats run at least this often; redelivery delays do not wait
# for it: each Delayed effect sets a timer at its deadline (_redelivery_due), so they resolve to ~1 ms
TICK_INTERVAL_S = 0.1
JOURNAL_RETRY_INTERVAL_MS = 1000  # after a failed journal write, durable sends are refused this long
OUTPUT_CHUNK_BYTES = 1 << 20  # one copy out of proton's output buffer
RECEIVE_BUFFER_BYTES = 64 << 10  # first size of the buffer incoming messages are copied through
# journal records nobody waits for (removals a consumer settled first, presettled sends) are held back
# from the writer until a batch has a waiter, the next tick, or this much is held: at moderate rates
# each message would otherwise cost the writer a wake-up and an fsync of its own
JOURNAL_HELD_MAX_BYTES = 1 << 20


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
        self._make_collaborators()

    def _make_collaborators(self) -> None:
        """One noun each, a module each (see the header); the state they work on stays here."""
        self.thread = EngineThread(self, TICK_INTERVAL_S)
        self.listener = Listener(self)
        self.connections = Connections(self)
        self.link_attach = LinkAttach(self)
        self.outgoing = Outgoing(self)
        self.incoming = Incoming(self)
        self.link_table = LinkTable(self)
        self.coordinator = Coordinator(self)  # local transactions (issue 31)
        # what the batch cycle and the journal's reports call on them, bound once (several per message)
        self._settle_send = self.incoming.settle_send
        self._top_up = self.incoming.top_up
        self._top_up_all = self.incoming.top_up_all
        self._detach = self.link_table.detach
        self._forget_link = self.link_table.forget
        self._close_link = self.link_table.close
        self._forget_connection = self.connections.forget
        self._handlers = {
            DELIVERY: self.link_table.on_delivery,
            LINK_FLOW: self.link_table.on_link_flow,
            TRANSPORT: self.connections.on_transport,
            CONNECTION_REMOTE_OPEN: self.connections.on_connection_remote_open,
            SESSION_REMOTE_OPEN: self.connections.on_session_remote_open,
            LINK_REMOTE_OPEN: self.link_attach.on_link_remote_open,
            LINK_REMOTE_CLOSE: self.link_table.on_link_remote_close,
            LINK_REMOTE_DETACH: self.link_table.on_link_remote_close,
            SESSION_REMOTE_CLOSE: self.connections.on_session_remote_close,
            CONNECTION_REMOTE_CLOSE: self.connections.on_connection_remote_close,
            TRANSPORT_ERROR: self.connections.on_transport_error,
            TRANSPORT_CLOSED: self.connections.on_transport_closed,
        }

    # ---- wake-ups ----------------------------------------------------------------------------

    def wake(self) -> None:
        if not self._batch_due:
            self._batch_due = True
            self.loop.call_soon(self._batch_if_due)

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
        (node/core/cluster/outbound.py) go to their owner's forwarder."""
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

    def detach_producers_of(self, queue_name: str) -> None:
        """A deleted queue's producers are detached too (node/cluster.py, node/admin/loop_control.py)."""
        self.link_table.detach_producers_of(queue_name)

    def engine_objects(self) -> dict[str, int]:
        """What the loop holds of proton's objects, for the soak's leak check."""
        return {"connections": len(self._by_pointer), "links": len(self._links),
                "unsettled_deliveries": sum(len(state.unsettled) for state in self.consumers.values())}

