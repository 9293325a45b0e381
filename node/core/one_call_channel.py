"""What every channel with one call in flight shares: which pending entries the next call carries, and
how long it backs off after a failure. The forwarding channel to an owner
(node/core/cluster/forward_sender.py) and the replication channel to a backup
(node/core/replication/channel.py) are both one; each adds its own acknowledgement rules.

Rules:
- Pure: no threads, sockets or clock; time comes in as `now_ms`.
- A call carries the oldest pending entries that fit batch_messages_max and batch_bytes_max (each entry's
  size by the channel's own measure), always at least one, in submit order, so an entry larger than
  batch_bytes_max still goes, alone, instead of blocking the channel for ever.
- A failure backs off: retry_min_ms, doubling up to retry_max_ms; no call starts before `retry_at_ms`.
  A call that took entries ends the backoff.
- `connected` is None until the first call ends, then whether the last one took entries; each outcome
  says what it was before, so a driver logs once when the channel stops and once when it resumes, never
  per attempt (`failed_attempts` and `failing_since_ms` say how long it has been failing).
"""

from __future__ import annotations

import itertools

BATCH_MESSAGES_MAX = 500  # entries of one call, by default
BATCH_BYTES_MAX = 4 << 20  # entry sizes of one call, by default (at least one entry goes, whatever its size)
RETRY_MIN_MS = 100  # the first backoff after a failure, by default
RETRY_MAX_MS = 2000  # the backoff doubles up to this, by default


def oldest_batch(pending, batch_messages_max: int, batch_bytes_max: int, size_bytes) -> list:
    """The oldest entries of `pending` (non-empty) that fit both limits, at least one."""
    batch: list = []
    total_bytes = 0
    for entry in itertools.islice(pending, batch_messages_max):
        total_bytes += size_bytes(entry)
        if batch and total_bytes > batch_bytes_max:
            break
        batch.append(entry)
    return batch


class OneCallChannel:
    """The batch limits and the backoff state; a channel subclasses it and keeps its own entries."""

    def __init__(self, *, batch_messages_max: int = BATCH_MESSAGES_MAX, batch_bytes_max: int = BATCH_BYTES_MAX,
                 retry_min_ms: int = RETRY_MIN_MS, retry_max_ms: int = RETRY_MAX_MS):
        if batch_messages_max < 1:
            raise ValueError(f"batch_messages_max must be >= 1, got {batch_messages_max}")
        if batch_bytes_max < 1:
            raise ValueError(f"batch_bytes_max must be >= 1, got {batch_bytes_max}")
        if not 1 <= retry_min_ms <= retry_max_ms:
            raise ValueError(f"need 1 <= retry_min_ms <= retry_max_ms, got {retry_min_ms} and {retry_max_ms}")
        self.batch_messages_max = batch_messages_max
        self.batch_bytes_max = batch_bytes_max
        self.retry_min_ms = retry_min_ms
        self.retry_max_ms = retry_max_ms
        self.retry_at_ms = 0  # no call starts before this
        self.retry_delay_ms = 0  # 0 while calls work
        self.connected: bool | None = None
        self.failed_attempts = 0  # since the channel last stopped
        self.failing_since_ms = 0

    def backing_off(self, now_ms: int) -> bool:
        return now_ms < self.retry_at_ms

    def call_took_entries(self) -> bool | None:
        """A call took entries: the backoff ends. Returns `connected` before."""
        self.retry_delay_ms = 0
        self.retry_at_ms = 0
        connected_before, self.connected = self.connected, True
        return connected_before

    def call_failed(self, now_ms: int) -> bool | None:
        """A call took nothing: back off, doubling. Returns `connected` before."""
        self.retry_delay_ms = min(self.retry_max_ms, max(self.retry_min_ms, self.retry_delay_ms * 2))
        self.retry_at_ms = now_ms + self.retry_delay_ms
        connected_before, self.connected = self.connected, False
        if connected_before is False:
            self.failed_attempts += 1
        else:
            self.failed_attempts = 1
            self.failing_since_ms = now_ms
        return connected_before
