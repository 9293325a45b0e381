"""What the engine loop knows of each attached link: plain records keyed by proton's link pointer.

Rules: the node core sees only the ids (ints) here, never a pointer. A record whose `alive` is false
belongs to a link that has ended: nothing may call proton with its pointers again (proton may have
freed them, and may reuse their addresses).
"""

from __future__ import annotations

TEMPORARY, DURABLE = "temporary", "durable"  # Consumer.subscription


class Consumer:
    """An outgoing link from a queue: the node sends, the client settles."""

    __slots__ = ("id", "link", "connection", "queue", "browse", "presettled", "first_key", "label", "unsettled",
                 "alive", "subscription")
    producer = False

    def __init__(self, consumer_id: int, link, connection, queue: str, browse: bool, presettled: bool,
                 first_key: str, label: str):
        self.id = consumer_id
        self.link = link
        self.connection = connection
        self.queue = queue
        self.browse = browse
        self.presettled = presettled
        self.first_key = first_key
        self.label = label  # "container/link name", for metrics and logs
        self.unsettled: dict = {}  # proton delivery pointer -> the core's delivery id
        self.alive = True
        # a subscription its topic attach made: TEMPORARY (deleted when the link ends), DURABLE (deleted
        # when the client closes the link, kept when it only detaches), or "" (a queue it did not make)
        self.subscription = ""


class Producer:
    """An incoming link: the client sends, the node settles. `address` None: anonymous relay ('to' decides)."""

    __slots__ = ("id", "link", "connection", "address", "alive", "partial", "size_bytes")
    producer = True

    def __init__(self, producer_id: int, link, connection, address: str | None):
        self.id = producer_id
        self.link = link
        self.connection = connection
        self.address = address
        self.alive = True
        self.partial = bytearray()  # the frames of a multi-frame message read so far (up to the size limit)
        self.size_bytes = 0  # of that message so far, counting what was dropped past the limit


class FanOut:
    """One producer delivery copied to a multicast address's subscription queues: the `incoming` of each
    copy is (FanOut, delivery), and the delivery is settled when `tally` says the last copy is."""

    __slots__ = ("producer", "tally")

    def __init__(self, producer: Producer, tally):
        self.producer = producer
        self.tally = tally  # node.core.dispatch.addresses.SendTally

    @property
    def alive(self) -> bool:
        return self.producer.alive

    @property
    def connection(self):
        return self.producer.connection
