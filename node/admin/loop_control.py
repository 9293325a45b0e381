"""LoopControl: the admin API's NodeControl (node/admin/control.py) over a running node's engine loop.

Rules:
- Callable from gRPC pool threads (and the console's HTTP threads): every read or change of the broker,
  the server or the cluster link runs on the engine loop through `Bridge.call`, with admin_timeout_ms as
  its deadline. Only the raft member's handle (`node.handler`) is asked from the caller's thread.
- In a cluster, queue definitions and membership go through the raft cluster and wait for its answer
  (node/admin/cluster_control.py, this class's collaborator); alone, they act on the broker directly.
- A call that removes, moves or deletes durable messages answers once the journal has them on disk
  (node/admin/flushes.py).
- `node` is a node.runtime.Node, taken as it comes (runtime imports this module, not back).
"""

from __future__ import annotations

from node.admin.cluster_control import ClusterControl
from node.admin.definitions import updated_settings
from node.admin.flushes import Flushes
from node.core.dispatch.settings import QueueSettings


class LoopControl:
    """NodeControl over the running engine loop: each call runs on the loop's thread."""

    def __init__(self, node):
        self._node = node
        self._cluster = ClusterControl(node, self._call)

    def _call(self, fn):
        return self._node.bridge.call(fn, self._node.config.admin_timeout_ms)

    def list_queues(self):
        return self._call(self._node.broker.list_queues)

    def add_queue(self, settings: QueueSettings):
        if self._node.handler is not None:  # a cluster: defined on every node (handler/queue_definitions.py)
            self._cluster.define_queue(settings)
            return self._stats_of(settings.name)

        def add():
            queue = self._node.broker.declare_queue(settings)
            self._node.server.apply([])  # journals the declaration
            return queue.stats()
        return self._call(add)

    def update_queue(self, name: str, changes: dict):
        node = self._node
        if node.handler is None:
            def update():
                settings = updated_settings(node.broker.queue(name).settings.to_dict(), changes)
                node.broker.redefine_queue(settings)
                node.server.apply([])  # journals the new declaration
                return node.broker.queues[name].stats()
            return self._call(update)
        self._cluster.update_queue(name, changes)
        return self._stats_of(name)

    def queue_defined(self, name: str) -> bool:
        return self._cluster.queue_defined(name)

    def _stats_of(self, name: str) -> dict:
        queue = self._call(lambda: self._node.broker.queues.get(name))
        return self._call(queue.stats) if queue is not None else {"name": name}

    def delete_queue(self, name: str):
        node = self._node
        if node.handler is not None:  # a cluster: one raft entry drops the queue and its routes everywhere
            self._cluster.delete_queue(name)
            return

        flushes = Flushes()

        def delete():
            node = self._node
            durable = node.broker.queue(name).settings.durable
            node.server.apply(node.broker.delete_queue(name))
            node.server.detach_producers_of(name)
            if durable and node.journal is not None:
                node.journal.delete(name)
                flushes.after(node.server)
        self._call(delete)
        self._written(flushes, f"the deletion of queue {name!r}", "the queue is gone from memory, and a restart "
                      "may bring it back with its messages")

    def list_groups(self, queue: str):
        return self._call(lambda: self._node.broker.list_groups(queue))

    def group_page(self, queue: str, prefix: str, position: int, page_size: int, order: str = "") -> dict:
        from node.admin.group_pages import check_request, group_page
        from node.admin.group_ranks import rank
        node = self._node

        def label_of(consumer_id) -> str:
            state = node.server.consumers.get(consumer_id)
            return getattr(state, "label", "") or ""

        def client_of(consumer_id) -> str:  # "host:port (user)": the client as its own logs show it
            connection = getattr(node.server.consumers.get(consumer_id), "connection", None)
            peer, user = getattr(connection, "peer", "") or "", getattr(connection, "user", None)
            return f"{peer} ({user})" if peer and user else peer
        if order:  # one bridge call per batch of groups, as purge_queue (node/admin/group_ranks.py)
            check_request(prefix, position, page_size)
            return rank(lambda: node.broker.queue(queue), order, prefix, position, page_size, node.clock_ms,
                        label_of, run=self._call, client_of=client_of)
        return self._call(lambda: group_page(node.broker.queue(queue), prefix, position, page_size,
                                             node.clock_ms(), label_of, client_of=client_of))

    def _counted(self, fn, flushes: Flushes | None = None):
        """Run fn(now_ms) -> (count, effects) on the engine loop and carry out its effects; with `flushes`,
        register a wait for the journal records they make."""
        def run():
            count, effects = fn(self._node.clock_ms())
            self._node.server.apply(effects)
            if flushes is not None:
                flushes.after(self._node.server, effects)
            return count
        return self._call(run)

    def _written(self, flushes: Flushes, what: str, meanwhile: str) -> None:
        """Answer only once the journal has on disk what the call changed (node/admin/flushes.py)."""
        flushes.wait(self._node.config.admin_timeout_ms, what, meanwhile)

    def reset_groups(self, queue, group):
        return self._counted(lambda now_ms: self._node.broker.reset_groups(queue, group, now_ms))

    def purge_group(self, queue, group, count):
        flushes = Flushes()
        purged = self._counted(lambda now_ms: self._node.broker.purge_group(queue, group, count, now_ms), flushes)
        self._written(flushes, f"the purge of group {group!r} of queue {queue!r}",
                      f"{purged} messages purged in memory, which a restart may bring back")
        return purged

    def purge_queue(self, queue: str) -> tuple[int, int]:
        from node.admin.queue_purge import available_left, purge_batch
        node = self._node
        flushes = Flushes()

        def batch(position: int):  # one engine loop turn (node.admin.queue_purge)
            effects: list = []
            purged, position, done = purge_batch(node.broker.queue(queue), position, node.clock_ms(), effects)
            node.server.apply(effects)
            flushes.after(node.server, effects)  # each batch's removals go to disk as it ends, not with the tick
            return purged, position, done, available_left(node.broker.queue(queue)) if done else 0
        purged, position, done = 0, 0, False
        while not done:
            count, position, done, left = self._call(lambda position=position: batch(position))
            purged += count
        self._written(flushes, f"the purge of queue {queue!r}",
                      f"{purged} messages purged in memory, which a restart may bring back")
        return purged, left

    def move_group(self, queue, group, destination, count):
        flushes = Flushes()
        moved = self._counted(lambda now_ms: self._node.broker.move_group(queue, group, destination, count, now_ms),
                              flushes)
        self._written(flushes, f"the move of group {group!r} from {queue!r} to {destination!r}",
                      f"{moved} messages moved in memory, and a restart finds each one at {queue!r} or at "
                      f"{destination!r}")
        return moved

    def reroute_queue(self, queue, destination, group, count):
        from node.admin.queue_reroute import reroute_queue
        from node.core.dispatch.reroute import Reroute
        reroute = reroute_queue(self._node, self._call, self._node.config.admin_timeout_ms,
                                Reroute(queue, destination, group=group, count_max=count))
        return reroute.moved, reroute.stayed, reroute.stayed_reason

    # ---- the cluster (node/admin/cluster_control.py) ----

    def node_id(self) -> str:
        return self._cluster.node_id()

    def peers(self):
        return self._cluster.peers()

    def add_member(self, node_id: str) -> None:
        self._cluster.add_member(node_id)

    def remove_member(self, node_id: str) -> int:
        return self._cluster.remove_member(node_id)

    def cluster_status(self) -> dict:
        return self._cluster.cluster_status()
