"""A small harness over the dispatch core for example tests: one broker, one queue `q` under test.

Messages are named by their payload (`"a1"`), so a test reads as "a1 went to c1", and settling is by
name. Every call returns the deliveries it caused as `(consumer, name)` pairs; the raw effects of the
last call stay in `last_effects` for tests about journal effects, drops and first-for-consumer flags.
"""

from __future__ import annotations

import pytest

from node.core.dispatch.broker import Broker
from node.core.effects import Deliver, Dropped, Removed, Stored
from node.core.dispatch.message import Message, Outcome
from node.core.dispatch.settings import QueueSettings


class Harness:
    def __init__(self, *, broker: Broker | None = None, queue: str = "q", **settings):
        self.broker = broker or Broker()
        self.name = queue
        self.queue = self.broker.declare_queue(QueueSettings(name=queue, **settings))
        self.now_ms = 0
        self.last_effects: list = []
        self.unsettled: dict[str, tuple] = {}  # name -> (consumer, delivery id), acquiring only
        self.log: list[tuple] = []  # every delivery so far: (consumer, name)

    # ---- producer and consumers --------------------------------------------------------------

    def send(self, group=None, name: str | None = None, *, ttl_ms: int = 0, closes: bool = False,
             queue: str | None = None) -> list[tuple]:
        name = name or f"m{self.broker.next_seq}"
        expires_at_ms = self.now_ms + ttl_ms if ttl_ms else 0
        message = Message(name.encode(), group, expires_at_ms=expires_at_ms, closes_group=closes)
        return self._take(self.broker.enqueue(queue or self.name, message, self.now_ms))

    def attach(self, consumer, credit: int = 0, *, browse: bool = False) -> list[tuple]:
        delivered = self._take(self.broker.attach_consumer(self.name, consumer, browse, self.now_ms))
        if credit:
            delivered += self.credit(consumer, credit)
        return delivered

    def credit(self, consumer, credit: int) -> list[tuple]:
        return self._take(self.broker.set_credit(consumer, credit, self.now_ms))

    def detach(self, consumer) -> list[tuple]:
        for name, (holder, _) in list(self.unsettled.items()):
            if holder == consumer:
                del self.unsettled[name]
        return self._take(self.broker.detach_consumer(consumer, self.now_ms))

    def settle(self, name: str, outcome: Outcome, delivery_failed: bool = False) -> list[tuple]:
        consumer, delivery_id = self.unsettled.pop(name)
        return self._take(self.broker.settle(consumer, delivery_id, outcome, self.now_ms, delivery_failed))

    def accept(self, *names: str) -> list[tuple]:
        delivered = []
        for name in names:
            delivered += self.settle(name, Outcome.ACCEPTED)
        return delivered

    def release(self, name: str) -> list[tuple]:
        return self.settle(name, Outcome.RELEASED)

    def reject(self, name: str) -> list[tuple]:
        return self.settle(name, Outcome.REJECTED)

    def modify(self, name: str, delivery_failed: bool = True) -> list[tuple]:
        return self.settle(name, Outcome.MODIFIED, delivery_failed)

    def tick(self, now_ms: int) -> list[tuple]:
        self.now_ms = now_ms
        return self._take(self.broker.tick(now_ms))

    def reset(self, group=None) -> list[tuple]:
        _, effects = self.broker.reset_groups(self.name, group, self.now_ms)
        return self._take(effects)

    # ---- reading effects ---------------------------------------------------------------------

    def _take(self, effects: list) -> list[tuple]:
        self.last_effects = effects
        delivered = []
        for effect in effects:
            if isinstance(effect, Deliver):
                name = effect.message.payload.decode()
                if not effect.browse:
                    self.unsettled[name] = (effect.consumer_id, effect.delivery_id)
                delivered.append((effect.consumer_id, name))
                self.log.append((effect.consumer_id, name))
        return delivered

    def delivers(self) -> list[Deliver]:
        return [e for e in self.last_effects if isinstance(e, Deliver)]

    def first_flags(self) -> dict[str, bool]:
        return {e.message.payload.decode(): e.first_for_consumer for e in self.delivers()}

    def delivery_counts(self) -> dict[str, int]:
        return {e.message.payload.decode(): e.message.delivery_count for e in self.delivers()}

    def dropped(self) -> list[tuple]:
        return [(e.queue, e.seq, e.reason) for e in self.last_effects if isinstance(e, Dropped)]

    def journal(self) -> list[tuple]:
        """Stored/Removed effects of the last call as ("stored"|"removed", queue, payload-or-seq)."""
        rows = []
        for effect in self.last_effects:
            if isinstance(effect, Stored):
                rows.append(("stored", effect.queue, effect.message.payload.decode()))
            elif isinstance(effect, Removed):
                rows.append(("removed", effect.queue, effect.seq))
        return rows

    def held_by(self, consumer) -> list[str]:
        return sorted((n for n, (c, _) in self.unsettled.items() if c == consumer), key=_natural)

    def stats(self) -> dict:
        return self.queue.stats()

    def owners(self) -> dict:
        return {row["group"]: row["consumer"] for row in self.queue.group_rows()}


def _natural(name: str):
    return (name.rstrip("0123456789"), int(name[len(name.rstrip("0123456789")):] or 0))


@pytest.fixture
def make():
    """`make(**queue_settings)` builds a Harness; `broker=` passes a prepared Broker."""
    return Harness
