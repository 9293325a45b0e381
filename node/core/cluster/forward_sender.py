"""The forwarding channel to one owner as a pure object: pending entries, the one call in flight, the backoff.

Rules:
- Pure: no threads, no gRPC, no clock; time comes in as `now_ms`. It decides what the next call
  carries and when it may start; its drivers make the calls and tell it each answer: the node's
  forwarder (node/peer/forwarder.py: a thread and gRPC) and the simulation's ForwarderModel
  (tests/sim/node_model.py: simulated delays). Whoever drives it serializes the calls into it (the
  forwarder holds its condition's lock).
- Exactly one call in flight. A call carries the oldest pending entries that fit batch_messages_max
  and batch_bytes_max (`entry_size_bytes` each), always at least one, in submit order; with them the
  seq bound they were submitted with (the node's next seq then: no forward seq this node gave is at
  or above it; 0 when the batch would break it, so a batch never carries a bound it breaks) and the
  high water this channel disputes (0: none).
- An answer at or above the call's bound claims seqs this node never gave (the owner took a forged
  batch as this node's, or this node reused seqs after a restart): it is no ack, the entries stay,
  and the next calls dispute that high water until an answer below the bound ends the dispute (the
  owner sets its mark back, node/core/cluster/owner.py). An answer below the call's first seq took
  nothing: a failure, or the same batch would go again at once, forever. Any other answer drops
  every pending entry up to it (a partial ack leaves the rest, which goes again, oldest first: the
  owner skips seqs at or below its mark, so a resend is harmless).
- A failure (no answer in time, a status, no address, a dispute, an answer that took nothing) backs
  off: retry_min_ms, doubling up to retry_max_ms; the next call starts from the oldest pending entry
  once the backoff is over. An answer that takes entries ends the backoff. The batch and the backoff
  are node/core/one_call_channel.py's, shared with the replication channel; `connected` is None until
  the first call ends, then whether the last one took entries, so the driver logs once when forwarding
  stops and once when it resumes, never per attempt.
- Pending entries are bounded by the caller: the outbound store (node/core/cluster/outbound.py) submits an
  owner's entries only while those pending stay within outbound_memory_max_bytes (at least one).
"""

from __future__ import annotations

from collections import deque
from typing import NamedTuple

from node.core.one_call_channel import (BATCH_BYTES_MAX, BATCH_MESSAGES_MAX, RETRY_MAX_MS, RETRY_MIN_MS,
                                        OneCallChannel, oldest_batch)

ENTRY_OVERHEAD_BYTES = 48  # protobuf framing and fixed fields of one Forwarded, counted against batch_bytes_max


def entry_size_bytes(entry) -> int:
    return len(entry.payload) + len(entry.queue) + len(entry.group_id or "") + ENTRY_OVERHEAD_BYTES


class Call(NamedTuple):
    """One call to the owner: what it carries (node/peer/forward_batch.py puts it on the wire)."""

    entries: list  # node.core.cluster.outbound.Entry, in forward seq order
    seq_bound: int  # 0: none said
    disputed_high_water: int  # 0: none


class Outcome(NamedTuple):
    """What a call's end means to the driver."""

    acked_high_water: int  # a high water above every one acknowledged before: tell the node; 0: none new
    failure: str  # why the call took nothing, for the log; "": it took entries
    disputed: bool  # the answer claimed seqs this node never gave
    connected_before: bool | None  # `connected` before this outcome: log when it changes


class ForwardSender(OneCallChannel):
    def __init__(self, *, batch_messages_max: int = BATCH_MESSAGES_MAX, batch_bytes_max: int = BATCH_BYTES_MAX,
                 retry_min_ms: int = RETRY_MIN_MS, retry_max_ms: int = RETRY_MAX_MS):
        super().__init__(batch_messages_max=batch_messages_max, batch_bytes_max=batch_bytes_max,
                         retry_min_ms=retry_min_ms, retry_max_ms=retry_max_ms)
        self.pending: deque = deque()  # submitted, not acknowledged, in forward seq order
        self.last_submitted_seq = 0
        self.seq_bound = 0  # the highest bound submitted with entries; 0: none said
        self.in_flight: Call | None = None
        self.high_water = 0  # the highest the owner acknowledged
        self.disputed_high_water = 0  # the owner's last answer at or above its call's bound; 0: none

    def submit(self, entries: list, seq_bound: int = 0) -> None:
        """`seq_bound`: the node's next seq, above every forward seq it gave (0: not said). ValueError,
        and nothing taken, when the entries' forward seqs do not increase from the last submitted."""
        if not entries:
            return
        if seq_bound > entries[-1].forward_seq:  # else no bound at all: one the batch breaks is refused
            self.seq_bound = max(self.seq_bound, seq_bound)
        previous = self.last_submitted_seq
        for entry in entries:
            if entry.forward_seq <= previous:
                raise ValueError(f"forward_seq must increase: {entry.forward_seq} after {previous}")
            previous = entry.forward_seq
        self.last_submitted_seq = previous
        self.pending.extend(entries)

    def take_call(self, now_ms: int) -> Call | None:
        """The next call, now in flight; None while one is, with nothing pending, or backing off."""
        if self.in_flight is not None or not self.pending or self.backing_off(now_ms):
            return None
        batch = oldest_batch(self.pending, self.batch_messages_max, self.batch_bytes_max, entry_size_bytes)
        bound = self.seq_bound if self.seq_bound > batch[-1].forward_seq else 0
        self.in_flight = Call(batch, bound, self.disputed_high_water)
        return self.in_flight

    def answered(self, call: Call, high_water: int, now_ms: int) -> Outcome | None:
        """The owner's high water in answer to `call`; None when `call` is not the one in flight (given up)."""
        if call is not self.in_flight:
            return None
        if call.seq_bound and high_water >= call.seq_bound:
            self.disputed_high_water = high_water
            return self._failed(f"the owner answers high water {high_water}, but this node never gave a forward seq "
                                f"at or above {call.seq_bound}: it took a batch as this node's that this node never "
                                f"sent (forged?), or this node reused seqs; not taken as an ack: the entries stay and "
                                f"go again, disputing that high water, and the owner sets its mark back", now_ms,
                                disputed=True)
        self.disputed_high_water = 0
        if high_water < call.entries[0].forward_seq:
            return self._failed(f"the owner took none of the batch (high water {high_water}, batch starts at "
                                f"{call.entries[0].forward_seq})", now_ms)
        self.in_flight = None
        pending = self.pending
        while pending and pending[0].forward_seq <= high_water:
            pending.popleft()
        connected_before = self.call_took_entries()
        acked = 0
        if high_water > self.high_water:
            self.high_water = acked = high_water
        return Outcome(acked, "", False, connected_before)

    def failed(self, call: Call, reason: str, now_ms: int) -> Outcome | None:
        """`call` got no answer (a status, no connection, no address, its deadline); None when it is not
        the one in flight (given up already)."""
        if call is not self.in_flight:
            return None
        return self._failed(reason, now_ms)

    def _failed(self, reason: str, now_ms: int, disputed: bool = False) -> Outcome:
        self.in_flight = None
        return Outcome(0, reason, disputed, self.call_failed(now_ms))
