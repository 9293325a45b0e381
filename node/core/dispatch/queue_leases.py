"""Group leases (issue 30): when a consumer that stopped settling loses the groups it holds. Pure: time is `now_ms`.

Rules this module keeps:
- With `group_lease_ms` > 0 a consumer's lease runs while it holds unsettled deliveries. It starts when a
  delivery reaches a consumer that held none, and every settlement or flow on its link renews it: no
  renewal call, so nothing to storm. A consumer with nothing in flight holds no lease and keeps its
  groups as before (an idle exclusive consumer keeps its group).
- Renewals are on the link, so every group a consumer holds lapses with it: a link silent for
  `group_lease_ms` while it holds deliveries is hung, whichever group it is stuck on. The broker then
  detaches the consumer (Broker.tick, through the queue's `lapsed_leases`): its unsettled deliveries come
  back first in their groups, in order, delivery count raised, and its groups go to other consumers.
- A lapsed consumer's credit is spent at once: until the broker detaches it, nothing released by another
  consumer lapsing at the same tick goes to it.
- The timer structure is one heap of (deadline, order, consumer), at most one entry per consumer whose
  lease runs; a renewal only writes its time (`renewed_ms`), and an entry found early is pushed again at
  its true deadline. An entry is never later than its consumer's deadline. A tick pops only what is due:
  no scan of groups or consumers, except once when `group_lease_ms` itself changes. A departed
  consumer's entry waits for its deadline, or goes once departed entries outnumber the attached.
"""

from __future__ import annotations

import heapq
import itertools

from node.core.dispatch.queue_consumers import Consumer, Consumers
from node.core.dispatch.settings import QueueSettings
from node.core.errors import GroupLeaseExpired

DEPARTED_ENTRIES_MIN = 64  # heap entries of departed consumers kept beyond twice the attached ones


class Leases:
    __slots__ = ("settings", "consumers", "renewed_ms", "heap", "order", "lease_ms", "now_ms")

    def __init__(self, settings: QueueSettings, consumers: Consumers):
        self.settings = settings
        self.consumers = consumers
        # consumers whose lease runs -> their last renewal; each has exactly one entry in `heap`
        self.renewed_ms: dict[Consumer, int] = {}
        self.heap: list = []  # (deadline_ms, order, consumer), deadline_ms <= renewed + group_lease_ms
        self.order = itertools.count()  # ties: no two consumers compare
        # the lease in force: a live change of group_lease_ms takes effect at the next tick (`lapsed`), which
        # restarts the heap; dispatch reads this, not the settings, so a queue without leases pays no call
        self.lease_ms = settings.group_lease_ms
        self.now_ms = 0  # of the dispatch under way (Dispatcher.dispatch sets it): when a lease starts

    def start(self, consumer: Consumer) -> None:
        """A delivery reaches `consumer`, which held none unsettled, and a lease is in force: it starts now."""
        lease_ms = self.lease_ms
        now_ms = self.now_ms
        if consumer not in self.renewed_ms:
            if len(self.heap) > 2 * len(self.consumers.by_id) + DEPARTED_ENTRIES_MIN:
                self._drop_departed()
            heapq.heappush(self.heap, (now_ms + lease_ms, next(self.order), consumer))
        self.renewed_ms[consumer] = now_ms

    def renew(self, consumer: Consumer, now_ms: int) -> None:
        """A settlement or flow on the consumer's link."""
        renewed = self.renewed_ms
        if consumer in renewed:
            renewed[consumer] = now_ms

    def deadline_ms(self) -> int | None:
        return self.heap[0][0] if self.heap else None

    def lapsed(self, now_ms: int) -> list[tuple[object, GroupLeaseExpired]]:
        """(consumer id, why) of each consumer whose lease lapsed by `now_ms`, oldest deadline first: the
        broker detaches them (Broker.tick). Their leases end here."""
        lease_ms = self.settings.group_lease_ms
        if lease_ms != self.lease_ms:
            self._restart(lease_ms, now_ms)
        heap = self.heap
        if not heap or heap[0][0] > now_ms:
            return []
        renewed = self.renewed_ms
        lapsed: list = []
        while heap and heap[0][0] <= now_ms:
            consumer = heapq.heappop(heap)[2]
            renewed_ms = renewed[consumer]
            if not consumer.unsettled:
                del renewed[consumer]  # nothing in flight (or it detached): no lease until its next delivery
                continue
            deadline_ms = renewed_ms + lease_ms
            if deadline_ms > now_ms:
                heapq.heappush(heap, (deadline_ms, next(self.order), consumer))  # renewed since it was pushed
                continue
            del renewed[consumer]
            consumer.credit = 0  # takes nothing more: what the others release must not go to it, lapsing too
            self.consumers.sync_taker(consumer)
            lapsed.append((consumer.id, self._why(consumer, lease_ms)))
        return lapsed

    def _why(self, consumer: Consumer, lease_ms: int) -> GroupLeaseExpired:
        """Names the group of the consumer's oldest unsettled delivery: the one it is likely stuck on."""
        oldest = next(iter(consumer.unsettled.values()))
        group = None if oldest.group is None else oldest.group.key
        return GroupLeaseExpired(self.settings.name, group, lease_ms, len(consumer.unsettled))

    def _drop_departed(self) -> None:
        """Consumers that detached while their lease ran keep their entry until its deadline: with a long
        lease and consumers coming and going, drop them once they outnumber the attached (amortized O(1))."""
        by_id = self.consumers.by_id
        self.heap = [entry for entry in self.heap if by_id.get(entry[2].id) is entry[2]]
        heapq.heapify(self.heap)
        self.renewed_ms = {consumer: ms for consumer, ms in self.renewed_ms.items() if by_id.get(consumer.id) is consumer}

    def _restart(self, lease_ms: int, now_ms: int) -> None:
        """`group_lease_ms` changed on a live queue: every consumer holding deliveries has a lease from now
        (or keeps its last renewal), each at its new deadline; with 0, none."""
        self.lease_ms = lease_ms
        self.heap.clear()
        old = self.renewed_ms
        self.renewed_ms = {}
        if not lease_ms:
            return
        for consumer in self.consumers.by_id.values():
            if consumer.unsettled:
                renewed_ms = old.get(consumer, now_ms)
                self.renewed_ms[consumer] = renewed_ms
                heapq.heappush(self.heap, (renewed_ms + lease_ms, next(self.order), consumer))
