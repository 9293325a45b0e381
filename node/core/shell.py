"""The node shell: one node's commit cycle as a pure object, run by the engine loop and by the simulation.

It owns the node's Broker, its Durability (what waits for the journal) and, in a cluster, its
ClusterProtocol (None on a node alone). Every entry point returns the effects (node/core/effects.py)
its adapter carries out, in order, with one executor: a table from effect type to method
(node/amqp/executor.py, with node/cluster.py's rows; tests/sim/node_model.py). docs/node-shell.md
draws the cycle.
- Sends in: `enqueue_local`, `accept_when_stored`, `refuse`, `after_flush`; broker effects out through
  `broker_effects` (what the adapter's own broker calls returned: settle, detach, tick, page in, ...).
- The cluster protocol's effects pass through `from_protocol`: EnqueueLocal, AcceptWhenStored, Refuse
  and AfterFlush are handled here and never reach the adapter (no U-turn through the engine loop); the
  rest, its journal records (Stored / Removed / Declared, the broker's words) and the broker effects it
  caused among them, go out in its order. A StopNode ends the list.
- The journal's answers come back: `end_batch` (before the adapter hands its unit to the journal),
  `batch_ended(ticket)`, `durable(ticket)`, `failed(ticket, reason)`.
Rules:
- Pure: never imports proton, grpc, threading, socket or time; takes `now_ms`; never calls its adapter.
  An adapter's after_flush callback goes out as a `Flushed` effect for the adapter to call.
- Declarations first: each list of broker effects handed out starts with the Declared of the durable
  queues declared since the last one, so a queue's record precedes its messages' in the journal.
- A producer's durable send is accepted (AcceptSend) only once its journal batch is durable; a
  non-durable one (a non-durable queue's, or one sent non-durable: never journalled, unless it went cold
  and was journalled after all) at the end of the batch it arrived in (settled together, in disposition ranges); one
  the producer settled first at once, with no outcome told.
- A consumer's outcome that removes a message is confirmed (Confirm) once the removal is durable.
- A failed batch: its sends nothing has seen yet are taken back (Broker.take_back), their producers
  refused (RefuseUnstored, outcome unknown for those a consumer had); its consumers' settlements stay
  unsettled (Unconfirmed) and those consumers are closed (CloseUnstored), after the take-back's effects.
- Paging: the STOREs of broker queues are kept per journal ticket and handed to Broker.journalled once
  durable (their bodies may page out then); forgotten when their batch failed (they stay in memory).
"""

from __future__ import annotations

from collections import deque

from node.core.dispatch.message import COLD
from node.core.dispatch.dedup import Duplicate
from node.core.durability import CALL, CONSUMER, CONTINUATION, PRODUCER
from node.core.effects import (AcceptSend, AcceptWhenStored, AfterFlush, CloseUnstored, Confirm, EnqueueLocal, Flushed,
                               Refuse, RefuseUnstored, StopNode, Stored, Unconfirmed, WriteFailed)
from node.core.errors import GrouperError, StoreFailed
from node.core import transaction_commit

RESERVED = "\x00"  # a journal name starting with NUL is the cluster's own (node/core/cluster/context.py)


class NodeShell:
    def __init__(self, broker, durability, journalled: bool, protocol=None):
        self.broker = broker
        self.durability = durability
        self.journalled = journalled  # False: no journal, every queue behaves as non-durable
        self.protocol = protocol  # node.core.cluster.ClusterProtocol in a cluster, else None
        self.replication = None  # node.core.replication.streams.ReplicaStreams of a journalled cluster node (issue 28)
        self._accept_at_batch_end: list = []  # non-durable sends of this batch
        self._stores_unflushed: list = []  # (queue, message) STOREs since the last unit handed to the journal
        self._stores_by_ticket: deque = deque()  # (ticket, STOREs) per unit, until reported durable or failed
        self._inside = {
            EnqueueLocal: self._enqueue_local, AcceptWhenStored: self._accept_when_stored, Refuse: self._refuse,
            AfterFlush: self._after_flush, Stored: self._stored,
        }

    # ---- sends in ------------------------------------------------------------------------------

    def enqueue_local(self, incoming, queue_name: str, message, durable: bool, producer_settled: bool,
                      now_ms: int) -> list:
        try:
            if self.replication is not None:
                self.replication.check_room(queue_name, message)  # a full backlog to an in-sync backup refuses
            effects = self.broker.enqueue(queue_name, message, now_ms)
        except GrouperError as error:
            return [Refuse(incoming, error)]
        except Duplicate as duplicate:  # a resend within its queue's window (issue 31): accepted once on disk
            return duplicate.effects + self.accept_when_stored(incoming, durable, producer_settled)
        if not durable and message.flags & COLD and self.journalled:
            durable = True  # a non-durable send that went cold is journalled (node/core/dispatch/queue_store.py)
        accepted = self.accept_when_stored(incoming, durable, producer_settled, (queue_name, message))
        effects = self.broker_effects(effects)
        if accepted:
            effects.insert(0, accepted[0])
        return effects

    def accept_when_stored(self, incoming, durable: bool, producer_settled: bool, stored=None) -> list:
        """`stored`: the (queue name, Message) the send put in the broker, taken back if its batch fails."""
        if producer_settled:
            return [AcceptSend(incoming, False)]
        if durable:
            self.durability.wait(incoming, PRODUCER, stored)
            if stored is not None and self.replication is not None:
                self.replication.expect(incoming, stored[0], stored[1].seq)  # its accept may wait for backups
        else:
            self._accept_at_batch_end.append(incoming)
        return []

    @staticmethod
    def refuse(incoming, error: BaseException) -> list:
        return [Refuse(incoming, error)]

    def after_flush(self, fn) -> None:
        """`fn(None)` goes out as a Flushed effect once everything journalled so far is on disk,
        `fn(reason)` if it failed."""
        self.durability.wait(fn, CALL)

    def consumer_waits(self, target) -> None:
        """A consumer's outcome removed a message: `target` is confirmed once the removal is on disk."""
        self.durability.wait(target, CONSUMER)

    def refusing(self, now_ms: int) -> str | None:
        """The reason durable sends are refused now, or None when they are taken."""
        return self.durability.refusing(now_ms)

    # ---- local transactions (issue 31): node/core/transaction_commit.py --------------------------

    def commit(self, transaction, incoming, now_ms: int) -> list:
        """Apply a discharged transaction whole, or refuse `incoming` (the discharge) and roll it back."""
        return transaction_commit.commit(self, transaction, incoming, now_ms)

    def roll_back(self, transaction, now_ms: int) -> list:
        return transaction_commit.roll_back(self, transaction, now_ms)

    # ---- effects out ---------------------------------------------------------------------------

    def broker_effects(self, effects: list) -> list:
        """The broker's `effects` for the adapter: the declarations made since the last call first; the
        STOREs kept for paging."""
        if self.broker.declared:
            effects[0:0] = self._declarations()
        if self.journalled:
            unflushed = self._stores_unflushed
            for effect in effects:
                if type(effect) is Stored:
                    unflushed.append((effect.queue, effect.message))
        return effects

    def tick(self, now_ms: int) -> list:
        return self.broker_effects(self.broker.tick(now_ms))

    def from_protocol(self, effects: list) -> list:
        """The cluster protocol's `effects`: those the shell handles done here, the rest for the adapter."""
        out: list = []
        inside = self._inside
        for effect in effects:
            handle = inside.get(type(effect))
            if handle is not None:
                handle(effect, out)
            else:
                out.append(effect)
                if type(effect) is StopNode:
                    break  # the rest dies with the process
        return out

    def _declarations(self) -> list:
        declared = self.broker.declarations()
        return list(declared) if self.journalled else []

    def _enqueue_local(self, effect: EnqueueLocal, out: list) -> None:
        out += self.enqueue_local(effect.incoming, effect.queue, effect.message, effect.durable,
                                  effect.producer_settled, effect.now_ms)

    def _accept_when_stored(self, effect: AcceptWhenStored, out: list) -> None:
        out += self.accept_when_stored(effect.incoming, effect.durable, effect.producer_settled)

    @staticmethod
    def _refuse(effect: Refuse, out: list) -> None:
        out.append(effect)

    def _after_flush(self, effect: AfterFlush, out: list) -> None:
        self.durability.wait(effect.what, CONTINUATION)

    def _stored(self, effect: Stored, out: list) -> None:
        out.append(effect)
        if self.journalled and effect.queue[:1] != RESERVED:  # a queue's message, not the cluster's own record
            self._stores_unflushed.append((effect.queue, effect.message))

    # ---- the commit cycle: the end of a batch and the journal's answers ------------------------

    def end_batch(self, now_ms: int) -> list:
        """The adapter's batch ends: accept its non-durable sends, journal its declarations, let the cluster
        protocol act on what the batch gathered. The adapter then hands its journal unit over (or not: a
        unit nobody waits for may be held) and calls `batch_ended`."""
        out = [AcceptSend(incoming) for incoming in self._accept_at_batch_end]
        self._accept_at_batch_end.clear()
        if self.broker.declared:
            out += self._declarations()
        if self.protocol is not None and self.protocol.batch_due:
            out += self.from_protocol(self.protocol.quiesced(now_ms))
        if self.broker.dedup.pending:  # issue 31: the batch's de-duplication marks, after their messages (dedup.py)
            marks = self.broker.dedup.take_marks()
            if self.journalled:
                out += marks
        if self.replication is not None:
            out += self.replication.pump(now_ms)  # the batch's records go to the backups with the journal's write
        return out

    @property
    def waiting(self) -> bool:
        """Something of the batch being built waits for its journal unit."""
        return self.durability.waiting

    def batch_ended(self, ticket: int | None, now_ms: int) -> list:
        """The batch's journal unit was handed over as `ticket` (None: there is no journal)."""
        released = self.durability.batch_ended(ticket)
        if ticket is not None and self._stores_unflushed:
            self._stores_by_ticket.append((ticket, self._stores_unflushed))
            self._stores_unflushed = []
        return self._released(released, now_ms) if released else []

    def durable(self, ticket: int, now_ms: int) -> list:
        """Every journal unit up to `ticket` is on disk."""
        out = self._released(self.durability.durable(ticket), now_ms)
        by_ticket = self._stores_by_ticket
        if by_ticket and by_ticket[0][0] <= ticket:
            stores: list = []
            while by_ticket and by_ticket[0][0] <= ticket:
                stores += by_ticket.popleft()[1]
            out += self.broker_effects(self.broker.journalled(stores, now_ms))  # their bodies may page out now
        return out

    def failed(self, ticket: int, reason, now_ms: int) -> list:
        """The unit ending at `ticket` could not be written: take back its sends, refuse their producers,
        close the consumers whose settlements it held."""
        refused = self.durability.failed(ticket, reason, now_ms)
        by_ticket = self._stores_by_ticket
        while by_ticket and by_ticket[0][0] <= ticket:
            by_ticket.popleft()  # not on disk: these bodies stay in memory for good
        handed_out, effects = self.broker.take_back([w.stored for w in refused if w.stored is not None], now_ms)
        out: list = [WriteFailed(reason, handed_out.count(False), handed_out.count(True))]
        outcome_unknown = iter(handed_out)
        unstored: list = []
        for target, kind, stored in refused:
            if kind == CALL:
                out.append(Flushed(target, reason))
            elif kind == CONTINUATION:
                out += self.from_protocol(self.protocol.flushed(target, reason, now_ms))
            else:
                unknown = stored is not None and next(outcome_unknown)
                if kind == PRODUCER:
                    if self.replication is not None:
                        self.replication.forget(target)
                    out.append(RefuseUnstored(target, StoreFailed(reason, outcome_unknown=unknown), reason))
                else:
                    out.append(Unconfirmed(target))
                    unstored.append(target)
        out += self.broker_effects(effects)
        if unstored:
            out.append(CloseUnstored(unstored, reason))
        return out

    def _released(self, released: list, now_ms: int) -> list:
        out: list = []
        for target, kind in released:
            if kind == PRODUCER:
                if self.replication is None or self.replication.accept_now(target):  # else the backups release it
                    out.append(AcceptSend(target))
            elif kind == CONSUMER:
                out.append(Confirm(target))
            elif kind == CALL:
                out.append(Flushed(target, None))
            else:
                out += self.from_protocol(self.protocol.flushed(target, None, now_ms))
        return out
