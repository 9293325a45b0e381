"""A durable queue's cold tail: its newest messages, kept as seqs only while the journal holds the rest.

Pure: no I/O, no clock. Paging (paging.py) takes bodies out of memory but keeps each message's record: a
Message of ~160 bytes, and a Group of ~260 for a group of its own, so 10,000,000 queued messages cost
gigabytes before any body. Past the node's record budget a queue keeps not even that. The rules:
- The cold tail is a suffix of its queue in seq order: once an arrival goes cold, every later one goes
  cold too until the tail is empty again. Dispatch sees only the warm prefix, so order within a group
  holds: every cold message of a group is newer than all of its warm ones, and comes in after them.
- An arrival goes cold when its queue already has a cold tail, or when the warm records of all durable
  queues together (RecordBudget: each message counted as MESSAGE_RECORD_BYTES, each group as
  GROUP_RECORD_BYTES, measured by bench/memory.py) have reached the budget. Until the journal reports
  its STORE on disk it waits whole in `pending`, never dispatched (a failed write withdraws it as
  usual); then only its seq stays, 8 bytes in an array, and the Message is let go.
- The oldest cold messages are read back whole from the journal (`ReadRecords`, records with their
  bodies) and put in the warm part, in seq order, one read per queue at once, of as many as the budget
  has room for (at most PROMOTE_BATCH_RECORDS: what consumers settle while a read is out makes the
  next one larger); and past the budget, a whole batch whenever the queue is
  starved (a consumer with credit, or a browser, finds nothing to take in the warm part while no body
  is being read back). A queue asks when it dispatches: room another queue made is seen at its next
  tick. A slow consumer's groups can thus hold the warm part full, and the others still
  get theirs: memory then grows by records, as it did before cold tails, never by lost order.
- A cold message's time to live is checked once it is read back (it expires then, as ActiveMQ's paged
  messages do when paged in); its depth counts until then.
- Only seqs are known of cold messages: their groups are not (a million cold groups cost nothing), so a
  purge or move of one group waits until its queue's cold tail is gone, and a queue purge reads the
  tail back batch by batch to purge it. A message whose record the journal lacks on read-back (a broken
  journal, never a normal path) is dropped loudly, as a missing body is.
- Cold tails are for a node alone for now: in a cluster a group's messages must be known to hand the
  group over, so a clustered node keeps every record warm (bodies still page).
"""

from __future__ import annotations

from array import array
from collections import deque

from node.core.message import COLD, JOURNALLED, Message

MESSAGE_RECORD_BYTES = 160  # a warm message's record: Message, seq int, browse-log and lane slots
GROUP_RECORD_BYTES = 256  # a warm group: Group, dict entry, id string, heap entry
PROMOTE_BATCH_RECORDS = 1024  # cold records read back together
_COMPACT_MIN = 4096  # promoted seqs dropped from the array's front once this many and half of it


class RecordBudget:
    """The node's warm records, shared by its durable queues."""

    __slots__ = ("max_bytes", "messages", "groups")

    def __init__(self, max_bytes: int = 0):
        self.max_bytes = max_bytes  # 0: no budget, nothing goes cold
        self.messages = 0  # warm messages of every durable queue
        self.groups = 0  # their groups

    @property
    def used_bytes(self) -> int:
        return self.messages * MESSAGE_RECORD_BYTES + self.groups * GROUP_RECORD_BYTES

    @property
    def full(self) -> bool:
        return bool(self.max_bytes) and self.used_bytes >= self.max_bytes

    def room_records(self) -> int:
        """Messages (each of a group of its own, at worst) the budget still has room for."""
        return max(0, self.max_bytes - self.used_bytes) // (MESSAGE_RECORD_BYTES + GROUP_RECORD_BYTES)


class ColdTail:
    __slots__ = ("budget", "pending", "pending_bytes", "seqs", "start", "asked", "journal_bytes")

    def __init__(self, budget: RecordBudget):
        self.budget = budget
        self.pending: deque[Message] = deque()  # seq order; whole, their STOREs not yet on disk
        self.pending_bytes = 0
        self.seqs = array("q")  # seq order; [start:] are cold, [start:start + asked] being read back
        self.start = 0
        self.asked = 0
        self.journal_bytes = 0  # payload bytes of seqs[start:], for the queue's resident figure

    @property
    def count(self) -> int:
        return len(self.pending) + len(self.seqs) - self.start

    def admits(self) -> bool:
        """Whether an arrival goes cold (it would be the warm part's newest otherwise)."""
        return bool(self.pending) or len(self.seqs) > self.start or self.budget.full

    def add(self, message: Message) -> None:
        if message.flags & JOURNALLED and not self.pending:
            self.seqs.append(message.seq)  # recovered or read back: the journal has it already
            self.journal_bytes += message.size_bytes
        else:
            message.flags |= COLD
            message.group = None
            self.pending.append(message)
            self.pending_bytes += message.size_bytes

    def add_journalled(self, seqs, size_bytes: int) -> None:
        """Recovery: live seqs of the queue, ascending, newer than anything it holds."""
        if not self.seqs and type(seqs) is array and seqs.typecode == "q":
            self.seqs = seqs  # ten million seqs are 80 MB: adopted, not copied
        else:
            self.seqs.extend(seqs)
        self.journal_bytes += size_bytes

    def journalled(self) -> None:
        """Let go of the pending messages whose STOREs are on disk now, oldest first."""
        pending = self.pending
        while pending and pending[0].flags & JOURNALLED:
            message = pending.popleft()
            message.flags &= ~COLD
            self.pending_bytes -= message.size_bytes
            self.seqs.append(message.seq)
            self.journal_bytes += message.size_bytes

    def withdraw(self, message: Message) -> None:
        self.pending.remove(message)
        self.pending_bytes -= message.size_bytes
        message.flags &= ~COLD

    def ask(self, starved: bool) -> tuple:
        """The seqs to read back now (the oldest not asked for), or ()."""
        if self.asked:
            return ()
        wanted = min(len(self.seqs) - self.start, PROMOTE_BATCH_RECORDS)
        if not starved:
            wanted = min(wanted, self.budget.room_records())  # while one read is out, settles add room
        if wanted <= 0:
            return ()
        self.asked = wanted
        return tuple(self.seqs[self.start:self.start + wanted])

    def asked_seqs(self) -> tuple:
        return tuple(self.seqs[self.start:self.start + self.asked])

    def promoted(self, size_bytes: int) -> int:
        """The asked seqs are warm now (or dropped); `size_bytes` of them came back. Returns the bytes of
        records the journal lacked, once they are known (when no seq is left): the queue's depth had them."""
        self.start += self.asked
        self.asked = 0
        self.journal_bytes -= size_bytes
        lost_bytes = 0
        if self.start == len(self.seqs):
            lost_bytes, self.journal_bytes = self.journal_bytes, 0
            self.seqs = array("q")
            self.start = 0
        elif self.start >= _COMPACT_MIN and self.start * 2 >= len(self.seqs):
            del self.seqs[:self.start]
            self.start = 0
        return lost_bytes

    def clear(self) -> None:
        for message in self.pending:
            message.flags &= ~COLD
        self.pending.clear()
        self.pending_bytes = self.journal_bytes = 0
        self.seqs = array("q")
        self.start = self.asked = 0
