"""The proton adapter: AMQP 1.0 events in, core calls; core effects out, proton calls.

Reactor thread only. Rules:
- Every proton object lives here; the core sees consumer ids (ints) and delivery ids (ints, also
  the delivery tags). Link state rides on the proton objects' attachment records, because proton
  hands out a new wrapper object for the same link on every event.
- A producer's delivery is settled as accepted only after the message is in its queue and, for a
  durable queue, its journal batch is on disk; either way at the end of a reactor batch, so many
  settlements share a frame. Refusals are rejections with a condition, at once.
- A queue at its depth limit rejects with amqp:resource-limit-exceeded rather than withholding
  credit: a link may carry messages for several queues (anonymous relay), and a rejection tells
  the producer at once which message failed and why.
- Effects are carried out in order; a presettled consumer's deliveries are accepted on the spot,
  which may produce more effects, so they are worked through as a list.
"""

from __future__ import annotations

import collections
import logging

import cproton

from proton import Condition, Delivery, Endpoint, Handler, Link, Terminus

from node.amqp import codec
from node.amqp.conditions import RESOURCE_LIMIT, condition_for
from node.core.effects import Deliver, DetachConsumer, Dropped, Removed, Stored
from node.core.errors import GrouperError, NotFound, ResourceLimitExceeded
from node.core.message import Message, Outcome
from node.store.journal import failure_condition

log = logging.getLogger("grouper.amqp")

TICK_INTERVAL_S = 0.1  # TTL expiry and delayed dispatch run at least this often
JOURNAL_RETRY_INTERVAL_MS = 1000  # after a failed journal write, durable sends are refused this long
MESSAGE_SIZE_MAX_BYTES = 16 << 20  # larger incoming messages are rejected with amqp:resource-limit-exceeded


PRODUCER, CONSUMER, CALL = 0, 1, 2  # what waits for a journal batch: a send, a settlement, a callback


class ConsumerLink:
    __slots__ = ("id", "sender", "link_impl", "queue", "browse", "presettled", "first_key", "connection_key")

    def __init__(self, consumer_id, sender, queue, browse, presettled, first_key, connection_key):
        self.id = consumer_id
        self.sender = sender
        self.link_impl = sender._impl
        self.queue = queue
        self.browse = browse
        self.presettled = presettled
        self.first_key = first_key
        self.connection_key = connection_key


class AmqpServer(Handler):
    def __init__(self, broker, journal, config, clock_ms, bridge_drain):
        self.broker = broker
        self.journal = journal  # None: no journal (every queue behaves as non-durable)
        self.config = config
        self.clock_ms = clock_ms
        self._bridge_drain = bridge_drain
        self.container = None
        self.consumers: dict[int, ConsumerLink] = {}
        self.producers: dict[int, object] = {}  # producer id -> proton Receiver
        self._next_link_id = 1
        self._connections: dict[int, set] = {}  # connection key -> consumer and producer ids
        self._connection_objects: dict[int, object] = {}  # connection key -> proton Connection
        self._next_connection_key = 1
        self._awaiting_flush: list = []  # deliveries to settle once the next journal batch is durable
        # non-durable sends are accepted at the end of the reactor batch: settling them together lets
        # proton put many in one disposition frame, which costs less than the send it confirms
        self._accept_at_quiesce: list = []
        self._pending: collections.deque = collections.deque()  # (ticket, delivery or callback, kind)
        self._journal_failed: str | None = None
        self._durable_ticket = 0
        self._journal_retry_at_ms = 0
        self.stopping = False
        self.cluster = None  # node.cluster.ClusterLink when this node is one of several

    # ---- lifecycle ---------------------------------------------------------------------------

    def on_reactor_init(self, event):
        self.container = event.container
        self.container.schedule(TICK_INTERVAL_S, self)

    def on_timer_task(self, event):
        if self.stopping:
            return
        now_ms = self.clock_ms()
        self.apply(self.broker.tick(now_ms))
        if self.cluster is not None:
            self.cluster.tick(now_ms)
        self.container.schedule(TICK_INTERVAL_S, self)

    def on_grouper_bridge(self, event):
        self._bridge_drain()

    def on_reactor_quiesced(self, event):
        if self._accept_at_quiesce:
            for delivery in self._accept_at_quiesce:
                delivery.update(Delivery.ACCEPTED)
                delivery.settle()
            self._accept_at_quiesce.clear()
        # the end of a reactor batch: hand everything journalled in it to the writer as one unit
        if self.cluster is not None:
            self.cluster.quiesced()
        if self.journal is None:
            for target, kind in self._awaiting_flush:
                _confirm(target, kind)
            self._awaiting_flush.clear()
            return
        ticket = self.journal.flush()
        if not self._awaiting_flush:
            return
        for target, kind in self._awaiting_flush:
            self._pending.append((ticket, target, kind))
        self._awaiting_flush.clear()
        if ticket <= self._durable_ticket:
            self.journal_durable(self._durable_ticket)

    def journal_durable(self, ticket: int) -> None:
        """Bridge closure: every record up to `ticket` is on disk."""
        self._journal_failed = None
        self._durable_ticket = max(self._durable_ticket, ticket)
        pending = self._pending
        while pending and pending[0][0] <= ticket:
            _, target, kind = pending.popleft()
            _confirm(target, kind)
        self._top_up_all()

    def journal_failed(self, ticket: int, reason: str) -> None:
        """Bridge closure: the batch ending at `ticket` could not be written."""
        self._journal_failed = reason
        self._journal_retry_at_ms = self.clock_ms() + JOURNAL_RETRY_INTERVAL_MS
        log.error("journal write failed: %s; durable sends are refused for %d ms, then tried again", reason,
                  JOURNAL_RETRY_INTERVAL_MS)
        pending = self._pending
        while pending and pending[0][0] <= ticket:
            _, target, kind = pending.popleft()
            if kind == PRODUCER:
                target.local.condition = Condition(failure_condition(reason),
                                                   f"the node could not store the message: {reason}")
                target.update(Delivery.REJECTED)
                target.settle()
            elif kind == CALL:
                target(reason)
            else:
                target.settle()

    # ---- endpoints ---------------------------------------------------------------------------

    def on_connection_remote_open(self, event):
        connection = event.connection
        if len(self._connections) >= self.config.connections_max:
            connection.open()
            connection.condition = Condition(RESOURCE_LIMIT, f"this node accepts at most "
                                             f"{self.config.connections_max} connections (connections_max)")
            connection.close()
            return
        key = self._next_connection_key
        self._next_connection_key += 1
        connection.grouper_key = key
        self._connections[key] = set()
        self._connection_objects[key] = connection
        if connection.state & Endpoint.LOCAL_UNINIT:
            connection.open()

    def on_session_remote_open(self, event):
        session = event.session
        if session.state & Endpoint.LOCAL_UNINIT:
            session.open()

    def on_link_remote_open(self, event):
        link = event.link
        connection_key = getattr(link.connection, "grouper_key", None)
        if connection_key is None:
            return  # the connection was refused
        link.source.copy(link.remote_source)
        link.target.copy(link.remote_target)
        try:
            if link.is_sender:
                self._open_consumer(link, connection_key)
            else:
                self._open_producer(link, connection_key)
        except GrouperError as error:
            link.open()
            link.condition = condition_for(error)
            link.close()

    def _open_consumer(self, sender, connection_key):
        address = sender.remote_source.address
        if not address:
            raise NotFound("a consumer link needs a source address naming a queue")
        now_ms = self.clock_ms()
        queue = self.broker.queue(address, create=True)
        consumer_id = self._next_link_id
        self._next_link_id += 1
        browse = sender.remote_source.distribution_mode == Terminus.DIST_MODE_COPY
        presettled = sender.remote_snd_settle_mode == Link.SND_SETTLED
        effects = self.broker.attach_consumer(address, consumer_id, browse, now_ms,
                                              self.config.link_unsettled_max)
        sender.grouper_consumer = consumer_id
        self.consumers[consumer_id] = ConsumerLink(consumer_id, sender, address, browse, presettled,
                                                   queue.settings.group_first_key, connection_key)
        self._connections[connection_key].add(consumer_id)
        sender.open()
        self.apply(effects)
        if sender.credit:
            self._credit(consumer_id, sender)

    def _open_producer(self, receiver, connection_key):
        address = receiver.remote_target.address
        if address:
            self.broker.queue(address, create=True)
        producer_id = self._next_link_id
        self._next_link_id += 1
        receiver.grouper_producer = producer_id
        receiver.grouper_address = address or None
        self.producers[producer_id] = receiver
        self._connections[connection_key].add(producer_id)
        receiver.max_message_size = MESSAGE_SIZE_MAX_BYTES
        receiver.open()
        receiver.flow(self.config.producer_credit_window)

    def on_link_remote_close(self, event):
        link = event.link
        self._forget_link(link)
        if link.state & Endpoint.LOCAL_ACTIVE:
            link.close()

    def on_session_remote_close(self, event):
        session = event.session
        for link_id in list(self._connections.get(getattr(session.connection, "grouper_key", None), ())):
            state = self.consumers.get(link_id)
            link = state.sender if state is not None else self.producers.get(link_id)
            if link is not None and link.session == session:
                self._forget_link(link)
        if session.state & Endpoint.LOCAL_ACTIVE:
            session.close()

    def on_connection_remote_close(self, event):
        self._forget_connection(event.connection)
        if event.connection.state & Endpoint.LOCAL_ACTIVE:
            event.connection.close()

    def on_transport_closed(self, event):
        if event.connection is not None:
            self._forget_connection(event.connection)

    def on_transport_error(self, event):
        condition = event.transport.condition
        if condition is not None:
            log.info("connection dropped: %s %s", condition.name, condition.description)

    def _forget_connection(self, connection):
        key = getattr(connection, "grouper_key", None)
        self._connection_objects.pop(key, None)
        ids = self._connections.pop(key, None)
        if not ids:
            return
        now_ms = self.clock_ms()
        for link_id in sorted(ids):
            if link_id in self.consumers:
                del self.consumers[link_id]
                self.apply(self.broker.detach_consumer(link_id, now_ms))
            else:
                self.producers.pop(link_id, None)

    def _forget_link(self, link):
        consumer_id = getattr(link, "grouper_consumer", None)
        producer_id = getattr(link, "grouper_producer", None)
        link_id = consumer_id or producer_id
        key = getattr(link.connection, "grouper_key", None)
        if key in self._connections:
            self._connections[key].discard(link_id)
        if consumer_id is not None and self.consumers.pop(consumer_id, None) is not None:
            self.apply(self.broker.detach_consumer(consumer_id, self.clock_ms()))
        if producer_id is not None:
            self.producers.pop(producer_id, None)

    # ---- flow and deliveries -----------------------------------------------------------------

    def on_link_flow(self, event):
        link = event.link
        consumer_id = getattr(link, "grouper_consumer", None)
        if consumer_id is not None and consumer_id in self.consumers:
            self._credit(consumer_id, link)

    def _credit(self, consumer_id, sender):
        self.apply(self.broker.set_credit(consumer_id, sender.credit, self.clock_ms()))
        if sender.drain_mode and sender.credit > 0:
            sender.drained()
            self.apply(self.broker.set_credit(consumer_id, 0, self.clock_ms()))

    def on_delivery(self, event):
        delivery = event.delivery
        link = delivery.link
        if link.is_receiver:
            self._receive(delivery, link)
        elif delivery.updated:
            self._disposition(delivery, link)

    def _receive(self, delivery, receiver):
        if delivery.aborted:
            delivery.settle()
            return
        if delivery.partial:
            return  # the link's max-message-size bounds what proton buffers meanwhile
        payload = receiver.recv(delivery.pending)
        receiver.advance()
        producer_settled = delivery.settled  # the producer sent it presettled
        now_ms = self.clock_ms()
        try:
            if len(payload) > MESSAGE_SIZE_MAX_BYTES:
                raise _too_large(len(payload))
            address = getattr(receiver, "grouper_address", None)
            queue = self.broker.queue(address, create=True) if address else None
            arrival = codec.read_arrival(payload, queue.settings.group_header if queue else "", now_ms)
            if queue is None:
                if not arrival.address:
                    raise NotFound("anonymous link: the message's 'to' field must name a queue")
                queue = self.broker.queue(arrival.address, create=True)
                if queue.settings.group_header:
                    arrival = codec.read_arrival(payload, queue.settings.group_header, now_ms)
            durable = queue.settings.durable and self.journal is not None
            if durable and self._journal_failed and now_ms < self._journal_retry_at_ms:
                raise _journal_down(self._journal_failed)
            message = Message(payload, arrival.group_id, expires_at_ms=arrival.expires_at_ms,
                              closes_group=arrival.closes_group)
            if self.cluster is not None:
                queue.check_group_id(message.group_id)  # refused here, before a route is proposed
                route_key = queue.route_key(message.group_id)
                if route_key is not None:
                    self.cluster.arrive(delivery, queue.settings.name, route_key, message, durable,
                                        producer_settled, now_ms)
                    self._top_up(receiver)
                    return
        except GrouperError as error:
            self.refuse(delivery, error)
        else:
            self.enqueue_local(delivery, queue.settings.name, message, durable, producer_settled, now_ms)
        self._top_up(receiver)

    def enqueue_local(self, delivery, queue_name, message, durable, producer_settled, now_ms) -> None:
        try:
            effects = self.broker.enqueue(queue_name, message, now_ms)
        except GrouperError as error:
            self.refuse(delivery, error)
        else:
            self.accept_when_stored(delivery, durable, producer_settled)
            self.apply(effects)

    def accept_when_stored(self, delivery, durable, producer_settled) -> None:
        if producer_settled:
            delivery.settle()
        elif durable:
            self._awaiting_flush.append((delivery, PRODUCER))
        else:
            self._accept_at_quiesce.append(delivery)

    def after_flush(self, fn) -> None:
        """Call fn(None) once everything journalled so far is on disk, fn(reason) if it failed."""
        self._awaiting_flush.append((fn, CALL))

    def refuse(self, delivery, error):
        delivery.local.condition = condition_for(error)
        delivery.update(Delivery.REJECTED)
        delivery.settle()

    def _top_up(self, receiver):
        window = self.config.producer_credit_window
        if receiver.credit * 2 >= window:
            return
        if self.journal is not None and self.journal.backlog_full():
            return  # the disk is behind: withhold credit until journal_durable tops up again
        receiver.flow(window - receiver.credit)

    def _top_up_all(self):
        for receiver in self.producers.values():
            if receiver.state & Endpoint.LOCAL_ACTIVE:
                self._top_up(receiver)

    def _disposition(self, delivery, sender):
        consumer_id = getattr(sender, "grouper_consumer", None)
        state = self.consumers.get(consumer_id)
        if state is None or state.browse:
            delivery.settle()
            return
        remote = delivery.remote_state
        if remote == Delivery.ACCEPTED:
            outcome, failed = Outcome.ACCEPTED, False
        elif remote == Delivery.REJECTED:
            outcome, failed = Outcome.REJECTED, False
        elif remote == Delivery.RELEASED:
            outcome, failed = Outcome.RELEASED, False
        elif remote == Delivery.MODIFIED:
            outcome, failed = Outcome.MODIFIED, delivery.remote.failed
        elif delivery.settled:
            outcome, failed = Outcome.ACCEPTED, False  # settled with no outcome: the default, accepted
        else:
            return  # a non-terminal state (received): wait for the outcome
        effects = self.broker.settle(consumer_id, int(delivery.tag), outcome, self.clock_ms(), failed)
        if not delivery.settled and any(isinstance(e, Removed) for e in effects):
            self._awaiting_flush.append((delivery, CONSUMER))  # settle once the removal is on disk
        else:
            delivery.settle()
        self.apply(effects)

    # ---- effects -----------------------------------------------------------------------------

    def apply(self, effects: list) -> None:
        if self.broker.declared:
            self._journal_declarations()
        index = 0
        while index < len(effects):
            effect = effects[index]
            index += 1
            kind = type(effect)
            if kind is Deliver:
                more = self._deliver(effect)
                if more:
                    effects.extend(more)
            elif kind is Stored:
                if self.journal is not None:
                    self.journal.store(effect.queue, effect.message)
            elif kind is Removed:
                if self.journal is not None:
                    self.journal.remove(effect.queue, effect.seq)
            elif kind is DetachConsumer:
                self._detach(effect)
            elif kind is Dropped:
                log.info("queue %s dropped message %d: %s", effect.queue, effect.seq, effect.reason)

    def _journal_declarations(self) -> None:
        # queues declared since the last call, auto-created ones too: journalled before their messages
        declared, self.broker.declared = self.broker.declared, []
        if self.journal is None:
            return
        for settings in declared:
            if settings.durable:
                self.journal.declare(settings.to_dict())

    def _deliver(self, effect: Deliver):
        state = self.consumers.get(effect.consumer_id)
        if state is None:
            return None
        message = effect.message
        payload = message.payload
        first_key = state.first_key if effect.first_for_consumer else ""
        if message.delivery_count or first_key:
            payload = codec.rewrite_for_delivery(payload, message.delivery_count, first_key)
        if message.enqueued_at_ms:
            payload = codec.stamp_enqueued_time(payload, message.enqueued_at_ms)
        # straight to proton's C binding: a Delivery wrapper per message costs more than the send itself
        link = state.link_impl
        delivery = cproton.pn_delivery(link, str(effect.delivery_id))
        cproton.pn_link_send(link, payload)
        cproton.pn_link_advance(link)
        if effect.browse:
            cproton.pn_delivery_settle(delivery)
        elif state.presettled:
            cproton.pn_delivery_settle(delivery)
            return self.broker.settle(effect.consumer_id, effect.delivery_id, Outcome.ACCEPTED, self.clock_ms())
        return None

    def _detach(self, effect: DetachConsumer):
        state = self.consumers.pop(effect.consumer_id, None)
        if state is None:
            return
        self._connections.get(state.connection_key, set()).discard(effect.consumer_id)
        sender = state.sender
        if sender.state & Endpoint.LOCAL_ACTIVE:
            sender.condition = condition_for(effect.error)
            sender.close()

    def consumer_counts(self) -> dict[str, int]:
        """Consumers (browsers excluded) per queue: where the cluster should route new groups."""
        counts: dict[str, int] = {}
        for state in self.consumers.values():
            if not state.browse:
                counts[state.queue] = counts.get(state.queue, 0) + 1
        return counts

    def close_connections(self) -> None:
        for connection in list(self._connection_objects.values()):
            if connection.state & Endpoint.LOCAL_ACTIVE:
                connection.close()

    def detach_producers_of(self, queue_name: str) -> None:
        """A deleted queue's producers are detached too, so they learn it is gone."""
        for producer_id, receiver in list(self.producers.items()):
            if getattr(receiver, "grouper_address", None) == queue_name:
                self.producers.pop(producer_id, None)
                if receiver.state & Endpoint.LOCAL_ACTIVE:
                    receiver.condition = Condition("amqp:resource-deleted", f"queue {queue_name!r} was deleted")
                    receiver.close()


def _confirm(target, kind) -> None:
    if kind == CALL:
        target(None)
        return
    if kind == PRODUCER:
        target.update(Delivery.ACCEPTED)
    target.settle()


def _too_large(size_bytes: int) -> GrouperError:
    return ResourceLimitExceeded(f"message is {size_bytes} bytes; this node accepts at most "
                                 f"{MESSAGE_SIZE_MAX_BYTES} bytes per message")


def _journal_down(reason: str) -> GrouperError:
    return ResourceLimitExceeded(f"the node cannot store messages right now ({reason}); retry later")
