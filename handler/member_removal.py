"""Member removal: the route table forgets a node that left the raft cluster (`grouper cluster remove-node`).

Owns the rule of the raft command `forget_node(node)` (ver=4, handler/replicated.py; proposed by the
admin's remove-node path, node/admin/cluster_control.py, once the raft membership change is committed),
as a function over the table (handler/route_table.py, at its size bound, so not one of its methods), applied
in one command (handler/removal_commands.py feeds what it changed):
- Every trace of `node` goes: its consumer counts, its `nodes` entry (how to reach it), its down mark,
  its routes (their groups are placed afresh by the next claim, on live members only), its in-sync set
  as an owner and its place in every other owner's set (handler/replica_sets.py); every move waiting
  for it stops waiting (it sends nothing more), and a removed route ends its move.
- Its epoch stays: epochs only grow (a name that comes back starts at the epoch it left at, so a
  stale claim of it stays fenced).
- Why: a removed node kept its last consumer counts, so placement kept giving it new groups whose
  messages stranded in the other nodes' outbound stores, and backup assignment
  (node/core/replication/assignment.py, over the registered members) kept counting it
  (docs/reliability.md finding 11).
- Idempotent (forgetting a node again, or one never known, changes nothing and returns []) and
  deterministic (removals in sorted order); malformed input changes nothing. Returns the removed
  routes' keys, sorted; the revision moves once when anything changed.
Never imports pysyncobj, threading, time, random, socket, grpc or proton.
"""

from __future__ import annotations

from handler.command_input import is_str
from handler.route_moves import Moves


def forget_node(table, node: str) -> list:
    """Forget `node` in `table` (a handler/route_table.py RouteTable, whose revision moves once if anything
    changed); returns the removed route keys, sorted."""
    keys, changed = _forget(table, node)
    table._changed(bool(keys) or changed)
    return keys


def _forget(table, node: str) -> tuple[list, bool]:
    if not is_str(node):
        return [], False
    members_changed = False
    for part in (table.consumers, table.nodes, table.down):
        if node in part:
            del part[node]
            members_changed = True
    in_sync = table.in_sync
    if in_sync.pop(node, None) is not None:
        members_changed = True
    for owner in sorted(in_sync):
        backups = in_sync[owner]
        if node in backups:
            members_changed = True
            kept = [backup for backup in backups if backup != node]
            if kept:
                in_sync[owner] = kept
            else:
                del in_sync[owner]
    moves_before = len(table.moves), sum(len(move[3]) for move in table.moves.values())
    Moves(table.moves).release(node)
    keys = table.store.keys_on(node)  # sorted
    table.store.remove(keys)
    for key in keys:
        table.moves.pop(key, None)  # a removed route ends its move
    moves_changed = (len(table.moves), sum(len(move[3]) for move in table.moves.values())) != moves_before
    return keys, members_changed or moves_changed
