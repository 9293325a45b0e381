"""ClusterControl: the raft half of the admin API's LoopControl: queue definitions, membership, status.

Rules:
- Used by LoopControl (node/admin/loop_control.py) when the node runs in a cluster; callable from gRPC
  pool threads. Reads of the cluster's state on the node run on the engine loop through `call` (the
  bridge, with admin_timeout_ms as its deadline); proposals go to the raft member's handle
  (`node.handler`) from the caller's thread, which then waits for the member's answer.
- Queue definitions and membership changes answer once this node's replica applied them, or fail
  within admin_timeout_ms: TimeoutError when nothing came back, HandlerUnavailable when the raft
  cluster refused. A denied membership change is proposed again (pysyncobj denies a second change
  while one is in flight).
- `node` is a node.runtime.Node, taken as it comes (runtime imports LoopControl, which imports this
  module; neither imports runtime back).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time

from node.core.cluster import feed
from node.admin.definitions import fixed_refusal, updated_settings
from node.admin.replica_report import replica_report
from node.core.errors import AlreadyExists, HandlerUnavailable, NotAllowed, NotFound
from node.core.dispatch.settings import QueueSettings

log = logging.getLogger("grouper.node")

MEMBERSHIP_RETRY_INTERVAL_MS = 200  # a denied membership change is proposed again after this long


class ClusterControl:
    def __init__(self, node, call):
        """`call(fn)`: run fn on the engine loop and return its result (LoopControl._call)."""
        self._node = node
        self._call = call

    def define_queue(self, settings: QueueSettings) -> None:
        """Defined on every node (handler/queue_definitions.py); refused if defined with other settings."""
        outcome, held = self._decide(lambda on_result: self._node.handler.define_queue(
            settings.to_dict(), False, on_result))
        if outcome == feed.CONFLICT:
            differing = sorted(key for key, value in settings.to_dict().items() if held.get(key) != value)
            raise AlreadyExists(f"queue {settings.name!r} is defined cluster-wide with other settings "
                                f"({', '.join(differing)} differ); change what may change with 'grouper "
                                f"queue update', or delete it first")

    def update_queue(self, name: str, changes: dict) -> None:
        node = self._node
        current = self._call(lambda: dict(node.cluster.protocol.definitions.get(name, {})))
        if not current:
            raise NotFound(f"queue {name!r} has no cluster-wide definition (unknown, or auto-created on some nodes); "
                           f"define it with 'grouper queue add' first")
        updated_settings(current, changes)  # a bad value or a fixed field fails here, before any proposal
        outcome, detail = self._decide(lambda on_result: node.handler.update_queue(name, changes, on_result))
        if outcome == feed.NOT_FOUND:
            raise NotFound(f"queue {name!r} was deleted cluster-wide meanwhile")
        if outcome == feed.UPDATE_REFUSED:
            raise fixed_refusal(name, detail)

    def queue_defined(self, name: str) -> bool:
        """Whether `name` has a cluster-wide definition, as this node's replica last heard."""
        cluster = self._node.cluster
        return cluster is not None and self._call(lambda: name in cluster.protocol.definitions)

    def delete_queue(self, name: str) -> None:
        """One raft entry drops the queue and its routes everywhere."""
        node = self._node
        seen_revision = self._call(lambda: node.cluster.protocol.definitions_revision)
        self._decide(lambda on_result: node.handler.delete_queue(name, seen_revision, on_result))

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
        if result[0] == feed.MALFORMED:
            raise AssertionError(f"the raft cluster found a queue command malformed: {result!r}")
        return result[0], result[1]

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
        """Remove `node_id` from the raft cluster, then forget it in the route table (forget_node,
        handler/member_removal.py): its routes, consumers, down mark and in-sync places go, so nothing is
        placed on it again. A retry after the first step finds the node out of raft but still in the
        table, and forgets it. Returns how many routes were dropped."""
        cluster = self._node.cluster
        try:
            self._membership("remove_member", node_id, adding=False)
        except NotFound:
            if not self._call(lambda: node_id in cluster.members.get("nodes", {})):
                raise
        done = threading.Event()
        answer: list = []

        def on_result(reason, result):  # the raft member channel's reader thread
            answer.extend((reason, result))
            done.set()
        self._node.handler.forget_node(node_id, on_result)
        timeout_ms = self._node.config.admin_timeout_ms
        if not done.wait(timeout_ms / 1000):
            raise TimeoutError(f"{node_id} left the raft cluster, but forgetting it in the route table was not "
                               f"applied within {timeout_ms} ms (admin_timeout_ms); run remove-node again")
        reason, dropped = answer
        if reason is not None:
            raise HandlerUnavailable(f"{node_id} left the raft cluster, but the route table did not forget it: "
                                     f"{reason}; run remove-node again")
        if dropped:
            log.warning("node %s left the cluster owning %d routes; dropped so its groups are placed afresh",
                        node_id, dropped)
        return dropped

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
        replicas = self._call(lambda: replica_report(node.cluster.protocol, node.config.replication_factor))
        rows = []
        for member in sorted(set(raft["members"]) | set(members["nodes"])):
            info = members["nodes"].get(member, {})
            rows.append({"node": member, "amqp_address": info.get("amqp_address", ""),
                         "admin_address": info.get("admin_address", ""), "down": member in members["down"],
                         "raft_member": member in raft["members"],
                         "connected": member == raft["node"] or member in raft["connected"],
                         "routes": routes_by_node.get(member, 0),
                         "consumers": members["consumers"].get(member, {}),
                         **replicas.get(member, {"epoch": 0, "in_sync": [], "under_replicated": False})})
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
