"""What every concern of the cluster protocol shares: the node, its broker and router, the moves the
replica applied, the journal's reserved names, and the continuation of a write that memory and journal
must agree on.

Rules:
- The bottom of the package: imports no other module of it.
- `moves` and `closed` are written only by their owners (handover.py: moves; any concern that stops
  the node: closed, through `stop`); everyone else reads them.
- A journal name starting with NUL is the cluster's own, never a queue's (a queue name cannot hold one).
"""

from __future__ import annotations

import collections
import dataclasses

from node.core.dispatch.broker import Broker
from node.core.effects import StopNode, Stored
from node.core.errors import GrouperError
from node.core.dispatch.message import Message
from node.core.cluster.routing import Router

PARK_PREFIX = "\x00park\x00"  # journal name of the messages a new owner parks during a move: prefix, queue
MARK_PREFIX = "\x00mark\x00"  # journal declaration holding a source's high-water forward seq
QUEUES_MARK = "\x00queues"  # journal declaration: "revision" of the last queue definition change applied here
SEQ_RESERVATION = "\x00seq"  # journal declaration: node seqs below "reserved" may have been used
STORED = "stored"  # outcome of a journal batch written to disk
CLAIM_KEYS_MAX = 1000  # keys per raft command; a larger batch is split


@dataclasses.dataclass(slots=True, eq=False)
class Context:
    node_id: str
    broker: Broker
    router: Router
    counts: collections.Counter  # what happened, for metrics and the simulation
    journalled: bool  # False: no journal, durable queues are kept in memory only
    # key (queue, route key) -> (from_node, to_node, waiting frozenset), as the replica applied them
    moves: dict = dataclasses.field(default_factory=dict)
    closed: bool = False  # stopping (StopNode) or closed: no more effects

    def stop(self, why: str, effects: list) -> None:
        """Memory and journal differ: only a restart from the journal makes them agree."""
        if not self.closed:
            self.closed = True
            effects.append(StopNode(why))

    def broker_effects(self, broker_effects: list, effects: list, origin: tuple | None = None) -> None:
        """The broker's effects among the protocol's, after the declarations it made meanwhile. `origin`
        (source, forward seq) of a forwarded message goes into its STORE, for the simulation."""
        effects += self.broker.declarations()
        if origin is not None:
            broker_effects = [Stored(e.queue, e.message, origin) if type(e) is Stored else e for e in broker_effects]
        effects += broker_effects

    def durable(self, queue_name: str) -> bool:
        queue = self.broker.queues.get(queue_name)
        if queue is not None:
            return queue.settings.durable
        try:  # the settings this queue gets when it is auto-created here
            return self.broker.address_settings.settings_for(queue_name).durable
        except GrouperError:  # a name no queue can have: refused where it is created, journalled till then
            return True

    def warm_here(self, key: tuple[str, str]) -> bool:
        """Group `key` has messages queued (warm) or in flight in its queue here."""
        queue = self.broker.queues.get(key[0])
        if queue is None:
            return False
        group_key = queue.group_key_of_route(key[1])
        return bool(queue.group_available(group_key) or queue.group_in_flight(group_key))


class Delegated:
    """An attribute of the facade (protocol.py) that is one concern's own: read and written there."""

    __slots__ = ("concern", "name")

    def __init__(self, concern: str, name: str):
        self.concern, self.name = concern, name

    def __get__(self, protocol, owner=None):
        return self if protocol is None else getattr(getattr(protocol, self.concern), self.name)

    def __set__(self, protocol, value) -> None:
        setattr(getattr(protocol, self.concern), self.name, value)


class MustAgree:
    """After a handover, an unpark, a relay or a reroute: a failed write stops the node, since the
    queue forgot what the journal still holds (or holds what it never wrote); a restart from the
    journal makes the two agree, and the move goes on from there."""

    __slots__ = ("context", "what")

    def __init__(self, context: Context, what: str):
        self.context = context
        self.what = what  # for the StopNode's text

    def flushed(self, reason: str | None, now_ms: int, effects: list) -> None:
        if reason is not None:
            self.context.stop(f"{self.what} was not journalled ({reason})", effects)


def chunks(items: list) -> list[list]:
    """Raft commands of at most CLAIM_KEYS_MAX keys each."""
    return [items[start:start + CLAIM_KEYS_MAX] for start in range(0, len(items), CLAIM_KEYS_MAX)]


def moved_copy(old: Message) -> Message:
    """A message leaving where it was (a queue, a park, a cold tail) for a queue or an outbound channel:
    a new Message (no seq, delivery count or state of its own yet) with what travels with it."""
    return Message(old.payload, old.group_id, expires_at_ms=old.expires_at_ms, closes_group=old.closes_group,
                   enqueued_at_ms=old.enqueued_at_ms)
