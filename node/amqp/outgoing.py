"""The engine loop's consumer links after attach: the credit a client gives, and the outcomes it sends back.

Engine loop thread only. Rules:
- A consumer's credit goes to the core as it is (`Broker.set_credit`); a drain request is answered
  at once (the core has delivered what it could), and leaves the consumer with no credit.
- A consumer's outcome that removes a message is settled only once the removal is on disk: settling
  promises the message is gone for good (the server's `durability` holds it until journal_durable).
  Any other outcome, and any delivery the client settled first, is settled here at once.
- A delivery settled with no outcome is accepted (AMQP's default outcome); a non-terminal state
  (received) waits for the outcome.
- The delivery itself is sent by the effect executor's `_deliver` (node/amqp/executor.py), as the core's effects
  come out of `apply`.
"""

from __future__ import annotations

from node.amqp.engine import ACCEPTED, MODIFIED, REJECTED, RELEASED, lib
from node.amqp.incoming import TRANSACTIONAL_STATE
from node.amqp.links import Consumer
from node.core.durability import CONSUMER
from node.core.effects import Removed
from node.core.dispatch.message import Outcome


class Outgoing:
    def __init__(self, server):
        self.server = server
        self.broker = server.broker
        self.tracer = server.tracer
        self.clock_ms = server.clock_ms

    def disposition(self, consumer: Consumer, delivery) -> None:
        delivery_id = consumer.unsettled.get(delivery)
        if delivery_id is None:
            return  # settled here already (a browser's copy, or an outcome taken before)
        remote = lib.pn_delivery_remote_state(delivery)
        settled = lib.pn_delivery_settled(delivery)
        if remote == TRANSACTIONAL_STATE:  # issue 31: held until the discharge (node/amqp/coordinator.py)
            self.server.coordinator.disposition(consumer, delivery, delivery_id)
            return
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
        server = self.server
        effects = self.broker.settle(consumer.id, delivery_id, outcome, self.clock_ms(), failed)
        if self.tracer.deliveries:
            self.tracer.delivery_settled(consumer.id, delivery, outcome.value,
                                         not settled and any(type(effect) is Removed for effect in effects))
        if not settled and any(type(effect) is Removed for effect in effects):
            server.durability.wait((consumer, delivery), CONSUMER)  # settled once the removal is on disk
        else:
            lib.pn_delivery_settle(delivery)
        server._dirty.add(consumer.connection)
        server.apply(effects)

    def credit(self, state: Consumer) -> None:
        link = state.link
        server = self.server
        server.apply(self.broker.set_credit(state.id, lib.pn_link_credit(link), self.clock_ms()))
        if lib.pn_link_get_drain(link) and lib.pn_link_credit(link) > 0:
            lib.pn_link_drained(link)
            server.apply(self.broker.set_credit(state.id, 0, self.clock_ms()))
        server._dirty.add(state.connection)
