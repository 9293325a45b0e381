"""The engine loop's producer links after attach: a client's sends read, checked, routed, and settled.

Engine loop thread only. Rules:
- A send is read out of proton as its frames arrive. proton advertises max-message-size but buffers
  whatever comes, so the part so far is read out (freeing the session's incoming window) and held on
  its `Producer`, up to MESSAGE_SIZE_MAX_BYTES; past it, the rest is read and dropped, and the send is
  rejected with amqp:resource-limit-exceeded once its last frame is in. The link stays usable.
- A send goes to the server's `enqueue_local` (its queue here), or to the cluster (`cluster.arrive`)
  when its queue's group routes are cluster-wide; either answers through the server's
  `accept_when_stored` or `refuse`, which settle here (`settle_send`).
- A send to a multicast address is copied to each of its subscription queues (node/core/dispatch/addresses.py)
  after every copy passed the checks that refuse a send (group id, depth, journal), and is settled once,
  after its last copy. A copy refused later (at its group's node) rejects the send; the other copies stay.
  With no subscription it is accepted and discarded, as Artemis does (counted in `server.unrouted`).
- A send is durable when its queue is durable and its AMQP header says durable (absent: not durable, as
  AMQP 1.0 and ActiveMQ Artemis read it); a non-durable one is not journalled (node/core/dispatch/message.py
  TRANSIENT) and is accepted at the end of its batch, without waiting for the journal.
- A durable send is refused while the journal is failing (`durability.refusing`), for
  JOURNAL_RETRY_INTERVAL_MS after each failure (node/amqp/loop.py).
- A producer's credit is topped up in bulk, once its window is half used, at most once per batch; while
  the journal's backlog is full it is withheld until journal_durable tops every producer up again.
- A queue at its depth limit rejects with amqp:resource-limit-exceeded rather than withholding
  credit: a link may carry messages for several queues (anonymous relay), and a rejection tells
  the producer at once which message failed and why.
- Refusals are rejections with a condition (node/amqp/conditions.py), at once; acceptances wait for the
  batch's end or the journal, as the server decides.
"""

from __future__ import annotations

import logging

from node.amqp import codec
from node.amqp.engine import ACCEPTED, REJECTED, ffi, lib, set_condition
from node.amqp.links import FanOut, Producer
from node.core.access.roles import Permission
from node.core.dispatch.addresses import SendTally
from node.core.errors import GrouperError, NotFound, ResourceLimitExceeded
from node.core.dispatch.message import Message

log = logging.getLogger("grouper.amqp")

TRANSACTIONAL_STATE = 0x34  # AMQP 1.0 4.5.5: a send inside a transaction (node/amqp/coordinator.py)

MESSAGE_SIZE_MAX_BYTES = 16 << 20  # larger incoming messages are rejected with amqp:resource-limit-exceeded


class Incoming:
    def __init__(self, server):
        self.server = server
        self.broker = server.broker
        self.tracer = server.tracer
        self.clock_ms = server.clock_ms
        self.enqueue_local = server.enqueue_local
        self.refuse = server.refuse

    def receive(self, producer: Producer, delivery) -> None:
        link = producer.link
        if lib.pn_link_current(link) != delivery:
            return  # an update of a delivery already taken (the producer settling it)
        if lib.pn_delivery_aborted(delivery):
            lib.pn_delivery_settle(delivery)
            return
        server = self.server
        size = lib.pn_delivery_pending(delivery)
        if size > server._receive_buffer_bytes:
            server._receive_buffer_bytes = max(size, server._receive_buffer_bytes * 2)
            server._receive_buffer = ffi.new("char[]", server._receive_buffer_bytes)
        buffer = server._receive_buffer
        count = max(lib.pn_link_recv(link, buffer, size), 0)
        if lib.pn_delivery_partial(delivery):  # more frames to come: held here, up to the limit (see the header)
            producer.size_bytes += count
            if producer.size_bytes <= MESSAGE_SIZE_MAX_BYTES:
                producer.partial += ffi.buffer(buffer, count)
            elif producer.partial:
                producer.partial = bytearray()
            return
        if producer.size_bytes > MESSAGE_SIZE_MAX_BYTES:
            size_bytes, producer.size_bytes = producer.size_bytes + count, 0
            lib.pn_link_advance(link)
            server._receiving.add(producer)
            self.refuse((producer, delivery), _too_large(size_bytes))
            return
        producer.size_bytes = 0
        payload = ffi.unpack(buffer, count)
        if producer.partial:
            payload, producer.partial = bytes(producer.partial + payload), bytearray()
        lib.pn_link_advance(link)
        server._receiving.add(producer)
        self._route(producer, delivery, payload)

    def _route(self, producer: Producer, delivery, payload: bytes) -> None:
        """A whole send: to its queue here, to the cluster, or to a multicast address's subscriptions."""
        server = self.server
        broker = self.broker
        producer_settled = lib.pn_delivery_settled(delivery)  # the producer sent it presettled
        incoming = (producer, delivery)
        if type(producer) is not Producer or lib.pn_delivery_remote_state(delivery) == TRANSACTIONAL_STATE:
            server.coordinator.receive(producer, delivery, payload)  # issue 31: node/amqp/coordinator.py
            return
        now_ms = self.clock_ms()
        try:
            if len(payload) > MESSAGE_SIZE_MAX_BYTES:
                raise _too_large(len(payload))
            address = producer.address
            if address is not None and broker.addresses.is_multicast(address):  # authorized at attach
                self.fan_out(incoming, address, payload, producer_settled, now_ms)
                return
            queue = broker.queue(address, create=True) if address else None  # authorized at attach
            arrival = codec.read_arrival(payload, queue.settings.group_header if queue else "", now_ms)
            if queue is None:
                if not arrival.address:
                    raise NotFound("anonymous link: the message's 'to' field must name a queue")
                if broker.addresses.is_multicast(arrival.address):
                    server.gate.security.access.check(producer.connection.user, Permission.SEND, arrival.address)
                    self.fan_out(incoming, arrival.address, payload, producer_settled, now_ms)
                    return
                queue = server.link_attach.authorized_queue(producer.connection, arrival.address, Permission.SEND)
                if queue.settings.group_header:
                    arrival = codec.read_arrival(payload, queue.settings.group_header, now_ms)
            if queue.settings.trace:
                self.tracer.send_arrived(delivery, queue.settings.name, arrival.group_id, payload, now_ms)
            # journalled only when its queue is durable and so is the message (its header; absent: not durable)
            durable = arrival.durable and queue.settings.durable and server.journal is not None
            if durable and server.durability.refusing(now_ms):
                raise _journal_down(server.durability.failure)
            message = Message(payload, arrival.group_id, expires_at_ms=arrival.expires_at_ms,
                              closes_group=arrival.closes_group, transient=not arrival.durable)
            if server.cluster is not None:
                queue.check_group_id(message.group_id)  # refused here, before a route is proposed
                route_key = queue.route_key(message.group_id)
                if route_key is not None:
                    server.cluster.arrive(incoming, queue.settings.name, route_key, message, durable,
                                          producer_settled, now_ms)
                    return
        except GrouperError as error:
            self.refuse(incoming, error)
        else:
            self.enqueue_local(incoming, queue.settings.name, message, durable, producer_settled, now_ms)

    def fan_out(self, incoming, address: str, payload: bytes, producer_settled: bool, now_ms: int) -> None:
        """Copy a send to every subscription queue of multicast `address`. Raises, copying nothing, when
        any copy would be refused here (see the header)."""
        server = self.server
        copies = self.broker.copies(address, len(payload),
                                    lambda header: codec.read_arrival(payload, header, now_ms))
        if not copies:
            server.unrouted[address] = server.unrouted.get(address, 0) + 1
            log.debug("multicast address %s has no subscription: a message sent to it is discarded", address)
            server.accept_when_stored(incoming, False, producer_settled)
            return
        journal, cluster = server.journal, server.cluster
        durable_any = journal is not None and any(queue.settings.durable and arrival.durable
                                                  for queue, arrival in copies)
        if durable_any and server.durability.refusing(now_ms):
            raise _journal_down(server.durability.failure)
        fan_out = FanOut(incoming[0], SendTally(len(copies)))
        for queue, arrival in copies:
            durable = arrival.durable and queue.settings.durable and journal is not None
            part = (fan_out, incoming[1])
            message = Message(payload, arrival.group_id, expires_at_ms=arrival.expires_at_ms,
                              closes_group=arrival.closes_group, transient=not arrival.durable)
            name = queue.settings.name
            if queue.settings.trace:  # one send line per traced copy, settled with the send
                self.tracer.send_arrived(incoming[1], name, arrival.group_id, payload, now_ms)
            if cluster is not None and (name in server._declared_subscriptions or cluster.defines(name)):
                route_key = queue.route_key(message.group_id)
                if route_key is not None:
                    cluster.arrive(part, name, route_key, message, durable, producer_settled, now_ms)
                    continue
            self.enqueue_local(part, name, message, durable, producer_settled, now_ms)

    def settle_send(self, incoming, condition: tuple | None = None, accept: bool = True) -> None:
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
            self.reject(producer, delivery, *condition)
            return
        if accept:
            lib.pn_delivery_update(delivery, ACCEPTED)
        lib.pn_delivery_settle(delivery)
        self.server._dirty.add(producer.connection)

    def reject(self, producer: Producer, delivery, name: str, description: str) -> None:
        set_condition(lib.pn_disposition_condition(lib.pn_delivery_local(delivery)), name, description)
        lib.pn_delivery_update(delivery, REJECTED)
        lib.pn_delivery_settle(delivery)
        self.server._dirty.add(producer.connection)

    def top_up(self, state: Producer) -> None:
        server = self.server
        window = server.config.producer_credit_window
        credit = lib.pn_link_credit(state.link)
        if credit * 2 >= window:
            return
        if server.journal is not None and server.journal.backlog_full():
            server._credit_withheld = True  # the batch's unit asks for a report, so journal_durable comes
            return  # the disk is behind: withhold credit until journal_durable tops up again
        lib.pn_link_flow(state.link, window - credit)
        server._dirty.add(state.connection)

    def top_up_all(self) -> None:
        for state in self.server.producers.values():
            self.top_up(state)


def _too_large(size_bytes: int) -> GrouperError:
    return ResourceLimitExceeded(f"message is {size_bytes} bytes; this node accepts at most "
                                 f"{MESSAGE_SIZE_MAX_BYTES} bytes per message")


def _journal_down(reason: str) -> GrouperError:
    return ResourceLimitExceeded(f"the node cannot store messages right now ({reason}); retry later")
