"""A queue's consumers and browsers: their credit, the groups assigned to each, and when dispatch opens. Pure.

Rules this module keeps:
- A group has at most one consumer (the group's consumer, `Group.consumer`; "owner" is the node a
  group's route names). `exclusive`: it keeps the group for its lifetime (or until the group is closed
  or reset). `shared`: it keeps it only while it holds unsettled messages of it.
- A consumer lists its groups in a plain list (`Consumer.assigned`, 8 bytes
  a group where a set's slot was ~33), whose stale entries are dropped once they outnumber the live ones
  (plus ASSIGNED_STALE_MIN), so detach stays proportional to what the consumer has.
- `Consumers.takers` holds exactly the acquiring consumers that may take a message now: credit left and
  below their unsettled cap. Dispatch looks at no other consumer.
- Dispatch opens once consumers_before_dispatch consumers granted credit (not merely attached: a link
  attaches before it flows) or time_before_dispatch_ms after the first attach, whichever comes first;
  it closes again when the last acquiring consumer leaves.
- A consumer may carry a JMS selector (`Consumer.selector`, a MessageSelector): while any acquiring consumer
  does, `Consumers.selection` is set and dispatch takes the selecting path (node/core/dispatch/selector_dispatch.py);
  without one it is None and dispatch costs what it did before selectors.
"""

from __future__ import annotations

from node.core.errors import NotFound
from node.core.dispatch.message import Message
from node.core.dispatch.queue_lanes import PAUSED, Group
from node.core.dispatch.selector_dispatch import MessageSelector, Selection
from node.core.dispatch.settings import QueueSettings

ASSIGNED_STALE_MIN = 16  # stale entries a consumer's assigned list may keep beyond its live ones


class Consumer:
    __slots__ = ("id", "browse", "credit", "unsettled", "ready", "assigned", "assigned_count", "cursor_seq",
                 "next_delivery_id", "last_used", "rebalance_due", "unsettled_max", "selector",
                 "moved_in")

    def __init__(self, consumer_id, browse: bool, unsettled_max: int = 0, selector: MessageSelector | None = None):
        self.id = consumer_id
        self.browse = browse
        self.selector = selector  # None: takes every message
        self.unsettled_max = unsettled_max  # deliveries held unsettled at once, whatever the credit; 0 = no cap
        self.credit = 0
        self.unsettled: dict[int, Message] = {}  # delivery id -> message, in delivery order
        self.ready: list = []  # heap of (head seq, Group) for groups assigned to this consumer
        # every group assigned to this consumer, and stale entries (groups it lost since, perhaps twice): a
        # list slot is 8 bytes a group where a set's was ~33. Live: `assigned_groups()`, counted `assigned_count`.
        self.assigned: list[Group] = []
        self.assigned_count = 0
        self.cursor_seq = -1  # browsers: last seq shown
        self.next_delivery_id = 0
        self.last_used = 0  # spreads ties round-robin
        self.rebalance_due = False  # group_rebalance: reset groups' consumers when this consumer first has credit
        # issue 30: groups an incremental rebalance moved here whose first message here is yet to go out
        # (flagged first-for-consumer then, node/core/dispatch/queue_rebalance.py); empty mostly
        self.moved_in: set[Group] = set()

    @property
    def may_take(self) -> bool:
        return self.credit > 0 and not (self.unsettled_max and len(self.unsettled) >= self.unsettled_max)

    def assign(self, group: Group) -> None:
        group.consumer = self
        assigned = self.assigned
        assigned.append(group)
        count = self.assigned_count = self.assigned_count + 1
        if len(assigned) > 2 * count + ASSIGNED_STALE_MIN:
            self._drop_stale_assigned()

    def unassign(self, group: Group) -> None:
        """The group is no longer this consumer's. Its heap entry, if any, was in this consumer's
        heap: it is stale from now on, and a hold stays."""
        group.consumer = None
        if group.placed is not PAUSED:
            group.placed = None
        if self.moved_in:
            self.moved_in.discard(group)
        count = self.assigned_count = self.assigned_count - 1
        if not count:
            self.assigned.clear()  # all stale: the shared policy's usual case, dropped without a look
        elif len(self.assigned) > 2 * count + ASSIGNED_STALE_MIN:
            self._drop_stale_assigned()

    def unassign_all(self, groups: list[Group]) -> None:
        """At detach: `groups` is assigned_groups()."""
        for group in groups:
            group.consumer = None
            if group.placed is not PAUSED:
                group.placed = None
        self.assigned = []
        self.assigned_count = 0
        self.moved_in.clear()

    def _drop_stale_assigned(self) -> None:
        # once the stale entries outnumber the live ones: amortized O(1) per assign/unassign
        self.assigned = self.assigned_groups()
        assert len(self.assigned) == self.assigned_count, (self.id, len(self.assigned), self.assigned_count)

    def iter_assigned_groups(self):
        """assigned_groups() lazily, for a look at a few of them."""
        seen: set[Group] = set()
        for group in self.assigned:
            if group.consumer is self and group not in seen:
                seen.add(group)
                yield group

    def assigned_groups(self) -> list[Group]:
        """The groups assigned to this consumer, each once, in the order it took them."""
        return list(dict.fromkeys(group for group in self.assigned if group.consumer is self))


class Consumers:
    """The queue's consumers by id, which of them may take now, and the dispatch gate."""

    __slots__ = ("settings", "by_id", "takers", "browsers", "first_attach_ms", "dispatch_started", "selection",
                 "lease_lapsed")

    def __init__(self, settings: QueueSettings):
        self.settings = settings
        self.by_id: dict[object, Consumer] = {}  # browsers included; the queue's `consumers`
        # both never rebound: the dispatcher holds them too
        self.takers: list[Consumer] = []  # acquiring consumers with credit > 0 (sync_taker)
        self.browsers: list[Consumer] = []
        self.first_attach_ms: int | None = None
        self.dispatch_started = False
        self.selection: Selection | None = None  # set while an acquiring consumer has a selector
        # issue 28: the owner's lease lapsed (node/core/cluster/owner_lease.py): no taker gets anything meanwhile
        self.lease_lapsed = False

    def add(self, consumer_id, browse: bool, now_ms: int, unsettled_max: int,
            selector: MessageSelector | None = None) -> Consumer:
        consumer = Consumer(consumer_id, browse, unsettled_max, selector)
        self.by_id[consumer_id] = consumer
        if browse:
            self.browsers.append(consumer)
            return consumer
        if selector is not None:
            if self.selection is None:
                self.selection = Selection()
            self.selection.selecting += 1
        if self.selection is not None:
            self.selection.unstrand_due = True  # the new consumer may select what no other does
            if selector is not None and selector.group_id is not None:
                self.selection.choosing_changed = True
        if self.first_attach_ms is None:
            self.first_attach_ms = now_ms
        # An AMQP consumer attaches before it grants credit: resetting groups' consumers now would hand the
        # freed groups straight back to the consumers that have credit. Reset at its first credit.
        consumer.rebalance_due = self.settings.group_rebalance
        return consumer

    def remove(self, consumer_id) -> Consumer | None:
        """Forget a consumer (None: it was not here); the caller settles what it held."""
        consumer = self.by_id.pop(consumer_id, None)
        if consumer is None:
            return None
        if consumer.browse:
            self.browsers.remove(consumer)
            return consumer
        if consumer in self.takers:
            self.takers.remove(consumer)
        if consumer.selector is not None:
            self.selection.selecting -= 1  # the selection ends at the next dispatch once none is left
            if consumer.selector.group_id is not None:  # its group is free for the others again
                self.selection.choosing_changed = self.selection.unstrand_due = True
        return consumer

    def close_gate_if_none_left(self) -> None:
        """Once no acquiring consumer is left, the dispatch rules start over at the next attach."""
        if not self.by_id or not any(not c.browse for c in self.by_id.values()):
            self.first_attach_ms = None
            self.dispatch_started = False

    def get(self, consumer_id) -> Consumer:
        consumer = self.by_id.get(consumer_id)
        if consumer is None:
            raise NotFound(f"no consumer {consumer_id!r} on queue {self.settings.name!r}")
        return consumer

    def sync_taker(self, consumer: Consumer) -> None:
        """`takers` holds exactly the acquiring consumers that may take a message now."""
        listed = consumer in self.takers
        if consumer.may_take and not listed:
            self.takers.append(consumer)
        elif listed and not consumer.may_take:
            self.takers.remove(consumer)

    def dispatch_open(self, now_ms: int) -> bool:
        if self.lease_lapsed:
            return False
        if self.dispatch_started:
            return True
        s = self.settings
        count_rule = s.consumers_before_dispatch > 0
        time_rule = s.time_before_dispatch_ms > 0
        # Count consumers that granted credit, not attached ones: a link attaches before it flows,
        # and counting it at attach would open dispatch while only the others can take groups.
        # Before dispatch starts no credit is spent, so the takers are exactly those consumers.
        ready = len(self.takers)
        if not count_rule and not time_rule:
            self.dispatch_started = True
        elif count_rule and ready >= s.consumers_before_dispatch:
            self.dispatch_started = True
        elif time_rule and self.first_attach_ms is not None and \
                now_ms >= self.first_attach_ms + s.time_before_dispatch_ms:
            self.dispatch_started = True
        return self.dispatch_started

    def deadline_ms(self) -> int | None:
        """When time_before_dispatch_ms opens dispatch; None: no such wait."""
        if not self.dispatch_started and self.first_attach_ms is not None and \
                self.settings.time_before_dispatch_ms > 0:
            return self.first_attach_ms + self.settings.time_before_dispatch_ms
        return None

    def clear(self) -> None:
        self.by_id.clear()
        self.takers.clear()
        self.browsers.clear()
        self.selection = None


def least_recently_used(consumer: Consumer) -> int:
    return consumer.last_used


def fewest_groups(consumer: Consumer) -> tuple[int, int]:
    return (consumer.assigned_count, consumer.last_used)
