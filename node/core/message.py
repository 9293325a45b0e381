"""A message as the dispatch core sees it.

The core never decodes AMQP: `payload` is the encoded message exactly as the producer sent it, and
the adapter extracts the few fields dispatch needs (group id, close flag, expiry) once, on arrival.
`seq` is node-wide and increases with every enqueue, so sorting by `seq` is queue order.
"""

from __future__ import annotations

import enum

AVAILABLE = 0
ACQUIRED = 1
REMOVED = 2


class Message:
    __slots__ = (
        "seq", "group_id", "payload", "size_bytes", "expires_at_ms", "closes_group",
        "delivery_count", "enqueued_at_ms", "state", "group_key", "handed_out", "available_at_ms",
    )

    def __init__(self, payload: bytes, group_id: str | None = None, *, expires_at_ms: int = 0,
                 closes_group: bool = False, delivery_count: int = 0, enqueued_at_ms: int = 0,
                 seq: int = 0):
        self.seq = seq
        self.group_id = group_id
        self.payload = payload
        self.size_bytes = len(payload)
        self.expires_at_ms = expires_at_ms  # 0: never expires
        self.closes_group = closes_group
        self.delivery_count = delivery_count
        self.enqueued_at_ms = enqueued_at_ms
        self.state = AVAILABLE
        self.group_key = None  # set by the queue: group id, default group, bucket, or None
        # delivered to a consumer or shown to a browser, or copied to another queue (move, dead-letter):
        # from then on a failed journal write can no longer take it back (Broker.take_back)
        self.handed_out = False
        # a failed delivery's redelivery delay: not dispatched (nor is its group) before this; 0 = now
        self.available_at_ms = 0

    def __repr__(self) -> str:
        return f"Message(seq={self.seq}, group={self.group_id!r}, state={self.state})"


class Outcome(enum.Enum):
    ACCEPTED = "accepted"
    RELEASED = "released"
    REJECTED = "rejected"
    MODIFIED = "modified"  # with delivery_failed it counts as a failed delivery
