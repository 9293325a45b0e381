"""What the core asks its adapters to do. Plain records; the adapters carry them out in order."""

from __future__ import annotations

from dataclasses import dataclass

from node.core.errors import GrouperError
from node.core.message import Message


class Deliver:
    """Send `message` on consumer `consumer_id`'s link. Browsers get copies, never unsettled."""

    __slots__ = ("consumer_id", "delivery_id", "message", "first_for_consumer", "browse")

    def __init__(self, consumer_id, delivery_id: int, message: Message, first_for_consumer: bool,
                 browse: bool):
        self.consumer_id = consumer_id
        self.delivery_id = delivery_id
        self.message = message
        self.first_for_consumer = first_for_consumer
        self.browse = browse


@dataclass(frozen=True, slots=True)
class DetachConsumer:
    """Close the consumer's link with `error` as the condition; its state is already gone."""

    consumer_id: object
    error: GrouperError


@dataclass(frozen=True, slots=True)
class Stored:
    """A message of a durable queue was added: journal it before confirming the producer."""

    queue: str
    message: Message


@dataclass(frozen=True, slots=True)
class Removed:
    """A message of a durable queue is gone for good (accepted, rejected, expired, purged, moved)."""

    queue: str
    seq: int


@dataclass(frozen=True, slots=True)
class Dropped:
    """A message was discarded without a consumer accepting it; reason is for logs and metrics."""

    queue: str
    seq: int
    reason: str
