"""A message as the dispatch core sees it.

The core never decodes AMQP: `payload` is the encoded message exactly as the producer sent it, and
the adapter extracts the few fields dispatch needs (group id, close flag, expiry) once, on arrival.
`seq` is node-wide and increases with every enqueue, so sorting by `seq` is queue order.

A queue may hold millions of these, so a Message is kept small (bench/memory.py measures it):
- `state`, `closes_group` and `handed_out` share one int, `flags`; each is still read and set by
  its name. Two slots fewer save 16 bytes per message. The queue's hot paths use `flags` directly:
  through the properties, five calls per message cost ~0.5 µs of a ~6 µs dispatch.
- `group` is the queue's Group object (not its key): settling needs no dict lookup, and the queue
  gives `group_id` its group's own copy of the id string, so a million messages in one group keep one
  string, not a million (the decoder makes one per arrival).
- `fields` is what a consumer's JMS selector reads of the message (node/core/dispatch/selector_dispatch.py):
  None until a selector first asks, then kept, so one message tried against many selectors is decoded
  once. A queue without selectors never sets it.
- Paging (node/core/dispatch/paging.py) keeps a message's record (seq, group, size_bytes) in memory while its
  `payload` lives only in the journal: `payload` is then None and PAGED is set. Nothing here may
  depend on the payload beyond `size_bytes`.
- TRANSIENT: the producer sent it non-durable (AMQP header durable false or absent). On a durable queue it
  is never journalled (no STORE, no REMOVE), never paged, and lost on a crash, as AMQP and JMS allow;
  on a non-durable queue the flag changes nothing. Past the node's record budget a durable queue's cold
  tail lives only in the journal, so an arrival that goes cold is journalled whatever its flag
  (node/core/dispatch/queue_store.py `admit` clears it).
"""

from __future__ import annotations

import enum

AVAILABLE = 0
ACQUIRED = 1
REMOVED = 2
STATE_MASK = 3
CLOSES_GROUP = 4
HANDED_OUT = 8
# paging (node/core/dispatch/paging.py): the body is only in the journal; asked back; read back (or returned by its
# consumer) and waiting for dispatch; its STORE is on disk, so it may be paged out
PAGED = 16
REQUESTED = 32
FETCHED = 64
JOURNALLED = 128
COLD = 256  # in its queue's cold tail, waiting for its STORE to be on disk (node/core/dispatch/cold.py)
TRANSIENT = 512  # sent non-durable: journalled by no queue (see the header)


class Message:
    __slots__ = ("seq", "group_id", "payload", "size_bytes", "expires_at_ms", "delivery_count",
                 "enqueued_at_ms", "group", "available_at_ms", "flags", "fields")

    def __init__(self, payload: bytes, group_id: str | None = None, *, expires_at_ms: int = 0,
                 closes_group: bool = False, delivery_count: int = 0, enqueued_at_ms: int = 0,
                 seq: int = 0, transient: bool = False):
        self.seq = seq
        self.group_id = group_id
        self.payload = payload
        self.size_bytes = len(payload)
        self.expires_at_ms = expires_at_ms  # 0: never expires
        self.delivery_count = delivery_count
        self.enqueued_at_ms = enqueued_at_ms
        self.group = None  # set by the queue: its Group, or None when ungrouped
        # a failed delivery's redelivery delay: not dispatched (nor is its group) before this; 0 = now
        self.available_at_ms = 0
        # state AVAILABLE, not handed out
        self.flags = (CLOSES_GROUP if closes_group else 0) | (TRANSIENT if transient else 0)
        self.fields = None  # a selector's view of it, read on first need (selector_dispatch.py)

    @property
    def state(self) -> int:
        return self.flags & STATE_MASK

    @state.setter
    def state(self, state: int) -> None:
        self.flags = (self.flags & ~STATE_MASK) | state

    @property
    def closes_group(self) -> bool:
        return bool(self.flags & CLOSES_GROUP)

    @property
    def handed_out(self) -> bool:
        """Delivered to a consumer or shown to a browser, or copied to another queue (move, dead-letter):
        from then on a failed journal write can no longer take it back (Broker.take_back)."""
        return bool(self.flags & HANDED_OUT)

    @handed_out.setter
    def handed_out(self, value: bool) -> None:
        self.flags = self.flags | HANDED_OUT if value else self.flags & ~HANDED_OUT

    def __repr__(self) -> str:
        return f"Message(seq={self.seq}, group={self.group_id!r}, state={self.state})"


class Outcome(enum.Enum):
    ACCEPTED = "accepted"
    RELEASED = "released"
    REJECTED = "rejected"
    MODIFIED = "modified"  # with delivery_failed it counts as a failed delivery
