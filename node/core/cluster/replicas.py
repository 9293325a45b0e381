"""Replicas: this node's copy of the route table's owner epochs and in-sync backups (issue 28).

Rules:
- Read-only for everyone but the feed: `applied(payload)` takes each REPLICAS payload
  (node/core/cluster/feed.py; handler/replica_sets.py decides them) whole, replacing what was known, in
  log order, so the copy is what the replica held after the last command this node heard of.
- `epoch_of(node)` (absent = 0) and `in_sync_of(owner)` answer from the copy; `report(...)` says, per
  owner, its epoch, its in-sync backups that are not down, and whether it runs under-replicated.
- Under-replicated: the owner has routes of a durable queue whose replication factor (the queue's
  setting, else the cluster default) asks for more backups than it has in sync and up. Until the
  replica streams run, no backup is ever in sync, so every owner of durable groups in a cluster with
  a factor above 1 says so: that is the truth of a message on one disk.
- Pure: imports nothing of this package; never imports threading, grpc, pysyncobj, socket or time.
"""

from __future__ import annotations


class Replicas:
    def __init__(self):
        self.epochs: dict[str, int] = {}  # node -> epoch; absent = 0
        self.in_sync: dict[str, tuple[str, ...]] = {}  # owner -> its in-sync backups, sorted

    def applied(self, payload: dict) -> None:
        self.epochs = {node: int(epoch) for node, epoch in payload.get("epochs", {}).items()}
        self.in_sync = {owner: tuple(sorted(backups)) for owner, backups in payload.get("in_sync", {}).items()}

    def epoch_of(self, node: str) -> int:
        return self.epochs.get(node, 0)

    def in_sync_of(self, owner: str) -> tuple[str, ...]:
        return self.in_sync.get(owner, ())

    def report(self, owners, down, factor_needed) -> dict:
        """{owner: {"epoch", "in_sync", "under_replicated"}} for `owners` (nodes with routes, and every node
        with an epoch or a set); `factor_needed(owner)`: the largest replication factor of the durable
        queues it owns routes of (1 when none)."""
        report = {}
        for owner in sorted(set(owners) | set(self.epochs) | set(self.in_sync)):
            live = [backup for backup in self.in_sync_of(owner) if backup not in down]
            report[owner] = {"epoch": self.epoch_of(owner), "in_sync": live,
                             "under_replicated": len(live) < factor_needed(owner) - 1}
        return report
