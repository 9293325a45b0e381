"""One queue and its group-aware dispatch: the interface the broker, the cluster protocol and the engine
loop use. Pure: no I/O, no clock, no threads; time is `now_ms`.

A Queue is the wiring of collaborators that each own one concern and state what they keep:
- node/core/dispatch/queue_lanes.py      a group's lane of messages and its consumer (Group)
- node/core/dispatch/queue_consumers.py  consumers, credit, the groups assigned to each, the dispatch gate
- node/core/dispatch/queue_groups.py     the group table: keys, heaps, holds, forgetting, groups_max
- node/core/dispatch/queue_store.py      admission, depth, the browse log, expiry, removal
- node/core/dispatch/queue_dispatch.py   which message goes to which consumer next
- node/core/dispatch/queue_settle.py     outcomes, redelivery, poison messages and dead letters
- node/core/dispatch/queue_backlog.py    paged bodies and the cold tail
- node/core/dispatch/queue_group_ops.py  resets, purges, moves and hand-overs of groups
- node/core/dispatch/queue_stats.py      the figures operators and metrics read

Rules this module keeps:
- Every operation that changes what may be delivered ends with one dispatch, so a consumer with credit
  never waits for a later call while a message it may take is queued.
- Operations that belong to one collaborator alone are that collaborator's bound methods, set once in
  `__init__`: no forwarding frame on the per-message path, and this class holds only what crosses them.
- `settings` may be replaced on a live queue (Broker.redefine_queue, with fields read at each use only):
  the setter hands the new settings to every collaborator.
- A durable send whose journal write failed is taken back (`withdraw`) only while no consumer or
  browser has seen it; once handed out (`Message.handed_out`) it stays the consumer's.
"""

from __future__ import annotations

from node.core.dispatch.cold import ColdTail, RecordBudget
from node.core.effects import DetachConsumer, Stored, Withdrawn
from node.core.errors import GrouperError, ResourceDeleted, ResourceLimitExceeded
from node.core.dispatch.message import AVAILABLE, COLD, TRANSIENT, Message, Outcome
from node.core.dispatch.paging import Pager
from node.core.dispatch.queue_backlog import Backlog
from node.core.dispatch.queue_consumers import Consumers
from node.core.dispatch.queue_dispatch import Dispatcher
from node.core.dispatch.queue_group_ops import GroupOps
from node.core.dispatch.queue_groups import GroupTable
from node.core.dispatch.queue_lanes import Group
from node.core.dispatch.queue_settle import Settlement
from node.core.dispatch.queue_stats import queue_stats
from node.core.dispatch.queue_store import MessageStore
from node.core.dispatch.settings import QueueSettings


class Queue:
    # Slots, not a __dict__: past ~30 attributes CPython 3.11 stops sharing an instance dict's keys, and
    # attribute reads of the dispatch paths get slower
    __slots__ = (
        "_settings", "_groups", "_consumers", "_store", "_dispatcher", "_settlement", "_parts", "_leases",
        "held_keys", "consumers", "pager", "cold",  # the collaborators' own objects, never rebound
        # operations served by one collaborator (its bound methods)
        "check_group_id", "route_key", "busy_route_keys", "group_key_from_text", "group_key_of_route",
        "group_in_flight", "group_available", "group_rows", "hold_group",
        "check_capacity", "browse_available", "resident_bytes",
        "page_out", "page_in", "restore_cold", "cold_journalled", "promote", "cold_taken", "cold_refusal",
        "read_cold_for_purge",
        "reset_groups", "release_group", "take_group_messages", "take_ungrouped_messages",
        "group_head_messages", "hand_over_group", "lapsed_leases", "rebalance", "next_free_group")

    def __init__(self, settings: QueueSettings, *, fallback_default_group: str = "",
                 records: RecordBudget | None = None):
        default = settings.effective_default_group
        if not settings.default_group and settings.group_policy == "shared" and fallback_default_group:
            default = fallback_default_group
        # which bodies are in memory (node/core/dispatch/paging.py); a non-durable queue's exist nowhere else
        self.pager = pager = Pager(settings.name) if settings.durable else None
        # past the node's record budget, the newest messages are only seqs here (node/core/dispatch/cold.py)
        self.cold = cold = ColdTail(records) if records is not None and settings.durable else None
        self._groups = groups = GroupTable(settings, default, cold)
        self._consumers = consumers = Consumers(settings)
        self._store = store = MessageStore(settings, groups, pager, cold)
        self._dispatcher = dispatcher = Dispatcher(settings, consumers, groups, store)
        self._settlement = settlement = Settlement(settings, groups, store)
        backlog = Backlog(settings, groups, store, dispatcher)
        ops = GroupOps(settings, groups, store, dispatcher)
        self._leases, self.lapsed_leases = dispatcher.leases, dispatcher.leases.lapsed  # Broker.tick detaches those
        self._parts = (groups, consumers, store, dispatcher, settlement, backlog, ops, self._leases)
        self._settings = settings
        self.held_keys = groups.held_keys
        self.consumers = consumers.by_id
        # operations one collaborator serves alone: its own bound methods
        self.check_group_id = groups.check_group_id
        self.route_key = groups.route_key
        self.busy_route_keys = groups.busy_route_keys
        self.group_key_from_text = groups.group_key_from_text
        self.group_key_of_route = groups.group_key_of_route
        self.group_in_flight = groups.group_in_flight
        self.group_available = groups.group_available
        self.group_rows = groups.group_rows
        self.hold_group = groups.hold
        self.check_capacity = store.check_capacity
        self.browse_available = store.browse_available
        self.resident_bytes = store.resident_bytes
        self.page_out = backlog.page_out
        self.page_in = backlog.page_in
        self.restore_cold = backlog.restore_cold
        self.cold_journalled = backlog.cold_journalled
        self.promote = backlog.promote
        self.cold_taken = backlog.cold_taken
        self.cold_refusal = backlog.cold_refusal
        self.read_cold_for_purge = backlog.read_cold_for_purge
        self.reset_groups = ops.reset_groups
        self.release_group = ops.release_group
        self.take_group_messages = ops.take_group_messages
        self.take_ungrouped_messages = ops.take_ungrouped_messages
        self.group_head_messages = ops.group_head_messages
        self.hand_over_group = ops.hand_over_group
        self.rebalance, self.next_free_group = ops.rebalance, ops.next_free_group  # issue 30

    @property
    def settings(self) -> QueueSettings:
        return self._settings

    @settings.setter
    def settings(self, settings: QueueSettings) -> None:
        self._settings = settings
        for part in self._parts:
            part.settings = settings

    @property
    def dead_letter_refusal(self):
        """The broker's answer to "can this message be dead-lettered now?": None yes, else why not."""
        return self._settlement.dead_letter_refusal

    @dead_letter_refusal.setter
    def dead_letter_refusal(self, refusal) -> None:
        self._settlement.dead_letter_refusal = refusal

    @property
    def groups(self) -> dict[object, Group]:
        return self._groups.groups

    @property
    def depth_messages(self) -> int:
        return self._store.depth_messages

    @property
    def depth_bytes(self) -> int:
        return self._store.depth_bytes

    @property
    def acquired_messages(self) -> int:
        return self._store.acquired_messages

    @property
    def delivered_total(self) -> int:
        return self._store.delivered_total

    @property
    def enqueued_total(self) -> int:
        return self._store.enqueued_total

    @enqueued_total.setter
    def enqueued_total(self, count: int) -> None:
        self._store.enqueued_total = count  # moves count their arrivals (node/core/dispatch/reroute.py)

    # ---- producers ---------------------------------------------------------------------------

    def enqueue(self, message: Message, now_ms: int, effects: list) -> None:
        """Add a message whose `seq` the broker assigned; raises before changing anything."""
        key = self.check_enqueue(message.group_id, message.size_bytes)
        groups = self._groups
        if groups.new_group_at_limit(key):
            groups.free_empty_assigned()  # check_enqueue found one
        store = self._store
        store.admit(message, key)
        store.enqueued_total += 1
        if self._settings.durable and not message.flags & TRANSIENT:  # admit may have cleared it (a cold arrival)
            effects.append(Stored(self._settings.name, message))
        self._dispatcher.dispatch(now_ms, effects)

    def check_enqueue(self, group_id, size_bytes: int):
        """Raises what `enqueue` would refuse a message with; returns its group key (None: ungrouped)."""
        groups = self._groups
        groups.check_group_id(group_id)
        self._store.check_capacity(size_bytes)
        key = groups.key_of(group_id)
        if groups.new_group_at_limit(key) and not groups.has_empty_assigned():
            raise ResourceLimitExceeded(
                f"queue {self._settings.name!r} tracks {len(groups.groups)} groups "
                f"(groups_max={self._settings.groups_max}); retry once groups drain, free idle ones with "
                f"'grouper group reset', or bound them with group_buckets")
        return key

    def restore(self, message: Message) -> None:
        """Add a message without limits or dispatch: journal recovery and internal moves."""
        self._store.admit(message, self._groups.key_of(message.group_id))

    def withdraw(self, message: Message, now_ms: int, effects: list) -> None:
        """Take back an available message no consumer or browser has seen: its journal write failed and
        its producer is refused, so it must never be delivered. Its group is forgotten if that leaves
        it idle, as after any other removal; a consumer it had before this message keeps it."""
        assert message.state == AVAILABLE and not message.handed_out, message
        store = self._store
        if message.flags & COLD:  # still pending in the cold tail
            self.cold.withdraw(message)
            store.depth_messages -= 1
            store.depth_bytes -= message.size_bytes
        else:
            store.take_available(message, effects, journalled=False)
        effects.append(Withdrawn(self._settings.name, message.seq))
        self._dispatcher.dispatch(now_ms, effects)

    # ---- consumers ---------------------------------------------------------------------------

    def attach(self, consumer_id, browse: bool, now_ms: int, effects: list, unsettled_max: int = 0,
               selector=None) -> None:
        """`selector`: a MessageSelector (node/core/dispatch/selector_dispatch.py), or None for every message."""
        self._consumers.add(consumer_id, browse, now_ms, unsettled_max, selector)
        if not browse:
            self._dispatcher.dispatch(now_ms, effects)

    def detach(self, consumer_id, now_ms: int, effects: list) -> list[Message]:
        """Release the consumer's unsettled messages in order (each a failed delivery); returns
        (message, reason) pairs to dead-letter."""
        consumer = self._consumers.remove(consumer_id)
        if consumer is None or consumer.browse:
            return []
        dead: list[tuple[Message, str]] = []
        assigned = consumer.assigned_groups()
        touched: set[Group] = set(assigned)
        settle_one = self._settlement.settle_one
        for message in consumer.unsettled.values():
            group = settle_one(message, Outcome.MODIFIED, True, now_ms, effects, dead)
            if group is not None:
                touched.add(group)
        consumer.unsettled.clear()
        consumer.unassign_all(assigned)
        for group in touched:
            self._settlement.after_settle(group)
        self._consumers.close_gate_if_none_left()
        self._dispatcher.dispatch(now_ms, effects)
        return dead

    def set_credit(self, consumer_id, credit: int, now_ms: int, effects: list) -> None:
        consumer = self._consumers.get(consumer_id)
        consumer.credit = credit
        self._leases.renew(consumer, now_ms)  # a flow on the link
        if consumer.rebalance_due and credit > 0:
            consumer.rebalance_due = False
            self.rebalance(consumer)  # reset, or incremental (issue 30)
        if not consumer.browse:
            self._consumers.sync_taker(consumer)
        self._dispatcher.dispatch(now_ms, effects)

    def delivered_seq(self, consumer_id, delivery_id: int) -> int | None:
        message = self._consumers.by_id[consumer_id].unsettled.get(delivery_id)  # Broker.delivered_seq
        return None if message is None else message.seq

    def settle(self, consumer_id, delivery_id: int, outcome: Outcome, delivery_failed: bool,
               now_ms: int, effects: list) -> list[Message]:
        """Apply a consumer's disposition; returns (message, reason) pairs to dead-letter."""
        consumer = self._consumers.get(consumer_id)
        if self._leases.lease_ms:  # group leases (node/core/dispatch/queue_leases.py)
            self._leases.renew(consumer, now_ms)
        message = consumer.unsettled.pop(delivery_id, None)
        if message is None:
            return []  # a duplicate or late disposition: already settled, nothing to do
        dead: list[tuple[Message, str]] = []
        settlement = self._settlement
        group = settlement.settle_one(message, outcome, delivery_failed, now_ms, effects, dead)
        if group is not None:
            settlement.after_settle(group)
        if consumer.unsettled_max:
            self._consumers.sync_taker(consumer)  # a consumer at its unsettled cap may take again
        self._dispatcher.dispatch(now_ms, effects)
        return dead

    # ---- time --------------------------------------------------------------------------------

    def tick(self, now_ms: int, effects: list) -> None:
        self._store.expire_due(now_ms, effects)
        self._dispatcher.dispatch(now_ms, effects)

    def hold_dispatch(self, held: bool) -> None:
        """Issue 28: deliver nothing to takers while `held` (the owner's lease lapsed); tick() after releasing."""
        self._consumers.lease_lapsed = held

    def next_deadline_ms(self) -> int | None:
        deadlines = [d for d in (self._store.deadline_ms(), self._consumers.deadline_ms(), self._leases.deadline_ms()) if d]
        return min(deadlines) if deadlines else None

    # ---- the whole queue ---------------------------------------------------------------------

    def close(self, effects: list) -> None:
        """The queue is being deleted: detach every consumer with a condition, drop everything."""
        error: GrouperError = ResourceDeleted(f"queue {self._settings.name!r} was deleted")
        for consumer_id in list(self.consumers):
            effects.append(DetachConsumer(consumer_id, error))
        self._consumers.clear()
        self._store.clear()
        self._groups.clear()

    def stats(self) -> dict:
        return queue_stats(self._settings.name, self._store, self._consumers, self._groups, self.pager, self.cold)
