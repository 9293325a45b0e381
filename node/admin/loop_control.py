"""LoopControl: the admin API's NodeControl (node/admin/control.py) over a running node's engine loop.

Rules:
- Callable from gRPC pool threads (and the console's HTTP threads): every read or change of the broker,
  the server or the cluster link runs on the engine loop through `Bridge.call`, with admin_timeout_ms as
  its deadline. Only the raft member's handle (`node.handler`) is asked from the caller's thread.
- In a cluster, queue definitions and membership go through the raft cluster and wait for its answer;
  alone, they act on the broker directly.
- A call that removes, moves or deletes durable messages answers once the journal has them on disk
  (node/admin/flushes.py).
- `node` is a node.runtime.Node, taken as it comes (runtime imports this module, not back).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time

from handler import queue_definitions as definitions
from node.admin.definitions import fixed_refusal, updated_settings
from node.admin.flushes import Flushes
from node.core.errors import AlreadyExists, HandlerUnavailable, NotAllowed, NotFound
from node.core.settings import QueueSettings

log = logging.getLogger("grouper.node")

MEMBERSHIP_RETRY_INTERVAL_MS = 200  # a denied membership change is proposed again after this long


class LoopControl:
    """NodeControl over the running engine loop: each call runs on the loop's thread."""

    def __init__(self, node):
        self._node = node

    def _call(self, fn):
        return self._node.bridge.call(fn, self._node.config.admin_timeout_ms)

    def list_queues(self):
        return self._call(self._node.broker.list_queues)

    def add_queue(self, settings: QueueSettings):
        if self._node.handler is not None:  # a cluster: defined on every node (handler/queue_definitions.py)
            outcome, held = self._decide(lambda on_result: self._node.handler.define_queue(
                settings.to_dict(), False, on_result))
            if outcome == definitions.CONFLICT:
                differing = sorted(key for key, value in settings.to_dict().items() if held.get(key) != value)
                raise AlreadyExists(f"queue {settings.name!r} is defined cluster-wide with other settings "
                                    f"({', '.join(differing)} differ); change what may change with 'grouper "
                                    f"queue update', or delete it first")
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
        current = self._call(lambda: dict(node.cluster.protocol.definitions.get(name, {})))
        if not current:
            raise NotFound(f"queue {name!r} has no cluster-wide definition (unknown, or auto-created on some nodes); "
                           f"define it with 'grouper queue add' first")
        updated_settings(current, changes)  # a bad value or a fixed field fails here, before any proposal
        outcome, detail = self._decide(lambda on_result: node.handler.update_queue(name, changes, on_result))
        if outcome == definitions.NOT_FOUND:
            raise NotFound(f"queue {name!r} was deleted cluster-wide meanwhile")
        if outcome == definitions.REFUSED:
            raise fixed_refusal(name, detail)
        return self._stats_of(name)

    def queue_defined(self, name: str) -> bool:
        """In a cluster: whether `name` has a cluster-wide definition, as this node's replica last heard."""
        cluster = self._node.cluster
        return cluster is not None and self._call(lambda: name in cluster.protocol.definitions)

    def _stats_of(self, name: str) -> dict:
        queue = self._call(lambda: self._node.broker.queues.get(name))
        return self._call(queue.stats) if queue is not None else {"name": name}

    def _decide(self, propose):
        """Propose a queue definition command and wait for its result, as applied by this node's replica
        (the feed reached the engine loop before the answer: both come through the member's channel)."""
        done = threading.Event()
        answer: list = []

        def on_result(reason, result):  # the raft member channel's reader thread
            answer.extend((reason, result))
            done.set()
        propose(on_result)
        timeout_ms = self._node.config.admin_timeout_ms
        if not done.wait(timeout_ms / 1000):
            raise TimeoutError(f"the raft cluster did not apply the queue change within {timeout_ms} ms "
                               f"(admin_timeout_ms); check 'grouper cluster status' and 'grouper queue list'")
        reason, result = answer
        if reason is not None:
            raise HandlerUnavailable(f"the raft cluster did not take the queue change: {reason}; retry")
        if result[0] == definitions.MALFORMED:
            raise AssertionError(f"the raft cluster found a queue command malformed: {result!r}")
        return result[0], result[1]

    def delete_queue(self, name: str):
        node = self._node
        if node.handler is not None:  # a cluster: one raft entry drops the queue and its routes everywhere
            seen_revision = self._call(lambda: node.cluster.protocol.definitions_revision)
            self._decide(lambda on_result: node.handler.delete_queue(name, seen_revision, on_result))
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

    def group_page(self, queue: str, prefix: str, position: int, page_size: int) -> dict:
        from node.admin.group_pages import group_page
        node = self._node

        def label_of(consumer_id) -> str:
            state = node.server.consumers.get(consumer_id)
            return getattr(state, "label", "") or ""
        return self._call(lambda: group_page(node.broker.queue(queue), prefix, position, page_size,
                                             node.clock_ms(), label_of))

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
        from node.core.reroute import Reroute
        reroute = reroute_queue(self._node, self._call, self._node.config.admin_timeout_ms,
                                Reroute(queue, destination, group=group, count_max=count))
        return reroute.moved, reroute.stayed, reroute.stayed_reason

    def node_id(self) -> str:
        return self._node.cluster.node_id if self._node.cluster is not None else ""

    def peers(self):
        cluster = self._node.cluster
        if cluster is None:
            return []
        nodes = self._call(lambda: cluster.members["nodes"])
        return [(node, info.get("admin_address", "")) for node, info in sorted(nodes.items())
                if node != cluster.node_id and info.get("admin_address")]

    def _membership(self, change, node_id: str, adding: bool) -> None:
        """Propose the change until it commits or is found done; denials are retried for half of
        admin_timeout_ms, and a proposal is waited for until admin_timeout_ms.

        Raft takes one membership change at a time and a new leader takes none before its first entry
        commits; pysyncobj answers both with a plain denial, so a denial is retried. This node's view
        of the membership tells a change already done (by an earlier try) from one still to make."""
        if self._node.handler is None:
            raise NotAllowed("this node runs alone (no --peers): there is no raft cluster to change")
        change = getattr(self._node.handler, change)  # by name: a node alone has no handler to take it from
        timeout_ms = self._node.config.admin_timeout_ms
        deadline_s = time.monotonic() + timeout_ms / 1000
        retry_until_s = time.monotonic() + timeout_ms / 2000  # half: the denial must reach the client in its deadline
        for attempt in itertools.count():
            done = threading.Event()
            failure: list = []

            def finished(reason, failure=failure, done=done):
                if reason is not None:
                    failure.append(reason)
                done.set()

            change(node_id, finished)
            if not done.wait(max(0.0, deadline_s - time.monotonic())):
                raise TimeoutError(f"the membership change of {node_id} was not committed within {timeout_ms} ms; "
                                   f"check 'grouper cluster status'")
            if not failure:
                return
            members = self._node.handler.status()["members"]
            if not adding and attempt == 0 and node_id not in members:
                raise NotFound(f"{node_id} is not a member of the raft cluster (members: {', '.join(members)}); "
                               f"give a node id as 'grouper cluster status' lists it")
            if (node_id in members) == adding:
                return  # done: by an earlier try, or (adding) before this call
            if time.monotonic() + MEMBERSHIP_RETRY_INTERVAL_MS / 1000 >= retry_until_s:
                raise HandlerUnavailable(f"the raft cluster did not change membership of {node_id} in "
                                         f"{attempt + 1} tries over {timeout_ms // 2} ms: {failure[0]}; check "
                                         f"'grouper cluster status'")
            time.sleep(MEMBERSHIP_RETRY_INTERVAL_MS / 1000)

    def add_member(self, node_id: str) -> None:
        self._membership("add_member", node_id, adding=True)

    def remove_member(self, node_id: str) -> int:
        self._membership("remove_member", node_id, adding=False)
        cluster = self._node.cluster
        keys = self._call(lambda: sorted(key for key, owner in cluster.router.routes.items() if owner == node_id))
        if keys:
            log.warning("node %s left the cluster owning %d routes; dropping them so its groups are placed "
                        "afresh", node_id, len(keys))
            self._node.handler.unroute(keys)
        return len(keys)

    def cluster_status(self) -> dict:
        node = self._node
        if node.cluster is None:
            return {"clustered": False, "members": [{"node": "", "connected": True}]}
        if node.handler is None:  # between the admin API's start and the raft member's
            raise HandlerUnavailable("this node is starting: its raft member is not running yet; ask again "
                                     "in a moment")
        raft = node.handler.status()
        local = self._call(node.cluster.status)
        members = local["members"]
        routes_by_node = self._call(lambda: _routes_by_node(node.cluster.router.routes))
        routes_digest = self._call(node.cluster.router.digest)
        rows = []
        for member in sorted(set(raft["members"]) | set(members["nodes"])):
            info = members["nodes"].get(member, {})
            rows.append({"node": member, "amqp_address": info.get("amqp_address", ""),
                         "admin_address": info.get("admin_address", ""), "down": member in members["down"],
                         "raft_member": member in raft["members"],
                         "connected": member == raft["node"] or member in raft["connected"],
                         "routes": routes_by_node.get(member, 0),
                         "consumers": members["consumers"].get(member, {})})
        return {"clustered": True, "node": raft["node"], "leader": raft["leader"], "term": raft["term"],
                "has_quorum": raft["has_quorum"], "routes": local["routes"],
                "routes_digest": routes_digest, "last_applied": raft.get("last_applied", 0),
                "commit_index": raft.get("commit_index", 0),
                "waiting_for_route": local["waiting_for_route"], "outbound": local["outbound"],
                "outbound_bytes": {owner: stats["bytes"] for owner, stats in local["outbound_store"].items()},
                "in_transit": local["in_transit"], "moving": local["moving"], "moves": local["moves"],
                "members": rows}


def _routes_by_node(routes: dict) -> dict[str, int]:
    counts: dict[str, int] = {}
    for owner in routes.values():
        counts[owner] = counts.get(owner, 0) + 1
    return counts
