"""The owner's end of one replication stream (owner -> backup) as a pure object: the backlog, the one
call in flight, the backoff, and whether the backup lags (docs/replication.md, "Synchronous").

Rules:
- Pure: no threads, sockets, gRPC or clock; time comes in as `now_ms`. Its driver (the owner's
  replication sender, an adapter; the simulation) makes the calls and tells it each answer, one at a
  time.
- Every entry is one journal frame of the owner's, tagged (queue, group id or None), numbered by
  `repl_seq` 1, 2, 3, ... within the channel's epoch. `reset(epoch)` starts a newer epoch at 1 again
  and drops what was pending: those entries belong to an epoch the backup now refuses.
- The backlog (submitted, not acknowledged) is bounded by backlog_max_messages and backlog_max_bytes
  (`entry_size_bytes` each); a submit that would pass either is refused with ResourceLimitExceeded
  naming the backup and the limit with its unit, and nothing is taken. One entry always fits an empty
  backlog, whatever its size, so no frame is refused for ever.
- Exactly one call in flight: it carries the oldest pending entries that fit batch_messages_max and
  batch_bytes_max, at least one (node/core/one_call_channel.py, shared with the forwarding channel).
  No seq bound and no dispute: the backup's high water counts this stream's own numbers only.
- The answer is the backup's high water: every pending entry up to it is dropped (a partial ack leaves
  the rest, which goes again, oldest first; the backup skips repl_seqs at or below its mark, so a
  resend is harmless). An answer below the call's first repl_seq took nothing: a failure. An answer
  above the last repl_seq submitted is no ack either (the backup holds numbers this channel never gave
  in this epoch: the owner restarted without a new epoch, or the backup is confused): a failure with
  `backup_ahead`, so the driver takes the backup out of the in-sync set instead of trusting it.
- A failure backs off: retry_min_ms doubling up to retry_max_ms; an answer that takes entries ends it.
- The backup lags once its oldest unacknowledged entry was submitted lag_ms ago or more: the owner
  then proposes `replica_out_of_sync` (docs/replication.md).
"""

from __future__ import annotations

from collections import deque
from typing import NamedTuple

from node.core.errors import ResourceLimitExceeded
from node.core.one_call_channel import (BATCH_BYTES_MAX, BATCH_MESSAGES_MAX, RETRY_MAX_MS, RETRY_MIN_MS,
                                        OneCallChannel, oldest_batch)

ENTRY_OVERHEAD_BYTES = 48  # protobuf framing and fixed fields of one ReplicaEntry, counted against both byte limits
BACKLOG_MAX_BYTES = 64 << 20  # replica_backlog_max_bytes, by default
BACKLOG_MAX_MESSAGES = 100_000  # replica_backlog_max_messages, by default
LAG_MS = 2000  # replica_lag_ms, by default


class ReplicaEntry(NamedTuple):
    repl_seq: int
    queue: str
    group_id: str | None  # None: an ungrouped message
    frame: bytes  # the owner's journal frame, byte-identical
    submitted_at_ms: int
    size_bytes: int  # entry_size_bytes, computed once


class ReplicaCall(NamedTuple):
    """One call to the backup: what the driver puts in a ReplicaBatch."""

    epoch: int
    entries: list  # ReplicaEntry, in repl_seq order


class ReplicaOutcome(NamedTuple):
    """What a call's end means to the driver."""

    acked_high_water: int  # a high water above every one acknowledged before: tell the gate; 0: none new
    failure: str  # why the call took nothing, for the log; "": it took entries
    backup_ahead: bool  # the backup claimed repl_seqs this channel never gave in this epoch
    connected_before: bool | None  # `connected` before this outcome: log when it changes


def entry_size_bytes(queue: str, group_id: str | None, frame: bytes) -> int:
    return len(frame) + len(queue) + len(group_id or "") + ENTRY_OVERHEAD_BYTES


def _size_of(entry: ReplicaEntry) -> int:
    return entry.size_bytes


class ReplicaChannel(OneCallChannel):
    def __init__(self, owner: str, backup: str, *, backlog_max_bytes: int = BACKLOG_MAX_BYTES,
                 backlog_max_messages: int = BACKLOG_MAX_MESSAGES, lag_ms: int = LAG_MS, epoch: int = 0,
                 batch_messages_max: int = BATCH_MESSAGES_MAX, batch_bytes_max: int = BATCH_BYTES_MAX,
                 retry_min_ms: int = RETRY_MIN_MS, retry_max_ms: int = RETRY_MAX_MS):
        super().__init__(batch_messages_max=batch_messages_max, batch_bytes_max=batch_bytes_max,
                         retry_min_ms=retry_min_ms, retry_max_ms=retry_max_ms)
        if backlog_max_bytes < 1:
            raise ValueError(f"replica_backlog_max_bytes must be >= 1, got {backlog_max_bytes}")
        if backlog_max_messages < 1:
            raise ValueError(f"replica_backlog_max_messages must be >= 1, got {backlog_max_messages}")
        if lag_ms < 1:
            raise ValueError(f"replica_lag_ms must be >= 1, got {lag_ms}")
        self.owner = owner
        self.backup = backup
        self.backlog_max_bytes = backlog_max_bytes
        self.backlog_max_messages = backlog_max_messages
        self.lag_ms = lag_ms
        self.epoch = epoch
        self.pending: deque = deque()  # ReplicaEntry submitted, not acknowledged, in repl_seq order
        self.pending_bytes = 0  # the sum of their size_bytes
        self.last_repl_seq = 0  # the last number given in this epoch
        self.high_water = 0  # the highest the backup acknowledged in this epoch
        self.in_flight: ReplicaCall | None = None

    def submit(self, queue: str, group_id: str | None, frame: bytes, now_ms: int) -> int:
        """Queue one frame for the backup; its repl_seq. ResourceLimitExceeded, nothing taken, when full."""
        size_bytes = entry_size_bytes(queue, group_id, frame)
        if len(self.pending) >= self.backlog_max_messages:
            self._refuse(f"{len(self.pending)} messages wait for it, replica_backlog_max_messages is "
                         f"{self.backlog_max_messages} messages")
        if self.pending and self.pending_bytes + size_bytes > self.backlog_max_bytes:
            self._refuse(f"{self.pending_bytes} bytes wait for it and this one is {size_bytes} bytes, "
                         f"replica_backlog_max_bytes is {self.backlog_max_bytes} bytes")
        self.last_repl_seq += 1
        self.pending.append(ReplicaEntry(self.last_repl_seq, queue, group_id, frame, now_ms, size_bytes))
        self.pending_bytes += size_bytes
        return self.last_repl_seq

    def _refuse(self, limit: str) -> None:
        raise ResourceLimitExceeded(
            f"the replication backlog from {self.owner} to backup {self.backup} is full ({limit}): the backup "
            f"is slow or unreachable; send again later (after replica_lag_ms = {self.lag_ms} ms of no "
            f"acknowledgement the owner stops waiting for it)")

    def next_call(self, now_ms: int) -> ReplicaCall | None:
        """The next call, now in flight; None while one is, with nothing pending, or backing off."""
        if self.in_flight is not None or not self.pending or self.backing_off(now_ms):
            return None
        batch = oldest_batch(self.pending, self.batch_messages_max, self.batch_bytes_max, _size_of)
        self.in_flight = ReplicaCall(self.epoch, batch)
        return self.in_flight

    def acked(self, call: ReplicaCall, high_water: int, now_ms: int) -> ReplicaOutcome | None:
        """The backup's high water in answer to `call`; None when `call` is not the one in flight (given
        up on, or of an epoch reset since)."""
        if call is not self.in_flight:
            return None
        if high_water > self.last_repl_seq:
            return self._failed(f"backup {self.backup} acknowledges repl_seq {high_water} of epoch {self.epoch}, "
                                f"but {self.owner} numbered only up to {self.last_repl_seq}: it holds entries this "
                                f"stream never sent; not taken as an ack", now_ms, backup_ahead=True)
        first = call.entries[0].repl_seq
        if high_water < first:
            return self._failed(f"backup {self.backup} took none of the batch (high water {high_water}, batch "
                                f"starts at {first})", now_ms)
        self.in_flight = None
        pending = self.pending
        while pending and pending[0].repl_seq <= high_water:
            self.pending_bytes -= pending.popleft().size_bytes
        connected_before = self.call_took_entries()
        acked = 0
        if high_water > self.high_water:
            self.high_water = acked = high_water
        return ReplicaOutcome(acked, "", False, connected_before)

    def failed(self, call: ReplicaCall, reason: str, now_ms: int) -> ReplicaOutcome | None:
        """`call` got no answer (a status, no connection, its deadline, a refusal); None when it is not the
        one in flight."""
        if call is not self.in_flight:
            return None
        return self._failed(reason, now_ms)

    def _failed(self, reason: str, now_ms: int, backup_ahead: bool = False) -> ReplicaOutcome:
        self.in_flight = None
        return ReplicaOutcome(0, reason, backup_ahead, self.call_failed(now_ms))

    def oldest_pending_age_ms(self, now_ms: int) -> int:
        """How long the oldest unacknowledged entry has waited; 0 with none."""
        return now_ms - self.pending[0].submitted_at_ms if self.pending else 0

    def lagging(self, now_ms: int) -> bool:
        return bool(self.pending) and self.oldest_pending_age_ms(now_ms) >= self.lag_ms

    def reset(self, epoch: int) -> int:
        """Start `epoch` (newer than the channel's): repl_seq restarts at 1, the pending entries and the
        call in flight are dropped (the backup refuses their epoch now). Returns how many were dropped."""
        if epoch <= self.epoch:
            raise ValueError(f"the stream from {self.owner} to {self.backup} is at epoch {self.epoch}: a reset "
                             f"must start a newer one, got {epoch} (numbering again from 1 in the same epoch "
                             f"would have the backup skip every entry up to its high water)")
        dropped = len(self.pending)
        self.epoch = epoch
        self.pending.clear()
        self.pending_bytes = 0
        self.last_repl_seq = 0
        self.high_water = 0
        self.in_flight = None
        return dropped
