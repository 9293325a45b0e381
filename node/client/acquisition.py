"""Messages one reader takes from a queue over one blocking connection, held until accepted or released.

Rules:
- The node caps each receiver link at its `link_unsettled_max` unsettled deliveries, so a reader
  that holds more opens more links (node/client/links.py `Receiver`), up to `links_max`.
- A message group stays on one link while it has unsettled messages there, so taking the links'
  arrivals in arrival order keeps each group's messages in queue order; releases go back in the
  order given, each message to its place in its group.
- `accept` returns once the node has applied every accept (settle-mode second).
"""

from __future__ import annotations

import time

from node.amqp.engine import ACCEPTED, RELEASED
from node.client.connection import Connection
from node.client.links import Receiver, Taken


class Acquisition:
    """Messages one reader takes from a queue over one connection (the module's rules)."""

    def __init__(self, connection: Connection, queue: str, browse: bool, link_unsettled_max: int,
                 links_max: int, name: str):
        self.connection, self.queue, self.browse, self.name = connection, queue, browse, name
        self.link_unsettled_max, self.links_max = link_unsettled_max, links_max
        self.receivers: list[Receiver] = []
        self.held: list[Taken] = []  # taken and not yet settled, in arrival order

    def _room(self, receiver: Receiver) -> int:
        return self.link_unsettled_max if self.browse else self.link_unsettled_max - receiver.unsettled

    def _receiver_with_room(self) -> Receiver | None:
        for receiver in self.receivers:
            if self._room(receiver) > 0:
                return receiver
        if len(self.receivers) >= self.links_max:
            return None
        receiver = Receiver(self.connection, self.queue, f"{self.name}-{len(self.receivers)}", self.browse)
        self.receivers.append(receiver)
        return receiver

    def take(self, count_max: int, idle_timeout_ms: int) -> list[Taken]:
        """Up to `count_max` messages: stop early when nothing more arrives within `idle_timeout_ms`
        (0: when the node has nothing available now) or when every link holds its maximum."""
        taken: list[Taken] = []
        idle_deadline_s = None
        while len(taken) < count_max:
            receiver = self._receiver_with_room()
            if receiver is None:
                break
            arrived = receiver.drain(min(self._room(receiver), count_max - len(taken)))
            if not arrived and idle_timeout_ms > 0:
                if idle_deadline_s is None:
                    idle_deadline_s = time.monotonic() + idle_timeout_ms / 1000
                if time.monotonic() < idle_deadline_s:
                    arrived = receiver.await_one(idle_deadline_s)
            if not arrived:
                break
            idle_deadline_s = None
            taken.extend(arrived)
        if not self.browse:
            self.held.extend(taken)
        return taken

    def accept(self, taken: list[Taken]) -> None:
        """Accept these messages; returns once the node has applied every accept."""
        self._settle(taken, ACCEPTED)
        self.connection.wait(lambda: all(c.confirmed() for c in self.receivers),
                             f"the node to confirm {len(taken)} accepts on queue {self.queue!r}")

    def release(self, taken: list[Taken]) -> None:
        """Give these messages back to the queue, in the order given (each returns to its place)."""
        self._settle(taken, RELEASED)
        self.connection.pump(0)

    def release_all(self) -> None:
        self.release(list(self.held))

    def _settle(self, taken: list[Taken], state: int) -> None:
        for receiver in self.receivers:
            receiver.settle([item for item in taken if item.receiver is receiver], state)
        done = {id(item) for item in taken}
        self.held = [item for item in self.held if id(item) not in done]

    def close(self) -> None:
        for receiver in self.receivers:
            receiver.close()
