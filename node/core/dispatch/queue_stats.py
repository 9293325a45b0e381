"""A queue's figures, as the admin API, the console and /metrics read them (Queue.stats).

Pure: reads the queue's collaborators (node/core/dispatch/queue.py lists them), changes nothing. The group
signals' cost is queue_groups.py's to state (GroupTable.signals: no pass over idle groups).
"""

from __future__ import annotations


def queue_stats(name: str, store, consumers, group_table, pager, cold) -> dict:
    groups = group_table.groups
    return {
        "name": name,
        "depth_messages": store.depth_messages,
        "depth_bytes": store.depth_bytes,
        "acquired_messages": store.acquired_messages,
        "consumers": len(consumers.by_id) - len(consumers.browsers),
        "browsers": len(consumers.browsers),
        "groups": len(groups),
        **group_table.signals(consumers, store.delayed),  # owned_groups and issue 30's group signals
        "enqueued_total": store.enqueued_total,
        "delivered_total": store.delivered_total,
        "resident_bytes": store.resident_bytes(),
        "paged_bytes": pager.paged_bytes if pager is not None else 0,
        "cold_messages": cold.count if cold is not None else 0,
    }
