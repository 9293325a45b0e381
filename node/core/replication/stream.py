"""One owner -> backup stream's incarnation: its channel, its catch-up copy and where it stands toward the
in-sync set (docs/replication.md, "Catch-up"; issue 28). ReplicaStreams (streams.py) holds one per backup.

Rules:
- Pure: no threads, sockets or clock; time comes in as `now_ms`.
- An incarnation starts with a reset (ReplicaBatch.reset: the backup drops what it held of the owner and
  takes repl_seq from 1), then copies the owner's live messages of the groups the backup backs, queue by
  queue in seq order, then streams. It never starts while raft still lists the backup in sync from an
  earlier incarnation (the reset would empty a copy promotion may pick): the owner proposes it out of
  sync first and waits for the commit.
- The copy's cursor per queue says which changes go live: every live message of the queue with seq at or
  below the cursor was copied, so a change of such a message is streamed; a change of a later one is
  not (the copy will read the message as it is then, or not at all once it is gone). A queue the copy
  did not list (declared later) streams everything; a finished queue's cursor is COPIED (everything).
- The copy is paced by the caller (a byte budget per step). A message whose body is not in memory (paged
  out, or in a cold tail) cannot be copied from memory: the copy is then incomplete and the stream never
  proposes itself in sync (the cluster keeps saying under-replicated); it still streams.
- In sync once the copy ended at the channel's repl_seq `meet_repl_seq` and the backup acknowledged it:
  the owner proposes replica_in_sync. A stream whose channel overflowed lost entries: `broken`; it is
  replaced by a new incarnation.
"""

from __future__ import annotations

from typing import NamedTuple

from node.core.errors import ResourceLimitExceeded
from node.core.replication.assignment import UNGROUPED_ROUTE_KEY

COPIED = 1 << 63  # the cursor of a queue copied whole: every change of it is streamed

NEW, COPYING, STREAMING = "new", "copying", "streaming"


class ReplicaCallDue(NamedTuple):
    """Make this Replicate call to `backup` (node/peer/replicator.py) and tell `answered` its outcome."""

    backup: str
    call: object  # ReplicaCall: epoch and entries
    reset: bool


class ProposeReplicaInSync(NamedTuple):
    backup: str
    epoch: int


class ProposeReplicaOutOfSync(NamedTuple):
    backup: str
    epoch: int


class CopyChunk(NamedTuple):
    """What `source.copy(queue, after_seq, bytes_max, wanted)` hands back: STORE frames of the queue's live
    messages above after_seq whose group `wanted(group_id)` accepts, in seq order, about bytes_max of them."""

    entries: list  # (group_id or None, seq, frame)
    last_seq: int  # every live message up to this seq was read
    done: bool  # the queue's end was reached
    complete: bool  # every message read had its body


class BackupStream:
    __slots__ = ("backup", "channel", "state", "cursors", "copy_order", "complete", "meet_repl_seq",
                 "reset_due", "reset_call", "broken", "proposed_at_ms", "proposed")

    def __init__(self, backup: str, channel):
        self.backup = backup
        self.channel = channel  # ReplicaChannel (channel.py)
        self.state = NEW
        self.cursors: dict[str, int] = {}  # queue -> the highest seq copied (COPIED: all); absent: COPIED
        self.copy_order: list[str] = []  # queues still to copy, the current one first
        self.complete = True  # every message copied had its body in memory
        self.meet_repl_seq = 0  # the channel's last repl_seq when the copy ended
        self.reset_due = True  # the next call carries ReplicaBatch.reset
        self.reset_call = None  # the call in flight that carries it
        self.broken = ""  # why this incarnation lost entries: replaced by a new one
        self.proposed = ""  # "in" / "out": the last proposal made and not yet seen applied
        self.proposed_at_ms = 0

    def sends(self, queue: str, seq: int) -> bool:
        """Whether a change of message `seq` of `queue` goes on this stream now."""
        return self.state != NEW and seq <= self.cursors.get(queue, COPIED)

    def start_copy(self, queues) -> None:
        """Raft no longer lists the backup in sync: the reset and the copy of `queues` (sorted) begin."""
        self.state = COPYING
        self.copy_order = list(queues)
        self.cursors = {queue: 0 for queue in self.copy_order}

    def copied_up_to(self, queue: str, seq: int, done: bool, complete: bool) -> None:
        self.complete = self.complete and complete
        if done:
            self.cursors[queue] = COPIED
            self.copy_order.remove(queue)
        else:
            self.cursors[queue] = seq

    def copy_ended(self) -> None:
        self.state = STREAMING
        self.meet_repl_seq = self.channel.last_repl_seq

    def caught_up(self) -> bool:
        """The copy ended complete, the reset went through and the backup holds everything to the meet."""
        return (self.state == STREAMING and self.complete and not self.reset_due and not self.broken
                and self.channel.high_water >= self.meet_repl_seq)

    def copy(self, source, budget: int, backups, route_keys: dict, now_ms: int) -> int:
        """Copy what `budget` bytes allow of the queues left, in order, into the channel (never past its
        backlog: the rest goes once the backup took some); what is left of the budget. `backups(queue,
        route key)`: a group's backups; `route_keys` learns each copied message's, for its REMOVE."""
        backup, channel = self.backup, self.channel
        while self.copy_order and budget > 0 and not self.broken:
            room = min(budget, channel.backlog_max_bytes - channel.pending_bytes)
            if room <= 0 or len(channel.pending) >= channel.backlog_max_messages:
                break
            queue = self.copy_order[0]

            def wanted(group_id, queue=queue) -> bool:
                return backup in backups(queue, UNGROUPED_ROUTE_KEY if group_id is None else group_id)

            chunk = source.copy(queue, self.cursors[queue], room, wanted)
            for group_id, seq, frame in chunk.entries:
                route_keys[(queue, seq)] = UNGROUPED_ROUTE_KEY if group_id is None else group_id
                try:
                    channel.submit(queue, group_id, frame, now_ms)
                except ResourceLimitExceeded as error:
                    self.broken = str(error)
                    return budget
                budget -= len(frame)
            self.copied_up_to(queue, chunk.last_seq, chunk.done, chunk.complete)
            if not chunk.done:
                break
        if self.state == COPYING and not self.copy_order:
            self.copy_ended()
        return budget
