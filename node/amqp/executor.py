"""The engine loop's one effect executor: a table from effect type to what the loop does for it.

Engine loop thread only. The node shell (node/core/shell.py) decides; this carries out, in order, what it
returns: proton calls (deliver, settle a producer's or a consumer's delivery, close a link), journal
calls (store, remove, declare, read back), the tracer's lines and the log's. In a cluster the cluster
link (node/cluster.py) adds its own rows (raft proposals, forwarding, replies) to the same table.
Rules:
- Never decides: every branch here is I/O. An effect whose target is gone (a link detached meanwhile)
  is skipped.
- A presettled consumer's delivery is settled here as it is sent; what the broker does with that
  outcome goes through the shell and is carried out after the effects already in the list.
"""

from __future__ import annotations

import logging

from node.amqp import codec
from node.amqp.conditions import condition_for, journal_failure_condition
from node.amqp.engine import delivery_tag, lib
from node.core.effects import (AcceptSend, CloseUnstored, Confirm, DeadLettered, Declared, Delayed, Deliver,
                               DetachConsumer, Dropped, Enqueued, Flushed, Kept, PageIn, ReadRecords, Refuse,
                               RefuseUnstored, Removed, Stored, Unconfirmed, Withdrawn, WriteFailed)
from node.core.dispatch.message import Outcome
from node.core.errors import GroupLeaseExpired

log = logging.getLogger("grouper.amqp")


class EffectExecutor:
    def __init__(self, server):
        self.server = server
        self.table = {
            Deliver: self._deliver, Stored: self._store, Removed: self._remove, Declared: self._declare,
            PageIn: self._page_in, ReadRecords: self._read_records, DetachConsumer: self._detach,
            Dropped: _dropped, Delayed: self._delayed, Enqueued: self._enqueued, DeadLettered: _dead_lettered,
            Kept: _kept, Withdrawn: _nothing, AcceptSend: self._accept, Refuse: self._refuse,
            RefuseUnstored: self._refuse_unstored, Confirm: self._confirm, Unconfirmed: self._unconfirmed,
            CloseUnstored: self._close_unstored, Flushed: _call, WriteFailed: self._write_failed,
        }

    # ---- deliveries and their consumers ----------------------------------------------------------

    def _deliver(self, effect: Deliver):
        server = self.server
        state = server.consumers.get(effect.consumer_id)
        if state is None:
            return None
        message = effect.message
        payload = message.payload
        first_key = state.first_key if effect.first_for_consumer else ""
        if message.delivery_count or first_key:
            payload = codec.rewrite_for_delivery(payload, message.delivery_count, first_key)
        if message.enqueued_at_ms:
            payload = codec.stamp_enqueued_time(payload, message.enqueued_at_ms)
        link = state.link
        delivery = lib.pn_delivery(link, delivery_tag(effect.delivery_id))
        lib.pn_link_send(link, payload, len(payload))
        lib.pn_link_advance(link)
        server._dirty.add(state.connection)
        tracer = server.tracer
        if not effect.browse and tracer.traced(state.queue):
            tracer.delivered(state.id, state.label, delivery, state.queue, message, state.presettled)
        if effect.browse:
            lib.pn_delivery_settle(delivery)
        elif state.presettled:
            lib.pn_delivery_settle(delivery)
            return server.shell.broker_effects(server.broker.settle(
                effect.consumer_id, effect.delivery_id, Outcome.ACCEPTED, server.clock_ms()))
        else:
            state.unsettled[delivery] = effect.delivery_id
        return None

    def _detach(self, effect: DetachConsumer) -> None:
        if isinstance(effect.error, GroupLeaseExpired):  # a hung consumer: its operator should hear of it
            state = self.server.consumers.get(effect.consumer_id)
            log.warning("consumer %s detached, its group lease lapsed: %s",
                        state.label if state is not None else effect.consumer_id, effect.error.description)
        self.server._detach(effect)

    def _confirm(self, effect: Confirm) -> None:
        server = self.server
        link, delivery = effect.target
        if server.tracer.deliveries:
            server.tracer.delivery_confirmed(link.id, delivery, True)
        if not link.alive:
            return
        lib.pn_delivery_settle(delivery)
        server._dirty.add(link.connection)

    def _unconfirmed(self, effect: Unconfirmed) -> None:
        link, delivery = effect.target
        if self.server.tracer.deliveries:
            self.server.tracer.delivery_confirmed(link.id, delivery, False)

    def _close_unstored(self, effect: CloseUnstored) -> None:
        server = self.server
        reason = effect.reason
        for consumer in dict.fromkeys(link for link, _ in effect.targets):
            if consumer.alive:  # not settled: the removal is not on disk, and a restart would deliver it again
                server._forget_link(consumer)
                server._close_link(consumer.link, (
                    journal_failure_condition(reason), f"the node could not store this link's settlements "
                    f"({reason}); a message whose acceptance it did not settle may be delivered again: attach again"))
                server._dirty.add(consumer.connection)

    # ---- producers' deliveries -------------------------------------------------------------------

    def _accept(self, effect: AcceptSend) -> None:
        self.server._settle_send(effect.incoming, accept=effect.tell)

    def _refuse(self, effect: Refuse) -> None:
        self.server._settle_send(effect.incoming, condition_for(effect.error))

    def _refuse_unstored(self, effect: RefuseUnstored) -> None:
        if effect.incoming[0].alive:
            self.server._settle_send(effect.incoming, (journal_failure_condition(effect.reason),
                                                       effect.error.description))

    # ---- the journal -----------------------------------------------------------------------------

    def _store(self, effect: Stored) -> None:
        journal = self.server.journal
        if journal is not None:
            journal.store(effect.queue, effect.message)

    def _remove(self, effect: Removed) -> None:
        journal = self.server.journal
        if journal is not None:
            journal.remove(effect.queue, effect.seq)

    def _declare(self, effect: Declared) -> None:
        journal = self.server.journal
        if journal is not None:
            journal.declare(effect.values)

    def _page_in(self, effect: PageIn) -> None:  # answered through AmqpServer.journal_bodies
        self.server.journal.read_bodies(effect.queue, effect.seqs)

    def _read_records(self, effect: ReadRecords) -> None:  # answered through AmqpServer.journal_records
        self.server.journal.read_records_after(effect.queue, effect.after_seq, effect.count, effect.max_bytes)

    # ---- timers, traces and logs -----------------------------------------------------------------

    def _delayed(self, effect: Delayed) -> None:
        self.server._redeliver_at(effect.until_ms)

    def _enqueued(self, effect: Enqueued) -> None:
        self.server.tracer.enqueued(effect.queue, effect.message)

    def _write_failed(self, effect: WriteFailed) -> None:
        log.error("journal write failed: %s; %d sends taken back, %d already delivered (their producers are "
                  "told the outcome is unknown); durable sends are refused for %d ms, then tried again",
                  effect.reason, effect.taken_back, effect.outcome_unknown, self.server.durability.retry_interval_ms)


def _nothing(_effect) -> None:
    """A Withdrawn send was never journalled: nothing to do."""


def _call(effect: Flushed) -> None:
    effect.fn(effect.reason)


def _dropped(effect: Dropped) -> None:
    log.info("queue %s dropped message %d: %s", effect.queue, effect.seq, effect.reason)


def _dead_lettered(effect: DeadLettered) -> None:
    log.info("queue %s dead-lettered message %d to %s (as message %d): %s", effect.queue, effect.seq,
             effect.dead_letter_queue, effect.dead_letter_seq, effect.reason)


def _kept(effect: Kept) -> None:
    log.warning("queue %s keeps message %d and will deliver it again: %s", effect.queue, effect.seq, effect.reason)
