"""The owner side: batches other nodes forwarded here, their de-duplication marks, and disputes of them.

Rules:
- An owner records, per source node, the highest forward seq it has enqueued (a MARK_PREFIX declaration
  journalled after the messages), so a resend after a lost acknowledgement is skipped. Seqs reach an
  owner with gaps (local messages and other owners take node seqs too; a restart skips to the next
  reservation), so no gap is a fault.
- A source says, with each batch, its seq bound (its next node seq). A mark at or above it holds seqs
  the source never gave: a forged batch took them, or the source reused seqs (it lost its journal, or
  runs without one). The owner cannot tell that from a late copy of an old batch, so it answers as to a
  resend; the source, hearing a high water at or above its bound, disputes it in its next batch, and a
  dispute of the mark as it stands sets it back to just below the batch (logged, forward_marks_set_back).
- A batch is enqueued at once (its consumers may have it before it is on disk) and acknowledged once it
  is stored (ForwardTaken). If that write fails the owner stops (StopNode): the batch is in its broker,
  perhaps delivered, but not on disk; restarted from its journal, it has neither the batch nor its mark,
  and takes the resend once. So a reply's high water is always on disk.
- A forwarded message sent non-durable (Entry.not_durable) is enqueued as one: its queue journals it not
  (node/core/dispatch/message.py TRANSIENT); the batch is still answered once its mark is on disk.
- Groups following their consumers: forwarded batches are refused (retriable) until the replica is
  current, and a group whose route is not known yet is refused too (a handover and what must wait
  behind it look alike until it is); where a message goes is handover.py's `placement`.
- Imports context and handover of this package.
"""

from __future__ import annotations

import logging

from node.core.cluster.context import MARK_PREFIX, Context
from node.core.cluster.handover import PARK, RELAY, Handovers
from node.core.effects import AfterFlush, Declared, Reply
from node.core.errors import GrouperError, HandlerUnavailable, ResourceLimitExceeded
from node.core.dispatch.dedup import Duplicate
from node.core.dispatch.message import Message
from node.core.cluster.outbound import Entry
from node.core.cluster.routing import Inbound

log = logging.getLogger("grouper.cluster")


class ForwardTaken:
    """A forwarded batch taken here, on its way to disk: its source hears the high water once it is."""

    __slots__ = ("context", "source", "high_water", "reply_to", "enqueued")

    def __init__(self, context: Context, source: str, high_water: int, reply_to, enqueued: bool):
        self.context = context
        self.source = source
        self.high_water = high_water
        self.reply_to = reply_to
        self.enqueued = enqueued

    def flushed(self, reason: str | None, now_ms: int, effects: list) -> None:
        if reason is None:
            effects.append(Reply(self.reply_to, self.high_water, None))
            return
        effects.append(Reply(self.reply_to, None, ResourceLimitExceeded(
            f"the owner could not store the batch ({reason}); retry later")))
        # enqueued here but not on disk: only a restart from the journal makes the two agree (a
        # resend alone, all skipped, changed nothing)
        if self.enqueued:
            self.context.stop(f"a batch forwarded by {self.source} was enqueued here but its journal "
                              f"write failed ({reason})", effects)


class OwnerSide:
    def __init__(self, context: Context, handovers: Handovers, follows_consumers: bool):
        self.context = context
        self.handovers = handovers
        self.follows_consumers = follows_consumers
        self.inbound = Inbound()

    def forward_received(self, source: str, entries: list[Entry], reply_to, now_ms: int, seq_bound: int = 0,
                         disputed_high_water: int = 0) -> list:
        """Enqueue a batch `source` forwarded; the Reply comes once it is stored here (or at once if refused).
        `seq_bound`: the source's next node seq as it sent the batch (0: not said); `disputed_high_water`:
        a high water this owner answered it that it says it never reached (see the header)."""
        effects: list = []
        try:
            if 0 < seq_bound <= disputed_high_water == self.inbound.high_water.get(source, 0):
                self._mark_set_back(source, entries[0].forward_seq - 1, seq_bound)
            high_water, enqueued = self._enqueue(source, entries, now_ms, effects)
        except GrouperError as error:
            return [Reply(reply_to, None, error)]
        effects.append(AfterFlush(ForwardTaken(self.context, source, high_water, reply_to, enqueued)))
        return effects

    def _mark_set_back(self, source: str, high_water: int, seq_bound: int) -> None:
        mark = self.inbound.high_water[source]
        self.inbound.set_back(source, high_water)
        self.context.counts["forward_marks_set_back"] += 1
        log.error("node %s says it never gave a forward seq at or above %d, but this node's mark for it is %d: a "
                  "batch taken here as node %s's was not its (forged, from before forwarding took credentials?) or "
                  "it reused seqs (restarted without its journal). The mark is set back to %d, below its batch, so its "
                  "messages are taken; a message it sent before that was taken already may arrive twice",
                  source, seq_bound, mark, source, high_water)

    def _enqueue(self, source: str, entries: list[Entry], now_ms: int, effects: list) -> tuple[int, bool]:
        """Returns the source's high water here and whether this batch enqueued anything."""
        context, inbound = self.context, self.inbound
        advanced = False
        if self.follows_consumers and not context.router.ready:
            # which of a moving group's messages go first depends on what the log says: not yet known
            raise HandlerUnavailable(f"node {context.node_id} is catching up with the raft log and takes no "
                                     f"forwarded messages until then; retry shortly")
        for entry in entries:
            if not inbound.fresh(source, entry.forward_seq):
                context.counts["resends_skipped"] += 1
                continue  # a resend of what is already here
            message = Message(entry.payload, entry.group_id, expires_at_ms=entry.expires_at_ms,
                              closes_group=entry.closes_group, enqueued_at_ms=entry.enqueued_at_ms,
                              transient=entry.not_durable)
            try:
                if (self.follows_consumers or self.handovers.taking_over or self.handovers.promoted_away) and \
                        entry.group_id is not None and self._parked_or_relayed(
                        source, entry, message, now_ms, effects):
                    inbound.advance(source, entry.forward_seq)
                    advanced = True
                    continue
                enqueued = context.broker.enqueue(entry.queue, message, now_ms)
            except Duplicate as duplicate:  # a producer's resend the queue took already (issue 31): nothing queued
                enqueued = duplicate.effects
            except GrouperError as error:
                if not advanced:
                    raise
                log.info("forwarded batch from %s stopped at seq %d: %s", source, entry.forward_seq,
                         error.description)
                break
            inbound.advance(source, entry.forward_seq)
            advanced = True
            context.broker_effects(enqueued, effects, (source, entry.forward_seq))
        high_water = inbound.high_water.get(source, 0)
        if advanced and context.journalled:
            effects.append(Declared({"name": MARK_PREFIX + source, "high_water": high_water}))
        return high_water, advanced

    def _parked_or_relayed(self, source: str, entry: Entry, message: Message, now_ms: int, effects: list) -> bool:
        """A forwarded message parked behind a move or relayed to a group's new owner (True), or to be
        enqueued here, its group held first if it must be (False)."""
        context, handovers = self.context, self.handovers
        queue = context.broker.queues.get(entry.queue)
        route_key = queue.route_key(entry.group_id) if queue is not None else entry.group_id
        key = (entry.queue, route_key)
        if key not in context.moves and key not in handovers.parked and context.router.routes.get(key) is None:
            # a handover and what must wait behind it look alike until the replica knows the group
            raise HandlerUnavailable(f"node {context.node_id} does not know the route of group {key[1]!r} of "
                                     f"queue {key[0]!r} yet (its replica lags the raft log); retry shortly")
        place = handovers.placement(key, source)
        durable = context.durable(entry.queue) and not entry.not_durable
        if place == PARK:
            handovers.parking.park(key, message, durable, now_ms, effects, origin=(source, entry.forward_seq))
            return True
        if place == RELAY:
            handovers.relay(key, message, durable, now_ms, effects, origin=(source, entry.forward_seq))
            return True
        handovers.queue_arrival(key)
        return False
