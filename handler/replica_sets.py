"""Replica sets: the route table's owner epochs, in-sync backups and the promotion of a failed owner's groups.

Owns the rules of the table's `epochs` ({node: epoch}, absent = 0) and `in_sync` ({owner: [backup, ...]
sorted}, no empty lists) (docs/replication.md; the raft commands replica_in_sync, replica_out_of_sync and
promote), as a view handed the table's dicts for one command, as handler/route_moves.py is; each command
bumps the table's revision once (`changed`) when it changed something. Who backs a group up is not
stored: node/core/replication/assignment.py computes it from the registered members.
- `replica_in_sync(owner, backup, epoch)`: the owner says `backup` holds a current copy of every group it
  backs for it. Taken only at the owner's current epoch, from a registered backup that is not the owner
  and not down, for a registered owner. In sync is per (owner, backup) pair and starts empty, so nothing
  is ever promoted to a copy nobody said exists.
- `replica_out_of_sync(owner, backup, epoch)`: the backup leaves the set (the owner saw it lag, or the
  backup lost its state); a stale epoch is ignored.
- Registering a NEW member name empties every set (handler/route_table.py register_node): it changes
  every group's backups (rendezvous ranks), so the owners confirm their backups again.
- `promote(owner, epoch, now_ms, factor_default, factors)`: only at the owner's current epoch, for a
  registered owner (a retry, or a promote decided under an older view, is a no-op: None). The owner's
  epoch becomes epoch + 1, it is marked down, it leaves every set and its own set empties; each of its
  routes moves to `promotion_target` of its group (members: the registered nodes, down ones included;
  in sync: its set less the nodes down; factor: `factors[queue]`, the queue definition's, else
  `factor_default`), touched at now_ms. A route with no target stays (it waits for its owner, or for
  owner_failover_ms). So does a route whose group is moving (route_moves.py): the old node may still
  hold messages of it the backup never saw; the moves themselves are left alone.
Deterministic, sorted, plain data; never raises for input from the cluster (malformed input changes
nothing). Never imports pysyncobj, threading, time, random, socket, grpc or proton.
"""

from __future__ import annotations

from handler.command_input import is_int, is_str
from handler.packed_routes import TOUCHED_MS_MAX
from node.core.replication.assignment import REPLICATION_FACTOR_MAX, promotion_target


def is_factor(value) -> bool:
    return is_int(value) and 1 <= value <= REPLICATION_FACTOR_MAX


class ReplicaSets:
    def __init__(self, epochs: dict, in_sync: dict, nodes: dict, down: dict, store, moves: dict, changed):
        self.epochs = epochs  # node -> epoch; absent = 0
        self.in_sync = in_sync  # owner -> [backup, ...] sorted; no empty lists
        self.nodes = nodes  # the registered members (handler/member_reports.py)
        self.down = down  # node -> now_ms when marked down
        self.store = store  # the routes (handler/packed_routes.py)
        self.moves = moves  # (queue, group) -> the move in progress (handler/route_moves.py)
        self._changed = changed  # (changes) -> changes, the table's revision bumped once if any

    def epoch_of(self, node: str) -> int:
        return self.epochs.get(node, 0)

    def replica_in_sync(self, owner: str, backup: str, epoch: int) -> bool:
        if not (self._current(owner, backup, epoch) and backup != owner and owner in self.nodes
                and backup in self.nodes and backup not in self.down):
            return False
        backups = self.in_sync.get(owner, [])
        if backup in backups:
            return False
        self.in_sync[owner] = sorted([*backups, backup])
        return self._changed(True)

    def replica_out_of_sync(self, owner: str, backup: str, epoch: int) -> bool:
        if not self._current(owner, backup, epoch) or backup not in self.in_sync.get(owner, ()):
            return False
        self._drop(owner, backup)
        return self._changed(True)

    def promote(self, owner: str, epoch: int, now_ms: int, factor_default: int, factors: dict | None = None):
        """Returns the moved routes [(queue, group, new node)], sorted, or None for a no-op."""
        factors = {} if factors is None else factors
        if not (is_str(owner) and is_int(epoch) and is_int(now_ms) and 0 <= now_ms <= TOUCHED_MS_MAX
                and is_factor(factor_default) and isinstance(factors, dict)):
            return None
        if owner not in self.nodes or epoch != self.epoch_of(owner):
            return None
        live = {backup for backup in self.in_sync.pop(owner, ()) if backup not in self.down}
        self.epochs[owner] = epoch + 1
        self.down.setdefault(owner, now_ms)  # marked down; a mark already there keeps its first time
        for other in sorted(self.in_sync):
            if owner in self.in_sync[other]:
                self._drop(other, owner)
        self._changed(True)
        if not live:
            return []
        members, moved = sorted(self.nodes), []
        for queue, group in self.store.keys_on(owner):  # sorted
            if (queue, group) in self.moves:
                continue
            factor = factors.get(queue)
            target = promotion_target(owner, queue, group, members, live,
                                      factor if is_factor(factor) else factor_default)
            if target is not None and self.store.repoint(queue, group, owner, target, now_ms):
                moved.append((queue, group, target))
        return moved

    def _current(self, owner, backup, epoch) -> bool:
        return is_str(owner) and is_str(backup) and is_int(epoch) and epoch == self.epoch_of(owner)

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
