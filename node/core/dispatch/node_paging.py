"""The node's paging: which durable queues' bodies leave memory, and what the journal reads back. Pure.

Rules (one queue's paging index is node/core/dispatch/paging.py; cold tails node/core/dispatch/cold.py):
- A body pages out only once the journal reported its STORE on disk (`journalled`).
- Each queue's `memory_max_bytes` bounds its own pageable bodies; then the node's budget
  (`Broker.memory_max_bytes`, 0 = none) takes the excess from the queues holding the most first, as
  little from each as will do, ties by name so every run pages alike.
- What the journal reads back for a queue deleted meanwhile is dropped: nothing waits for it.
"""

from __future__ import annotations

from node.core.dispatch.message import COLD, JOURNALLED


class NodePaging:
    def __init__(self, broker):
        self.broker = broker

    def journalled(self, stores: list, now_ms: int) -> list:
        """The journal reported these (queue name, message) STOREs on disk: their bodies may be paged
        out now. Pages out what is over the queues' budgets and the node's (`memory_max_bytes`)."""
        cold_queues = set()
        for queue_name, message in stores:
            message.flags |= JOURNALLED
            if message.flags & COLD:
                cold_queues.add(queue_name)
        effects: list = []
        for queue_name in sorted(cold_queues):
            queue = self.broker.queues.get(queue_name)
            if queue is not None:
                queue.cold_journalled(now_ms, effects)
        return effects + self.page_out(now_ms)

    def promote(self, queue_name: str, records: dict, now_ms: int) -> list:
        """Records of a cold tail the journal read back (seq -> Message or None): node/core/dispatch/cold.py."""
        effects: list = []
        queue = self.broker.queues.get(queue_name)
        if queue is not None:  # deleted meanwhile: nothing waits for them
            queue.promote(records, now_ms, effects)
        return effects + self.page_out(now_ms)

    def page_out(self, now_ms: int) -> list:
        queues = self.broker.queues
        total_bytes = 0
        for queue in queues.values():
            if queue.pager is None:
                continue
            budget_bytes = queue.settings.memory_max_bytes
            if budget_bytes and queue.pager.pageable_bytes > budget_bytes:
                queue.page_out(budget_bytes)
            total_bytes += queue.pager.pageable_bytes
        memory_max_bytes = self.broker.memory_max_bytes
        excess_bytes = total_bytes - memory_max_bytes
        if memory_max_bytes and excess_bytes > 0:
            for queue in sorted((q for q in queues.values() if q.pager is not None),
                                key=lambda q: (-q.pager.pageable_bytes, q.settings.name)):
                excess_bytes -= queue.page_out(max(0, queue.pager.pageable_bytes - excess_bytes))
                if excess_bytes <= 0:
                    break
        return []  # paging out changes no delivery: an empty list of effects, as every broker call returns

    def page_in(self, queue_name: str, bodies: dict, now_ms: int) -> list:
        """Bodies the journal read back for `queue_name` (seq -> payload): dispatch goes on with them."""
        effects: list = []
        queue = self.broker.queues.get(queue_name)
        if queue is not None:  # deleted meanwhile: nothing waits for them
            queue.page_in(bodies, now_ms, effects)
        return effects
