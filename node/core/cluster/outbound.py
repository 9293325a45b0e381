"""The outbound store: messages accepted here for groups owned by other nodes, one channel per owner.

Pure, owned by the engine loop thread through the cluster protocol (node/core/cluster/forwarding.py),
which decides what enters a channel and when; this module keeps the channels (OutboundChannel,
node/core/cluster/outbound_channel.py), counts them and pages their bodies (Line, node/core/cluster/outbound_line.py).
Entry and the journal names are node/core/cluster/outbound_entry.py's. Rules:
- A channel holds its entries in forward seq order (the node seq a message was given here). Its
  owner acknowledges a high-water mark, and everything up to it leaves the channel. Per channel it
  counts messages and payload bytes: all of them (what outbound_max_bytes bounds), the journalled
  ones and the paged ones, and per (owner, group) the entries, which a move waits on.
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
  A non-journalled one (its queue is not durable, or it was sent non-durable) cannot page and waits
  whole, in its place. As the owner acknowledges, the oldest waiting entries are read back from the
  journal (ReadOutbound, one read per owner at a time; its answers come to `read_back`, a journal name
  at a time) and submitted, in order, once the whole read is back. So an owner that is down or slow
  costs this node the records of its backlog, not their bodies.
- A paged entry the journal no longer has cannot be sent: it leaves the channel, reported to the
  caller (`lost`), which logs it. The journal keeps every STORE until its REMOVE, so this means a
  damaged journal, never a race.
Never imports threading, grpc, pysyncobj, socket or time.
"""

from __future__ import annotations

import collections

from node.core.effects import ReadOutbound, SubmitForward
from node.core.dispatch.message import Message
from node.core.cluster.outbound_channel import OutboundChannel
from node.core.cluster.outbound_entry import OUTBOUND_PREFIX, Entry, entry_of, outbound_name, parse_outbound_name
from node.core.cluster.outbound_line import Line, seq_of

# OUTBOUND_PREFIX, Entry and the names are outbound_entry's; kept importable from here, where most callers look
__all__ = ["OUTBOUND_PREFIX", "Entry", "Outbound", "entry_of", "outbound_name", "parse_outbound_name"]


class Outbound:
    def __init__(self, memory_max_bytes: int = 0, counts: collections.Counter | None = None):
        self.memory_max_bytes = memory_max_bytes  # per owner, see the header; 0 = no bound
        # entries paged and read back, for metrics and the simulation: outbound_paged, outbound_read_back
        self.counts = counts if counts is not None else collections.Counter()
        # owner node -> its channel: forward seq -> (route key, journal name or None, payload bytes), in
        # seq order (a channel stays once made, perhaps empty)
        self.channels: dict[str, OutboundChannel] = {}
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
        self._lines: dict[str, Line] = {}
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
            channel = self.channels[owner] = OutboundChannel(owner, self.journal_name)
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
            line = self._lines[owner] = Line()
        channel = self.channels[owner]
        waiting = line.waiting
        submit = []
        for entry in entries:
            seq = seq_of(entry)
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

    def _room(self, line: Line, taken_bytes: int, size_bytes: int) -> bool:
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
            seq = seq_of(item)
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

    def _submit(self, owner: str, line: Line, entries: list, effects: list) -> None:
        if entries:
            channel = self.channels[owner]
            line.submitted_bytes += sum(channel.size_of(entry.forward_seq) for entry in entries)
            line.submitted_top = entries[-1].forward_seq
            effects.append(SubmitForward(owner, entries))
        self._pump(owner, effects)

    # ---- leaving the channel --------------------------------------------------------------------------

    def _drop(self, owner: str, channel: OutboundChannel, seq: int) -> tuple:
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
            elif line.waiting and seq_of(line.waiting.first()) == seq:
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



def _count_up(counts: dict, key, amount: int) -> None:
    if amount:
        counts[key] = counts.get(key, 0) + amount


def _count_down(counts: dict, key, amount: int) -> None:
    left = counts.get(key, 0) - amount
    if left:
        counts[key] = left
    else:
        counts.pop(key, None)
