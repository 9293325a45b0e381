"""Takeovers and fencing: a promotion's two ends on one node (issue 28, docs/replication.md).

Rules:
- Takeover: the REPLICAS copy that raised an owner's epoch comes before the ROUTES that moved its groups
  (handler/replicated.py `promote`); a route moving to this node from an owner promoted by the last
  REPLICAS is taken over (an ordinary move or placement is not: its old owner's epoch did not move). The
  order of steps is node/core/replication/takeover.py's; this module translates them: the groups are held
  and their new sends and forwards park (handover.py `placement`, `holding`, `review_holds` see
  `taking_over`) until the taken-over messages are in the queue ahead of them and on disk, then they are
  served and the parked ones follow. The replica journal is read and written on the replica writer's
  thread: ReadReplica and DropReplica are effects, answered by `replica_read` and `replica_dropped`.
- Enqueued messages keep their group order, with their delivery count raised by one; one that the queue
  refuses (its bounds) stops the node rather than being lost: the replica copy stays and a restart takes
  it over again (the BEGUN mark undoes the local part).
- A restart that finds no mark of a promoted owner scans its replica journal (a crash may have come before
  the takeover's first record): the messages of groups routed here are taken over then. New sends of those
  groups that reach this node during that one read are not held (their keys are not known before it).
- Fencing: once the table gives this node an epoch above the one it served with (the FENCE_MARK in its
  journal, 0 when absent), it was promoted away while it was dead or cut off: every group it holds whose
  route names another node is held (delivered no more) and its messages are removed here, once nothing of
  the group is in flight (they live at the new owner); then the new epoch is journalled as the one served
  with and what was dropped is logged once. Groups still routed here stay. Recovered groups are fenced
  before review_holds could hand them to their owner (which would duplicate them there). A batch another
  node forwarded here before it knew (unacknowledged while this node was away) is stored here once (the
  source's high water skips what was stored before) and relayed to the group's owner, never served here
  (handover.py `placement`, RELAY); those few may arrive there after the source's newer sends.
- Imports context, handover and holds of this package and node/core/replication's takeover.
"""

from __future__ import annotations

import logging

from node.core.cluster.context import Context
from node.core.cluster.handover import Handovers
from node.core.dispatch.message import Message
from node.core.effects import AfterFlush, Declared
from node.core.errors import GrouperError
from node.core.replication.takeover import (READING, TAKEOVER_MARK_PREFIX, DropReplica, Takeover, promoted_owners,
                                            raised_count, recovered, taken_over)

log = logging.getLogger("grouper.cluster")

FENCE_MARK = "\x00fence epoch"  # the journal declaration of the epoch this node serves with
FENCE_MESSAGES_PER_TICK = 5000  # messages a fenced node removes a tick, over all its lost groups
FENCE_BYTES_MAX = 1 << 62  # no byte bound of its own: the message bound paces it


class TakeoverStored:
    """A takeover's local unit, on its way to disk (an AfterFlush continuation)."""

    __slots__ = ("takeovers", "owner")

    def __init__(self, takeovers: Takeovers, owner: str):
        self.takeovers = takeovers
        self.owner = owner

    def flushed(self, reason: str | None, now_ms: int, effects: list) -> None:
        self.takeovers.stored(self.owner, reason, now_ms, effects)


class Takeovers:
    def __init__(self, context: Context, handovers: Handovers, replicas):
        self.context = context
        self.handovers = handovers
        self.holds = handovers.holds
        self.replicas = replicas  # node/core/cluster/replicas.py: the table's epochs, read-only
        self.taking_over = handovers.taking_over  # keys held for a takeover (handover.py reads it)
        self.running: dict[str, Takeover] = {}  # owner -> its takeover in progress
        self.waiting: dict[str, list] = {}  # owner -> keys of a later promotion, begun once `running` ends
        self.promoted: dict[str, int] = {}  # owners the last REPLICAS promoted: {owner: new epoch}
        self.undo: dict[str, tuple] = {}  # owner -> (first_seq, keys) of a BEGUN mark recovery found
        self.recovered: list[Takeover] = []  # the takeovers the journal's marks left, begun at ready
        self.serving_epoch = 0  # FENCE_MARK: the epoch this node served with
        self.fenced: set[tuple[str, str]] = set()  # lost keys still being emptied here
        self.dropped_count = 0  # messages removed by fencing, for the one log line

    # ---- recovery -------------------------------------------------------------------------------

    def recover_declaration(self, values: dict) -> bool:
        name = values["name"]
        if name == FENCE_MARK:
            self.serving_epoch = int(values["epoch"])
            self.handovers.promoted_away = True
            return True
        if not name.startswith(TAKEOVER_MARK_PREFIX):
            return False
        first_seq, takeover = recovered(values)
        if first_seq is not None:
            self.undo[takeover.owner] = (first_seq, takeover.keys)
        self.recovered.append(takeover)
        return True

    def ready(self, now_ms: int, effects: list) -> None:
        """The replica is current: fence first (before review_holds hands recovered groups on), then go on
        with the takeovers recovery found."""
        self.fence(now_ms, effects)
        recovered_, self.recovered = self.recovered, []  # once, however often the replica catches up again
        for takeover in recovered_:
            owner = takeover.owner
            if owner in self.undo:
                for key in takeover.keys:
                    self.holds.hold(key)  # hand_over_group takes from held groups only
                self._undo(owner, effects)
            self._begin(takeover, effects)
        me, broker = self.context.node_id, self.context.broker
        queues = [name for name in sorted(broker.queues) if not name.startswith("\x00")]
        for owner, epoch in sorted(self.replicas.epochs.items()):  # promoted owners no mark speaks of
            if owner != me and epoch > 0 and owner not in self.running and queues:
                self._begin(Takeover(owner, epoch - 1, (), queues=queues), effects)

    def _undo(self, owner: str, effects: list) -> None:
        """A BEGUN mark: the local copy may be partial; nothing of it was served. Discarded, taken again."""
        first_seq, keys = self.undo.pop(owner)
        broker = self.context.broker
        for queue_name, route_key in keys:
            queue = broker.queues.get(queue_name)
            if queue is None:
                continue
            removed: list = []
            taken, _ = queue.hand_over_group(queue.group_key_of_route(route_key), removed, 1 << 62, FENCE_BYTES_MAX)
            kept = [message for message in taken if message.seq < first_seq]
            if kept:  # older than the takeover: not its own. Never expected (the group lived elsewhere)
                log.error("group %r of queue %r held %d messages older than its takeover from %s; kept, in "
                          "order, ahead of what is taken over again", route_key, queue_name, len(kept), owner)
            for message in kept:  # their new STOREs before the REMOVEs: a torn tail duplicates, never loses
                self.context.broker_effects(broker.enqueue(queue_name, Message(
                    message.payload, message.group_id, expires_at_ms=message.expires_at_ms,
                    closes_group=message.closes_group, delivery_count=message.delivery_count), 0), effects)
            self.context.broker_effects(removed, effects)

    # ---- the feed ---------------------------------------------------------------------------------

    def replicas_applied(self, payload: dict) -> None:
        """REPLICAS: the copy is replaced; the owners whose epoch grew are remembered for the ROUTES after it."""
        before = self.replicas.epochs
        self.replicas.applied(payload)
        self.promoted = promoted_owners(before, self.replicas.epochs, self.context.node_id)

    def routes_learning(self, payload) -> dict:
        """ROUTES, before the router learns them: {old owner: keys} this node takes over."""
        if not self.promoted:
            return {}
        taken = taken_over(payload, self.context.router.routes, self.promoted, self.context.node_id)
        self.promoted = {}
        return taken

    def take_over(self, taken: dict, effects: list) -> None:
        for owner, keys in sorted(taken.items()):
            self.taking_over.update(keys)
            for key in keys:
                self.holds.hold(key)
            if owner in self.running:
                self.waiting.setdefault(owner, []).extend(keys)
                continue
            # the epoch of the messages taken: the one the promotion ended (the replica journal's, at most)
            self._begin(Takeover(owner, self.replicas.epoch_of(owner) - 1, keys), effects)

    def _begin(self, takeover: Takeover, effects: list) -> None:
        self.running[takeover.owner] = takeover
        if takeover.redrop:  # the local copy is whole and served: only the replica's leftovers go
            effects.append(takeover.begin())
            return
        self.taking_over.update(takeover.keys)
        for key in takeover.keys:
            if key not in self.holds.held:
                self.holds.hold(key)
        effects.append(takeover.begin())

    # ---- the replica writer's answers -----------------------------------------------------------

    def replica_read(self, owner: str, found: dict, now_ms: int) -> list:
        """The live messages of `owner`'s replica journal: {queue: [Message, ...] in seq order}."""
        effects: list = []
        takeover = self.running.get(owner)
        if takeover is None or takeover.state != READING:
            return effects
        broker, context = self.context.broker, self.context

        def route_key_of(queue_name, group_id):
            queue = broker.queues.get(queue_name)
            return queue.route_key(group_id) if queue is not None else group_id
        routes, me = context.router.routes, context.node_id
        step = takeover.read(found, route_key_of, broker.next_seq,
                             lambda key: routes.get(key) == me and key not in self.handovers.moves)
        if step is None:  # a scan that found nothing of this node's
            self.running.pop(owner, None)
            return effects
        if takeover.scan_queues is not None:  # its keys are known now: held before anything is enqueued
            self.taking_over.update(takeover.keys)
            for key in takeover.keys:
                self.holds.hold(key)
        if isinstance(step, DropReplica):
            effects.append(step)  # recovery: the local copy is whole, the replica's leftovers go
            return effects
        effects.append(Declared(step.begun))
        for (queue_name, route_key), messages in step.enqueues:
            for old in messages:
                message = Message(old.payload, old.group_id, expires_at_ms=old.expires_at_ms,
                                  closes_group=old.closes_group, delivery_count=raised_count(old.delivery_count),
                                  enqueued_at_ms=old.enqueued_at_ms)
                try:
                    enqueued = broker.enqueue(queue_name, message, now_ms)
                except GrouperError as error:
                    context.stop(f"taking over group {route_key!r} of queue {queue_name!r} from {owner}: the queue "
                                 f"refused a message ({error.description}); its replica copy stays and a "
                                 f"restart takes it over again", effects)
                    return effects
                context.broker_effects(enqueued, effects)
            context.counts["messages_taken_over"] += len(messages)
        effects.append(Declared(step.stored))
        effects.append(AfterFlush(TakeoverStored(self, owner)))
        return effects

    def stored(self, owner: str, reason: str | None, now_ms: int, effects: list) -> None:
        if reason is not None:
            self.context.stop(f"taking over the groups of {owner} was not journalled ({reason}); their replica "
                              f"copy stays and a restart takes them over again", effects)
            return
        takeover = self.running[owner]
        effects.append(takeover.stored())
        log.warning("took over %d groups (%d messages) of %s, promoted away at epoch %d", len(takeover.keys),
                    takeover.taken, owner, takeover.epoch)
        self._release(takeover.keys, now_ms, effects)

    def _release(self, keys, now_ms: int, effects: list) -> None:
        handovers = self.handovers
        self.taking_over.difference_update(keys)
        for key in keys:
            if key in handovers.parked and key not in handovers.moves:
                handovers.parking.unpark(key, now_ms, effects)  # behind what was taken over
            if key in self.holds.held and not handovers.holding(key):
                self.holds.unhold(key, now_ms, effects)

    def replica_dropped(self, owner: str, error, effects: list) -> None:
        takeover = self.running.pop(owner, None)
        if takeover is None:
            return
        if error is not None:  # the local copy is whole (STORED): a restart drops the leftovers again
            log.error("dropping the taken-over messages of %s from its replica journal failed (%s); a restart "
                      "drops them again", owner, error)
        takeover.dropped()
        keys = self.waiting.pop(owner, None)
        if keys:
            self._begin(Takeover(owner, self.replicas.epoch_of(owner) - 1, keys), effects)

    # ---- fencing ------------------------------------------------------------------------------------

    def fence(self, now_ms: int, effects: list) -> None:
        """At ready and at each tick: empty the groups this node lost to a promotion (see the header)."""
        context, me = self.context, self.context.node_id
        epoch = self.replicas.epoch_of(me)
        if epoch <= self.serving_epoch or not context.router.ready:
            return
        routes, broker = context.router.routes, context.broker
        for name, queue in broker.queues.items():
            if queue.settings.grouping:
                for route_key in queue.busy_route_keys():
                    owner = routes.get((name, route_key))
                    if owner is not None and owner != me:
                        self.fenced.add((name, route_key))
        left = FENCE_MESSAGES_PER_TICK
        for key in sorted(self.fenced):
            queue = broker.queues.get(key[0])
            if queue is None:
                self.fenced.discard(key)
                continue
            if key not in self.holds.held:
                self.holds.hold(key)  # delivered no more, from now on
            self.holds.restored.discard(key)  # never handed to its owner: it has them already
            removed: list = []
            taken, whole = queue.hand_over_group(queue.group_key_of_route(key[1]), removed, max(left, 0),
                                                 FENCE_BYTES_MAX)
            left -= len(taken)
            self.dropped_count += len(taken)
            context.broker_effects(removed, effects)
            if whole:
                self.fenced.discard(key)
                self.holds.unhold(key, now_ms, effects)
        if not self.fenced:
            log.warning("node %s was promoted away (its epoch is %d, it served with %d): dropped %d messages of "
                        "groups now routed to other nodes, which hold them", me, epoch, self.serving_epoch,
                        self.dropped_count)
            self.serving_epoch = epoch
            self.dropped_count = 0
            self.handovers.promoted_away = True
            if context.journalled:
                effects.append(Declared({"name": FENCE_MARK, "epoch": epoch}))
