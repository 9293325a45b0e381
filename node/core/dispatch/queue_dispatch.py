"""Group dispatch: which message goes to which consumer next. Pure: time is `now_ms`.

Rules this module keeps:
- Queue order is `seq` order. Among what the takers may take (the groups assigned to each, the unassigned groups,
  the ungrouped lane), the lowest head seq goes first; an unassigned group goes to the taker that has the
  fewest groups, an ungrouped message to the least recently used taker (ties round-robin).
- Within a group, messages are delivered in `seq` order, one consumer at a time: a group is only ever in
  its consumer's heap, so no other consumer can take its next message.
- Dispatch only sees the warm part and bodies in memory: a paged head is asked for (node/core/dispatch/paging.py)
  and its group waits, unplaced, until page_in places it again; a taker or browser with credit and
  nothing to take (`starved`) makes the cold tail be read back (node/core/dispatch/cold.py).
- A message delivered or shown is `handed_out`: a failed journal write can no longer take it back.
- While a consumer has a JMS selector, node/core/dispatch/selector_dispatch.py takes the takers' dispatch;
  a browser's selector is applied here.
"""

from __future__ import annotations

import heapq
import itertools
from bisect import bisect_right
from collections import deque

from node.core.dispatch.cold import ColdTail
from node.core.effects import Deliver, ReadRecords
from node.core.dispatch.message import (ACQUIRED, AVAILABLE, CLOSES_GROUP, HANDED_OUT, PAGED, REQUESTED, STATE_MASK,
                               Message)
from node.core.dispatch.paging import READ_AHEAD_MESSAGES, Pager
from node.core.dispatch.queue_consumers import Consumer, Consumers, fewest_groups, least_recently_used
from node.core.dispatch.queue_groups import GroupTable
from node.core.dispatch.queue_leases import Leases
from node.core.dispatch.queue_lanes import PAUSED, Group, insert_in_order
from node.core.dispatch.queue_store import MessageStore
from node.core.dispatch.selector_dispatch import dispatch_selecting
from node.core.dispatch.settings import QueueSettings


class Dispatcher:
    __slots__ = ("settings", "consumers", "groups", "store", "pager", "cold", "takers", "browsers", "unassigned",
                 "delayed", "use_counter", "starved", "leases")

    def __init__(self, settings: QueueSettings, consumers: Consumers, groups: GroupTable, store: MessageStore):
        self.settings = settings
        self.consumers = consumers
        self.groups = groups
        self.store = store
        self.pager: Pager | None = store.pager
        self.cold: ColdTail | None = store.cold
        # read at every dispatch: their makers never rebind them (collaborators' bound methods are not
        # cached likewise: on CPython 3.11 calling one from a slot costs more than self.groups.method())
        self.takers = consumers.takers
        self.browsers = consumers.browsers
        self.unassigned = groups.unassigned
        self.delayed = store.delayed
        self.use_counter = itertools.count(1)  # Consumer.last_used: spreads ties round-robin
        self.starved = False  # the last dispatch left a taker or browser with credit and nothing to take
        self.leases = Leases(settings, consumers)  # when a consumer that stopped settling loses its groups

    def dispatch(self, now_ms: int, effects: list) -> None:
        self.starved = False
        self.leases.now_ms = now_ms  # a lease starts at the delivery that finds its consumer holding none
        self._dispatch_takers(now_ms, effects)
        pager = self.pager
        if pager is not None and pager.waiting:
            pager.ask(self._lane_of, effects)
        cold = self.cold
        if cold is not None and cold.stored and not cold.asked:
            # starved: nothing warm for a consumer with credit, and no body is on its way either
            self.read_cold(self.starved and not pager.requested_bytes and not pager.waiting, effects)

    def read_cold(self, past_budget: bool, effects: list) -> None:
        """Ask the journal for the cold tail's next records, as many as the budget has room for (a whole
        batch `past_budget`), unless a read is out already."""
        count = self.cold.ask(past_budget)
        if count:
            effects.append(ReadRecords(self.settings.name, self.cold.after_seq, count, self.cold.read_max_bytes))

    def _lane_of(self, group):
        """A group's messages in seq order (None: the ungrouped lane); None when the group is gone."""
        if group is None:
            return self.groups.ungrouped
        return group.messages() if self.groups.groups.get(group.key) is group else None

    def _dispatch_takers(self, now_ms: int, effects: list) -> None:
        if self.delayed and self.delayed[0][0] <= now_ms:  # whichever call comes first past a delay
            self._release_delayed(now_ms)
        if self.browsers:
            self._dispatch_browsers(now_ms, effects)
        takers = self.takers
        if not takers or not self.consumers.dispatch_open(now_ms):
            return
        if self.consumers.selection is not None and dispatch_selecting(self, now_ms, effects):
            return
        unassigned = self.unassigned
        ungrouped = self.groups.ungrouped
        while takers:
            best_seq = -1
            best_group = None
            best_consumer = None
            for consumer in takers:
                entry = self._peek(consumer.ready, now_ms, effects)
                if entry is not None and (best_group is None or entry[0] < best_seq):
                    best_seq, best_group = entry
                    best_consumer = consumer
            entry = self._peek(unassigned, now_ms, effects)
            if entry is not None and (best_group is None or entry[0] < best_seq):
                best_seq, best_group = entry
                best_consumer = None
            loose = self._peek_ungrouped(ungrouped, now_ms, effects)
            if loose is not None and (best_group is None or loose.seq < best_seq):
                ungrouped.popleft()
                consumer = min(takers, key=least_recently_used)
                self._deliver(loose, consumer, False, effects)
                if self.pager is not None and self.pager.paged_bytes and ungrouped and consumer.may_take:
                    self._read_ahead(None, ungrouped)
                continue
            if best_group is None:
                self.starved = True
                return
            if best_consumer is None:
                heapq.heappop(unassigned)
                best_consumer = min(takers, key=fewest_groups)
                best_consumer.assign(best_group)
                first = True
            else:
                heapq.heappop(best_consumer.ready)
                first = False
            self._deliver_from_group(best_group, best_consumer, first, effects)

    def _deliver_from_group(self, group: Group, consumer: Consumer, first: bool, effects: list) -> None:
        if consumer.moved_in and group in consumer.moved_in:  # issue 30: an incremental rebalance moved it here
            consumer.moved_in.discard(group)
            first = True
        message = group.pop_head()
        group.available_count -= 1
        group.acquired += 1
        # PAUSED: free the group once this and every earlier message is settled
        group.placed = PAUSED if message.flags & CLOSES_GROUP else None
        self._deliver(message, consumer, first, effects)
        self.groups.place_or_forget(group)
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
        store = self.store
        store.acquired_messages += 1
        store.delivered_total += 1
        delivery_id = consumer.next_delivery_id
        consumer.next_delivery_id = delivery_id + 1
        if not consumer.unsettled and self.leases.lease_ms:
            self.leases.start(consumer)
        consumer.unsettled[delivery_id] = message
        consumer.last_used = next(self.use_counter)
        consumer.credit -= 1
        if not consumer.may_take:
            self.takers.remove(consumer)
        effects.append(Deliver(consumer.id, delivery_id, message, first, False))

    def _dispatch_browsers(self, now_ms: int, effects: list) -> None:
        log = self.store.log
        for browser in self.browsers:
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
                if browser.selector is not None and not browser.selector.matches(message):
                    browser.cursor_seq = message.seq
                    continue
                browser.cursor_seq = message.seq
                browser.credit -= 1
                message.handed_out = True  # a browser has seen it: a failed write cannot take it back unseen
                delivery_id = browser.next_delivery_id
                browser.next_delivery_id = delivery_id + 1
                effects.append(Deliver(browser.id, delivery_id, message, False, True))
            if browser.credit > 0 and index == len(log):
                self.starved = True  # at the warm part's end: a cold tail is read back for it

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
                group.placed = None  # expire re-places the group, or forgets it once idle
                self.store.expire(head, effects)
                continue
            if head.flags & PAGED:  # met by a consumer that could take it: ask for its body, it waits
                heapq.heappop(heap)
                group.placed = None
                self.pager.want(group)
                continue
            return entry
        return None

    def _peek_ungrouped(self, lane: deque, now_ms: int, effects: list) -> Message | None:
        while lane:
            head = lane[0]
            if head.flags & STATE_MASK != AVAILABLE:
                lane.popleft()
            elif head.expires_at_ms and head.expires_at_ms <= now_ms:
                lane.popleft()
                self.store.expire(head, effects)
            elif head.flags & PAGED:
                self.pager.want(None)  # the ungrouped lane waits for its head's body
                return None
            else:
                return head
        return None

    def _release_delayed(self, now_ms: int) -> None:
        delayed = self.delayed
        while delayed and delayed[0][0] <= now_ms:
            _, _, message = heapq.heappop(delayed)
            message.available_at_ms = 0
            if message.state != AVAILABLE:
                continue  # expired, purged or moved while it waited
            if message.group is None:
                insert_in_order(self.groups.ungrouped, message, True)
            else:
                self.groups.place_or_forget(message.group)


def _seq_of(message: Message) -> int:
    return message.seq
