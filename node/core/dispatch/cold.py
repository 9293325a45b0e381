"""A durable queue's cold tail: its newest messages, counted in memory while the journal holds them.

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
  usual); then it is only counted, and the Message is let go: a cold message costs the core nothing.
- Being the queue's newest, the cold messages on disk are exactly its live records above `after_seq`
  (every warm message's seq is at most that, pending ones are newer than them all), and that is how
  the journal is asked for them: the next N records after `after_seq`, read back whole (`ReadRecords`,
  records with their bodies) and put in the warm part in seq order. A read also stops once the bodies
  it brought reach the node's `read_max_bytes` (READ_BACK_BYTES_MAX; one record larger than that still
  comes whole): 1,024 records of 1 MiB would otherwise be a GiB in memory at once. So a read comes back
  with fewer records than asked either because of that bound (the next read goes on) or because the
  journal lacks them, which `read_missing` tells apart: the journal stops short of the bound only at its
  last record. One read per queue at once, of as many as the budget has room for (at most
  PROMOTE_BATCH_RECORDS: what consumers settle while a read is out makes the next one larger); and past
  the budget, a whole batch whenever the queue is starved:
  a consumer with credit, or a browser, finds nothing to take in the warm part while no body is being
  read back. A queue asks when it dispatches: room another queue made is seen at its next tick. A slow
  consumer's groups can thus hold the warm part full and the others still get theirs: memory then
  grows by records, as it did before cold tails, never by lost order.
- A cold message's time to live is checked once it is read back (it expires then, as ActiveMQ's paged
  messages do when paged in); its depth counts until then.
- Which group a cold message belongs to is not known (a million cold groups cost nothing), so a purge
  or move of one group waits until its queue's cold tail is gone, and a queue purge reads the tail
  back batch by batch to purge it. Records the journal lacks on read-back (a broken journal, never a
  normal path) are dropped loudly, as a missing body is.
- In a cluster, while a queue has a cold tail the cluster protocol keeps alive every route of the
  queue naming this node, since the cold messages' groups are unknown. Where groups follow their
  consumers, a group moving away may have cold messages here: the protocol sweeps the tail (reads it
  through, its own reads, `frozen` meanwhile: no read-back for dispatch, so the two never read the same
  records and what the sweep took is gone from the journal's index before dispatch reads again) and
  hands over the moving groups' records it meets (`taken`), the rest left cold
  (node/core/cluster/sweep.py and docs/cluster-protocol.md say the rules of the handover).
"""

from __future__ import annotations

from collections import deque

from node.core.dispatch.message import COLD, JOURNALLED, REMOVED, STATE_MASK, Message

MESSAGE_RECORD_BYTES = 160  # a warm message's record: Message, seq int, browse-log and lane slots
GROUP_RECORD_BYTES = 256  # a warm group: Group, dict entry, id string, heap entry
PROMOTE_BATCH_RECORDS = 1024  # cold records read back together
READ_BACK_BYTES_MAX = 8 << 20  # body bytes past which a read of cold records stops (its last record whole)


class RecordBudget:
    """The node's warm records, shared by its durable queues."""

    __slots__ = ("max_bytes", "messages", "groups", "read_max_bytes")

    def __init__(self, max_bytes: int = 0):
        self.max_bytes = max_bytes  # 0: no budget, nothing goes cold
        self.read_max_bytes = READ_BACK_BYTES_MAX  # a read of cold records stops once its bodies reach this
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


def read_missing(asked: int, read: int, read_bytes: int, read_max_bytes: int) -> int:
    """Of `asked` cold records, how many the journal lacks, when a read brought back `read` of them holding
    `read_bytes` of bodies: a read stopped by its byte bound lacks nothing (the rest comes next)."""
    return asked - read if read < asked and read_bytes < read_max_bytes else 0


class ColdTail:
    __slots__ = ("budget", "pending", "pending_count", "pending_bytes", "stored", "asked", "after_seq",
                 "journal_bytes", "frozen")

    def __init__(self, budget: RecordBudget):
        self.budget = budget
        # seq order; whole, their STOREs not yet on disk. A withdrawn one stays (REMOVED) until it is at
        # the head: a failed batch withdraws thousands, and removing each from a long deque was quadratic
        self.pending: deque[Message] = deque()
        self.pending_count = 0  # live ones in `pending`
        self.pending_bytes = 0
        # cold messages on disk, only counted: they are the queue's live records above after_seq (every
        # warm message's seq is at most after_seq; pending ones are newer still), oldest first
        self.stored = 0
        self.asked = 0  # of those, the oldest being read back
        self.after_seq = 0
        self.journal_bytes = 0  # their payload bytes, for the queue's resident figure
        self.frozen = False  # the cluster sweeps the tail: nothing is read back for dispatch meanwhile

    @property
    def count(self) -> int:
        return self.pending_count + self.stored

    @property
    def read_max_bytes(self) -> int:
        return self.budget.read_max_bytes

    def admits(self) -> bool:
        """Whether an arrival goes cold (it would be the warm part's newest otherwise)."""
        return bool(self.pending_count) or bool(self.stored) or self.budget.full

    def add(self, message: Message) -> None:
        if not self.pending_count and not self.stored:
            self.after_seq = message.seq - 1  # a new tail: every warm message is older
        if message.flags & JOURNALLED and not self.pending_count:
            self.stored += 1  # its STORE is on disk already (a recovered record)
            self.journal_bytes += message.size_bytes
        else:
            message.flags |= COLD
            message.group = None
            self.pending.append(message)
            self.pending_count += 1
            self.pending_bytes += message.size_bytes

    def add_stored(self, count: int, after_seq: int, size_bytes: int) -> None:
        """Recovery: `count` live records above `after_seq` (newer than anything the queue holds)."""
        if not self.count:
            self.after_seq = after_seq
        self.stored += count
        self.journal_bytes += size_bytes

    def journalled(self) -> None:
        """Let go of the pending messages whose STOREs are on disk now, oldest first."""
        pending = self.pending
        while pending:
            flags = pending[0].flags
            if flags & STATE_MASK == REMOVED:
                pending.popleft()  # withdrawn
            elif flags & JOURNALLED:
                message = pending.popleft()
                message.flags &= ~COLD
                self.pending_count -= 1
                self.pending_bytes -= message.size_bytes
                self.stored += 1
                self.journal_bytes += message.size_bytes
            else:
                break

    def withdraw(self, message: Message) -> None:
        """A pending arrival whose write failed: gone (REMOVED), dropped from `pending` when at its head."""
        message.flags = message.flags & ~(COLD | STATE_MASK) | REMOVED
        self.pending_count -= 1
        self.pending_bytes -= message.size_bytes

    def ask(self, starved: bool) -> int:
        """How many of the oldest cold records to read back now (after `after_seq`), or 0."""
        if self.asked or self.frozen:
            return 0
        wanted = min(self.stored, PROMOTE_BATCH_RECORDS)
        if not starved:
            wanted = min(wanted, self.budget.room_records())  # while one read is out, settles add room
        self.asked = max(wanted, 0)
        return self.asked

    def promoted(self, read: int, missing: int, last_seq: int | None, size_bytes: int) -> int:
        """`read` of the asked records are warm now, holding `size_bytes`, the newest `last_seq` (None:
        none), and `missing` of them the journal lacks (read_missing). Returns the bytes of records the
        journal lacked, once known (when none is left on disk): the queue's depth had them."""
        self.stored -= read + missing
        self.asked = 0
        if last_seq is not None:
            self.after_seq = max(self.after_seq, last_seq)
        self.journal_bytes -= size_bytes
        lost_bytes = 0
        if not self.stored:
            lost_bytes, self.journal_bytes = self.journal_bytes, 0
        return lost_bytes

    def taken(self, size_bytes: int) -> None:
        """A stored cold record left the queue without being read back for it (a sweep handed it over)."""
        self.stored -= 1
        self.journal_bytes -= size_bytes

    def clear(self) -> None:
        for message in self.pending:
            message.flags &= ~COLD
        self.pending.clear()
        self.pending_count = self.pending_bytes = self.journal_bytes = 0
        self.stored = self.asked = 0
