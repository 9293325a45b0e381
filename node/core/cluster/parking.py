"""Parking: messages of a moving group that wait outside the queue, in arrival order, behind the move's
handover (at the new owner), or behind a cold tail (at the old owner).

Rules:
- A parked message is journalled under PARK_PREFIX queue (when durable), outside the queue, and its
  producer hears "accepted" once it is stored. Until its write is known good (Parked) it is neither
  unparked nor relayed: its producer may still be refused, and a refused one is never delivered.
- Unparking puts the group's parked messages in its queue in arrival order, each a REMOVE of its park
  after the STORE of its queue (a torn tail duplicates one, never loses one); a failed write stops the
  node (MustAgree).
- A relay (the old owner's parks, once nothing else of the group is left there) goes to the new owner in
  arrival order within the tick's handover room, each outbound STORE before its park's REMOVE.
- Imports context and forwarding of this package; handover.py decides when to park, unpark or relay.
"""

from __future__ import annotations

import logging

from node.core.dispatch.dedup import Duplicate
from node.core.cluster.context import PARK_PREFIX, Context, MustAgree, moved_copy
from node.core.cluster.forwarding import Forwarding
from node.core.effects import AfterFlush, Removed, Stored
from node.core.errors import GrouperError
from node.core.dispatch.message import Message

log = logging.getLogger("grouper.cluster")


class Parked:
    """A message parked behind a move, on its way to disk."""

    __slots__ = ("parking", "key", "message")

    def __init__(self, parking: Parking, key: tuple[str, str], message: Message):
        self.parking = parking
        self.key = key
        self.message = message

    def flushed(self, reason: str | None, now_ms: int, effects: list) -> None:
        parking, key, message = self.parking, self.key, self.message
        parked = parking.parked.get(key, [])
        parking.unsure.discard(message.seq)  # known on disk (or refused): it may be unparked
        # its producer is refused (or its source stopped us): never deliver it
        if reason is not None and message in parked:
            parked.remove(message)
            if not parked:
                del parking.parked[key]


class Parking:
    def __init__(self, context: Context, forwarding: Forwarding):
        self.context = context
        self.forwarding = forwarding
        self.parked: dict[tuple[str, str], list] = {}  # key -> [Message] in arrival order
        self.unsure: set[int] = set()  # park seqs whose journal write is not known good yet

    def park(self, key: tuple[str, str], message: Message, durable: bool, now_ms: int, effects: list,
             origin: tuple | None = None) -> None:
        context = self.context
        message.seq = context.broker.allocate_seq()
        message.enqueued_at_ms = message.enqueued_at_ms or now_ms
        self.unsure.add(message.seq)
        if durable and context.journalled:
            effects.append(Stored(PARK_PREFIX + key[0], message, origin))
        self.parked.setdefault(key, []).append(message)
        effects.append(AfterFlush(Parked(self, key, message)))
        context.counts["messages_parked"] += 1

    def unpark(self, key: tuple[str, str], now_ms: int, effects: list) -> None:
        """The move ended: what waited behind its handover goes in the queue, in arrival order."""
        context = self.context
        parked = self.parked[key]
        journalled = context.durable(key[0]) and context.journalled
        unparked = False
        while parked:
            old = parked[0]
            if old.seq in self.unsure:
                break  # its journal write is not known good yet: its producer may still be refused
            message = moved_copy(old)
            try:
                enqueued = context.broker.enqueue(key[0], message, now_ms)
            except Duplicate as duplicate:  # a resend the queue took already (issue 31): done with, nothing queued
                enqueued = duplicate.effects
            except GrouperError as error:
                log.warning("parked messages of group %r of queue %r wait: %s", key[1], key[0], error.description)
                break  # held until a later tick takes them
            context.broker_effects(enqueued, effects)
            if journalled:
                effects.append(Removed(PARK_PREFIX + key[0], old.seq))  # after the STORE: a torn tail duplicates
            parked.pop(0)
            unparked = True
        if unparked:
            effects.append(AfterFlush(MustAgree(
                context, f"unparking messages of group {key[1]!r} of queue {key[0]!r}")))
        if not parked:
            del self.parked[key]

    def relay(self, key: tuple[str, str], to_node: str, left: list, owed: dict, now_ms: int, effects: list) -> None:
        """What the old owner parked, its group with nothing else left here: on to the new owner, in arrival
        order, as much as this tick's handover room `left` ([messages, bytes]) takes; `owed`: handover.py's."""
        context = self.context
        parked = self.parked[key]
        durable = context.durable(key[0])
        relayed = False
        # the head's journal write not known good yet: its producer may still be refused
        while parked and parked[0].seq not in self.unsure and left[0] > 0 and left[1] > 0:
            old = parked.pop(0)
            left[0] -= 1
            left[1] -= old.size_bytes
            message = moved_copy(old)
            self.forwarding.forward(to_node, key[0], key[1], message, durable, now_ms, effects)
            if durable and context.journalled:
                effects.append(Removed(PARK_PREFIX + key[0], old.seq))  # after the STORE: a torn tail duplicates
            owed[key] = message.seq
            context.counts["messages_relayed"] += 1
            relayed = True
        if relayed:
            effects.append(AfterFlush(MustAgree(
                context, f"relaying parked messages of group {key[1]!r} of queue {key[0]!r} to {to_node}")))
        if not parked:
            del self.parked[key]

    def recover(self, queue_name: str, messages: list) -> None:
        """Parked messages the journal held (PARK_PREFIX queue_name), back in arrival order."""
        broker = self.context.broker
        known = broker.queues.get(queue_name)
        for message in sorted(messages, key=lambda message: message.seq):
            broker.next_seq = max(broker.next_seq, message.seq + 1)
            route_key = known.route_key(message.group_id) if known is not None else message.group_id
            self.parked.setdefault((queue_name, route_key), []).append(message)
