"""What of one owner's outbound channel is with its forwarder, and what waits for room there.

Rules:
- Pure data, owned by the outbound store (node/core/cluster/outbound.py), which decides what moves between
  them: the forwarder holds at most outbound_memory_max_bytes of an owner's entries unacknowledged
  (at least one), and the rest waits here, in forward seq order.
- A waiting entry is whole (an Entry, its body in memory: not journalled, it cannot page) or paged
  (its seq alone, the body in the journal). Runs of paged seqs are kept in arrays (8 bytes a seq, not
  an int object and a deque slot: a dead owner's backlog is all paged), and the room of what was
  taken is given back once at least half of a run and CHANNEL_COMPACT_MIN_ENTRIES.
- While a read-back of paged entries is out, the entries it takes out wait in `run`, submitted together
  once every journal name's answer is back.
"""

from __future__ import annotations

from array import array
from collections import deque

from node.core.cluster.outbound_channel import CHANNEL_COMPACT_MIN_ENTRIES
from node.core.cluster.outbound_entry import Entry


class Waiting:
    """A line's ready entries not given yet, in seq order: whole Entries, and runs of paged seqs kept in
    arrays (8 bytes a seq, not an int object and a deque slot: a dead owner's backlog is all paged)."""

    __slots__ = ("items", "head")
    compact_min_entries = CHANNEL_COMPACT_MIN_ENTRIES

    def __init__(self):
        self.items: deque = deque()  # Entry, or array("q") of paged seqs
        self.head = 0  # the index of the first seq not taken yet in items[0], if that is a run

    def __bool__(self) -> bool:
        return bool(self.items)

    def append(self, item) -> None:
        """An Entry (whole) or a paged entry's seq."""
        items = self.items
        if type(item) is not int:
            items.append(item)
        elif items and type(items[-1]) is array:
            items[-1].append(item)
        else:
            items.append(array("q", (item,)))

    def first(self):
        first = self.items[0]
        return first[self.head] if type(first) is array else first

    def popleft(self):
        items = self.items
        first = items[0]
        if type(first) is not array:
            return items.popleft()
        item = first[self.head]
        self.head += 1
        if self.head == len(first):
            items.popleft()
            self.head = 0
        elif self.head >= self.compact_min_entries and 2 * self.head >= len(first):
            del first[:self.head]  # give back the room of what was taken
            self.head = 0
        return item


class Line:
    """What of one owner's channel is with its forwarder, and what waits for room there."""

    __slots__ = ("submitted_top", "submitted_bytes", "waiting", "reading", "run", "run_paged", "read")

    def __init__(self):
        self.submitted_top = 0  # the highest forward seq given to the forwarder
        self.submitted_bytes = 0  # payload bytes given to the forwarder and not acknowledged yet
        # ready entries not given yet, in seq order: an Entry (whole in memory) or its seq (paged)
        self.waiting = Waiting()
        self.reading: set[str] = set()  # journal names whose read-back is still out
        self.run: list = []  # the waiting items that read takes out, in order, submitted together
        self.run_paged: set[int] = set()  # the run's paged seqs not acknowledged meanwhile
        self.read: dict[int, Entry | None] = {}  # seq -> what the read brought back (None: missing)


def seq_of(item) -> int:
    """The forward seq of a waiting item: a paged entry's seq, or a whole Entry."""
    return item if type(item) is int else item.forward_seq
