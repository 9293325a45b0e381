"""One owner's outbound channel: its entries in forward seq order, as parallel arrays.

Rules:
- Pure, owned by the outbound store (node/core/cluster/outbound.py), which alone changes it, never while
  anyone iterates it (a compaction moves the arrays under an iterator, where a dict would raise).
- A channel keeps its records in parallel arrays, not objects: the forward seq (8 bytes), the payload
  size (8), the id of its route key in the channel's key table (4) and a flag byte (journalled;
  dead), ~21.5 bytes an entry with the arrays' spare room; a paged entry's seq in its line's waiting
  run adds 8 (node/core/cluster/outbound_line.py): ~30 bytes a paged entry (bench/memory.py outbound_paged;
  146 as a dict of tuples and a deque of ints). The journal name is not kept: it is the channel's
  name for the key's queue (another name, which only tests give, is kept by seq).
- The entries of one group share one route key tuple while any is in the channel: a record is kept
  per message, the key once.
- An acknowledgement moves a head index past the oldest; a forgotten or lost entry elsewhere is
  flagged dead and skipped everywhere; the arrays are compacted once the acknowledged and dead
  entries are at least half of them and at least CHANNEL_COMPACT_MIN_ENTRIES, so their memory is
  given back. To its callers a channel is a read-only mapping seq -> (route key, journal name or
  None, payload bytes) in seq order, as the dict it replaced was.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Mapping

# a channel compacts its arrays once this many of their entries are dead (and at least half of them):
# below it, the dead records cost less than copying the live ones would
CHANNEL_COMPACT_MIN_ENTRIES = 4096
_JOURNALLED = 1  # a channel entry's flag: its body is in the journal (under the channel's name for its queue)
_DEAD = 2  # a channel entry's flag: forgotten (or lost), skipped until the arrays are compacted
_OTHER_NAME = 4  # a channel entry's flag: journalled under a name of its own (OutboundChannel.other_names)


class OutboundChannel(Mapping):
    """One owner's entries, in forward seq order, as parallel arrays (see the header): to read, a mapping
    seq -> (route key, journal name or None, payload bytes); changed only by its Outbound, never while
    anyone iterates it (a compaction moves the arrays under an iterator, where a dict would raise)."""

    __slots__ = ("owner", "seqs", "sizes", "key_ids", "flags", "head", "live", "flagged",
                 "key_counts", "other_names", "_key_ids", "_keys", "_free_ids", "_journal_name")
    compact_min_entries = CHANNEL_COMPACT_MIN_ENTRIES  # a class's, so a test's subclass may lower it

    def __init__(self, owner: str, journal_name):
        self.owner = owner
        self.seqs = array("q")  # forward seqs, ascending; those below `head` are acknowledged
        self.sizes = array("q")  # payload bytes
        self.key_ids = array("I")  # the entry's route key: an index into _keys
        self.flags = array("B")  # _JOURNALLED, _DEAD, _OTHER_NAME
        self.head = 0  # the index of the oldest live entry (or len(seqs)): never at a dead one
        self.live = 0  # entries neither acknowledged nor dead
        self.flagged = 0  # dead entries at or past `head`
        self.key_counts: dict[tuple, int] = {}  # route key -> live entries of it; no zeros
        # seq -> journal name of a live entry journalled under another name than the channel's for its
        # key's queue (none in the product, which names them so; kept so the mapping gives back any name)
        self.other_names: dict[int, str] = {}
        self._key_ids: dict[tuple, int] = {}  # route key -> its id while any entry of it is live
        self._keys: list = []  # id -> the one route key tuple its entries share (None: free)
        self._free_ids: list[int] = []
        self._journal_name = journal_name  # (owner, queue) -> the journal name, one string per channel

    # ---- read: a mapping in seq order ----------------------------------------------------------------

    def __len__(self) -> int:
        return self.live

    def __iter__(self):
        seqs, flags = self.seqs, self.flags
        if not self.flagged:  # no copy of the arrays: next(iter(channel)) is the head, at once
            return map(seqs.__getitem__, range(self.head, len(seqs)))
        return (seqs[index] for index in range(self.head, len(seqs)) if not flags[index] & _DEAD)

    def _index(self, seq) -> int:
        """The index of live entry `seq`, or -1."""
        seqs = self.seqs
        index = bisect_left(seqs, seq, self.head)
        if index < len(seqs) and seqs[index] == seq and not self.flags[index] & _DEAD:
            return index
        return -1

    def __contains__(self, seq) -> bool:
        return type(seq) is int and self._index(seq) >= 0

    def _record(self, index: int) -> tuple:
        key, flags = self._keys[self.key_ids[index]], self.flags[index]
        if not flags & _JOURNALLED:
            name = None
        elif flags & _OTHER_NAME:
            name = self.other_names[self.seqs[index]]
        else:
            name = self._journal_name(self.owner, key[0])
        return key, name, self.sizes[index]

    def __getitem__(self, seq) -> tuple:
        index = self._index(seq) if type(seq) is int else -1
        if index < 0:
            raise KeyError(seq)
        return self._record(index)

    def get(self, seq, default=None):
        index = self._index(seq) if type(seq) is int else -1
        return self._record(index) if index >= 0 else default

    def size_of(self, seq: int) -> int:
        """The payload bytes of live entry `seq` (KeyError if none): no record tuple made."""
        index = self._index(seq)
        if index < 0:
            raise KeyError(seq)
        return self.sizes[index]

    def items(self) -> list:
        """(seq, record) of every live entry, in seq order: a list, for tests and the simulation."""
        return [(self.seqs[index], self._record(index)) for index in self._live_indexes()]

    def values(self) -> list:
        return [self._record(index) for index in self._live_indexes()]

    def _live_indexes(self):
        flags = self.flags
        return (index for index in range(self.head, len(self.seqs)) if not flags[index] & _DEAD)

    # ---- changed by Outbound ---------------------------------------------------------------------------

    def append(self, seq: int, key: tuple, journal_name: str | None, size_bytes: int) -> None:
        seqs = self.seqs
        if len(seqs) > self.head and seqs[-1] >= seq:
            raise AssertionError(f"outbound channel to {self.owner}: forward seq {seq} after {seqs[-1]}")
        key_id = self._key_ids.get(key)
        if key_id is None:
            key_id = self._free_ids.pop() if self._free_ids else len(self._keys)
            if key_id == len(self._keys):
                self._keys.append(key)
            else:
                self._keys[key_id] = key
            self._key_ids[key] = key_id
            self.key_counts[key] = 1
        else:
            self.key_counts[self._keys[key_id]] += 1
        seqs.append(seq)
        self.sizes.append(size_bytes)
        self.key_ids.append(key_id)
        if journal_name is None:
            self.flags.append(0)
        elif journal_name == self._journal_name(self.owner, key[0]):
            self.flags.append(_JOURNALLED)
        else:
            self.flags.append(_JOURNALLED | _OTHER_NAME)
            self.other_names[seq] = journal_name
        self.live += 1

    def _release(self, index: int) -> tuple:
        """Count entry `index` out of its key (the key's id is freed with its last entry); its record."""
        record = self._record(index)
        key = record[0]
        left = self.key_counts[key] - 1
        if left:
            self.key_counts[key] = left
        else:  # the group's last entry left: its shared key goes with it
            del self.key_counts[key]
            key_id = self._key_ids.pop(key)
            self._keys[key_id] = None
            self._free_ids.append(key_id)
        if self.flags[index] & _OTHER_NAME:
            del self.other_names[self.seqs[index]]
        self.live -= 1
        return record

    def pop(self, seq: int) -> tuple:
        """Remove live entry `seq` (KeyError if none), wherever it is: flagged dead; its record."""
        index = self._index(seq)
        if index < 0:
            raise KeyError(seq)
        record = self._release(index)
        if index == self.head:
            self.head += 1
            self._skip_dead()
        else:
            self.flags[index] |= _DEAD
            self.flagged += 1
        self._compact()
        return record

    def pop_through(self, high_water: int) -> list[tuple[int, tuple]]:
        """Remove the entries up to forward seq `high_water`, from the head: (seq, record) of each."""
        seqs, flags, head = self.seqs, self.flags, self.head
        end = bisect_right(seqs, high_water, head)
        if end == head:
            return []
        done = [(seqs[index], self._release(index)) for index in range(head, end) if not flags[index] & _DEAD]
        self.flagged -= end - head - len(done)  # the dead ones passed are behind the head now
        self.head = end
        self._skip_dead()
        self._compact()
        return done

    def _skip_dead(self) -> None:
        flags, end = self.flags, len(self.seqs)
        while self.flagged and self.head < end and flags[self.head] & _DEAD:
            self.head += 1
            self.flagged -= 1

    def _compact(self) -> None:
        """Give back the arrays' room of acknowledged and dead entries once it is worth a copy (header)."""
        if not self.live:
            if self.seqs:  # nothing left: start again, no copy
                self.seqs, self.sizes, self.key_ids, self.flags = array("q"), array("q"), array("I"), array("B")
                self.head = self.flagged = 0
            return
        garbage = self.head + self.flagged
        if garbage < self.compact_min_entries or 2 * garbage < len(self.seqs):
            return
        if not self.flagged:
            for column in (self.seqs, self.sizes, self.key_ids, self.flags):
                del column[:self.head]
        else:
            kept = list(self._live_indexes())
            self.seqs, self.sizes, self.key_ids, self.flags = (
                array(column.typecode, [column[index] for index in kept])
                for column in (self.seqs, self.sizes, self.key_ids, self.flags))
            self.flagged = 0
        self.head = 0
