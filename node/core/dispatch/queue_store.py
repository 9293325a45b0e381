"""A queue's messages as a store: admission, depth, the browse log, expiry and removal. Pure.

Rules this module keeps:
- Nothing grows silently: depth in messages and bytes is bounded by the settings (check_capacity).
- Past the node's record budget a durable queue's newest messages form a cold tail (node/core/dispatch/cold.py):
  counted in its depth but in no group, heap or log until read back whole, oldest first, into the warm
  part (`warm`); dispatch only ever sees the warm part, a prefix of the queue in seq order.
- `log` holds every warm message in seq order, for browsing and listing; a removed message stays in it
  as a tombstone until they are many (LOG_COMPACT_MIN) or hold many bytes (LOG_COMPACT_MIN_BYTES).
- Removal is lazy: a removed message is flagged REMOVED and dropped from its lane, heap or log when met.
  `remove` is the one place a warm message leaves; its REMOVE is due only if its STORE was (durable, journalled,
  not TRANSIENT).
- A non-durable (TRANSIENT) message of a durable queue lives in memory only, as a non-durable queue's do: no
  STORE, never paged (the depth limits bound it), lost on a crash. One that would go cold is journalled
  instead (its flag cleared): a cold tail is only in the journal, and order within a group needs it there.
"""

from __future__ import annotations

import heapq

from node.core.dispatch.cold import ColdTail
from node.core.effects import Dropped, Removed
from node.core.errors import ResourceLimitExceeded
from node.core.dispatch.message import AVAILABLE, REMOVED, STATE_MASK, TRANSIENT, Message
from node.core.dispatch.paging import Pager
from node.core.dispatch.queue_groups import GroupTable
from node.core.dispatch.settings import QueueSettings

LOG_COMPACT_MIN = 1024  # tombstones tolerated in the browse log before compaction is considered
# payload bytes of tombstones tolerated in the browse log (beyond the queue's resident bytes, not its depth:
# paged and cold bodies are not in memory, and a drained paged backlog's tombstones kept up to half its
# depth alive, bodies read back included): without it 1,024 removed 1 MiB messages kept 1 GiB alive
# after their queue was empty (found by bench/soak.py)
LOG_COMPACT_MIN_BYTES = 16 << 20


class MessageStore:
    __slots__ = ("settings", "groups", "pager", "cold", "log", "log_removed", "log_removed_bytes", "expiry",
                 "delayed", "depth_messages", "depth_bytes", "acquired_messages", "enqueued_total",
                 "delivered_total")

    def __init__(self, settings: QueueSettings, groups: GroupTable, pager: Pager | None, cold: ColdTail | None):
        self.settings = settings
        self.groups = groups
        self.pager = pager  # which bodies are in memory (node/core/dispatch/paging.py); None: a non-durable queue
        self.cold = cold  # past the node's record budget, the newest messages are only seqs here
        self.log: list[Message] = []  # every live warm message in seq order, for browsing and listing
        self.log_removed = 0
        self.log_removed_bytes = 0
        self.expiry: list = []  # heap of (expires_at_ms, seq, Message)
        # heap of (available_at_ms, seq, Message): failed deliveries waiting out their delay; never rebound
        # (the dispatcher holds it too)
        self.delayed: list = []
        self.depth_messages = 0
        self.depth_bytes = 0
        self.acquired_messages = 0
        self.enqueued_total = 0
        self.delivered_total = 0

    def check_capacity(self, size_bytes: int, count: int = 1) -> None:
        s = self.settings
        if s.depth_max_messages and self.depth_messages + count > s.depth_max_messages:
            raise ResourceLimitExceeded(f"queue {s.name!r} is full: {self.depth_messages} + {count} messages "
                                        f"exceeds depth_max_messages={s.depth_max_messages}; retry later")
        if s.depth_max_bytes and self.depth_bytes + size_bytes > s.depth_max_bytes:
            raise ResourceLimitExceeded(f"queue {s.name!r} is full: {self.depth_bytes} + {size_bytes} "
                                        f"bytes exceeds depth_max_bytes={s.depth_max_bytes}; retry later")

    def admit(self, message: Message, key) -> None:
        message.flags &= ~STATE_MASK  # AVAILABLE
        self.depth_messages += 1
        self.depth_bytes += message.size_bytes
        cold = self.cold
        if cold is not None and cold.admits():
            message.flags &= ~TRANSIENT  # the cold tail lives in the journal: this one is journalled too
            cold.add(message)  # behind the cold tail: read back whole when dispatch nears it
            return
        self.warm(message, key)

    def warm(self, message: Message, key) -> None:
        """Put a counted message in the warm part: the browse log, its group, the heaps."""
        self.log.append(message)
        if self.pager is not None:
            self.pager.admitted(message)
            if self.cold is not None:
                self.cold.budget.messages += 1
        if message.expires_at_ms:
            heapq.heappush(self.expiry, (message.expires_at_ms, message.seq, message))
        self.groups.make_available(message, key)

    def remove(self, message: Message, effects: list, journalled: bool = True) -> None:
        """Forget a message that is available or acquired; the caller fixes group counters.

        `journalled` False: its STORE never reached the disk (a withdrawn send), so no REMOVE is due."""
        if self.pager is not None:
            self.pager.removed(message)
            if self.cold is not None:
                self.cold.budget.messages -= 1
        message.flags = message.flags & ~STATE_MASK | REMOVED
        self.depth_messages -= 1
        self.depth_bytes -= message.size_bytes
        self.log_removed += 1
        self.log_removed_bytes += message.size_bytes
        if journalled and self.settings.durable and not message.flags & TRANSIENT:
            effects.append(Removed(self.settings.name, message.seq))
        if ((self.log_removed > LOG_COMPACT_MIN and self.log_removed * 2 > len(self.log))
                or (self.log_removed_bytes > LOG_COMPACT_MIN_BYTES
                    and self.log_removed_bytes > self.resident_bytes())):
            self.log = [m for m in self.log if m.state != REMOVED]
            self.log_removed = self.log_removed_bytes = 0

    def take_available(self, message: Message, effects: list, journalled: bool = True) -> None:
        """Remove an available message from wherever it waits (lazily, via its state)."""
        self.remove(message, effects, journalled)
        group = message.group
        if group is not None:
            group.available_count -= 1
            self.groups.place_or_forget(group)

    def expire(self, message: Message, effects: list) -> None:
        self.take_available(message, effects)
        effects.append(Dropped(self.settings.name, message.seq, "ttl expired"))

    def expire_due(self, now_ms: int, effects: list) -> None:
        expiry = self.expiry
        while expiry and expiry[0][0] <= now_ms:
            _, _, message = heapq.heappop(expiry)
            if message.state == AVAILABLE:
                self.expire(message, effects)
            # an acquired message that expired is dropped when it comes back (Settlement.settle_one)

    def deadline_ms(self) -> int | None:
        """The next expiry or end of a redelivery delay; None: neither."""
        deadlines = []
        if self.expiry:
            deadlines.append(self.expiry[0][0])
        if self.delayed:
            deadlines.append(self.delayed[0][0])
        return min(deadlines) if deadlines else None

    def browse_available(self) -> list[Message]:
        return [m for m in self.log if m.state != REMOVED]

    def resident_bytes(self) -> int:
        """Payload bytes of the queue's messages in memory: not paged out, not cold."""
        return (self.depth_bytes - (self.pager.paged_bytes if self.pager is not None else 0)
                - (self.cold.journal_bytes if self.cold is not None else 0))

    def clear(self) -> None:
        """The queue is deleted: every message is gone, and leaves the node's record budget."""
        for message in self.log:
            message.state = REMOVED
        self.log.clear()
        self.expiry.clear()
        self.delayed.clear()
        if self.pager is not None:
            self.pager.clear()
        if self.cold is not None:
            self.cold.budget.messages -= self.depth_messages - self.cold.count
            self.cold.clear()
        self.depth_messages = self.depth_bytes = self.acquired_messages = 0
