"""The links of a load generator on one pump: deliveries read and accepted, outcomes, credit, failures.

`grouper perf` (node/tools/perf_run.py) and bench/lean.py's producer and consumer processes share it.
Rules:
- Events are routed by link to the caller's link states (any object with `link`, `opened`, `error`;
  a consumer's also `accepted_since_flow`), and from there to the caller's three callbacks:
  `message(consumer, payload)`, `outcome(producer, delivery)` and `failed(state, problem)` (state
  None for a connection or transport that ended). What to count is the caller's.
- A consumer accepts and settles each delivery as soon as it is read, and grants the credit back
  after each pass (`top_up`): one flow frame per link per pass, so at most the credit it started
  with is ever unsettled on its link.
- A producer's delivery is handed to `outcome` only when the broker updated it; settling it is the
  caller's (after it read the outcome's condition, which settling frees).
- A link refused by the broker opens with a null terminus (AMQP 1.0 2.6.3), then detaches naming why:
  `opened` stays False and `failed` gets the reason.
"""

from __future__ import annotations

from node.amqp.engine import (ACCEPTED, CONNECTION_REMOTE_CLOSE, DELIVERY, LINK_REMOTE_CLOSE, LINK_REMOTE_DETACH,
                              LINK_REMOTE_OPEN, TRANSPORT_ERROR, ffi, lib, terminus_present)
from node.client.endpoint import problem
from node.client.pump import Pump

RECEIVE_BUFFER_BYTES = 64 << 10  # a delivery larger than this is read through a bigger buffer
WINDOW_MESSAGES = 1000  # unsettled sends a producer allows itself, whatever credit the broker grants


class DeliveryReader:
    """Reads a complete delivery into one reused buffer, then accepts and settles it."""

    def __init__(self):
        self._buffer = ffi.new("char[]", RECEIVE_BUFFER_BYTES)
        self._buffer_bytes = RECEIVE_BUFFER_BYTES

    def accept(self, delivery) -> bytes | None:
        """The delivery's bytes, accepted and settled; None for an update or a partial delivery."""
        if not lib.pn_delivery_readable(delivery) or lib.pn_delivery_partial(delivery):
            return None  # an update of a delivery already read, or more frames to come
        link = lib.pn_delivery_link(delivery)
        size = lib.pn_delivery_pending(delivery)
        if size > self._buffer_bytes:
            self._buffer_bytes = max(size, 2 * self._buffer_bytes)
            self._buffer = ffi.new("char[]", self._buffer_bytes)
        count = lib.pn_link_recv(link, self._buffer, size)
        payload = ffi.unpack(self._buffer, max(count, 0))
        lib.pn_link_advance(link)
        lib.pn_delivery_update(delivery, ACCEPTED)
        lib.pn_delivery_settle(delivery)
        return payload


class Traffic:
    """One pump's links and their events: see the module's rules."""

    def __init__(self, message, outcome, failed):
        self.message, self.outcome, self.failed = message, outcome, failed
        self.pump = Pump(self._on_event)
        self.consumers: list = []
        self._consumer_of: dict = {}  # receiver link -> its state
        self._producer_of: dict = {}  # sender link -> its state
        self._reader = DeliveryReader()

    def add_consumer(self, state, credit: int) -> None:
        lib.pn_link_flow(state.link, credit)
        self.consumers.append(state)
        self._consumer_of[state.link] = state

    def add_producer(self, state) -> None:
        self._producer_of[state.link] = state

    def _on_event(self, kind: int, event) -> None:
        if kind == DELIVERY:
            delivery = lib.pn_event_delivery(event)
            link = lib.pn_delivery_link(delivery)
            consumer = self._consumer_of.get(link)
            if consumer is not None:
                payload = self._reader.accept(delivery)
                if payload is not None:
                    consumer.accepted_since_flow += 1
                    self.message(consumer, payload)
                return
            producer = self._producer_of.get(link)
            if producer is not None and lib.pn_delivery_updated(delivery):
                self.outcome(producer, delivery)
        elif kind == LINK_REMOTE_OPEN:
            link = lib.pn_event_link(event)
            consumer = self._consumer_of.get(link)
            if consumer is not None:
                consumer.opened = terminus_present(lib.pn_link_remote_source(link))
            elif link in self._producer_of:
                self._producer_of[link].opened = terminus_present(lib.pn_link_remote_target(link))
        elif kind in (LINK_REMOTE_CLOSE, LINK_REMOTE_DETACH):
            link = lib.pn_event_link(event)
            state = self._consumer_of.get(link) or self._producer_of.get(link)
            if state is not None:
                self.failed(state, problem(kind, event))
        elif kind in (CONNECTION_REMOTE_CLOSE, TRANSPORT_ERROR):
            self.failed(None, problem(kind, event))

    def top_up(self) -> None:
        """Credit back what each consumer accepted since the last pass."""
        for consumer in self.consumers:
            if consumer.accepted_since_flow:
                lib.pn_link_flow(consumer.link, consumer.accepted_since_flow)
                consumer.accepted_since_flow = 0

    def pass_once(self, timeout_s: float) -> None:
        """Write, wait up to `timeout_s` for what arrives, handle it, grant credit back."""
        self.pump.flush()
        self.pump.run_once(timeout_s)
        self.top_up()
