"""The replica part of `grouper cluster status`: per owner node, its epoch, its in-sync backups and whether
it runs under-replicated (issue 28, docs/replication.md).

Rules:
- Read on the engine loop (ClusterControl passes it through its `call`), from the node's cluster protocol:
  its copy of the owner epochs and in-sync backups (node/core/cluster/replicas.py), its routes and the
  queues' settings. Changes nothing.
- A queue's replication factor is its setting `replication_factor`, else the cluster default (node config
  `replication_factor`); non-durable queues are not replicated (factor 1: their messages live in their
  owner's memory). An owner is under-replicated when it has routes of a queue whose factor asks for
  more backups than it has in sync and up, or a route whose group's own backups (assignment.backups_of) are
  not all in sync and up.
"""

from __future__ import annotations

from node.core.replication.assignment import backups_of


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
    report = cluster.replicas.report(needed, down, lambda owner: needed.get(owner, 1))
    # backups are chosen per group (assignment.backups_of): enough in sync is not enough, each group's own
    # backups must be (issue 28 phase 3: one backup down leaves the groups it backs on one disk)
    members = sorted(cluster.members.get("nodes", {}))
    for (queue, group), owner in cluster.router.routes.items():
        row = report.get(owner)
        if row is None or row["under_replicated"] or factor_of(queue) <= 1:
            continue
        if not set(backups_of(owner, queue, group, members, factor_of(queue))) <= set(row["in_sync"]):
            row["under_replicated"] = True
    return report
