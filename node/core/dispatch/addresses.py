"""Multicast addresses: which subscription queues a message sent to an address is copied to.

Pure (no I/O, clock or threads). An address is multicast when the config declares it (`[[address]]`)
or a queue's settings name it (`address = "prices"`); every other name is an anycast queue, as before.
Rules:
- A subscription queue is an ordinary queue with its own group settings; `address` in its settings
  binds it. A message sent to the address gets one copy per bound queue, in queue-name order, so
  every node fans out alike.
- `ADDRESS::QUEUE` (Artemis's fully qualified queue name) names one subscription queue; both parts
  must be non-empty and the queue, once it exists, must be bound to that address.
- A subscription made by a `topic` attach is named from the client: `CONTAINER.LINK` when durable
  (expiry policy never: the same container id and link name attach to it again, as Artemis and Qpid
  JMS name durable subscriptions), `CONTAINER.LINK.ID` otherwise (ID: the node's link id, so two
  links of one name never share a non-durable subscription).
- One send fanned out is settled once, when every copy has its outcome (`SendTally`): accepted when
  all were, else rejected with the first refusal.
"""

from __future__ import annotations

from node.core.errors import InvalidField

FQQN_SEPARATOR = "::"  # ADDRESS::QUEUE, as Artemis spells a fully qualified queue name
QUEUE_NAME_MAX_CHARS = 255  # as QueueSettings.validate: a subscription name longer than this is refused
TOPIC_CAPABILITY = "topic"  # a source capability asking for a subscription of its own (Artemis, Qpid JMS)
# a source or target capability asking for an existing queue: the attach never auto-creates one, and an
# unknown name is refused naming the queues it is close to (`grouper send/receive/browse` without --create)
EXISTING_QUEUE_CAPABILITY = "grouper:existing-queue"
CLOSE_NAMES_MAX = 3  # queue names an unknown one is said to be close to


def no_such_queue(name: str, known) -> str:
    """Why an attach that may not create `name` is refused: it, and the `known` queue names close to it."""
    from difflib import get_close_matches  # only on this refusal

    close = get_close_matches(name, sorted(known), n=CLOSE_NAMES_MAX)
    guess = f" (did you mean {' or '.join(repr(other) for other in close)}?)" if close else ""
    return f"no queue {name!r}{guess}"


def split_fqqn(address: str) -> tuple[str, str] | None:
    """(address, queue) of 'ADDRESS::QUEUE'; None for a plain name."""
    if FQQN_SEPARATOR not in address:
        return None
    name, queue = address.split(FQQN_SEPARATOR, 1)
    if not name or not queue:
        raise InvalidField(f"{address!r}: a fully qualified queue name is ADDRESS::QUEUE with both parts "
                           f"non-empty, e.g. prices::prices.audit")
    return name, queue


def subscription_name(container_id: str, link_name: str, durable: bool, link_id: int) -> str:
    """The queue a `topic` attach subscribes through (see the header)."""
    if not link_name:
        raise InvalidField("a topic subscription needs a link name: the subscription queue is named from it")
    name = f"{container_id}.{link_name}" if durable else f"{container_id}.{link_name}.{link_id}"
    if len(name) > QUEUE_NAME_MAX_CHARS:
        raise InvalidField(f"the subscription queue name {name[:40]!r}... (container id '.' link name) is "
                           f"{len(name)} characters; at most {QUEUE_NAME_MAX_CHARS}: use a shorter link name")
    if any(ord(char) < 32 for char in name):
        raise InvalidField("the container id and link name of a topic subscription must not contain control "
                           "characters: they name its queue")
    return name


class Addresses:
    """The multicast addresses of one node and the subscription queues bound to each."""

    def __init__(self, declared: tuple = ()):
        self._bound: dict[str, list[str]] = {name: [] for name in declared}

    def is_multicast(self, name: str) -> bool:
        return name in self._bound

    def declare(self, name: str) -> None:
        self._bound.setdefault(name, [])

    def bind(self, address: str, queue: str) -> None:
        queues = self._bound.setdefault(address, [])
        if queue not in queues:
            queues.append(queue)
            queues.sort()

    def unbind(self, address: str, queue: str) -> None:
        """The queue is gone; its address stays multicast (Artemis keeps an address its queues leave)."""
        queues = self._bound.get(address)
        if queues is not None and queue in queues:
            queues.remove(queue)

    def subscriptions(self, address: str) -> tuple[str, ...]:
        """The queues a message sent to `address` is copied to, in name order; () when none."""
        return tuple(self._bound.get(address, ()))

    def names(self) -> list[str]:
        return sorted(self._bound)


class SendTally:
    """One producer delivery fanned out to `copies` queues: settled once, after its last copy."""

    __slots__ = ("waiting", "refusal")

    def __init__(self, copies: int):
        assert copies > 0, "a send with no copy is settled at once, not tallied"
        self.waiting = copies
        self.refusal = None  # the first copy's refusal (an AMQP condition), kept for the settlement

    def settle(self, refusal=None) -> bool:
        """A copy's outcome (None: stored). True when it was the last one: settle the send now."""
        assert self.waiting > 0, "more outcomes than copies"
        self.waiting -= 1
        if refusal is not None and self.refusal is None:
            self.refusal = refusal
        return self.waiting == 0
