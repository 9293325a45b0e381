"""A discharged transaction applied to the node (issue 31): committed whole, or rolled back leaving no trace.

Pure: no proton, no clock, no I/O; the node shell (node/core/shell.py) calls it with its broker,
durability and cluster protocol, and hands the effects to its adapter. Rules:
- A commit is refused, and rolled back instead, rather than half done: when the transaction is marked
  rollback-only (node/core/dispatch/transactions.py), when one of its sends would be refused by its
  queue (checked for every send before the first is enqueued), and, in a cluster, when a send needs a
  group this node does not own (or that no node owns yet), or one being handed over between nodes: a
  later increment may forward such sends.
  The refusal is a TransactionRolledBack on the discharge (amqp:transaction:rollback) naming the cause.
- A commit enqueues the sends in their order, then applies the dispositions in theirs. A send its
  de-duplicating queue took already (node/core/dispatch/dedup.py) is part of the commit, not queued again. The discharge is
  accepted once every durable send and every removal is on disk (one journal unit: the whole commit is
  one batch of the engine loop), else at the end of the batch; a disposition that removed a message is
  confirmed to its consumer once the removal is on disk, any other at once.
- A rollback forgets the sends and gives each delivery it settled back to its group (modified, delivery
  failed: the delivery count is raised), in seq order (so each group gets them back in order, whatever
  order they were settled in); their consumers' deliveries are settled here.
"""

from __future__ import annotations

from node.core.cluster.handover import AS_ROUTED
from node.core.dispatch.dedup import Duplicate
from node.core.dispatch.message import Outcome
from node.core.dispatch.transactions import Transaction, TransactionRolledBack
from node.core.durability import CONSUMER
from node.core.effects import Confirm, Refuse, Removed
from node.core.errors import GrouperError


def commit(shell, transaction: Transaction, incoming, now_ms: int) -> list:
    refusal = transaction.rollback_only or _remote_group(shell.protocol, transaction) or \
        _refused_send(shell.broker, transaction)
    if refusal is not None:
        return roll_back(shell, transaction, now_ms) + \
            [Refuse(incoming, TransactionRolledBack(f"transaction rolled back: {refusal}"))]
    broker = shell.broker
    effects: list = []
    waits = False
    for send in transaction.sends:
        try:
            effects += broker.enqueue(send.queue, send.message, now_ms)
        except Duplicate as duplicate:  # a resend its de-duplicating queue took already: accepted, not queued
            effects += duplicate.effects
            continue
        waits = waits or (send.durable and shell.journalled)
    confirms: list = []
    for disposition in transaction.dispositions:
        settled = broker.settle(disposition.consumer_id, disposition.delivery_id, disposition.outcome, now_ms,
                                disposition.delivery_failed)
        if shell.journalled and any(type(effect) is Removed for effect in settled):
            shell.durability.wait(disposition.target, CONSUMER)
            waits = True
        else:
            confirms.append(Confirm(disposition.target))
        effects += settled
    accepted = shell.accept_when_stored(incoming, waits, False)
    return accepted + confirms + shell.broker_effects(effects)


def roll_back(shell, transaction: Transaction, now_ms: int) -> list:
    broker = shell.broker
    effects: list = []
    confirms: list = []
    # in seq order, whatever order the consumer settled them in: each goes back to the head of its group
    # and may be delivered again at once, so an older message given back later would come after a newer one
    given_back = sorted(transaction.dispositions, key=lambda disposition: (
        broker.delivered_seq(disposition.consumer_id, disposition.delivery_id) or 0))
    for disposition in given_back:
        effects += broker.settle(disposition.consumer_id, disposition.delivery_id, Outcome.MODIFIED, now_ms, True)
        confirms.append(Confirm(disposition.target))
    return confirms + shell.broker_effects(effects)


def _remote_group(protocol, transaction: Transaction) -> str | None:
    if protocol is None:
        return None
    routes = protocol.router.routes
    for send in transaction.sends:
        if send.route_key is None:
            continue
        key = (send.queue, send.route_key)
        owner = routes.get(key)
        if owner == protocol.node_id and (protocol.moves or protocol.parked) \
                and protocol.handovers.placement(key, None, owner) != AS_ROUTED:
            return (f"group {send.route_key!r} of queue {send.queue!r} is being handed over between nodes; "
                    f"retry the transaction once the move has ended")
        if owner != protocol.node_id:
            return (f"group {send.route_key!r} of queue {send.queue!r} is owned by "
                    f"{'node ' + repr(owner) if owner else 'no node yet'}, not by this node "
                    f"({protocol.node_id!r}); a transaction's sends must go to groups the node it is "
                    f"declared on owns: connect to that node, or send outside a transaction")
    return None


def _refused_send(broker, transaction: Transaction) -> str | None:
    for send in transaction.sends:
        queue = broker.queues.get(send.queue)
        if queue is None:
            continue  # made by its first enqueue, as outside a transaction
        try:
            queue.check_enqueue(send.message.group_id, send.message.size_bytes)
        except GrouperError as error:
            return f"a send to queue {send.queue!r} is refused: {error.description}"
    return None
