"""Dispatch when consumers carry JMS selectors: which message goes to which consumer. Pure: time is `now_ms`.

The rules (docs/selectors.md, "Groups and selectors"), on top of node/core/dispatch/queue_dispatch.py's:
- A consumer receives a message only when its selector is TRUE for it (no selector: every message).
- A group's messages stay in one FIFO lane and only its head is a candidate. When the head is one its
  consumer's selector refuses, that consumer lets the group go: at once when nothing of the group is
  in flight, else once it is settled (the group is PAUSED meanwhile, as a rebalance's hand-over is).
  The head then goes to the consumer with credit and the fewest groups among those whose selector
  selects it. So a consumer never holds back a message it refuses, and message n+1 of a group is
  never delivered while message n is unsettled elsewhere: each consumer sees a group's messages it
  selects in group order.
- A group whose head no consumer with credit selects is passed over for this dispatch (it waits for
  their credit); one whose head no attached consumer selects at all is `stranded`: out of every heap,
  so it costs nothing, until a consumer attaches (Selection.unstrand_due). It stays queued, as JMS
  queues keep unselected messages, and never delays another group.
- Ungrouped messages: the first in queue order that a consumer with credit selects goes to the least
  recently used of those consumers. The scan starts over at each dispatch; it passes by the
  unselected messages before it (Artemis scans likewise), so a long run of messages nobody selects
  costs one look each per dispatch; that is the price of keeping them.
- A message's fields are read once, on a selector's first look (MessageSelector.matches), and kept on
  the message (`Message.fields`) while it is a candidate: dropped when it is delivered, and kept only
  by the first UNGROUPED_FIELDS_KEPT_MAX unselected messages of the ungrouped lane, so what they cost
  stays bounded (a group keeps them for its head alone). A queue whose consumers have no selector
  never reads them, and its dispatch never enters this module (Consumers.selection is None).
- A consumer that has no credit keeps the groups it has, as without selectors; its heap's first group
  is still let go when it refuses that group's head, so a group waiting on it is freed once it surfaces.
- Consumer-chosen groups (issue 30): a consumer whose selector is exactly `JMSXGroupID = 'X'` is group X's
  consumer: while it is attached every other consumer refuses X's messages, and X is taken from the
  consumer that had it (credit or not) once that one's in-flight messages of X are settled, as a reset
  with pause does; X then goes to the chooser and waits for its credit.
  Two such consumers of one group: the one attached first serves it, the next one takes over when it
  leaves.
"""

from __future__ import annotations

import heapq
from collections import deque
from itertools import islice

from node.core.dispatch.message import AVAILABLE, PAGED, STATE_MASK
from node.core.dispatch.queue_lanes import PAUSED


# unselected messages of the ungrouped lane that keep their fields (a few hundred bytes each) between
# dispatches, from the lane's head; past them a message's fields are read at each look and dropped
UNGROUPED_FIELDS_KEPT_MAX = 1024


class MessageSelector:
    """A consumer's compiled selector and how to read a message's fields for it: the reader is the
    adapter's (node.amqp.message_fields.MessageFields), since the core never decodes AMQP."""

    __slots__ = ("selector", "read_fields")

    def __init__(self, selector, read_fields):
        self.selector = selector  # node.core.dispatch.selector.Selector
        self.read_fields = read_fields  # payload bytes -> a mapping-like view (`get(name)`)

    @property
    def text(self) -> str:
        return self.selector.text

    @property
    def group_id(self) -> str | None:
        return self.selector.group_id

    def matches(self, message) -> bool:
        fields = message.fields
        if fields is None:  # read once per message, shared by every selector that looks at it
            fields = message.fields = self.read_fields(message.payload)
        return self.selector.matches(fields)


class Selection:
    """A queue's selecting state, kept while one of its acquiring consumers has a selector."""

    __slots__ = ("selecting", "stranded", "unstrand_due", "chosen", "choosing_changed")

    def __init__(self):
        self.selecting = 0  # acquiring consumers with a selector
        self.chosen: dict = {}  # group key -> the consumer that chose it (JMSXGroupID = 'X'); empty mostly
        self.choosing_changed = False  # a consumer that chose a group came or went: `chosen` is made again
        # groups whose head no attached consumer selects, each once (an arrival may place one again);
        # stale ones (placed since, or forgotten) are dropped when looked at
        self.stranded: dict = {}
        self.unstrand_due = False  # a consumer attached: stranded groups are looked at again


def selects(consumer, message, chosen: dict) -> bool:
    if chosen and message.group is not None:
        chooser = chosen.get(message.group.key)
        if chooser is not None and chooser is not consumer:
            return False  # the group is another consumer's choice
    selector = consumer.selector
    return selector is None or selector.matches(message)


def dispatch_selecting(dispatcher, now_ms: int, effects: list) -> bool:
    """The takers' dispatch while a selection is on; False once it is over (the plain path takes on)."""
    acquiring = _start(dispatcher, now_ms, effects)
    if acquiring is None:
        return False
    takers = dispatcher.takers
    unassigned = dispatcher.unassigned
    ungrouped = dispatcher.groups.ungrouped
    waiting: list = []  # unassigned entries no taker selects now: back in the heap when this dispatch ends
    scan_from = 0
    try:
        while takers:
            best_seq = -1
            best_group = None
            best_consumer = None
            for consumer in takers:
                entry = _selected_top(dispatcher, consumer, now_ms, effects)
                if entry is not None and (best_group is None or entry[0] < best_seq):
                    best_seq, best_group = entry
                    best_consumer = consumer
            entry, choosers = _unassigned_top(dispatcher, acquiring, waiting, now_ms, effects)
            if entry is not None and (best_group is None or entry[0] < best_seq):
                best_seq, best_group = entry
                best_consumer = None
            found = _first_ungrouped(dispatcher, ungrouped, scan_from, now_ms, effects)
            if found is not None and (best_group is None or found[1].seq < best_seq):
                index, loose, loose_choosers = found
                del ungrouped[index]
                loose.fields = None  # in flight, it is no candidate: its fields are read again if it comes back
                dispatcher._deliver(loose, min(loose_choosers, key=_least_recently_used), False, effects)
                scan_from = index  # the messages before it are selected by no taker left
                continue
            if best_group is None:
                dispatcher.starved = True
                return True
            if best_consumer is None:
                heapq.heappop(unassigned)
                best_consumer = min(choosers, key=_fewest_groups)
                best_consumer.assign(best_group)
                first = True
            else:
                heapq.heappop(best_consumer.ready)
                first = False
            _head(best_group).fields = None  # as for an ungrouped one
            dispatcher._deliver_from_group(best_group, best_consumer, first, effects)
        return True
    finally:
        for entry in waiting:
            heapq.heappush(unassigned, entry)


def _start(dispatcher, now_ms: int, effects: list) -> list | None:
    """Bring the selection up to date with its consumers; the acquiring consumers, or None once it is over."""
    consumers = dispatcher.consumers
    selection = consumers.selection
    if selection.choosing_changed:
        selection.choosing_changed = False
        _choose(dispatcher, selection)
    if selection.unstrand_due or not selection.selecting:
        selection.unstrand_due = False
        _unstrand(dispatcher, selection)
    if not selection.selecting:
        consumers.selection = None
        return None
    acquiring = [consumer for consumer in consumers.by_id.values() if not consumer.browse]
    takers = dispatcher.takers
    for consumer in acquiring:
        if consumer.selector is not None and consumer not in takers:
            _selected_top(dispatcher, consumer, now_ms, effects)  # lets go a refused head it would hold back
    return acquiring


def _head(group):
    lane = group.lane
    return lane[0] if type(lane) is deque else lane


def _selected_top(dispatcher, consumer, now_ms: int, effects: list):
    """The consumer's first ready entry whose head it selects; refused heads' groups are let go on the way."""
    ready = consumer.ready
    while True:
        entry = dispatcher._peek(ready, now_ms, effects)
        if entry is None or selects(consumer, _head(entry[1]), dispatcher.consumers.selection.chosen):
            return entry
        heapq.heappop(ready)
        group = entry[1]
        if group.acquired:
            group.placed = PAUSED  # Settlement.after_settle frees it once its in-flight messages are settled
        else:
            consumer.unassign(group)
            dispatcher.groups.place_or_forget(group)  # into the unassigned heap


def _unassigned_top(dispatcher, acquiring: list, waiting: list, now_ms: int, effects: list):
    """(entry, the takers that select its head) for the first unassigned group some taker selects."""
    unassigned = dispatcher.unassigned
    while True:
        entry = dispatcher._peek(unassigned, now_ms, effects)
        if entry is None:
            return None, None
        head = _head(entry[1])
        chosen = dispatcher.consumers.selection.chosen
        choosers = [taker for taker in dispatcher.takers if selects(taker, head, chosen)]
        if choosers:
            return entry, choosers
        heapq.heappop(unassigned)
        if any(selects(consumer, head, chosen) for consumer in acquiring):
            waiting.append(entry)  # a consumer without credit selects it
        else:
            group = entry[1]
            group.placed = None
            dispatcher.consumers.selection.stranded[group] = None


def _first_ungrouped(dispatcher, lane: deque, start: int, now_ms: int, effects: list):
    """(index, message, the takers that select it) for the first ungrouped message from `start` on."""
    if not start and dispatcher._peek_ungrouped(lane, now_ms, effects) is None:
        return None  # empty, or its head's body is asked for (dead heads are dropped on the way)
    takers = dispatcher.takers
    index = start
    for message in islice(lane, start, None):
        flags = message.flags
        if flags & STATE_MASK == AVAILABLE and not (message.expires_at_ms and message.expires_at_ms <= now_ms):
            if flags & PAGED:
                dispatcher.pager.want(None)  # the lane waits for this body; page_in dispatches again
                return None
            choosers = [taker for taker in takers if selects(taker, message, None)]  # no group, none chosen
            if choosers:
                return index, message, choosers
            if index >= UNGROUPED_FIELDS_KEPT_MAX:
                message.fields = None  # memory stays bounded: past the bound, read again at the next look
        index += 1
    return None


def _choose(dispatcher, selection: Selection) -> None:
    """Which consumer serves each chosen group: the first attached of those that chose it."""
    chosen: dict = {}
    key_of = dispatcher.groups.key_of
    for consumer in dispatcher.consumers.by_id.values():  # attach order
        selector = consumer.selector
        if selector is not None and not consumer.browse and selector.group_id is not None:
            key = key_of(selector.group_id)
            if key is not None:
                chosen.setdefault(key, consumer)
    selection.chosen = chosen
    table = dispatcher.groups
    for key, chooser in chosen.items():
        group = table.groups.get(key)
        if group is not None and group.consumer is not None and group.consumer is not chooser:
            table.reset([group], True)  # taken from its consumer, credit or not, once its in-flight ones settle


def _unstrand(dispatcher, selection: Selection) -> None:
    """Stranded groups go back to the unassigned heap, to be looked at with the consumers there are now."""
    stranded, selection.stranded = selection.stranded, {}
    table = dispatcher.groups
    for group in stranded:
        if table.groups.get(group.key) is group and group.placed is None:
            table.place_or_forget(group)


def _least_recently_used(consumer) -> int:
    return consumer.last_used


def _fewest_groups(consumer) -> tuple[int, int]:
    return (consumer.assigned_count, consumer.last_used)
