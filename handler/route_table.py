"""The route table: which node serves each message group, as replicated by the raft cluster.

Owns the table's replicated state and its commands: the routes (queue, group) -> node, held packed by
handler/packed_routes.py, the consumer counts each node reports, how to reach each member, which
members are down, the moves in progress and the revision. The rules of each seam live in a module of
its own: placement of a new group (handler/placement.py), the moves of groups following their
consumers (handler/route_moves.py), the members' reports (handler/member_reports.py), the owner
epochs, in-sync backups and promotions (handler/replica_sets.py); the latter four are views handed the
table's dicts for one command. Older snapshot formats are read by handler/route_snapshots.py.
pysyncobj applies every command on every replica in the same order, so:
- Deterministic: no clock (the proposer passes `now_ms`), no randomness, nothing from the
  environment; results and removals go in sorted order.
- Idempotent, first proposal wins: a retried claim returns the route the first one made.
- Plain data: the state holds only dict, list, tuple, str and int, and the routes' GroupMaps, which
  `state()` turns into ints and lists of bytes, because pysyncobj snapshots the table by pickling
  `state()` (snapshot format 4, handler/replicated.py: its keys and layout never change).
- Never raises for input from the cluster: a malformed entry gets None or is ignored, because an
  exception inside an applied command would kill the raft tick thread (handler/command_input.py). A
  time past TOUCHED_MS_MAX does not fit a packed route: a command carrying one is malformed (None, as
  a negative time is).
- Every command that changed something bumps `revision` once. Expiry (expire_idle) never removes a
  route whose group is moving; a removed route ends its move.
Never imports pysyncobj, threading, time, random, socket, grpc or proton.
"""

from __future__ import annotations

from handler.command_input import is_int, is_key, is_str
from handler.member_reports import MemberReports
from handler.packed_routes import TOUCHED_MS_MAX, PackedRoutes
from handler.placement import PLACEMENT_LOCAL, PLACEMENTS, Placement
from handler.replica_sets import ReplicaSets
from handler.route_moves import MOVES_PER_COMMAND_MAX, Moves
from node.core.group_map import GroupMap


ROUTES_MAX_DEFAULT = 1_000_000  # routes (queue, group) held cluster-wide; more are refused


def _is_time(value) -> bool:
    return type(value) is int and 0 <= value <= TOUCHED_MS_MAX


class RouteTable:
    def __init__(self, routes_max: int = ROUTES_MAX_DEFAULT):
        if not is_int(routes_max) or routes_max < 0:
            raise ValueError(f"routes_max must be an int >= 0, got {routes_max!r}")
        self.routes_max = routes_max
        self.store = PackedRoutes()  # the routes, their node names and counts per (node, queue)
        self.consumers: dict[str, dict[str, int]] = {}  # node -> queue -> consumers; no zero entries
        self.nodes: dict[str, dict] = {}  # node -> {"peer_address", "amqp_address", "admin_address"}
        self.down: dict[str, int] = {}  # node -> now_ms when marked down; absent means up
        # (queue, group) -> [from_node, to_node, started_ms, waiting (sorted nodes)]: moves in progress
        self.moves: dict[tuple[str, str], list] = {}
        self.epochs: dict[str, int] = {}  # owner node -> epoch (handler/replica_sets.py); absent = 0
        self.in_sync: dict[str, list] = {}  # owner node -> its in-sync backups, sorted; no empty lists
        self.revision = 0  # bumped once by every command that changed something

    @property
    def route_counts(self) -> dict[tuple[str, str], int]:
        """(node, queue) -> routes (placement and the leader's duties read them)."""
        return self.store.route_counts

    STATE = ("routes_max", "routes", "node_names", "route_counts", "consumers", "nodes", "down", "moves",
             "revision", "epochs", "in_sync")  # a snapshot's parts in order (handler/replicated.py: formats 2-4;
    # 2 and 3 end at "revision")

    def state(self) -> dict:
        """The table as plain data for a snapshot (format 4: routes {queue: GroupMap.state()}); shared,
        not copied (pysyncobj pickles it at once, in a forked child)."""
        store = self.store
        parts = {"routes": {queue: groups.state() for queue, groups in store.routes.items()},
                 "node_names": store.node_names, "route_counts": store.route_counts}
        return {name: parts[name] if name in parts else getattr(self, name) for name in self.STATE}

    @classmethod
    def from_state(cls, state: dict, read_groups=GroupMap.from_state) -> "RouteTable":
        """A snapshot of format version 4 (see state()); `read_groups` reads a queue's routes of another
        (handler/route_snapshots.py reads versions 1 to 3)."""
        table = cls(state["routes_max"])
        table.store = PackedRoutes({queue: read_groups(groups) for queue, groups in state["routes"].items()},
                                   state["node_names"], state["route_counts"])
        for name in ("consumers", "nodes", "down", "moves", "revision", "epochs", "in_sync"):
            setattr(table, name, state[name])
        return table

    def _placement(self) -> Placement:
        return Placement(self.consumers, self.store.route_counts, self.down)

    def _members(self) -> MemberReports:
        return MemberReports(self.consumers, self.nodes, self.down)

    def replica_sets(self) -> ReplicaSets:
        """The owner epochs, in-sync backups and promotion: replica_in_sync, replica_out_of_sync and promote
        are its commands (handler/replica_sets.py), each bumping the revision once when it changed something."""
        return ReplicaSets(self.epochs, self.in_sync, self.nodes, self.down, self.store, self.moves, self._changed)

    def entry(self, queue: str, group: str) -> tuple[str, int] | None:
        """(node, touched_ms) of the route, or None."""
        return self.store.entry(queue, group)

    def entries(self):
        """Every route as ((queue, group), (node, touched_ms)), in no particular order."""
        return self.store.entries()

    def __len__(self) -> int:
        return len(self.store)

    # ---- commands: replicated, so deterministic and never raising -----------------------------

    def claim(self, keys: list, proposer: str, now_ms: int, placement: str = PLACEMENT_LOCAL,
              members_only: bool = False) -> list:
        """`members_only`: place on registered members only (handler/placement.py; claims proposed once
        raft code version 4 is enabled)."""
        if not isinstance(keys, (list, tuple)):
            return []
        if not (is_str(proposer) and _is_time(now_ms) and is_str(placement)
                and placement in PLACEMENTS and type(members_only) is bool):
            return [None] * len(keys)
        chooser = Placement(self.consumers, self.store.route_counts, self.down, self.nodes if members_only else None)
        nodes = [self._claim_one(key[0], key[1], proposer, now_ms, placement, chooser) if is_key(key) else None
                 for key in keys]
        # A refresh counts as a change: touched_ms decides expiry, so the revision must move with it.
        if any(node is not None for node in nodes):
            self.revision += 1
        return nodes

    def _claim_one(self, queue: str, group: str, proposer: str, now_ms: int, placement: str,
                   chooser: Placement) -> str | None:
        store = self.store
        packed = store.get(queue, group)
        if packed is not None:
            store.refresh(queue, group, packed, now_ms)
            return store.node_of(packed)
        if len(store) >= self.routes_max:
            return None
        return store.create(queue, group, chooser.choose(queue, proposer, placement), now_ms)

    def follow_consumers(self, queue: str, from_node: str, now_ms: int) -> list:
        """Move the routes of `queue` on `from_node` to the nodes consuming it (handler/route_moves.py).
        Returns the moves begun, [(queue, group, from_node, to_node, waiting)], sorted."""
        placement = self._placement()
        if not (is_str(queue) and is_str(from_node) and _is_time(now_ms)) or placement.serves(from_node, queue):
            return []
        targets = placement.serving(queue)  # from_node is not among them: it serves the queue no more
        if not targets:
            return []
        keys = [key for key in self.store.groups_on(queue, from_node) if key not in self.moves]
        moves, members = Moves(self.moves), self._members().up()
        begun = []
        for key in keys[:MOVES_PER_COMMAND_MAX]:
            to_node = placement.fewest_routes(targets, queue)
            if not self.store.repoint(queue, key[1], from_node, to_node, now_ms):
                break  # NODES_MAX names routed to already
            begun.append(moves.begin(key, from_node, to_node, now_ms, members))
        if begun:
            self.revision += 1
        return begun

    def move_clear(self, entries: list, node: str) -> list:
        """`node` holds and sends nothing more of each moving group toward its old owner: entries are
        [queue, group, from_node, to_node] (handler/route_moves.py). Returns the moves that changed, as
        follow_consumers does (waiting () for a move that ended)."""
        return self._changed(Moves(self.moves).clear(entries, node))

    def touch(self, entries: list, now_ms: int) -> list:
        """Refresh routes a node relies on: entries are [queue, group, node], the node it routes to.

        Unlike a claim, a missing route is made again on the given node, never by placement: the
        group's messages are there (or on their way), so placing it elsewhere would split it. A
        route naming another node is left alone; its node is returned so the caller sees the
        conflict. Results align with entries: the route's node, or None (malformed, routes_max)."""
        if not isinstance(entries, (list, tuple)) or not is_int(now_ms):
            return []
        if now_ms > TOUCHED_MS_MAX:
            return [None] * len(entries)  # does not fit a packed route: malformed, as a negative time for a new one
        store, results = self.store, []
        for entry in entries:
            if not (isinstance(entry, (list, tuple)) and len(entry) == 3 and is_key(entry[:2])
                    and is_str(entry[2])):
                results.append(None)
                continue
            queue, group, node = entry
            packed = store.get(queue, group)
            if packed is None:
                results.append(store.create(queue, group, node, now_ms)
                               if len(store) < self.routes_max and now_ms >= 0 else None)
            else:
                owner = store.node_of(packed)
                if owner == node:
                    store.refresh(queue, group, packed, now_ms)
                results.append(owner)
        if any(result is not None for result in results):
            self.revision += 1
        return results

    def report_consumers(self, node: str, counts: dict, now_ms: int) -> None:
        self._changed(self._members().report_consumers(node, counts))

    def register_node(self, node: str, peer_address: str, amqp_address: str, admin_address: str,
                      now_ms: int) -> None:
        known = node in self.nodes
        if self._changed(self._members().register(node, peer_address, amqp_address, admin_address)) and not known:
            self.in_sync.clear()  # a new name changes every group's backups (handler/replica_sets.py)

    def mark_down(self, node: str, now_ms: int) -> None:
        self._changed(self._members().mark_down(node, now_ms))

    def mark_up(self, node: str, now_ms: int) -> None:
        self._changed(self._members().mark_up(node))

    def fail_over(self, node: str, now_ms: int) -> list:
        """The owner-failover policy: mark `node` down and drop every route naming it, so its groups
        are placed afresh on live nodes. Returns the dropped keys, sorted."""
        if not (is_str(node) and is_int(now_ms)):
            return []
        self.mark_down(node, now_ms)
        Moves(self.moves).release(node)  # it sends nothing more: nobody waits for it
        return self._remove(self.store.keys_on(node))

    def expire_idle(self, cutoff_ms: int, spared_nodes: list = ()) -> list:
        """Remove routes touched before cutoff_ms, except those of `spared_nodes` (members the leader
        cannot reach cannot refresh the groups they hold, which must not move meanwhile) and those
        of moving groups (both ends hold the group until the move ends; the clears end it)."""
        if not is_int(cutoff_ms) or not isinstance(spared_nodes, (list, tuple)):
            return []
        return self._remove([key for key in self.store.idle(cutoff_ms, spared_nodes) if key not in self.moves])

    def unroute(self, keys: list) -> list:
        if not isinstance(keys, (list, tuple)):
            return []
        wanted = sorted({(key[0], key[1]) for key in keys if is_key(key)})
        return self._remove([key for key in wanted if self.store.get(*key) is not None])

    def drop_queue(self, queue: str) -> list:
        if not is_str(queue):
            return []
        return self._remove([(queue, group) for group, _node, _touched_ms in self.store.routes_of(queue)])

    def _remove(self, keys: list) -> list:
        self.store.remove(keys)
        for key in keys:
            self.moves.pop(key, None)  # a removed route ends its move (the ROUTES feed says so)
        return self._changed(keys)

    def _changed(self, changes):
        """`changes` (a bool, or a list of what changed), after one revision more if they say something changed."""
        if changes:
            self.revision += 1
        return changes

    # ---- policy and reads: pure, never change state ------------------------------------------

    def choose_node(self, queue: str, proposer: str, placement: str = PLACEMENT_LOCAL) -> str:
        return self._placement().choose(queue, proposer, placement)

    def route(self, queue: str, group: str) -> str | None:
        if not (is_str(queue) and is_str(group)):
            return None
        packed = self.store.get(queue, group)
        return None if packed is None else self.store.node_of(packed)

    def moves_all(self) -> list:
        """Every move in progress, as the MOVES_ALL feed carries them, sorted."""
        return Moves(self.moves).all()

    def routes_of(self, queue: str) -> list:
        return self.store.routes_of(queue)

    def snapshot(self) -> dict:
        routes_by_node: dict[str, int] = {}
        for (node, _queue), count in sorted(self.route_counts.items()):
            routes_by_node[node] = routes_by_node.get(node, 0) + count
        return {
            "revision": self.revision,
            "routes": len(self.store),
            "routes_max": self.routes_max,
            "routes_by_node": routes_by_node,
            "consumers": {node: dict(sorted(held.items())) for node, held in sorted(self.consumers.items())},
            "nodes": {node: dict(member) for node, member in sorted(self.nodes.items())},
            "down": dict(sorted(self.down.items())),
            "moving": len(self.moves),
        }
