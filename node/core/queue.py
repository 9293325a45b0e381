"""One queue and its group-aware dispatch. Pure: no I/O, no clock, no threads; time is `now_ms`.

Rules this module keeps:
- Queue order is `seq` order. Within a group, messages are delivered in `seq` order; a message
  returned by a release or a detach goes back to its original place in its group.
- A group has at most one owner. `exclusive`: the owner keeps the group for its lifetime (or until
  the group is closed or reset). `shared`: the owner keeps it only while it holds unsettled messages.
- The next message to dispatch is found through heaps of *groups keyed by their head seq*: one heap
  per consumer for the groups it owns and one for unowned groups. A group whose owner has no credit
  waits in that owner's heap and is never scanned, so a blocked group costs nothing to skip.
- Heap entries are validated lazily: a group keeps the one entry (head seq, group) it was last
  pushed with (`Group.placed`); any other entry for it is stale and dropped when met. That entry is
  in its owner's heap, or the unowned heap when it has none, so a change of owner unplaces it.
- Nothing grows silently: depth in messages and bytes is bounded by the settings.
- A failed delivery (modified with delivery-failed, or unsettled at its consumer's detach) counts
  in `delivery_count`. It comes back after `redelivery_delay_for_ms`; while it waits at its group's
  head the group is not placed in any heap, so no later message of the group overtakes it; other
  groups flow. At `delivery_count_max` it is dead-lettered if `dead_letter_refusal` (the broker)
  says a dead-letter queue can take it, else it stays (a `Kept` effect says so once) and is retried.
- A durable send whose journal write failed is taken back (`withdraw`) only while no consumer or
  browser has seen it; once handed out (`Message.handed_out`) it stays the consumer's.
- Group state is compact, since a queue may track a million groups (bench/memory.py measures it):
  an idle group (nothing queued or in flight, no owner) is forgotten at once, on every path, and
  costs nothing; a group of one message holds it without a container (`Group.lane`); messages share
  their group's id string; the groups dict is copied small once most of its groups are gone; a
  consumer lists its groups in a plain list (`Consumer.owned`), whose stale entries are dropped
  once they outnumber the live ones (plus OWNED_STALE_MIN), so detach stays proportional to what
  the consumer owns, and forgotten groups that stale entries keep alive stay as few.
- Past the node's record budget a durable queue's newest messages form a cold tail (node/core/cold.py):
  counted in its depth but in no group, heap or log until read back whole, oldest first, into the warm
  part; dispatch only ever sees the warm part, a prefix of the queue in seq order.
- groups_max counts every tracked group, an empty one kept by its exclusive owner included, but
  such a group frees itself: when a new group would pass groups_max, the group empty longest with
  an owner is forgotten to make room (its owner loses it; nothing of it is queued or in flight, so
  no order can break, and its next message may go to any consumer). A new group is refused only
  when every tracked group has messages queued or in flight.
"""

from __future__ import annotations

import heapq
import itertools
import zlib
from bisect import bisect_right
from collections import deque

from node.core.cold import ColdTail, RecordBudget, read_missing
from node.core.effects import Deliver, Delayed, DetachConsumer, Dropped, Kept, ReadRecords, Removed, Stored, Withdrawn
from node.core.errors import GrouperError, InvalidField, NotFound, ResourceDeleted, ResourceLimitExceeded
from node.core.message import (ACQUIRED, AVAILABLE, CLOSES_GROUP, COLD, HANDED_OUT, JOURNALLED, PAGED, REMOVED,
                               REQUESTED, STATE_MASK, Message, Outcome)
from node.core.paging import READ_AHEAD_MESSAGES, Pager
from node.core.settings import QueueSettings

EMPTY_OWNED = "empty-owned"  # Group.placed of an empty group kept by its owner (Queue._empty_owned)
HELD = "held"  # Group.placed of a closing, reset or rebalanced group: no dispatch until nothing is acquired
OWNED_STALE_MIN = 16  # stale entries a consumer's owned list may keep beyond its live ones
GROUPS_SHRINK_MIN = 4096  # groups below which the groups dict is never copied smaller
LOG_COMPACT_MIN = 1024  # tombstones tolerated in the browse log before compaction is considered
# payload bytes of tombstones tolerated in the browse log (beyond the queue's resident bytes, not its depth:
# paged and cold bodies are not in memory, and a drained paged backlog's tombstones kept up to half its
# depth alive, bodies read back included): without it 1,024 removed 1 MiB messages kept 1 GiB alive
# after their queue was empty (found by bench/soak.py)
LOG_COMPACT_MIN_BYTES = 16 << 20


class Group:
    """One group's messages and owner. A queue may track a million of these, so it is kept small:
    `lane` is None when the group has no available message, the Message itself when it has one, and a
    deque only from the second on (an empty deque costs ~630 bytes; a group of one message, the
    million-groups case, needs no container). An emptied deque is dropped, not kept.

    Each slot costs 8 bytes a group, so `placed` says in one slot where the group is and whether it
    is held: the (head seq, group) tuple it was last pushed into a heap with (the only entry of it
    that is live, found by identity), EMPTY_OWNED, HELD (no dispatch until `acquired` reaches 0;
    never in a heap meanwhile), or None (in no heap, not held)."""

    __slots__ = ("key", "lane", "available_count", "acquired", "owner", "placed")

    def __init__(self, key):
        self.key = key
        self.lane: Message | deque[Message] | None = None  # seq order; may hold REMOVED tombstones
        self.available_count = 0
        self.acquired = 0  # delivered and not yet settled, by any consumer
        self.owner: Consumer | None = None
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
            _insert_in_order(lane, message, returning)

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
        return self.available_count == 0 and self.acquired == 0 and self.owner is None

    @property
    def held(self) -> bool:
        return self.placed is HELD


class Consumer:
    __slots__ = ("id", "browse", "credit", "unsettled", "ready", "owned", "owned_count", "cursor_seq",
                 "next_delivery_id", "last_used", "rebalance_due", "unsettled_max")

    def __init__(self, consumer_id, browse: bool, unsettled_max: int = 0):
        self.id = consumer_id
        self.browse = browse
        self.unsettled_max = unsettled_max  # deliveries held unsettled at once, whatever the credit; 0 = no cap
        self.credit = 0
        self.unsettled: dict[int, Message] = {}  # delivery id -> message, in delivery order
        self.ready: list = []  # heap of (head seq, Group) for groups this consumer owns
        # every group whose owner this is, and stale entries (groups it lost since, perhaps twice): a
        # list slot is 8 bytes a group where a set's was ~33. Live: `owned_groups()`, counted `owned_count`.
        self.owned: list[Group] = []
        self.owned_count = 0
        self.cursor_seq = -1  # browsers: last seq shown
        self.next_delivery_id = 0
        self.last_used = 0  # spreads ties round-robin
        self.rebalance_due = False  # group_rebalance: reset owners when this consumer first has credit

    @property
    def may_take(self) -> bool:
        return self.credit > 0 and not (self.unsettled_max and len(self.unsettled) >= self.unsettled_max)

    def own(self, group: Group) -> None:
        group.owner = self
        owned = self.owned
        owned.append(group)
        count = self.owned_count = self.owned_count + 1
        if len(owned) > 2 * count + OWNED_STALE_MIN:
            self._drop_stale_owned()

    def disown(self, group: Group) -> None:
        """The group loses its owner (this consumer). Its heap entry, if any, was in this consumer's
        heap: it is stale from now on, and a hold stays."""
        group.owner = None
        if group.placed is not HELD:
            group.placed = None
        count = self.owned_count = self.owned_count - 1
        if not count:
            self.owned.clear()  # all stale: the shared policy's usual case, dropped without a look
        elif len(self.owned) > 2 * count + OWNED_STALE_MIN:
            self._drop_stale_owned()

    def disown_all(self, owned: list[Group]) -> None:
        """At detach: `owned` is owned_groups()."""
        for group in owned:
            group.owner = None
            if group.placed is not HELD:
                group.placed = None
        self.owned = []
        self.owned_count = 0

    def _drop_stale_owned(self) -> None:
        # once the stale entries outnumber the live ones: amortized O(1) per own/disown
        self.owned = self.owned_groups()
        assert len(self.owned) == self.owned_count, (self.id, len(self.owned), self.owned_count)

    def iter_owned_groups(self):
        """owned_groups() lazily, for a look at a few of them."""
        seen: set[Group] = set()
        for group in self.owned:
            if group.owner is self and group not in seen:
                seen.add(group)
                yield group

    def owned_groups(self) -> list[Group]:
        """The groups this consumer owns, each once, in the order it took them."""
        return list(dict.fromkeys(group for group in self.owned if group.owner is self))


def _seq_of(message: Message) -> int:
    return message.seq


class Queue:
    # Slots, not a __dict__: past ~30 attributes CPython 3.11 stops sharing an instance dict's keys, and
    # every attribute read of the dispatch paths got slower (two more attributes cost ~2 us a message)
    __slots__ = ("settings", "default_group", "_grouping", "groups", "_groups_high", "_empty_owned",
                 "_tracking_empty_owned", "held_keys", "consumers", "_takers", "_browsers", "_unowned",
                 "_ungrouped", "_log", "_log_removed", "_log_removed_bytes", "_expiry", "_delayed",
                 "dead_letter_refusal", "_use_counter", "depth_messages", "depth_bytes", "acquired_messages",
                 "enqueued_total", "delivered_total", "_first_attach_ms", "_dispatch_started", "pager", "cold",
                 "_starved")

    def __init__(self, settings: QueueSettings, *, fallback_default_group: str = "",
                 records: RecordBudget | None = None):
        self.settings = settings
        default = settings.effective_default_group
        if not settings.default_group and settings.group_policy == "shared" and fallback_default_group:
            default = fallback_default_group
        self.default_group = default
        self._grouping = settings.grouping
        self.groups: dict[object, Group] = {}  # with messages, in flight, or owned; idle ones are forgotten
        self._groups_high = 0  # len(groups) since the dict was last copied small (_forget)
        # groups that became empty while owned, oldest first; an entry is live while the group's
        # placed is EMPTY_OWNED (stale ones are dropped when met, or all at once past a bound)
        self._empty_owned: deque[Group] = deque()
        self._tracking_empty_owned = False  # listed only near groups_max (_track_empty_owned)
        self.held_keys: set = set()  # group keys held for the cluster (a move): never dispatched, kept
        self.consumers: dict[object, Consumer] = {}
        self._takers: list[Consumer] = []  # acquiring consumers with credit > 0
        self._browsers: list[Consumer] = []
        self._unowned: list = []  # heap of (head seq, Group)
        self._ungrouped: deque[Message] = deque()  # seq order; may hold tombstones
        self._log: list[Message] = []  # every live message in seq order, for browsing and listing
        self._log_removed = 0
        self._log_removed_bytes = 0
        self._expiry: list = []  # heap of (expires_at_ms, seq, Message)
        self._delayed: list = []  # heap of (available_at_ms, seq, Message): failed deliveries waiting out their delay
        # the broker's answer to "can this message be dead-lettered now?": None yes, else why not
        self.dead_letter_refusal = _no_refusal
        self._use_counter = itertools.count(1)
        self.depth_messages = 0
        self.depth_bytes = 0
        self.acquired_messages = 0
        self.enqueued_total = 0
        self.delivered_total = 0
        self._first_attach_ms: int | None = None
        self._dispatch_started = False
        # which bodies are in memory (node/core/paging.py); a non-durable queue's exist nowhere else
        self.pager: Pager | None = Pager(settings.name) if settings.durable else None
        # past the node's record budget, the newest messages are only seqs here (node/core/cold.py)
        self.cold: ColdTail | None = ColdTail(records) if records is not None and settings.durable else None
        self._starved = False  # the last dispatch left a taker or browser with credit and nothing to take

    # ---- producers ---------------------------------------------------------------------------

    def check_group_id(self, group_id) -> None:
        if group_id is None:
            return
        if not isinstance(group_id, str):
            raise InvalidField(f"group id must be a string, got {type(group_id).__name__}")
        limit = self.settings.group_id_length_max_chars
        if len(group_id) > limit:
            raise InvalidField(f"group id is {len(group_id)} characters; queue {self.settings.name!r} "
                               f"allows at most {limit}")

    def check_capacity(self, size_bytes: int, count: int = 1) -> None:
        s = self.settings
        if s.depth_max_messages and self.depth_messages + count > s.depth_max_messages:
            raise ResourceLimitExceeded(f"queue {s.name!r} is full: {self.depth_messages} + {count} messages "
                                        f"exceeds depth_max_messages={s.depth_max_messages}; retry later")
        if s.depth_max_bytes and self.depth_bytes + size_bytes > s.depth_max_bytes:
            raise ResourceLimitExceeded(f"queue {s.name!r} is full: {self.depth_bytes} + {size_bytes} "
                                        f"bytes exceeds depth_max_bytes={s.depth_max_bytes}; retry later")

    def enqueue(self, message: Message, now_ms: int, effects: list) -> None:
        """Add a message whose `seq` the broker assigned; raises before changing anything."""
        key = self.check_enqueue(message.group_id, message.size_bytes)
        if self._new_group_at_limit(key):
            self._free_empty_owned()  # check_enqueue found one
        self._admit(message, key)
        self.enqueued_total += 1
        if self.settings.durable:
            effects.append(Stored(self.settings.name, message))
        self._dispatch(now_ms, effects)

    def check_enqueue(self, group_id, size_bytes: int):
        """Raises what `enqueue` would refuse a message with; returns its group key (None: ungrouped)."""
        self.check_group_id(group_id)
        self.check_capacity(size_bytes)
        key = self._key_of(group_id)
        if self._new_group_at_limit(key) and not self._has_empty_owned():
            raise ResourceLimitExceeded(
                f"queue {self.settings.name!r} tracks {len(self.groups)} groups "
                f"(groups_max={self.settings.groups_max}); retry once groups drain, free idle ones with "
                f"'grouper group reset', or bound them with group_buckets")
        return key

    def _new_group_at_limit(self, key) -> bool:
        """A message of group `key` would be a new group past groups_max."""
        groups_max = self.settings.groups_max
        return bool(groups_max) and key is not None and key not in self.groups and len(self.groups) >= groups_max

    def restore(self, message: Message) -> None:
        """Add a message without limits or dispatch: journal recovery and internal moves."""
        self._admit(message, self._key_of(message.group_id))

    def _admit(self, message: Message, key) -> None:
        message.flags &= ~STATE_MASK  # AVAILABLE
        self.depth_messages += 1
        self.depth_bytes += message.size_bytes
        cold = self.cold
        if cold is not None and cold.admits():
            cold.add(message)  # behind the cold tail: read back whole when dispatch nears it
            return
        self._warm(message, key)

    def _warm(self, message: Message, key) -> None:
        """Put a counted message in the warm part: the browse log, its group, the heaps."""
        self._log.append(message)
        if self.pager is not None:
            self.pager.admitted(message)
            if self.cold is not None:
                self.cold.budget.messages += 1
        if message.expires_at_ms:
            heapq.heappush(self._expiry, (message.expires_at_ms, message.seq, message))
        self._make_available(message, key)

    def route_key(self, group_id) -> str | None:
        """The name this message's group is routed by across a cluster; None: not grouped here."""
        key = self._key_of(group_id)
        return None if key is None else _route_name(key)

    def busy_route_keys(self) -> list[str]:
        """Route keys of groups with messages here (queued or delivered and unsettled) or an owner: an
        exclusive owner keeps its group while idle, so its route must not expire under it."""
        return [_route_name(key) for key, group in self.groups.items() if not group.idle]

    def _key_of(self, group_id):
        if not self._grouping:
            return None
        if group_id is None:
            group_id = self.default_group
            if group_id is None:
                return None
        buckets = self.settings.group_buckets
        if buckets > 0:
            return zlib.crc32(group_id.encode("utf-8", "surrogatepass")) % buckets
        return group_id

    # ---- consumers ---------------------------------------------------------------------------

    def attach(self, consumer_id, browse: bool, now_ms: int, effects: list, unsettled_max: int = 0) -> None:
        consumer = Consumer(consumer_id, browse, unsettled_max)
        self.consumers[consumer_id] = consumer
        if browse:
            self._browsers.append(consumer)
            return
        if self._first_attach_ms is None:
            self._first_attach_ms = now_ms
        # An AMQP consumer attaches before it grants credit: resetting owners now would hand the
        # freed groups straight back to the consumers that have credit. Reset at its first credit.
        consumer.rebalance_due = self.settings.group_rebalance
        self._dispatch(now_ms, effects)

    def detach(self, consumer_id, now_ms: int, effects: list) -> list[Message]:
        """Release the consumer's unsettled messages in order (each a failed delivery); returns
        (message, reason) pairs to dead-letter."""
        consumer = self.consumers.pop(consumer_id, None)
        if consumer is None:
            return []
        if consumer.browse:
            self._browsers.remove(consumer)
            return []
        if consumer in self._takers:
            self._takers.remove(consumer)
        dead: list[tuple[Message, str]] = []
        owned = consumer.owned_groups()
        touched: set[Group] = set(owned)
        for message in consumer.unsettled.values():
            group = self._settle_one(message, Outcome.MODIFIED, True, now_ms, effects, dead)
            if group is not None:
                touched.add(group)
        consumer.unsettled.clear()
        consumer.disown_all(owned)
        for group in touched:
            self._after_settle(group)
        if not self.consumers or not any(not c.browse for c in self.consumers.values()):
            self._first_attach_ms = None
            self._dispatch_started = False
        self._dispatch(now_ms, effects)
        return dead

    def set_credit(self, consumer_id, credit: int, now_ms: int, effects: list) -> None:
        consumer = self._consumer(consumer_id)
        consumer.credit = credit
        if consumer.rebalance_due and credit > 0:
            consumer.rebalance_due = False
            self._reset_groups(list(self.groups.values()), self.settings.group_rebalance_pause_dispatch)
        if not consumer.browse:
            self._sync_taker(consumer)
        self._dispatch(now_ms, effects)

    def _sync_taker(self, consumer: Consumer) -> None:
        """`_takers` holds exactly the acquiring consumers that may take a message now."""
        listed = consumer in self._takers
        if consumer.may_take and not listed:
            self._takers.append(consumer)
        elif listed and not consumer.may_take:
            self._takers.remove(consumer)

    def settle(self, consumer_id, delivery_id: int, outcome: Outcome, delivery_failed: bool,
               now_ms: int, effects: list) -> list[Message]:
        """Apply a consumer's disposition; returns (message, reason) pairs to dead-letter."""
        consumer = self._consumer(consumer_id)
        message = consumer.unsettled.pop(delivery_id, None)
        if message is None:
            return []  # a duplicate or late disposition: already settled, nothing to do
        dead: list[tuple[Message, str]] = []
        group = self._settle_one(message, outcome, delivery_failed, now_ms, effects, dead)
        if group is not None:
            self._after_settle(group)
        if consumer.unsettled_max:
            self._sync_taker(consumer)  # a consumer at its unsettled cap may take again
        self._dispatch(now_ms, effects)
        return dead

    def _consumer(self, consumer_id) -> Consumer:
        consumer = self.consumers.get(consumer_id)
        if consumer is None:
            raise NotFound(f"no consumer {consumer_id!r} on queue {self.settings.name!r}")
        return consumer

    def _settle_one(self, message: Message, outcome: Outcome, delivery_failed: bool, now_ms: int,
                    effects: list, dead: list) -> Group | None:
        self.acquired_messages -= 1
        group = message.group
        if group is not None:
            group.acquired -= 1
        if outcome is Outcome.ACCEPTED:
            self._remove(message, effects)
        elif outcome is Outcome.REJECTED:
            refusal = self.dead_letter_refusal(message)
            self._remove(message, effects)
            if refusal is None:
                dead.append((message, "rejected"))
            else:  # the consumer refused it for good: redelivering it would only be refused again
                effects.append(Dropped(self.settings.name, message.seq, f"rejected; {refusal}"))
        else:
            failed = outcome is Outcome.MODIFIED and delivery_failed
            if failed:
                message.delivery_count += 1
            limit = self.settings.delivery_count_max
            refusal = None
            if limit and message.delivery_count >= limit:
                refusal = self.dead_letter_refusal(message)
                if refusal is None:
                    self._remove(message, effects)
                    dead.append((message, f"delivery_count_max={limit} reached"))
                    return group
                if message.delivery_count == limit:  # said once: it stays, and is retried at every failure
                    effects.append(Kept(self.settings.name, message.seq,
                                        f"delivery_count_max={limit} reached; {refusal}"))
            if message.expires_at_ms and message.expires_at_ms <= now_ms:
                # tick() spent its expiry entry while it was acquired: drop it here, not in its group
                self._remove(message, effects)
                effects.append(Dropped(self.settings.name, message.seq, "ttl expired"))
            else:
                message.state = AVAILABLE
                if self.pager is not None:
                    self.pager.returned(message)
                delay_ms = self.settings.redelivery_delay_for_ms(message.delivery_count) if failed else 0
                if delay_ms:
                    message.available_at_ms = now_ms + delay_ms
                    heapq.heappush(self._delayed, (message.available_at_ms, message.seq, message))
                    effects.append(Delayed(self.settings.name, message.seq, message.available_at_ms))
                self._make_available(message, None if group is None else group.key, returning=True)
        return group

    def _after_settle(self, group: Group) -> None:
        if group.acquired == 0:
            if group.owner is not None and (group.placed is HELD or self.settings.group_policy == "shared"):
                group.owner.disown(group)
            if group.placed is HELD:
                group.placed = None
        self._place_or_forget(group)

    # ---- dispatch ----------------------------------------------------------------------------

    def _dispatch_open(self, now_ms: int) -> bool:
        if self._dispatch_started:
            return True
        s = self.settings
        count_rule = s.consumers_before_dispatch > 0
        time_rule = s.time_before_dispatch_ms > 0
        # Count consumers that granted credit, not attached ones: a link attaches before it flows,
        # and counting it at attach would open dispatch while only the others can take groups.
        # Before dispatch starts no credit is spent, so the takers are exactly those consumers.
        ready = len(self._takers)
        if not count_rule and not time_rule:
            self._dispatch_started = True
        elif count_rule and ready >= s.consumers_before_dispatch:
            self._dispatch_started = True
        elif time_rule and self._first_attach_ms is not None and \
                now_ms >= self._first_attach_ms + s.time_before_dispatch_ms:
            self._dispatch_started = True
        return self._dispatch_started

    def _release_delayed(self, now_ms: int) -> None:
        delayed = self._delayed
        while delayed and delayed[0][0] <= now_ms:
            _, _, message = heapq.heappop(delayed)
            message.available_at_ms = 0
            if message.state != AVAILABLE:
                continue  # expired, purged or moved while it waited
            if message.group is None:
                _insert_in_order(self._ungrouped, message, True)
            else:
                self._place_or_forget(message.group)

    def _dispatch(self, now_ms: int, effects: list) -> None:
        self._starved = False
        self._dispatch_takers(now_ms, effects)
        pager = self.pager
        if pager is not None and pager.waiting:
            pager.ask(self._lane_of, effects)
        cold = self.cold
        if cold is not None and cold.stored and not cold.asked:
            # starved: nothing warm for a consumer with credit, and no body is on its way either
            self._read_cold(self._starved and not pager.requested_bytes and not pager.waiting, effects)

    def _read_cold(self, past_budget: bool, effects: list) -> None:
        """Ask the journal for the cold tail's next records, as many as the budget has room for (a whole
        batch `past_budget`), unless a read is out already."""
        count = self.cold.ask(past_budget)
        if count:
            effects.append(ReadRecords(self.settings.name, self.cold.after_seq, count, self.cold.read_max_bytes))

    def _lane_of(self, group):
        """A group's messages in seq order (None: the ungrouped lane); None when the group is gone."""
        if group is None:
            return self._ungrouped
        return group.messages() if self.groups.get(group.key) is group else None

    def _dispatch_takers(self, now_ms: int, effects: list) -> None:
        if self._delayed and self._delayed[0][0] <= now_ms:  # whichever call comes first past a delay
            self._release_delayed(now_ms)
        if self._browsers:
            self._dispatch_browsers(now_ms, effects)
        takers = self._takers
        if not takers or not self._dispatch_open(now_ms):
            return
        while takers:
            best_seq = -1
            best_group = None
            best_consumer = None
            for consumer in takers:
                entry = self._peek(consumer.ready, now_ms, effects)
                if entry is not None and (best_group is None or entry[0] < best_seq):
                    best_seq, best_group = entry
                    best_consumer = consumer
            entry = self._peek(self._unowned, now_ms, effects)
            if entry is not None and (best_group is None or entry[0] < best_seq):
                best_seq, best_group = entry
                best_consumer = None
            loose = self._peek_ungrouped(now_ms, effects)
            if loose is not None and (best_group is None or loose.seq < best_seq):
                self._ungrouped.popleft()
                consumer = min(takers, key=_least_recently_used)
                self._deliver(loose, consumer, False, effects)
                if self.pager is not None and self.pager.paged_bytes and self._ungrouped and consumer.may_take:
                    self._read_ahead(None, self._ungrouped)
                continue
            if best_group is None:
                self._starved = True
                return
            if best_consumer is None:
                heapq.heappop(self._unowned)
                best_consumer = min(takers, key=_fewest_groups)
                best_consumer.own(best_group)
                first = True
            else:
                heapq.heappop(best_consumer.ready)
                first = False
            self._deliver_from_group(best_group, best_consumer, first, effects)

    def _deliver_from_group(self, group: Group, consumer: Consumer, first: bool, effects: list) -> None:
        message = group.pop_head()
        group.available_count -= 1
        group.acquired += 1
        # HELD: free the group once this and every earlier message is settled
        group.placed = HELD if message.flags & CLOSES_GROUP else None
        self._deliver(message, consumer, first, effects)
        self._place_or_forget(group)
        if self.pager is not None and self.pager.paged_bytes and group.lane is not None and consumer.may_take:
            self._read_ahead(group, group.lane)

    def _read_ahead(self, group, lane) -> None:
        """Ask for a group's next bodies before dispatch reaches them, while the consumer it went to
        may take more: once the message halfway through the read-ahead window is paged (paging.py)."""
        if type(lane) is deque:
            ahead = lane[min(len(lane), READ_AHEAD_MESSAGES // 2) - 1] if lane else None
        else:
            ahead = lane
        if ahead is not None and ahead.flags & (PAGED | REQUESTED) == PAGED:
            self.pager.want(group)

    def _deliver(self, message: Message, consumer: Consumer, first: bool, effects: list) -> None:
        if self.pager is not None:
            assert message.payload is not None, f"queue {self.settings.name!r} delivers paged-out {message}"
            self.pager.delivered(message)
        message.flags = message.flags & ~STATE_MASK | ACQUIRED | HANDED_OUT
        self.acquired_messages += 1
        self.delivered_total += 1
        delivery_id = consumer.next_delivery_id
        consumer.next_delivery_id = delivery_id + 1
        consumer.unsettled[delivery_id] = message
        consumer.last_used = next(self._use_counter)
        consumer.credit -= 1
        if not consumer.may_take:
            self._takers.remove(consumer)
        effects.append(Deliver(consumer.id, delivery_id, message, first, False))

    def _dispatch_browsers(self, now_ms: int, effects: list) -> None:
        log = self._log
        for browser in self._browsers:
            if browser.credit <= 0:
                continue
            index = bisect_right(log, browser.cursor_seq, key=_seq_of)
            while browser.credit > 0 and index < len(log):
                message = log[index]
                index += 1
                if message.state != AVAILABLE or (message.expires_at_ms and message.expires_at_ms <= now_ms):
                    continue
                if message.flags & PAGED:  # this browser waits for the body; page_in() dispatches again
                    self.pager.want_browse(message, effects)
                    break
                browser.cursor_seq = message.seq
                browser.credit -= 1
                message.handed_out = True  # a browser has seen it: a failed write cannot take it back unseen
                delivery_id = browser.next_delivery_id
                browser.next_delivery_id = delivery_id + 1
                effects.append(Deliver(browser.id, delivery_id, message, False, True))
            if browser.credit > 0 and index == len(log):
                self._starved = True  # at the warm part's end: a cold tail is read back for it

    def _peek(self, heap: list, now_ms: int, effects: list) -> tuple | None:
        """The heap's first live entry (head seq, group), stale ones dropped on the way."""
        while heap:
            entry = heap[0]
            group = entry[1]
            if group.placed is not entry:
                heapq.heappop(heap)
                continue
            head = group.lane
            if type(head) is deque:
                head = head[0]
            if head.expires_at_ms and head.expires_at_ms <= now_ms:
                heapq.heappop(heap)
                group.placed = None  # _expire re-places the group, or forgets it once idle
                self._expire(head, effects)
                continue
            if head.flags & PAGED:  # met by a consumer that could take it: ask for its body, it waits
                heapq.heappop(heap)
                group.placed = None
                self.pager.want(group)
                continue
            return entry
        return None

    def _peek_ungrouped(self, now_ms: int, effects: list) -> Message | None:
        lane = self._ungrouped
        while lane:
            head = lane[0]
            if head.flags & STATE_MASK != AVAILABLE:
                lane.popleft()
            elif head.expires_at_ms and head.expires_at_ms <= now_ms:
                lane.popleft()
                self._expire(head, effects)
            elif head.flags & PAGED:
                self.pager.want(None)  # the ungrouped lane waits for its head's body
                return None
            else:
                return head
        return None

    def _place_or_forget(self, group: Group) -> None:
        head = group.head()
        placed = group.placed
        # a head waiting out its redelivery delay holds its whole group: tick() places it when due
        if head is None or placed is HELD or group.key in self.held_keys or head.available_at_ms:
            if group.idle:
                self._forget(group)
            elif self._tracking_empty_owned and head is None and self._empty_and_owned(group):
                # its exclusive owner keeps it, but it is first to go when groups_max is reached
                if placed is not EMPTY_OWNED:
                    group.placed = EMPTY_OWNED
                    self._empty_owned.append(group)
                    if len(self._empty_owned) > 2 * len(self.groups) + GROUPS_SHRINK_MIN:
                        self._empty_owned = deque(dict.fromkeys(
                            g for g in self._empty_owned if g.placed is EMPTY_OWNED))
            elif placed is not HELD:
                group.placed = None  # drops the last head's seq too: that int (32 bytes) would outlive it
            return
        # a live entry is in the owner's heap (or the unowned one): every change of owner unplaced it
        if type(placed) is tuple and placed[0] == head.seq:
            return
        entry = group.placed = (head.seq, group)
        owner = group.owner
        heapq.heappush(self._unowned if owner is None else owner.ready, entry)

    def _empty_and_owned(self, group: Group) -> bool:
        return (group.owner is not None and not group.available_count and not group.acquired
                and group.placed is not HELD and group.key not in self.held_keys)

    def _forget(self, group: Group) -> None:
        group.placed = None
        groups = self.groups
        del groups[group.key]
        if self.cold is not None:
            self.cold.budget.groups -= 1
        if self._tracking_empty_owned and len(groups) * 2 < self.settings.groups_max:
            self._tracking_empty_owned = False  # far from the limit again: _track_empty_owned starts over
            self._empty_owned.clear()
        # A dict never gives back the room of its deleted keys: after a million groups drained, the
        # table alone held ~40 MB. Copy it once it is a quarter full (amortized O(1) per deletion).
        if len(groups) * 4 < self._groups_high and self._groups_high > GROUPS_SHRINK_MIN:
            self.groups = dict(groups)
            self._groups_high = len(groups)

    def _free_empty_owned(self) -> bool:
        """Make room under groups_max: forget the group that has been empty with an owner the longest
        (nothing of it is queued or in flight, so no order can break); False when there is none."""
        candidates = self._empty_owned
        while candidates:
            group = candidates.popleft()
            if group.placed is EMPTY_OWNED:
                group.owner.disown(group)
                self._forget(group)
                return True
        return False

    def _has_empty_owned(self) -> bool:
        if not self._tracking_empty_owned:
            self._track_empty_owned()
        candidates = self._empty_owned
        while candidates and candidates[0].placed is not EMPTY_OWNED:
            candidates.popleft()  # stale: it has messages again, or was forgotten
        return bool(candidates)

    def _track_empty_owned(self) -> None:
        """Start listing empty owned groups: one pass over the groups, made only when a new group meets
        groups_max, and again only after the groups fell below half of it (so amortized O(1) per group).
        Far from the limit nothing is listed: the list cost ~7% of dispatch CPU when kept always."""
        self._tracking_empty_owned = True
        self._empty_owned.clear()
        for group in self.groups.values():
            if self._empty_and_owned(group):
                group.placed = EMPTY_OWNED
                self._empty_owned.append(group)

    def _make_available(self, message: Message, key, returning: bool = False) -> None:
        if key is None:
            message.group = None
            if not message.available_at_ms:  # a delayed one joins the lane when tick() finds it due
                _insert_in_order(self._ungrouped, message, returning)
            return
        groups = self.groups
        group = groups.get(key)
        if group is None:
            group = groups[key] = Group(key)
            if len(groups) > self._groups_high:
                self._groups_high = len(groups)
            if self.cold is not None:
                self.cold.budget.groups += 1
        elif type(key) is str and message.group_id is not None:
            message.group_id = group.key  # the group's copy: one string per group, not one per message
        message.group = group
        group.push(message, returning)
        group.available_count += 1
        if not returning:
            self._place_or_forget(group)
        # a returning message is placed by _after_settle once the group's counts are final

    # ---- removal -----------------------------------------------------------------------------

    def _remove(self, message: Message, effects: list, journalled: bool = True) -> None:
        """Forget a message that is available or acquired; the caller fixes group counters.

        `journalled` False: its STORE never reached the disk (a withdrawn send), so no REMOVE is due."""
        if self.pager is not None:
            self.pager.removed(message)
            if self.cold is not None:
                self.cold.budget.messages -= 1
        message.flags = message.flags & ~STATE_MASK | REMOVED
        self.depth_messages -= 1
        self.depth_bytes -= message.size_bytes
        self._log_removed += 1
        self._log_removed_bytes += message.size_bytes
        if journalled and self.settings.durable:
            effects.append(Removed(self.settings.name, message.seq))
        if ((self._log_removed > LOG_COMPACT_MIN and self._log_removed * 2 > len(self._log))
                or (self._log_removed_bytes > LOG_COMPACT_MIN_BYTES
                    and self._log_removed_bytes > self.resident_bytes())):
            self._log = [m for m in self._log if m.state != REMOVED]
            self._log_removed = self._log_removed_bytes = 0

    def _take_available(self, message: Message, effects: list, journalled: bool = True) -> None:
        """Remove an available message from wherever it waits (lazily, via its state)."""
        self._remove(message, effects, journalled)
        group = message.group
        if group is not None:
            group.available_count -= 1
            self._place_or_forget(group)

    def withdraw(self, message: Message, now_ms: int, effects: list) -> None:
        """Take back an available message no consumer or browser has seen: its journal write failed and
        its producer is refused, so it must never be delivered. Its group is forgotten if that leaves
        it idle, as after any other removal; an owner it had before this message keeps it."""
        assert message.state == AVAILABLE and not message.handed_out, message
        if message.flags & COLD:  # still pending in the cold tail
            self.cold.withdraw(message)
            self.depth_messages -= 1
            self.depth_bytes -= message.size_bytes
        else:
            self._take_available(message, effects, journalled=False)
        effects.append(Withdrawn(self.settings.name, message.seq))
        self._dispatch(now_ms, effects)

    def _expire(self, message: Message, effects: list) -> None:
        self._take_available(message, effects)
        effects.append(Dropped(self.settings.name, message.seq, "ttl expired"))

    def tick(self, now_ms: int, effects: list) -> None:
        expiry = self._expiry
        while expiry and expiry[0][0] <= now_ms:
            _, _, message = heapq.heappop(expiry)
            if message.state == AVAILABLE:
                self._expire(message, effects)
            # an acquired message that expired is dropped when it comes back (_settle_one)
        self._dispatch(now_ms, effects)

    # ---- paging (node/core/paging.py) --------------------------------------------------------

    def page_out(self, target_bytes: int) -> int:
        """Page out journalled bodies until this queue's pageable bytes are at most `target_bytes`."""
        return 0 if self.pager is None else self.pager.page_out(target_bytes, self.held_keys)

    def page_in(self, bodies: dict, now_ms: int, effects: list) -> None:
        """Bodies the journal read back (seq -> payload); a None payload is a body the journal does not
        have: the message is dropped, loudly (a broken journal, never a normal path)."""
        pager = self.pager
        if pager is None:
            return
        touched = []
        for seq, payload in bodies.items():
            message = pager.arrived(seq, payload)
            if message is None:
                continue
            if payload is None:
                self._take_available(message, effects)
                effects.append(Dropped(self.settings.name, seq, "its body is missing from the journal"))
                continue
            if message.group is not None:
                touched.append(message.group)
        for group in touched:
            if self.groups.get(group.key) is group and group.placed is None:
                self._place_or_forget(group)
        self._dispatch(now_ms, effects)

    # ---- the cold tail (node/core/cold.py) --------------------------------------------------------

    def restore_cold(self, count: int, after_seq: int, size_bytes: int) -> None:
        """Journal recovery: `count` live records above `after_seq` (newer than anything here), whose
        payloads are `size_bytes` in all, stay in the journal until dispatch nears them."""
        self.depth_messages += count
        self.depth_bytes += size_bytes
        self.cold.add_stored(count, after_seq, size_bytes)

    def cold_journalled(self, now_ms: int, effects: list) -> None:
        """Some STOREs were reported on disk: pending cold messages among them let go of their bodies."""
        cold = self.cold
        if cold is not None and cold.pending:
            cold.journalled()
            self._dispatch(now_ms, effects)

    def promote(self, records: dict, now_ms: int, effects: list) -> None:
        """Records the journal read back (seq -> Message) for the cold tail's last ReadRecords: the next
        ones after its `after_seq`. They join the warm part in seq order, and dispatch goes on with them."""
        cold = self.cold
        if cold is None or not cold.asked:
            return
        seqs = sorted(seq for seq, message in records.items() if message is not None)
        if len(seqs) > cold.asked or (seqs and seqs[0] <= cold.after_seq):
            return  # an answer to a read of a queue of the same name deleted since: not this tail's
        back_bytes = 0
        for seq in seqs:
            message = records[seq]
            message.flags |= JOURNALLED
            back_bytes += message.size_bytes
            self._warm(message, self._key_of(message.group_id))
        missing = read_missing(cold.asked, len(seqs), back_bytes, cold.read_max_bytes)
        if missing:  # their bytes leave the depth once known (ColdTail.promoted)
            self.depth_messages -= missing
            effects.append(Dropped(self.settings.name, cold.after_seq,
                                   f"{missing} cold records after this seq are missing from the journal"))
        self.depth_bytes -= cold.promoted(len(seqs), missing, seqs[-1] if seqs else None, back_bytes)
        self._dispatch(now_ms, effects)

    def cold_taken(self, seq: int, size_bytes: int, effects: list) -> None:
        """Stored cold record `seq` of `size_bytes` left for another node (the cluster's sweep read it
        back): only counted here, so the counts change and its REMOVE is due."""
        self.depth_messages -= 1
        self.depth_bytes -= size_bytes
        self.cold.taken(size_bytes)
        effects.append(Removed(self.settings.name, seq))

    def cold_refusal(self, what: str) -> None:
        """Raise when `what` needs every message of a group and this queue has a cold tail: which groups
        its messages belong to is not known until they are read back."""
        cold = self.cold
        if cold is not None and cold.count:
            raise ResourceLimitExceeded(
                f"{what}: queue {self.settings.name!r} holds {cold.count} messages past the node's "
                f"record_memory_max_bytes (only in the journal until consumers near them), and a group's "
                f"messages among them are not known here; retry once consumers have drained the queue "
                f"below that budget, purge the whole queue, or raise record_memory_max_bytes")

    def read_cold_for_purge(self, effects: list) -> bool:
        """A queue purge reached the cold tail: read its next records back (past the budget) so the
        purge takes them as warm ones. False when nothing is cold any more."""
        cold = self.cold
        if cold is None or not cold.count:
            return False
        self._read_cold(True, effects)
        return True

    def next_deadline_ms(self) -> int | None:
        deadlines = []
        if self._expiry:
            deadlines.append(self._expiry[0][0])
        if self._delayed:
            deadlines.append(self._delayed[0][0])
        if not self._dispatch_started and self._first_attach_ms is not None and \
                self.settings.time_before_dispatch_ms > 0:
            deadlines.append(self._first_attach_ms + self.settings.time_before_dispatch_ms)
        return min(deadlines) if deadlines else None

    # ---- management --------------------------------------------------------------------------

    def _group(self, group_key) -> Group:
        key = self.group_key_from_text(group_key)
        group = self.groups.get(key)
        if group is None:
            raise NotFound(f"queue {self.settings.name!r} has no group {group_key!r}")
        return group

    def group_key_from_text(self, text):
        """Management names groups as text; bucket queues key them by bucket number."""
        if self.settings.group_buckets > 0 and isinstance(text, str):
            try:
                return int(text)
            except ValueError:
                return self._key_of(text)
        return text

    def reset_groups(self, group_key, now_ms: int, effects: list) -> int:
        """Free one group (or every group with None); in-flight groups are freed once settled."""
        if group_key is not None and self.cold is not None and self.cold.count \
                and self.group_key_from_text(group_key) not in self.groups:
            return 0  # perhaps a group of the cold tail's only: one without an owner, or it would be known
        groups = [self._group(group_key)] if group_key is not None else list(self.groups.values())
        count = self._reset_groups(groups, pause=True)
        self._dispatch(now_ms, effects)
        return count

    def _reset_groups(self, groups: list[Group], pause: bool) -> int:
        count = 0
        for group in groups:
            if group.owner is None:
                continue
            count += 1
            if group.acquired and pause:
                group.placed = HELD  # its heap entry is stale from now on
                continue
            group.owner.disown(group)
            group.placed = None  # a hold ends with the owner
            self._place_or_forget(group)
        return count

    def take_group_messages(self, group_key, count: int | None, effects: list, bodies: bool = True,
                            bytes_max: int | None = None, whole: bool = False) -> list[Message]:
        """Remove up to `count` available messages from a group's head (all with None).

        Acquired messages are never taken: they belong to a consumer until settled. `bodies` False
        (a purge): paged-out messages are taken too; else only up to the first one (see group_head_messages,
        which also says `bytes_max` and `whole`)."""
        group = self._group(group_key)
        taken = self.group_head_messages(group_key, count, bodies, bytes_max, whole)
        for message in taken:
            self._remove(message, effects)
        group.available_count -= len(taken)
        self._place_or_forget(group)  # its head() drops the tombstones just made
        return taken

    def take_ungrouped_messages(self, count: int | None, effects: list) -> list[Message]:
        """Remove up to `count` available messages that are in no group (all with None), in queue order.

        Acquired ones are never taken. The lane keeps only what is still available, so a purge of a
        queue no consumer reads leaves no tombstones behind."""
        taken: list[Message] = []
        for message in self._ungrouped:
            if count is not None and len(taken) >= count:
                break
            if message.flags & STATE_MASK == AVAILABLE:
                taken.append(message)
        for message in taken:
            self._remove(message, effects)
        if taken:
            self._ungrouped = deque(message for message in self._ungrouped
                                    if message.flags & STATE_MASK == AVAILABLE)
        return taken

    def group_head_messages(self, group_key, count: int | None, bodies: bool = True,
                            bytes_max: int | None = None, whole: bool = False) -> list[Message]:
        """The first `count` available messages of a group (all with None), left in place, and none past
        the one whose body reaches `bytes_max` (None: no bound). With `bodies` they end before the first
        one whose body is paged out, and the group's next bodies are asked for (a move copies bodies: the
        caller moves what it got; called again, the next window); `whole` asks past READ_AHEAD_MESSAGES
        (Pager.want_whole: a hand-over)."""
        group = self._group(group_key)
        head: list[Message] = []
        head_bytes = 0
        for message in group.messages():
            if (count is not None and len(head) >= count) or (bytes_max is not None and head_bytes >= bytes_max):
                break
            if message.state == AVAILABLE:
                if bodies and message.flags & PAGED:
                    # the next window, within the read-ahead room: never a whole backlog
                    (self.pager.want_whole if whole else self.pager.want)(group)
                    break
                head.append(message)
                head_bytes += message.size_bytes
        return head

    # ---- the cluster's holds (node/core/cluster_protocol.py: groups follow their consumers) ---------

    def group_key_of_route(self, route_key: str):
        """The group key a route key names here (queue.route_key's inverse)."""
        if self.settings.group_buckets > 0 and route_key.startswith("bucket-"):
            try:
                return int(route_key[len("bucket-"):])
            except ValueError:
                return route_key
        return route_key

    def hold_group(self, group_key) -> None:
        """Deliver nothing more of the group until release_group; what is in flight stays in flight."""
        self.held_keys.add(group_key)
        group = self.groups.get(group_key)
        if group is not None and group.placed is not HELD:
            group.placed = None  # its heap entries are stale from now on

    def release_group(self, group_key, now_ms: int, effects: list) -> None:
        self.held_keys.discard(group_key)
        group = self.groups.get(group_key)
        if group is not None:
            self._place_or_forget(group)
        self._dispatch(now_ms, effects)

    def group_in_flight(self, group_key) -> int:
        """Delivered and not yet settled, by any consumer."""
        group = self.groups.get(group_key)
        return 0 if group is None else group.acquired

    def group_available(self, group_key) -> int:
        group = self.groups.get(group_key)
        return 0 if group is None else group.available_count

    def hand_over_group(self, group_key, effects: list, messages_max: int,
                        bytes_max: int) -> tuple[list[Message], bool]:
        """Remove a held group's next available messages, in order, for another node: at most
        `messages_max`, and none past the one whose body reaches `bytes_max`, all with their bodies in
        memory (paged ones further on are asked for, a window at a time: read them back whole and a
        large group would be in memory twice). Returns them and whether nothing of the group is left
        here, its owner freed. Only once nothing of it is in flight: a message delivered here must be
        settled (or released) before another node may deliver the next."""
        group = self.groups.get(group_key)
        if group is None:
            return [], True
        if group.acquired or group_key not in self.held_keys:
            return [], False
        taken = self.take_group_messages(group_key, messages_max, effects, bytes_max=bytes_max, whole=True)
        for message in taken:
            message.handed_out = True  # a copy lives on at the new owner: a failed write cannot take it back
        if group.available_count:
            return taken, False  # held, so in no heap: the rest goes at the next call
        if group.owner is not None:  # without one, take_group_messages forgot the group already
            group.owner.disown(group)
            self._place_or_forget(group)  # idle now: forgotten
        return taken, True

    def group_rows(self) -> list[dict]:
        rows = []
        for key, group in self.groups.items():
            rows.append({
                "group": str(key),
                "messages": group.available_count + group.acquired,
                "acquired": group.acquired,
                "consumer": group.owner.id if group.owner is not None else None,
            })
        rows.sort(key=lambda row: row["group"])
        return rows

    def browse_available(self) -> list[Message]:
        return [m for m in self._log if m.state != REMOVED]

    def close(self, effects: list) -> None:
        """The queue is being deleted: detach every consumer with a condition, drop everything."""
        error: GrouperError = ResourceDeleted(f"queue {self.settings.name!r} was deleted")
        for consumer_id in list(self.consumers):
            effects.append(DetachConsumer(consumer_id, error))
        self.consumers.clear()
        self._takers.clear()
        self._browsers.clear()
        for message in self._log:
            message.state = REMOVED
        self._empty_owned.clear()
        self._log.clear()
        self._ungrouped.clear()
        self._unowned.clear()
        self._expiry.clear()
        self._delayed.clear()
        if self.pager is not None:
            self.pager.clear()
        if self.cold is not None:
            budget = self.cold.budget
            budget.messages -= self.depth_messages - self.cold.count
            budget.groups -= len(self.groups)
            self.cold.clear()
        self.groups.clear()
        self.depth_messages = self.depth_bytes = self.acquired_messages = 0

    def stats(self) -> dict:
        return {
            "name": self.settings.name,
            "depth_messages": self.depth_messages,
            "depth_bytes": self.depth_bytes,
            "acquired_messages": self.acquired_messages,
            "consumers": len(self.consumers) - len(self._browsers),
            "browsers": len(self._browsers),
            "groups": len(self.groups),
            "owned_groups": sum(1 for g in self.groups.values() if g.owner is not None),
            "enqueued_total": self.enqueued_total,
            "delivered_total": self.delivered_total,
            "resident_bytes": self.resident_bytes(),
            "paged_bytes": self.pager.paged_bytes if self.pager is not None else 0,
            "cold_messages": self.cold.count if self.cold is not None else 0,
        }

    def resident_bytes(self) -> int:
        """Payload bytes of the queue's messages in memory: not paged out, not cold."""
        return (self.depth_bytes - (self.pager.paged_bytes if self.pager is not None else 0)
                - (self.cold.journal_bytes if self.cold is not None else 0))


def _no_refusal(message: Message) -> None:
    return None  # a queue on its own hands every dead letter to its caller


def _least_recently_used(consumer: Consumer) -> int:
    return consumer.last_used


def _fewest_groups(consumer: Consumer) -> tuple[int, int]:
    return (consumer.owned_count, consumer.last_used)


def _insert_in_order(lane: deque, message: Message, returning: bool) -> None:
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


def _route_name(key) -> str:
    """A group key as the route table names it: the group id, or the bucket number spelled out."""
    return key if isinstance(key, str) else f"bucket-{key}"
