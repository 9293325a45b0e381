"""The operators' calls on a node's queues (the admin API, the console): list, reset and purge.

Pure like the broker it serves (node/core/dispatch/broker.py binds these calls, so callers name the broker
alone): `now_ms` comes in, effects go out for the caller to carry out in order. A purge reads no bodies
and refuses a queue whose tail is cold (Queue.cold_refusal).
"""

from __future__ import annotations


class Management:
    def __init__(self, broker):
        self.broker = broker

    def list_queues(self) -> list[dict]:
        return [self.broker.dedup.stats(self.broker.queues[name].stats()) for name in sorted(self.broker.queues)]

    def list_groups(self, queue_name: str) -> list[dict]:
        return self.broker.queue(queue_name).group_rows()

    def reset_groups(self, queue_name: str, group: str | None, now_ms: int) -> tuple[int, list]:
        effects: list = []
        count = self.broker.queue(queue_name).reset_groups(group, now_ms, effects)
        return count, effects

    def purge_group(self, queue_name: str, group: str, count: int | None, now_ms: int) -> tuple[int, list]:
        effects: list = []
        queue = self.broker.queue(queue_name)
        queue.cold_refusal(f"purging group {group!r}")
        taken = queue.take_group_messages(group, count, effects, bodies=False)  # a purge needs no bodies
        queue.tick(now_ms, effects)
        return len(taken), effects
