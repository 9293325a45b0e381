"""The blocking client's links: a sender with a window of unsettled sends, a receiver that holds.

Rules:
- A sender (a producer's link) counts a message as written only when the node settles it as
  accepted; any other outcome is kept (with the node's condition) and raised by the next `send` or
  `flush`.
- A receiver (a consumer's link) holds what it took unsettled until the caller accepts or releases
  it. Accepts use receiver-settle-mode second: an accept is confirmed once the node has settled, so
  the removal is applied (and journalled, for durable queues) when `confirmed()` says so.
- Credit is granted only by `drain` and `await_one`, never behind the caller's back.
- proton's C engine through node/amqp/engine.py; each link belongs to one node/client/connection.py
  `Connection` and is driven by its thread.
"""

from __future__ import annotations

from node.amqp.engine import ACCEPTED, MODIFIED, REJECTED, RELEASED, delivery_tag, ffi, lib, tag_value
from node.client.connection import Connection, DeliveryRefused, LinkRefused, condition_words
from node.client.endpoint import condition_parts

PUMP_EVERY_MESSAGES = 64  # a producer moves bytes after this many sends, so settlements keep flowing
RECEIVE_BUFFER_BYTES = 64 << 10  # a delivery larger than this is read through a bigger buffer

_TERMINAL = {ACCEPTED: "accepted", REJECTED: "rejected", RELEASED: "released", MODIFIED: "modified"}


class Sender:
    """One sender link with a bounded window of unsettled deliveries."""

    def __init__(self, connection: Connection, queue: str, name: str, window_messages: int):
        self.connection = connection
        self.queue = queue
        self.window_messages = window_messages
        self.sent = 0
        self.accepted = 0
        self.unsettled = 0
        self.detached = False
        self.failure: DeliveryRefused | None = None
        link = connection.endpoint.sender(name, queue, open_now=False)
        lib.pn_link_set_snd_settle_mode(link, lib.PN_SND_UNSETTLED)
        self.link = link
        connection.attach(link, self, f"a producer link to queue {queue!r}")

    def send(self, payload: bytes) -> None:
        link = self.link
        self.connection.check_open()
        if self.unsettled >= self.window_messages or lib.pn_link_credit(link) <= 0:
            self.connection.wait(self._can_send, f"credit or settlements for queue {self.queue!r}")
        if self.failure is not None:
            raise self.failure
        lib.pn_delivery(link, delivery_tag(self.sent))  # the tag names the message in a refusal
        lib.pn_link_send(link, payload, len(payload))
        lib.pn_link_advance(link)
        self.sent += 1
        self.unsettled += 1
        if self.sent % PUMP_EVERY_MESSAGES == 0:
            self.connection.pump(0)

    def _can_send(self) -> bool:
        if self.failure is not None or self.detached:
            return True
        return self.unsettled < self.window_messages and lib.pn_link_credit(self.link) > 0

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
        if not lib.pn_delivery_settled(delivery):
            return  # the node always settles with the outcome; a bare state update is not one
        state = lib.pn_delivery_remote_state(delivery)
        if state == ACCEPTED:
            self.accepted += 1
        elif self.failure is None:
            condition = lib.pn_disposition_condition(lib.pn_delivery_remote(delivery))
            row = tag_value(delivery).decode()
            self.failure = DeliveryRefused(
                f"the Grouper node at {self.connection.address} {_TERMINAL.get(state, 'did not accept')} message "
                f"{row} of this task (queue {self.queue!r}): {condition_words(condition)}",
                condition_parts(condition)[0])
        lib.pn_delivery_settle(delivery)
        self.unsettled -= 1

    def on_detached(self) -> None:
        self.detached = True
        if self.failure is None:
            condition = lib.pn_link_remote_condition(self.link)
            self.failure = DeliveryRefused(
                f"the Grouper node at {self.connection.address} detached the producer link of queue {self.queue!r}"
                f" with {self.unsettled} messages unsettled: {condition_words(condition)}",
                condition_parts(condition)[0])

    def close(self) -> None:
        if not self.detached and not self.connection.failure and not self.connection.closed:
            lib.pn_link_close(self.link)


class Taken:
    """A message a receiver holds: its bytes, and the unsettled delivery (None for a browser's copy)."""

    __slots__ = ("payload", "delivery", "receiver")

    def __init__(self, payload: bytes, delivery, receiver: "Receiver"):
        self.payload = payload
        self.delivery = delivery
        self.receiver = receiver


class Receiver:
    """One receiver link; credit is granted only by `drain` and `await_one`, never behind the caller's back."""

    def __init__(self, connection: Connection, queue: str, name: str, browse: bool):
        self.connection = connection
        self.queue = queue
        self.browse = browse
        self.arrived: list[Taken] = []
        self.unsettled = 0  # deliveries held (taken, not yet accepted or released and confirmed)
        self.detached = False
        link = connection.endpoint.receiver(name, queue, open_now=False)
        if browse:
            lib.pn_terminus_set_distribution_mode(lib.pn_link_source(link), lib.PN_DIST_MODE_COPY)
        else:
            lib.pn_link_set_rcv_settle_mode(link, lib.PN_RCV_SECOND)
        self.link = link
        self._buffer = ffi.new("char[]", RECEIVE_BUFFER_BYTES)
        self._buffer_bytes = RECEIVE_BUFFER_BYTES
        self._awaiting_confirm = 0
        what = f"a {'browser' if browse else 'consumer'} link on queue {queue!r}"
        connection.attach(link, self, what)

    def on_delivery(self, delivery) -> None:
        link = self.link
        if lib.pn_link_current(link) == delivery and not lib.pn_delivery_partial(delivery):
            payload = self._read(link, lib.pn_delivery_pending(delivery))
            lib.pn_link_advance(link)
            if self.browse:
                lib.pn_delivery_settle(delivery)  # a browser's copy arrives settled; nothing to answer
                self.arrived.append(Taken(payload, None, self))
            else:
                self.unsettled += 1
                self.arrived.append(Taken(payload, delivery, self))
        elif lib.pn_delivery_settled(delivery) and self._awaiting_confirm:
            lib.pn_delivery_settle(delivery)  # the node applied our outcome: now this side forgets it
            self._awaiting_confirm -= 1
            self.unsettled -= 1

    def _read(self, link, size: int) -> bytes:
        if size > self._buffer_bytes:
            self._buffer_bytes = max(size, 2 * self._buffer_bytes)
            self._buffer = ffi.new("char[]", self._buffer_bytes)
        count = lib.pn_link_recv(link, self._buffer, size)
        return ffi.unpack(self._buffer, max(count, 0))

    def on_detached(self) -> None:
        self.detached = True

    def drain(self, credit: int) -> list[Taken]:
        """Everything the node can give this link now, up to `credit`: one drain round trip."""
        link = self.link
        lib.pn_link_set_drain(link, True)
        lib.pn_link_flow(link, credit)
        self.connection.wait(lambda: not lib.pn_link_draining(link) or self.detached,
                             f"the node to answer a drain on queue {self.queue!r}")
        lib.pn_link_set_drain(link, False)
        return self.take_arrived()

    def await_one(self, deadline_s: float) -> list[Taken]:
        """Wait, until the monotonic `deadline_s`, for one message; then take back any unused credit."""
        lib.pn_link_flow(self.link, 1)
        self.connection.wait_until(lambda: bool(self.arrived) or self.detached, deadline_s)
        return self.take_arrived() + (self.drain(0) if lib.pn_link_credit(self.link) > 0 else [])

    def take_arrived(self) -> list[Taken]:
        if self.detached and not self.arrived:
            condition = lib.pn_link_remote_condition(self.link)
            raise LinkRefused(f"the Grouper node at {self.connection.address} detached the consumer of queue "
                              f"{self.queue!r}: {condition_words(condition)}", condition_parts(condition)[0])
        taken, self.arrived = self.arrived, []
        return taken

    def settle(self, taken: list[Taken], state: int) -> None:
        """Send one outcome for each held delivery (in the given order); confirmed by `wait_confirmed`."""
        self.connection.check_open()  # a closed connection freed its deliveries
        for item in taken:
            delivery = item.delivery
            if delivery is None:
                continue
            lib.pn_delivery_update(delivery, state)
            if state == ACCEPTED:
                self._awaiting_confirm += 1  # settled once the node has applied it (settle-mode second)
            else:
                lib.pn_delivery_settle(delivery)
                self.unsettled -= 1
            item.delivery = None

    def confirmed(self) -> bool:
        return self._awaiting_confirm == 0 or self.detached

    def close(self) -> None:
        if not self.detached and not self.connection.failure and not self.connection.closed:
            lib.pn_link_close(self.link)
