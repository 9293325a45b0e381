"""The outbound store: messages accepted here for groups owned by other nodes, one channel per owner.

Pure, owned by the engine loop thread through the cluster protocol (node/core/cluster/forwarding.py),
which decides what enters a channel and when; this module keeps the channels, counts them and pages
their bodies. Rules:
- A channel holds its entries in forward seq order (the node seq a message was given here). Its
  owner acknowledges a high-water mark, and everything up to it leaves the channel. Per channel it
  counts messages and payload bytes: all of them (what outbound_max_bytes bounds), the journalled
  ones and the paged ones, and per (owner, group) the entries, which a move waits on. The entries of
  one group share one route key tuple while any is in the channel: a record is kept per message.
- A channel (`Channel`) keeps its records in parallel arrays, not objects: the forward seq (8 bytes),
  the payload size (8), the id of its route key in the channel's key table (4) and a flag byte
  (journalled; dead), ~21.5 bytes an entry with the arrays' spare room; a paged entry's seq in its
  line's waiting run adds 8: ~30 bytes a paged entry (bench/memory.py outbound_paged; 146 as a dict
  of tuples and a deque of ints). The journal name is not kept: it is the channel's name for the
  key's queue (another name, which only tests give, is kept by seq). An acknowledgement moves a head
  index past the oldest; a forgotten or lost entry elsewhere is flagged dead and skipped everywhere;
  the arrays are compacted once the acknowledged and dead entries are at least half of them and at
  least CHANNEL_COMPACT_MIN_ENTRIES, so their memory is given back. To its callers a channel is a
  read-only mapping seq -> (route key, journal name or None, payload bytes) in seq order, as the
  dict it replaced was.
- An entry is *ready* once its batch is on disk (`ready`; recovered entries at once, as bare seqs
  when recovery left their bodies in the journal: paged from the start). Ready entries
  go to the owner's forwarder (SubmitForward) in forward seq order, never out of it: the owner skips
  a forward seq at or below its high water as a resend, so a later entry overtaking an earlier one
  would lose the earlier.
- Paging, with `memory_max_bytes` per owner (0 = none): the forwarder is given ready entries only
  while the bytes it holds unacknowledged stay within the budget, and always at least one, so an
  entry larger than the budget still goes. A ready journalled entry that cannot go yet is paged: the
  channel keeps only its record (seq, group, journal name, size) and the body lives in the journal;
  the forwarder's line keeps the waiting paged seqs as runs in arrays (8 bytes each), not as ints.
  A non-journalled one (its queue is not durable) cannot page and waits whole, in its place. As the
  owner acknowledges, the oldest waiting entries are read back from the journal (ReadOutbound, one
  read per owner at a time; its answers come to `read_back`, a journal name at a time) and
  submitted, in order, once the whole read is back. So an owner that is down or slow costs this node
  the records of its backlog, not their bodies.
- A paged entry the journal no longer has cannot be sent: it leaves the channel, reported to the
  caller (`lost`), which logs it. The journal keeps every STORE until its REMOVE, so this means a
  damaged journal, never a race.
Never imports threading, grpc, pysyncobj, socket or time.
"""

from __future__ import annotations

import collections
from array import array
from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Mapping
from typing import NamedTuple

from node.core.effects import ReadOutbound, SubmitForward
from node.core.message import Message

OUTBOUND_PREFIX = "\x00out\x00"  # journal name of an outbound channel: prefix, owner, NUL, queue
# a channel compacts its arrays once this many of their entries are dead (and at least half of them):
# below it, the dead records cost less than copying the live ones would
CHANNEL_COMPACT_MIN_ENTRIES = 4096
_JOURNALLED = 1  # a channel entry's flag: its body is in the journal (under the channel's name for its queue)
_DEAD = 2  # a channel entry's flag: forgotten (or lost), skipped until the arrays are compacted
_OTHER_NAME = 4  # a channel entry's flag: journalled under a name of its own (Channel.other_names)


class Entry(NamedTuple):
    """A message on its way to its owner: what a forwarder sends and the owner's servicer receives."""

    forward_seq: int
    queue: str
    group_id: str | None  # None: ungrouped; "" is a group of its own
    payload: bytes  # the encoded AMQP message as received
    expires_at_ms: int  # 0: never
    closes_group: bool
    enqueued_at_ms: int


def outbound_name(owner: str, queue: str) -> str:
    return f"{OUTBOUND_PREFIX}{owner}\x00{queue}"


def parse_outbound_name(name: str) -> tuple[str, str]:
    owner, _, queue = name[len(OUTBOUND_PREFIX):].partition("\x00")
    return owner, queue


def entry_of(queue: str, message: Message) -> Entry:
    return Entry(message.seq, queue, message.group_id, bytes(message.payload), message.expires_at_ms or 0,
                 message.closes_group, message.enqueued_at_ms or 0)


class Channel(Mapping):
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


class _Waiting:
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


class _Line:
    """What of one owner's channel is with its forwarder, and what waits for room there."""

    __slots__ = ("submitted_top", "submitted_bytes", "waiting", "reading", "run", "run_paged", "read")

    def __init__(self):
        self.submitted_top = 0  # the highest forward seq given to the forwarder
        self.submitted_bytes = 0  # payload bytes given to the forwarder and not acknowledged yet
        # ready entries not given yet, in seq order: an Entry (whole in memory) or its seq (paged)
        self.waiting = _Waiting()
        self.reading: set[str] = set()  # journal names whose read-back is still out
        self.run: list = []  # the waiting items that read takes out, in order, submitted together
        self.run_paged: set[int] = set()  # the run's paged seqs not acknowledged meanwhile
        self.read: dict[int, Entry | None] = {}  # seq -> what the read brought back (None: missing)


class Outbound:
    def __init__(self, memory_max_bytes: int = 0, counts: collections.Counter | None = None):
        self.memory_max_bytes = memory_max_bytes  # per owner, see the header; 0 = no bound
        # entries paged and read back, for metrics and the simulation: outbound_paged, outbound_read_back
        self.counts = counts if counts is not None else collections.Counter()
        # owner node -> its channel: forward seq -> (route key, journal name or None, payload bytes), in
        # seq order (a channel stays once made, perhaps empty)
        self.channels: dict[str, Channel] = {}
        # owner -> route key -> entries in its channel; no zeros: each channel's own key_counts. Each key
        # has one tuple (and group id string), shared by its entries' records while any is in the channel
        # (the channel's key table), not one each. Per owner, not by (owner, route key): that tuple would
        # cost a group of one entry more than sharing saves.
        self.key_counts: dict[str, dict[tuple, int]] = {}
        self.depth_bytes: dict[str, int] = {}  # owner -> payload bytes in its channel; no zeros
        self.journal_bytes: dict[str, int] = {}  # owner -> of those, bytes of journalled entries; no zeros
        self.journal_messages: dict[str, int] = {}  # owner -> journalled entries in its channel; no zeros
        self.paged_bytes: dict[str, int] = {}  # owner -> of those, bytes of paged entries; no zeros
        self.paged_messages: dict[str, int] = {}  # owner -> paged entries in its channel; no zeros
        self.total_bytes = 0  # payload bytes in every channel
        self.lost: list[tuple[str, int]] = []  # (journal name, seq) paged and gone from the journal, to report
        self._lines: dict[str, _Line] = {}
        self._names: dict[tuple[str, str], str] = {}  # (owner, queue) -> its journal name, one string for all

    def journal_name(self, owner: str, queue: str) -> str:
        """The journal name of `owner`'s channel entries of `queue`: one string object that every entry's
        record shares, not one per entry (~60 bytes each)."""
        name = self._names.get((owner, queue))
        if name is None:
            name = self._names[(owner, queue)] = outbound_name(owner, queue)
        return name

    def add(self, owner: str, seq: int, key: tuple[str, str], journal_name: str | None, size_bytes: int) -> None:
        """Entry `seq` (above every seq in the channel) for `owner`; `journal_name` None (not journalled) or,
        as the product names them, journal_name(owner, key[0]), which the record does not keep."""
        channel = self.channels.get(owner)
        if channel is None:
            channel = self.channels[owner] = Channel(owner, self.journal_name)
            self.key_counts[owner] = channel.key_counts
        channel.append(seq, key, journal_name, size_bytes)
        _count_up(self.depth_bytes, owner, size_bytes)
        self.total_bytes += size_bytes
        if journal_name is not None:
            _count_up(self.journal_bytes, owner, size_bytes)
            _count_up(self.journal_messages, owner, 1)

    def count(self, owner: str, key: tuple[str, str]) -> int:
        """Entries of group `key` on their way to `owner` (not acknowledged yet)."""
        return self.key_counts.get(owner, {}).get(key, 0)

    # ---- to the forwarder, paged past the budget -----------------------------------------------------

    def ready(self, owner: str, entries: list, effects: list) -> None:
        """`entries` (added already, in seq order, above any ready before) may leave for `owner`: those
        the budget has room for are submitted, the rest wait, the journalled ones paged. An entry may be
        given as its bare seq: journalled, its body not in memory (a restart's), so paged at once."""
        line = self._lines.get(owner)
        if line is None:
            line = self._lines[owner] = _Line()
        channel = self.channels[owner]
        waiting = line.waiting
        submit = []
        for entry in entries:
            seq = _seq_of(entry)
            record = channel.get(seq)
            if record is None:
                continue  # acknowledged or forgotten meanwhile
            size_bytes = record[2]
            if type(entry) is not int and not waiting and not line.reading and self._room(line, 0, size_bytes):
                submit.append(entry)
                line.submitted_bytes += size_bytes
                line.submitted_top = seq
            elif record[1] is not None:
                waiting.append(seq)
                self._page(owner, size_bytes)
            else:
                waiting.append(entry)
        if submit:
            effects.append(SubmitForward(owner, submit))
        self._pump(owner, effects)  # paged ones first in line are read back while the budget has room

    def _room(self, line: _Line, taken_bytes: int, size_bytes: int) -> bool:
        """Whether the forwarder may hold `size_bytes` more, on top of `taken_bytes` on their way to it."""
        held_bytes = line.submitted_bytes + taken_bytes
        return not self.memory_max_bytes or not held_bytes or held_bytes + size_bytes <= self.memory_max_bytes

    def _pump(self, owner: str, effects: list) -> None:
        """Give the forwarder the oldest waiting entries the budget has room for, reading paged ones back
        first (their read holds back every later entry of this owner)."""
        line = self._lines.get(owner)
        if line is None or line.reading or not line.waiting:
            return
        channel, waiting = self.channels[owner], line.waiting
        run, reads, run_bytes = [], {}, 0
        while waiting:
            item = waiting.first()
            seq = _seq_of(item)
            _key, journal_name, size_bytes = channel[seq]
            if not self._room(line, run_bytes, size_bytes):
                break
            waiting.popleft()
            run.append(item)
            run_bytes += size_bytes
            if type(item) is int:
                reads.setdefault(journal_name, []).append(seq)
        if not run:
            return
        if not reads:
            self._submit(owner, line, run, effects)
            return
        line.run = run
        line.run_paged = {item for item in run if type(item) is int}
        line.reading = set(reads)
        effects.append(ReadOutbound(owner, tuple((name, tuple(seqs)) for name, seqs in reads.items())))

    def read_back(self, name: str, records: dict[int, Message | None], effects: list) -> None:
        """The journal's answer to a ReadOutbound for journal name `name`: seq -> Message, None if missing."""
        owner, queue = parse_outbound_name(name)
        line = self._lines.get(owner)
        if line is None or name not in line.reading:
            return  # nothing of this store asked for it
        line.reading.discard(name)
        for seq, message in records.items():
            line.read[seq] = entry_of(queue, message) if message is not None else None
        if line.reading:
            return
        run, read, run_paged = line.run, line.read, line.run_paged
        line.run, line.read, line.run_paged = [], {}, set()
        channel = self.channels[owner]
        entries = []
        for item in run:
            if type(item) is not int:
                if item.forward_seq in channel:  # else acknowledged meanwhile
                    entries.append(item)
                continue
            if item not in run_paged:
                continue  # acknowledged while it was being read: the owner has it (counted then)
            _key, journal_name, size_bytes = channel[item]
            self._unpage(owner, size_bytes)
            self.counts["outbound_read_back"] += 1
            entry = read.get(item)
            if entry is None:
                self.lost.append((journal_name, item))
                self._drop(owner, channel, item)
            else:
                entries.append(entry)
        self._submit(owner, line, entries, effects)

    def _page(self, owner: str, size_bytes: int) -> None:
        _count_up(self.paged_bytes, owner, size_bytes)
        _count_up(self.paged_messages, owner, 1)
        self.counts["outbound_paged"] += 1

    def _unpage(self, owner: str, size_bytes: int) -> None:
        _count_down(self.paged_bytes, owner, size_bytes)
        _count_down(self.paged_messages, owner, 1)

    def _submit(self, owner: str, line: _Line, entries: list, effects: list) -> None:
        if entries:
            channel = self.channels[owner]
            line.submitted_bytes += sum(channel.size_of(entry.forward_seq) for entry in entries)
            line.submitted_top = entries[-1].forward_seq
            effects.append(SubmitForward(owner, entries))
        self._pump(owner, effects)

    # ---- leaving the channel --------------------------------------------------------------------------

    def _drop(self, owner: str, channel: Channel, seq: int) -> tuple:
        record = channel.pop(seq)
        self._count_out(owner, record)
        return record

    def _count_out(self, owner: str, record: tuple) -> None:
        _key, journal_name, size_bytes = record
        _count_down(self.depth_bytes, owner, size_bytes)
        self.total_bytes -= size_bytes
        if journal_name is not None:
            _count_down(self.journal_bytes, owner, size_bytes)
            _count_down(self.journal_messages, owner, 1)

    def acknowledge(self, owner: str, high_water: int, effects: list | None = None) -> list[tuple[str, int]]:
        """Drop what `owner` now holds; returns (journal name, seq) of the journalled ones. With
        `effects`, what waits takes the room this made (see the header)."""
        channel = self.channels.get(owner)
        if not channel:
            return []
        done = channel.pop_through(high_water)
        journalled = []
        line = self._lines.get(owner)
        for seq, record in done:
            self._count_out(owner, record)
            _key, journal_name, size_bytes = record
            if line is None:
                pass
            elif seq <= line.submitted_top:
                line.submitted_bytes -= size_bytes
            elif line.waiting and _seq_of(line.waiting.first()) == seq:
                # never given to this forwarder: the owner took it before a restart here, and its
                # acknowledgement was lost
                if type(line.waiting.popleft()) is int:
                    self._unpage(owner, size_bytes)
            elif seq in line.run_paged:
                line.run_paged.discard(seq)  # likewise, while being read back: skipped when it is back
                self._unpage(owner, size_bytes)
            if journal_name is not None:
                journalled.append((journal_name, seq))
        if done and effects is not None:
            self._pump(owner, effects)
        return journalled

    def forget(self, owner: str, seqs) -> None:
        """Drop entries that must not be forwarded (their producers were refused); never ready ones."""
        channel = self.channels.get(owner)
        if channel is None:
            return
        for seq in seqs:
            if seq in channel:
                self._drop(owner, channel, seq)

    # ---- what it holds ----------------------------------------------------------------------------------

    def owners_by_key(self) -> dict[tuple[str, str], str]:
        """(queue, route key) -> the owner whose channel holds entries of it: one look per group, not per
        entry (a dead owner's paged backlog may hold a million entries of a few groups)."""
        return {key: owner for owner, counts in self.key_counts.items() for key in counts}

    def depths(self) -> dict[str, int]:
        return {owner: len(channel) for owner, channel in sorted(self.channels.items()) if channel}

    def stats(self) -> dict[str, dict[str, int]]:
        """Per owner with entries: messages and bytes waiting, those whose bodies are in memory (all but
        the paged ones) and those journalled."""
        return {owner: {"messages": len(channel), "bytes": self.depth_bytes.get(owner, 0),
                        "memory_messages": len(channel) - self.paged_messages.get(owner, 0),
                        "memory_bytes": self.depth_bytes.get(owner, 0) - self.paged_bytes.get(owner, 0),
                        "journal_messages": self.journal_messages.get(owner, 0),
                        "journal_bytes": self.journal_bytes.get(owner, 0)}
                for owner, channel in sorted(self.channels.items()) if channel}


def _seq_of(item) -> int:
    """The forward seq of a waiting item: a paged entry's seq, or a whole Entry."""
    return item if type(item) is int else item.forward_seq


def _count_up(counts: dict, key, amount: int) -> None:
    if amount:
        counts[key] = counts.get(key, 0) + amount


def _count_down(counts: dict, key, amount: int) -> None:
    left = counts.get(key, 0) - amount
    if left:
        counts[key] = left
    else:
        counts.pop(key, None)
