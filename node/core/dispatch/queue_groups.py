"""A queue's group table: which groups it tracks, their keys, and where each waits for dispatch. Pure.

Rules this module keeps:
- The next message to dispatch is found through heaps of *groups keyed by their head seq*: one heap
  per consumer for the groups assigned to it (`Consumer.ready`) and `unassigned` for the others. A group
  whose consumer has no credit waits in that consumer's heap and is never scanned, so a blocked group costs nothing
  to skip. Messages of no group wait in the `ungrouped` lane, in seq order.
- Heap entries are validated lazily: a group keeps the one entry (head seq, group) it was last pushed
  with (`Group.placed`); any other entry for it is stale and dropped when met. That entry is in its
  consumer's heap, or the unassigned heap when it has none, so a change of consumer unplaces it.
- A group that is paused (`PAUSED`) or held (its key in `held_keys`, for the cluster) or whose head waits out a
  redelivery delay is in no heap, so no later message of it overtakes what waits.
- An idle group (nothing queued or in flight, no consumer) is forgotten at once, on every path; the dict
  is copied small once most of its groups are gone (a dict never gives back its deleted keys' room).
  Messages share their group's id string: a million messages of one group keep one string.
- groups_max counts every tracked group, an empty one kept by its exclusive consumer included, but such a
  group frees itself: a new group past groups_max takes the place of the group empty longest with a
  consumer (nothing of it is queued or in flight, so no order can break). A new group is refused only
  when every tracked group has messages queued or in flight. Empty assigned groups are listed only near
  the limit (`tracking_empty_assigned`): the list cost ~7% of dispatch CPU when kept always.
"""

from __future__ import annotations

import heapq
import zlib
from collections import deque

from node.core.dispatch.cold import ColdTail
from node.core.dispatch.group_signals import group_signals
from node.core.errors import InvalidField, NotFound
from node.core.dispatch.message import Message
from node.core.dispatch.queue_lanes import EMPTY_ASSIGNED, PAUSED, Group, insert_in_order
from node.core.dispatch.settings import QueueSettings

GROUPS_SHRINK_MIN = 4096  # groups below which the groups dict is never copied smaller


class GroupTable:
    __slots__ = ("settings", "default_group", "grouping", "cold", "groups", "groups_high", "empty_assigned",
                 "tracking_empty_assigned", "held_keys", "unassigned", "ungrouped")

    def __init__(self, settings: QueueSettings, default_group: str | None, cold: ColdTail | None):
        self.settings = settings
        self.default_group = default_group  # the group of messages without a group id; None: ungrouped
        self.grouping = settings.grouping
        self.cold = cold  # counts tracked groups against the node's record budget (node/core/dispatch/cold.py)
        self.groups: dict[object, Group] = {}  # with messages, in flight, or assigned; idle ones are forgotten
        self.groups_high = 0  # len(groups) since the dict was last copied small (forget)
        # groups that became empty while assigned, oldest first; an entry is live while the group's
        # placed is EMPTY_ASSIGNED (stale ones are dropped when met, or all at once past a bound)
        self.empty_assigned: deque[Group] = deque()
        self.tracking_empty_assigned = False  # listed only near groups_max (_track_empty_assigned)
        self.held_keys: set = set()  # group keys held for the cluster (a move): never dispatched, kept
        self.unassigned: list = []  # heap of (head seq, Group); never rebound: the dispatcher holds it too
        self.ungrouped: deque[Message] = deque()  # seq order; may hold tombstones

    # ---- keys --------------------------------------------------------------------------------

    def check_group_id(self, group_id) -> None:
        if group_id is None:
            return
        if not isinstance(group_id, str):
            raise InvalidField(f"group id must be a string, got {type(group_id).__name__}")
        limit = self.settings.group_id_length_max_chars
        if len(group_id) > limit:
            raise InvalidField(f"group id is {len(group_id)} characters; queue {self.settings.name!r} "
                               f"allows at most {limit}")

    def key_of(self, group_id):
        if not self.grouping:
            return None
        if group_id is None:
            group_id = self.default_group
            if group_id is None:
                return None
        buckets = self.settings.group_buckets
        if buckets > 0:
            return zlib.crc32(group_id.encode("utf-8", "surrogatepass")) % buckets
        return group_id

    def route_key(self, group_id) -> str | None:
        """The name this message's group is routed by across a cluster; None: not grouped here."""
        key = self.key_of(group_id)
        return None if key is None else route_name(key)

    def busy_route_keys(self) -> list[str]:
        """Route keys of groups with messages here (queued or delivered and unsettled) or a consumer: an
        exclusive consumer keeps its group while idle, so its route must not expire under it."""
        return [route_name(key) for key, group in self.groups.items() if not group.idle]

    def group_key_from_text(self, text):
        """Management names groups as text; bucket queues key them by bucket number."""
        if self.settings.group_buckets > 0 and isinstance(text, str):
            try:
                return int(text)
            except ValueError:
                return self.key_of(text)
        return text

    def group_key_of_route(self, route_key: str):
        """The group key a route key names here (route_key's inverse)."""
        if self.settings.group_buckets > 0 and route_key.startswith("bucket-"):
            try:
                return int(route_key[len("bucket-"):])
            except ValueError:
                return route_key
        return route_key

    def find(self, group_key) -> Group:
        """The group management names as `group_key` (text); NotFound when it is not tracked."""
        group = self.groups.get(self.group_key_from_text(group_key))
        if group is None:
            raise NotFound(f"queue {self.settings.name!r} has no group {group_key!r}")
        return group

    # ---- placing -----------------------------------------------------------------------------

    def make_available(self, message: Message, key, returning: bool = False) -> None:
        if key is None:
            message.group = None
            if not message.available_at_ms:  # a delayed one joins the lane when tick() finds it due
                insert_in_order(self.ungrouped, message, returning)
            return
        groups = self.groups
        group = groups.get(key)
        if group is None:
            group = groups[key] = Group(key)
            if len(groups) > self.groups_high:
                self.groups_high = len(groups)
            if self.cold is not None:
                self.cold.budget.groups += 1
        elif type(key) is str and message.group_id is not None:
            message.group_id = group.key  # the group's copy: one string per group, not one per message
        message.group = group
        group.push(message, returning)
        group.available_count += 1
        if not returning:
            self.place_or_forget(group)
        # a returning message is placed by Settlement.after_settle once the group's counts are final

    def place_or_forget(self, group: Group) -> None:
        head = group.head()
        placed = group.placed
        # a head waiting out its redelivery delay holds its whole group: tick() places it when due
        if head is None or placed is PAUSED or group.key in self.held_keys or head.available_at_ms:
            if group.idle:
                self.forget(group)
            elif self.tracking_empty_assigned and head is None and self._empty_and_assigned(group):
                # its exclusive consumer keeps it, but it is first to go when groups_max is reached
                if placed is not EMPTY_ASSIGNED:
                    group.placed = EMPTY_ASSIGNED
                    self.empty_assigned.append(group)
                    if len(self.empty_assigned) > 2 * len(self.groups) + GROUPS_SHRINK_MIN:
                        self.empty_assigned = deque(dict.fromkeys(
                            g for g in self.empty_assigned if g.placed is EMPTY_ASSIGNED))
            elif placed is not PAUSED:
                group.placed = None  # drops the last head's seq too: that int (32 bytes) would outlive it
            return
        # a live entry is in the consumer's heap (or the unassigned one): every change of consumer unplaced it
        if type(placed) is tuple and placed[0] == head.seq:
            return
        entry = group.placed = (head.seq, group)
        consumer = group.consumer
        heapq.heappush(self.unassigned if consumer is None else consumer.ready, entry)

    def forget(self, group: Group) -> None:
        group.placed = None
        groups = self.groups
        del groups[group.key]
        if self.cold is not None:
            self.cold.budget.groups -= 1
        if self.tracking_empty_assigned and len(groups) * 2 < self.settings.groups_max:
            self.tracking_empty_assigned = False  # far from the limit again: _track_empty_assigned starts over
            self.empty_assigned.clear()
        # A dict never gives back the room of its deleted keys: after a million groups drained, the
        # table alone held ~40 MB. Copy it once it is a quarter full (amortized O(1) per deletion).
        if len(groups) * 4 < self.groups_high and self.groups_high > GROUPS_SHRINK_MIN:
            self.groups = dict(groups)
            self.groups_high = len(groups)

    def reset(self, groups: list[Group], pause: bool) -> int:
        """Free the groups' consumers (in-flight ones once settled, with `pause`); returns how many had one."""
        count = 0
        for group in groups:
            if group.consumer is None:
                continue
            count += 1
            if group.acquired and pause:
                group.placed = PAUSED  # its heap entry is stale from now on
                continue
            group.consumer.unassign(group)
            group.placed = None  # a hold ends with the consumer
            self.place_or_forget(group)
        return count

    def hold(self, group_key) -> None:
        """Deliver nothing more of the group until release; what is in flight stays in flight."""
        self.held_keys.add(group_key)
        group = self.groups.get(group_key)
        if group is not None and group.placed is not PAUSED:
            group.placed = None  # its heap entries are stale from now on

    def release(self, group_key) -> None:
        self.held_keys.discard(group_key)
        group = self.groups.get(group_key)
        if group is not None:
            self.place_or_forget(group)

    # ---- groups_max: empty assigned groups make room ----------------------------------------------

    def new_group_at_limit(self, key) -> bool:
        """A message of group `key` would be a new group past groups_max."""
        groups_max = self.settings.groups_max
        return bool(groups_max) and key is not None and key not in self.groups and len(self.groups) >= groups_max

    def _empty_and_assigned(self, group: Group) -> bool:
        return (group.consumer is not None and not group.available_count and not group.acquired
                and group.placed is not PAUSED and group.key not in self.held_keys)

    def free_empty_assigned(self) -> bool:
        """Make room under groups_max: forget the group that has been empty with a consumer the longest
        (nothing of it is queued or in flight, so no order can break); False when there is none."""
        candidates = self.empty_assigned
        while candidates:
            group = candidates.popleft()
            if group.placed is EMPTY_ASSIGNED:
                group.consumer.unassign(group)
                self.forget(group)
                return True
        return False

    def has_empty_assigned(self) -> bool:
        if not self.tracking_empty_assigned:
            self._track_empty_assigned()
        candidates = self.empty_assigned
        while candidates and candidates[0].placed is not EMPTY_ASSIGNED:
            candidates.popleft()  # stale: it has messages again, or was forgotten
        return bool(candidates)

    def _track_empty_assigned(self) -> None:
        """Start listing empty assigned groups: one pass over the groups, made only when a new group meets
        groups_max, and again only after the groups fell below half of it (so amortized O(1) per group)."""
        self.tracking_empty_assigned = True
        self.empty_assigned.clear()
        for group in self.groups.values():
            if self._empty_and_assigned(group):
                group.placed = EMPTY_ASSIGNED
                self.empty_assigned.append(group)

    # ---- looking -----------------------------------------------------------------------------

    def group_in_flight(self, group_key) -> int:
        """Delivered and not yet settled, by any consumer."""
        group = self.groups.get(group_key)
        return 0 if group is None else group.acquired

    def group_available(self, group_key) -> int:
        group = self.groups.get(group_key)
        return 0 if group is None else group.available_count

    def group_rows(self) -> list[dict]:
        rows = []
        for key, group in self.groups.items():
            rows.append({
                "group": str(key),
                "messages": group.available_count + group.acquired,
                "acquired": group.acquired,
                "consumer": group.consumer.id if group.consumer is not None else None,
            })
        rows.sort(key=lambda row: row["group"])
        return rows

    def signals(self, consumers, delayed: list) -> dict:
        """Runnable, blocked and held groups, and the oldest head's arrival (node/core/dispatch/group_signals.py):
        made per stats call only, from the heaps, not by a pass over the groups."""
        return group_signals(self, consumers, delayed)

    def clear(self) -> None:
        """The queue is deleted: its groups leave the node's record budget."""
        if self.cold is not None:
            self.cold.budget.groups -= len(self.groups)
        self.empty_assigned.clear()
        self.ungrouped.clear()
        self.unassigned.clear()
        self.groups.clear()


def route_name(key) -> str:
    """A group key as the route table names it: the group id, or the bucket number spelled out."""
    return key if isinstance(key, str) else f"bucket-{key}"
