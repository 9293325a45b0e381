"""What the admin API may ask of a running node. Thread-safe: callable from gRPC pool threads.

In a cluster, adding, updating and deleting a queue act on every node through the raft cluster's
queue definitions (handler/queue_definitions.py); alone, on the node.

The runtime implements it by posting each call into the engine loop thread through the bridge and
waiting with a deadline; tests implement it over a plain `Broker`. Failures are `GrouperError`s.

A call that removes, moves or deletes messages of a durable queue answers only once the journal has
its records on disk (node/admin/flushes.py), so what it reports done does not come back after a
crash; a failed write is a `JournalFailed` naming the journal's failure.
"""

from __future__ import annotations

from typing import Protocol

from node.core.dispatch.settings import QueueSettings


class NodeControl(Protocol):
    def list_queues(self) -> list[dict]: ...  # Queue.stats() rows, sorted by name

    def add_queue(self, settings: QueueSettings) -> dict: ...  # stats of the new queue

    def delete_queue(self, name: str) -> None: ...  # in a cluster: on every node, in one raft entry

    def update_queue(self, name: str, changes: dict) -> dict: ...  # only the fields given; stats after

    def queue_defined(self, name: str) -> bool: ...  # in a cluster: it has a cluster-wide definition

    def list_groups(self, queue: str) -> list[dict]: ...  # rows: group, messages, acquired, consumer

    # one bounded page of this node's groups and the queue's consumers here (node.admin.group_pages)
    # with `order` ("backlog", "head_age", "owner"): this node's top groups by it (node.admin.group_ranks)
    def group_page(self, queue: str, prefix: str, position: int, page_size: int, order: str = "") -> dict: ...

    def reset_groups(self, queue: str, group: str | None) -> int: ...  # groups freed (None = all)

    def purge_group(self, queue: str, group: str, count: int | None) -> int: ...  # messages purged

    # (messages purged, available messages left: those that arrived meanwhile), batch by batch (queue_purge)
    def purge_queue(self, queue: str) -> tuple[int, int]: ...

    def move_group(self, queue: str, group: str, destination: str, count: int | None) -> int: ...

    # (messages moved, messages selected that stayed, why they stayed): node/core/dispatch/reroute.py, batch by batch
    def reroute_queue(self, queue: str, destination: str, group: str | None,
                      count: int | None) -> tuple[int, int, str]: ...

    # in a cluster (a single node answers {"clustered": False} and no peers)
    def cluster_status(self) -> dict: ...  # handler status, routes, members (see ClusterStatusResponse)

    def peers(self) -> list[tuple[str, str]]: ...  # (node id, admin address) of the other members

    def add_member(self, node: str) -> None: ...  # raft membership change, waits for its commit

    def remove_member(self, node: str) -> int: ...  # routes dropped with it
