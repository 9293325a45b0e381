"""Replica sets: the route table's owner epochs, in-sync backups and the promotion of a failed owner's groups.

Owns the rules of the table's `epochs` ({node: epoch}, absent = 0) and `in_sync` ({owner: [backup, ...]
sorted}, no empty lists) (docs/replication.md; the interfaces: /work/wt/replication-interfaces.md,
"Raft"), as a view handed the table's dicts for one command, as handler/route_moves.py is. Who backs a
group up is not stored: node/core/replication/assignment.py computes it from the registered members.
- `in_sync(owner, backup, epoch)`: the owner says `backup` holds a current copy of every group it backs
  for it. Taken only at the owner's current epoch, from a registered backup that is not the owner and
  not down, for a registered owner. In sync is per (owner, backup) pair and starts empty, so nothing
  is ever promoted to a copy nobody said exists.
- `out_of_sync(owner, backup, epoch)`: the backup leaves the set (the owner saw it lag, or the backup
  lost its state); a stale epoch is ignored.
- `member_registered(known)`: a NEW member name changes every group's backups (rendezvous ranks), so
  every set empties and the owners confirm their backups again.
- `promote(owner, epoch, now_ms, factor_of)`: only at the owner's current epoch (a retry, or a promote
  decided under an older view, is a no-op). The owner's epoch becomes epoch + 1, it is marked down, it
  leaves every set and its own set empties; each of its routes moves to `promotion_target` of its
  group (members: the registered nodes, down ones included; in sync: its set less the nodes down;
  factor: `factor_of(queue)`). A route with no target stays (it waits for its owner, or for
  owner_failover_ms). So does a route whose group is moving (route_moves.py): the old node may still
  hold messages of it the backup never saw. Moves are left alone: the owner still holds what it held.
Deterministic, sorted, plain data; never raises for input from the cluster (malformed input changes
nothing). Never imports pysyncobj, threading, time, random, socket, grpc or proton.
"""

from __future__ import annotations

from handler.command_input import is_int, is_str
from node.core.replication.assignment import REPLICATION_FACTOR_MAX, promotion_target


def is_factor(value) -> bool:
    return is_int(value) and 1 <= value <= REPLICATION_FACTOR_MAX


class ReplicaSets:
    def __init__(self, epochs: dict, in_sync: dict, nodes: dict, down: dict):
        self.epochs = epochs  # node -> epoch; absent = 0
        self.in_sync = in_sync  # owner -> [backup, ...] sorted; no empty lists
        self.nodes = nodes  # the registered members (handler/member_reports.py)
        self.down = down  # node -> now_ms when marked down

    def epoch_of(self, node: str) -> int:
        return self.epochs.get(node, 0)

    def _current(self, owner, backup, epoch) -> bool:
        return is_str(owner) and is_str(backup) and is_int(epoch) and epoch == self.epoch_of(owner)

    def add(self, owner: str, backup: str, epoch: int) -> bool:
        if not (self._current(owner, backup, epoch) and backup != owner and owner in self.nodes
                and backup in self.nodes and backup not in self.down):
            return False
        backups = self.in_sync.get(owner, [])
        if backup in backups:
            return False
        self.in_sync[owner] = sorted([*backups, backup])
        return True

    def remove(self, owner: str, backup: str, epoch: int) -> bool:
        if not self._current(owner, backup, epoch) or backup not in self.in_sync.get(owner, ()):
            return False
        self._drop(owner, backup)
        return True

    def member_registered(self, known: bool) -> bool:
        """A member registered; `known`: its name was registered before. Returns whether sets emptied."""
        if known or not self.in_sync:
            return False
        self.in_sync.clear()
        return True

    def promote(self, owner: str, epoch: int, factor_of, store, moves: dict, now_ms: int) -> list:
        """Returns the moved routes [(queue, group, new node)], sorted, or None for a no-op. The caller
        marks the owner down (handler/member_reports.py) and checked `now_ms` and the default factor."""
        if not (is_str(owner) and is_int(epoch)) or owner not in self.nodes or epoch != self.epoch_of(owner):
            return None
        live = {backup for backup in self.in_sync.pop(owner, ()) if backup not in self.down and backup != owner}
        self.epochs[owner] = epoch + 1
        for other in sorted(self.in_sync):
            if owner in self.in_sync[other]:
                self._drop(other, owner)
        if not live:
            return []
        members = sorted(self.nodes)
        moved = []
        for queue, group in store.keys_on(owner):  # sorted
            if (queue, group) in moves:
                continue
            target = promotion_target(owner, queue, group, members, live, factor_of(queue))
            if target is not None and store.repoint(queue, group, owner, target, now_ms):
                moved.append((queue, group, target))
        return moved

    def _drop(self, owner: str, backup: str) -> None:
        backups = [node for node in self.in_sync[owner] if node != backup]
        if backups:
            self.in_sync[owner] = backups
        else:
            del self.in_sync[owner]

    def copy(self) -> dict:
        """The sets as the REPLICAS feed carries them (node/core/cluster/feed.py): copies, sorted."""
        return {"epochs": dict(sorted(self.epochs.items())),
                "in_sync": {owner: list(backups) for owner, backups in sorted(self.in_sync.items())}}
