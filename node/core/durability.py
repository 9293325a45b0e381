"""What waits for the journal: tickets to waiters, and whether durable sends are taken right now.

Pure (no I/O, no clock: `now_ms` is an argument). The adapter journals records during a batch,
registers here what must wait for them (`wait`), ends the batch with the journal's ticket
(`batch_ended`), and carries out what the journal writer's reports release (`durable`, `failed`).
Rules:
- A waiter is released only by a report covering the ticket of the batch it was registered in, in
  registration order; the journal reports tickets in order, so nothing is confirmed before what was
  written ahead of it.
- A waiter registered in a batch whose ticket is already durable (a batch that wrote nothing new) is
  released at the end of that batch.
- After a failed write, durable sends are refused for `retry_interval_ms`, then tried again: a full
  disk refuses quickly instead of queueing work it cannot store.
- A producer's waiter remembers the send it put in the broker (queue name, message), so a failed batch
  hands back what to take back (Broker.take_back) along with whom to refuse.
"""

from __future__ import annotations

import collections
from typing import NamedTuple

# what waits: a send to accept, a consumer's settlement, an adapter's callback, a cluster protocol's
# continuation (handed back to ClusterProtocol.flushed by the node shell, node/core/shell.py)
PRODUCER, CONSUMER, CALL, CONTINUATION = 0, 1, 2, 3


class Refused(NamedTuple):
    """A waiter of a failed batch. `stored`: the (queue name, Message) a producer's send put in the
    broker, None for every other waiter and for sends held elsewhere (the cluster's outbound store)."""

    target: object
    kind: int
    stored: tuple | None


class Durability:
    def __init__(self, retry_interval_ms: int):
        self.retry_interval_ms = retry_interval_ms
        self.durable_ticket = 0  # every batch up to this ticket is on disk
        self.failure: str | None = None  # the last write's failure, until a write succeeds
        self._retry_at_ms = 0
        self._batch: list = []  # (target, kind, stored) registered during the batch being built
        self._pending: collections.deque = collections.deque()  # (ticket, target, kind, stored), ticket order

    def wait(self, target, kind: int, stored: tuple | None = None) -> None:
        """`stored`: for a producer, the (queue name, Message) its send put in the broker."""
        self._batch.append((target, kind, stored))

    @property
    def waiting(self) -> bool:
        """Something registered in the batch being built waits for its journal unit."""
        return bool(self._batch)

    @property
    def waiting_count(self) -> int:
        """Waiters registered and not released yet, in the batch being built or handed to the journal."""
        return len(self._batch) + len(self._pending)

    def batch_ended(self, ticket: int | None) -> list:
        """The batch was handed to the journal as `ticket` (None: there is no journal, nothing to wait
        for). Returns the (target, kind) pairs released at once."""
        batch, self._batch = self._batch, []
        if ticket is None:
            return [(target, kind) for target, kind, _ in batch]
        self._pending.extend((ticket, target, kind, stored) for target, kind, stored in batch)
        return self.durable(self.durable_ticket) if batch and ticket <= self.durable_ticket else []

    def durable(self, ticket: int) -> list:
        """Every batch up to `ticket` is on disk; returns the waiters that released."""
        self.failure = None
        self.durable_ticket = max(self.durable_ticket, ticket)
        return [(target, kind) for target, kind, _ in self._release(ticket)]

    def failed(self, ticket: int, reason: str, now_ms: int) -> list[Refused]:
        """The batch ending at `ticket` was not written; returns its waiters, which must be refused, each
        with the send it stored (take those back from the broker before refusing)."""
        self.failure = reason
        self._retry_at_ms = now_ms + self.retry_interval_ms
        return [Refused(*waiter) for waiter in self._release(ticket)]

    def refusing(self, now_ms: int) -> str | None:
        """The reason durable sends are refused now, or None when they are taken."""
        return self.failure if self.failure is not None and now_ms < self._retry_at_ms else None

    def _release(self, ticket: int) -> list:
        released = []
        pending = self._pending
        while pending and pending[0][0] <= ticket:
            _, target, kind, stored = pending.popleft()
            released.append((target, kind, stored))
        return released
