"""One group's lane of messages and its consumer: what group dispatch places, moves and forgets. Pure.

Rules this module keeps:
- A lane is in `seq` order. A message returned by a release or a detach goes back to its original
  place (insert_in_order), so no later message of its group overtakes it.
- A queue may track a million groups (bench/memory.py measures it), so a Group is kept small: a lane of
  one message needs no container, and an emptied deque is dropped, not kept.
- `Group.placed` is written by the group table (node/core/dispatch/queue_groups.py) and by changes of its consumer
  (node/core/dispatch/queue_consumers.py); its values are the heap entry, EMPTY_ASSIGNED, PAUSED or None below.
"""

from __future__ import annotations

from collections import deque

from node.core.dispatch.message import AVAILABLE, STATE_MASK, Message

EMPTY_ASSIGNED = "empty-assigned"  # Group.placed of an empty group kept by its consumer (GroupTable.empty_assigned)
PAUSED = "paused"  # Group.placed of a closing, reset or rebalanced group: no dispatch until nothing is acquired


class Group:
    """One group's messages and consumer. A queue may track a million of these, so it is kept small:
    `lane` is None when the group has no available message, the Message itself when it has one, and a
    deque only from the second on (an empty deque costs ~630 bytes; a group of one message, the
    million-groups case, needs no container). An emptied deque is dropped, not kept.

    Each slot costs 8 bytes a group, so `placed` says in one slot where the group is and whether it
    is held: the (head seq, group) tuple it was last pushed into a heap with (the only entry of it
    that is live, found by identity), EMPTY_ASSIGNED, PAUSED (no dispatch until `acquired` reaches 0;
    never in a heap meanwhile), or None (in no heap, not held)."""

    __slots__ = ("key", "lane", "available_count", "acquired", "consumer", "placed")

    def __init__(self, key):
        self.key = key
        self.lane: Message | deque[Message] | None = None  # seq order; may hold REMOVED tombstones
        self.available_count = 0
        self.acquired = 0  # delivered and not yet settled, by any consumer
        self.consumer = None  # its Consumer (node/core/dispatch/queue_consumers.py), or None
        self.placed: tuple | str | None = None

    def __lt__(self, other: Group) -> bool:
        # Heap entries are (head seq, group): a seq is one message's, so two entries only tie when
        # they are the same group's (and tuples compare equal items by identity first). Keys order
        # any other tie deterministically rather than raising.
        return self.key < other.key

    def head(self) -> Message | None:
        lane = self.lane
        if lane is None:
            return None
        if type(lane) is not deque:
            if lane.flags & STATE_MASK == AVAILABLE:
                return lane
            self.lane = None
            return None
        while lane and lane[0].flags & STATE_MASK != AVAILABLE:
            lane.popleft()
        if lane:
            return lane[0]
        self.lane = None
        return None

    def push(self, message: Message, returning: bool) -> None:
        """Append a new message; put a returning one back at its seq position (near the head)."""
        lane = self.lane
        if lane is None:
            self.lane = message
        elif type(lane) is not deque:
            if lane.flags & STATE_MASK != AVAILABLE:
                self.lane = message
            elif lane.seq < message.seq:
                self.lane = deque((lane, message))
            else:
                self.lane = deque((message, lane))
        else:
            insert_in_order(lane, message, returning)

    def pop_head(self) -> Message:
        """Take the head head() found."""
        lane = self.lane
        if type(lane) is not deque:
            self.lane = None
            return lane
        message = lane.popleft()
        if not lane:
            self.lane = None
        return message

    def messages(self):
        """The lane in seq order, tombstones included."""
        lane = self.lane
        if lane is None:
            return ()
        return lane if type(lane) is deque else (lane,)

    @property
    def idle(self) -> bool:
        return self.available_count == 0 and self.acquired == 0 and self.consumer is None

    @property
    def paused(self) -> bool:
        return self.placed is PAUSED


def insert_in_order(lane: deque, message: Message, returning: bool) -> None:
    """Append new messages; put returning ones back at their seq position (near the head)."""
    if not returning or not lane or lane[-1].seq < message.seq:
        lane.append(message)
        return
    seq = message.seq
    for index, other in enumerate(lane):
        if other.seq > seq:
            lane.insert(index, message)
            return
    lane.append(message)
