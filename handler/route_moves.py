"""Moves: the route table's records of groups following their consumers to another node.

Owns the rules of the move records (the raft names stay `follow_consumers`, `move_clear`, MOVES; the
handover itself, on the nodes, is node/core/cluster/handover.py), as a view over the table's `moves`
dict, built for one command:
- `follow_consumers(queue, from_node, now_ms)` (handler/route_table.py picks the routes and their new
  nodes), proposed by the leader's duties, moves the routes of `queue` that name `from_node` to the nodes
  that consume the queue (fewest routes of the queue first), at most MOVES_PER_COMMAND_MAX a command, and
  only while `from_node` has no consumer on the queue (or is down) and another node has some: applied
  late, after consumers came back, it moves nothing. A moving route is never moved again until its move
  ends.
- Each moved route gets a move record [from_node, to_node, started_ms, waiting]: `waiting` are the
  members (registered, not down, plus both ends) that may still hold or send messages of the group
  toward `from_node`. `move_clear(entries, node)` takes `node` out of `waiting` for each
  [queue, group, from_node, to_node] that names the move exactly (compare-and-set: a clear of an
  older move of the same group does nothing). `from_node` is taken out only last: its clear says its
  backlog and everything it relayed have reached `to_node`. When `waiting` is empty the move ends.
- A route removed (expire_idle, unroute, drop_queue, fail_over of its node) ends its move; a member
  failed over is taken out of every `waiting` (availability over order, as failover already is).
Records are plain lists (the table's snapshot pickles them); results go out as the MOVES feed's tuples
(queue, group, from_node, to_node, waiting), in sorted order. Never raises for input from the cluster.
Never imports pysyncobj, threading, time, random, socket, grpc or proton.
"""

from __future__ import annotations

from handler.command_input import is_key, is_str

MOVES_PER_COMMAND_MAX = 1000  # routes one follow_consumers moves; the leader proposes again for the rest


class Moves:
    def __init__(self, records: dict):
        # the table's (queue, group) -> [from_node, to_node, started_ms, waiting (sorted nodes)]
        self.records = records

    def begin(self, key: tuple, from_node: str, to_node: str, now_ms: int, members: set) -> tuple:
        """Record the move of `key`'s route; `members` (the members up) may still send toward from_node."""
        waiting = sorted(members | {from_node, to_node})
        self.records[key] = [from_node, to_node, now_ms, waiting]
        return (key[0], key[1], from_node, to_node, tuple(waiting))

    def clear(self, entries: list, node: str) -> list:
        """`node` holds and sends nothing more of each moving group toward its old owner: entries are
        [queue, group, from_node, to_node]. Returns the moves that changed (waiting () for one that ended)."""
        if not (isinstance(entries, (list, tuple)) and is_str(node)):
            return []
        changed = []
        for entry in entries:
            if not (isinstance(entry, (list, tuple)) and len(entry) == 4 and is_key(entry[:2])
                    and is_str(entry[2]) and is_str(entry[3])):
                continue
            key = (entry[0], entry[1])
            move = self.records.get(key)
            if move is None or move[0] != entry[2] or move[1] != entry[3] or node not in move[3]:
                continue  # another move of the group, or cleared already: a retry
            if node == move[0] and len(move[3]) > 1:
                continue  # the old owner clears last: what the others still send it, it relays
            changed.append(self._clear(key, move, node))
        return changed

    def release(self, node: str) -> None:
        """`node` failed over: it sends nothing more, so nobody waits for it."""
        for key in sorted(self.records):
            move = self.records[key]
            if node in move[3]:
                self._clear(key, move, node)

    def all(self) -> list:
        """Every move in progress, as the MOVES_ALL feed carries them, sorted."""
        return [(queue, group, move[0], move[1], tuple(move[3]))
                for (queue, group), move in sorted(self.records.items())]

    def _clear(self, key: tuple, move: list, node: str) -> tuple:
        move[3].remove(node)
        if not move[3]:
            del self.records[key]
        return (key[0], key[1], move[0], move[1], tuple(move[3]))
