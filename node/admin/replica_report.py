"""The replica part of `grouper cluster status`: per owner node, its epoch, its in-sync backups and whether
it runs under-replicated (issue 28, docs/replication.md).

Rules:
- Read on the engine loop (ClusterControl passes it through its `call`), from the node's cluster protocol:
  its copy of the owner epochs and in-sync backups (node/core/cluster/replicas.py), its routes and the
  queues' settings. Changes nothing.
- A queue's replication factor is its setting `replication_factor`, else the cluster default (node config
  `replication_factor`); non-durable queues are not replicated (factor 1: their messages live in their
  owner's memory). An owner is under-replicated when it has routes of a queue whose factor asks for
  more backups than it has in sync and up.
"""

from __future__ import annotations


def replica_report(cluster, replication_factor_default: int) -> dict:
    """{owner: {"epoch", "in_sync", "under_replicated"}} for every node with routes, an epoch or a set;
    `cluster`: the node's ClusterProtocol (node/core/cluster/protocol.py)."""
    queues, definitions = cluster.broker.queues, cluster.definitions
    factors: dict[str, int] = {}

    def factor_of(queue: str) -> int:
        factor = factors.get(queue)
        if factor is None:
            held = queues.get(queue)
            values = vars(held.settings) if held is not None else definitions.get(queue, {})
            durable = values.get("durable", True)
            factor = factors[queue] = (values.get("replication_factor") or replication_factor_default) if durable else 1
        return factor

    needed: dict[str, int] = {}
    for owner, queue in {(owner, queue) for (queue, _group), owner in cluster.router.routes.items()}:
        needed[owner] = max(needed.get(owner, 1), factor_of(queue))
    down = set(cluster.members.get("down", {}))
    return cluster.replicas.report(needed, down, lambda owner: needed.get(owner, 1))
