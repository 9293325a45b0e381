"""The route table: which node serves each message group, as replicated by the raft cluster.

Owns the routes (queue, group) -> node, the consumer counts each node reports, how to reach each
member, and which members are down. pysyncobj applies every command on every replica in the same
order, so the rules are:
- Deterministic: no clock (the proposer passes `now_ms`), no randomness, nothing from the
  environment; results and removals go in sorted order.
- Idempotent, first proposal wins: a retried claim returns the route the first one made.
- Plain data: the attributes hold only dict, list, tuple, str and int, and the routes' GroupMaps,
  which `state()` turns into ints and lists of bytes, because pysyncobj snapshots the table by
  pickling it.
- Never raises for input from the cluster: a malformed entry gets None or is ignored, because an
  exception inside an applied command would kill the raft tick thread.
Placement of a new group (`choose_node`), by the claim's `placement`, which the proposer puts into
the claim command itself: a mode read from each replica's own settings could differ between replicas
and split their tables, a mode in the log cannot.
- PLACEMENT_BALANCED: the node whose consumers on the queue hold the fewest groups per consumer,
  counting the new group (routes of the queue / its consumers there, cluster-wide, down nodes
  excluded); ties go to the smallest node name. The proposer's node saves a forwarding hop, so it
  keeps the group while its groups per consumer, counting the new one, are at most
  LOCAL_TOLERANCE_RATIO above the best node's: a tie within 10%, never a standing lead.
- PLACEMENT_LOCAL (the rule before placement was an argument, so the default for claims journalled
  then): the proposer's node whenever it has a consumer on the queue, else the node with consumers
  and the fewest routes of the queue.
- Either way, with no consumer on the queue anywhere: the proposer's node (messages wait where they
  were sent). A claim naming an unknown placement is malformed: None for every key.
Moves (groups follow their consumers; node/core/cluster/handover.py has the handover itself):
- `follow_consumers(queue, from_node, now_ms)`, proposed by the leader's duties, moves the routes of
  `queue` that name `from_node` to the nodes that consume the queue (fewest routes of the queue
  first), at most MOVES_PER_COMMAND_MAX a command, and only while `from_node` has no consumer on the
  queue (or is down) and another node has some: applied late, after consumers came back, it moves
  nothing. A moving route is never moved again until its move ends.
- Each moved route gets a move record [from_node, to_node, started_ms, waiting]: `waiting` are the
  members (registered, not down, plus both ends) that may still hold or send messages of the group
  toward `from_node`. `move_clear(entries, node)` takes `node` out of `waiting` for each
  [queue, group, from_node, to_node] that names the move exactly (compare-and-set: a clear of an
  older move of the same group does nothing). `from_node` is taken out only last: its clear says its
  backlog and everything it relayed have reached `to_node`. When `waiting` is empty the move ends.
- A route removed (expire_idle, unroute, drop_queue, fail_over of its node) ends its move; a member
  failed over is taken out of every `waiting` (availability over order, as failover already is).
Memory (a million routes are held on every node; bench/route_memory.py measures them): a route is
one entry in its queue's GroupMap (node/core/group_map.py: the group id's bytes and 8 bytes, ~30
bytes), group -> touched_ms << NODE_BITS | node number, with node names interned in `node_names`
(append-only, at most NODES_MAX) and each queue name held once. A dict per queue cost ~127 bytes a
route, a (queue, group) tuple key and a [node, touched_ms] list ~234. A time past TOUCHED_MS_MAX
does not fit the packing: a command carrying one is malformed (None, as a negative time is).
Expiry (expire_idle) never removes a route whose group is moving.
Never imports pysyncobj, threading, time, random, socket, grpc or proton.
"""

from __future__ import annotations

from fractions import Fraction

from node.core.group_map import VALUE_MAX, GroupMap

ROUTES_MAX_DEFAULT = 1_000_000  # routes (queue, group) held cluster-wide; more are refused

# the feed's kinds are node/core/cluster/feed.py's; importable from here too for node/cluster.py and
# tests/sim/node_model.py, which read them
from node.core.cluster.feed import MEMBERS, MOVES, MOVES_ALL, REFUSED, ROUTES, SNAPSHOT  # noqa: F401

PLACEMENT_BALANCED = "balanced"  # fewest groups per consumer cluster-wide; the proposer wins near-ties
PLACEMENT_LOCAL = "local"  # the proposer's node whenever it has consumers on the queue
PLACEMENTS = (PLACEMENT_BALANCED, PLACEMENT_LOCAL)
# balanced: the proposer's node keeps a new group while its groups per consumer (the new one counted)
# are at most this many times the best node's. Exact (a Fraction, not a float), the same on every replica
LOCAL_TOLERANCE_RATIO = Fraction(11, 10)

MOVES_PER_COMMAND_MAX = 1000  # routes one follow_consumers moves; the leader proposes again for the rest

NODE_BITS = 16  # low bits of a packed route: its node's number in node_names
NODES_MAX = 1 << NODE_BITS  # distinct node names a table ever routes to; a route to one more is refused
_NODE_MASK = NODES_MAX - 1
TOUCHED_MS_MAX = VALUE_MAX >> NODE_BITS  # the latest time a packed route holds (year ~10,900)


def _is_str(value) -> bool:
    return type(value) is str  # exactly str: a subclass would put a custom class into the state


def _is_int(value) -> bool:
    return type(value) is int  # bool is an int subclass, but no time or count


def _is_time(value) -> bool:
    return type(value) is int and 0 <= value <= TOUCHED_MS_MAX


def _is_key(key) -> bool:
    return isinstance(key, (list, tuple)) and len(key) == 2 and _is_str(key[0]) and _is_str(key[1])


class RouteTable:
    def __init__(self, routes_max: int = ROUTES_MAX_DEFAULT):
        if not _is_int(routes_max) or routes_max < 0:
            raise ValueError(f"routes_max must be an int >= 0, got {routes_max!r}")
        self.routes_max = routes_max
        # queue -> group -> touched_ms << NODE_BITS | node number (see the header: ~30 bytes a route)
        self.routes: dict[str, GroupMap] = {}
        self.node_names: list[str] = []  # node number -> name; append-only, so numbers never change
        self.route_counts: dict[tuple[str, str], int] = {}  # (node, queue) -> routes; no zero entries
        self.consumers: dict[str, dict[str, int]] = {}  # node -> queue -> consumers; no zero entries
        self.nodes: dict[str, dict] = {}  # node -> {"peer_address", "amqp_address", "admin_address"}
        self.down: dict[str, int] = {}  # node -> now_ms when marked down; absent means up
        # (queue, group) -> [from_node, to_node, started_ms, waiting (sorted nodes)]: moves in progress
        self.moves: dict[tuple[str, str], list] = {}
        self.revision = 0  # bumped once by every command that changed something
        self._derive()

    def _derive(self) -> None:
        """What follows from the state above and is left out of snapshots."""
        self._node_numbers = {name: number for number, name in enumerate(self.node_names)}
        self.route_total = sum(len(groups) for groups in self.routes.values())

    STATE = ("routes_max", "routes", "node_names", "route_counts", "consumers", "nodes", "down", "moves",
             "revision")  # what a snapshot holds (handler/replicated.py: format versions 2 and 3)

    def state(self) -> dict:
        """The table as plain data for a snapshot (format 3: routes {queue: GroupMap.state()}); shared,
        not copied (pysyncobj pickles it at once, in a forked child)."""
        state = {name: getattr(self, name) for name in self.STATE}
        state["routes"] = {queue: groups.state() for queue, groups in self.routes.items()}
        return state

    @classmethod
    def from_state(cls, state: dict) -> "RouteTable":
        """A snapshot of format version 3 (see state())."""
        table = cls(state["routes_max"])
        for name in cls.STATE:
            setattr(table, name, state[name])
        table.routes = {queue: GroupMap.from_state(groups) for queue, groups in state["routes"].items()}
        table._derive()
        return table

    @classmethod
    def from_state_v2(cls, state: dict) -> "RouteTable":
        """A snapshot of format version 2: as 3, but routes {queue: {group: packed}}. Groups are added
        in sorted order, so every replica restoring it builds the same layout."""
        table = cls(state["routes_max"])
        for name in cls.STATE:
            setattr(table, name, state[name])
        table.routes = {queue: GroupMap.from_items(sorted(groups.items()))
                        for queue, groups in state["routes"].items()}
        table._derive()
        return table

    @classmethod
    def from_state_v1(cls, state: dict) -> "RouteTable":
        """A snapshot of format version 1: the table's attributes with routes {(queue, group): [node,
        touched_ms]}. Routes are packed in sorted order, so every replica numbers the nodes alike."""
        table = cls(state["routes_max"])
        for name in ("route_counts", "consumers", "nodes", "down", "moves", "revision"):
            setattr(table, name, state[name])
        for (queue, group), (node, touched_ms) in sorted(state["routes"].items()):
            groups = table.routes.get(queue)
            if groups is None:
                groups = table.routes[queue] = GroupMap()
            groups[group] = table._pack(node, min(max(touched_ms, 0), TOUCHED_MS_MAX))
        table._derive()
        return table

    def _pack(self, node: str, touched_ms: int) -> int | None:
        """The packed route, or None when `node` would be name number NODES_MAX + 1."""
        number = self._node_numbers.get(node)
        if number is None:
            if len(self.node_names) >= NODES_MAX:
                return None  # every replica meets the same names in the same order: all refuse alike
            number = len(self.node_names)
            self.node_names.append(node)
            self._node_numbers[node] = number
        return touched_ms << NODE_BITS | number

    def _unpack(self, packed: int) -> tuple[str, int]:
        return self.node_names[packed & _NODE_MASK], packed >> NODE_BITS

    def _refresh(self, queue: str, group: str, packed: int, now_ms: int) -> None:
        """The route touched at now_ms; a late proposal never makes a route look older."""
        if now_ms > packed >> NODE_BITS:
            self.routes[queue][group] = now_ms << NODE_BITS | packed & _NODE_MASK

    def entry(self, queue: str, group: str) -> tuple[str, int] | None:
        """(node, touched_ms) of the route, or None."""
        packed = self.routes.get(queue, {}).get(group)
        return None if packed is None else self._unpack(packed)

    def entries(self):
        """Every route as ((queue, group), (node, touched_ms)), in no particular order."""
        names = self.node_names
        for queue, groups in self.routes.items():
            for group, packed in groups.items():
                yield (queue, group), (names[packed & _NODE_MASK], packed >> NODE_BITS)

    def __len__(self) -> int:
        return self.route_total

    # ---- commands: replicated, so deterministic and never raising -----------------------------

    def claim(self, keys: list, proposer: str, now_ms: int, placement: str = PLACEMENT_LOCAL) -> list:
        if not isinstance(keys, (list, tuple)):
            return []
        if not (_is_str(proposer) and _is_time(now_ms) and _is_str(placement)
                and placement in PLACEMENTS):
            return [None] * len(keys)
        nodes = [self._claim_one(key[0], key[1], proposer, now_ms, placement) if _is_key(key) else None
                 for key in keys]
        # A refresh counts as a change: touched_ms decides expiry, so the revision must move with it.
        if any(node is not None for node in nodes):
            self.revision += 1
        return nodes

    def _claim_one(self, queue: str, group: str, proposer: str, now_ms: int, placement: str) -> str | None:
        groups = self.routes.get(queue)
        packed = None if groups is None else groups.get(group)
        if packed is not None:
            self._refresh(queue, group, packed, now_ms)
            return self.node_names[packed & _NODE_MASK]
        if self.route_total >= self.routes_max:
            return None
        return self._create(queue, group, self.choose_node(queue, proposer, placement), now_ms)

    def _create(self, queue: str, group: str, node: str, now_ms: int) -> str | None:
        packed = self._pack(node, now_ms)
        if packed is None:
            return None
        groups = self.routes.get(queue)
        if groups is None:
            groups = self.routes[queue] = GroupMap()
        groups[group] = packed
        self.route_total += 1
        self.route_counts[(node, queue)] = self.route_counts.get((node, queue), 0) + 1
        return node

    def follow_consumers(self, queue: str, from_node: str, now_ms: int) -> list:
        """Move the routes of `queue` on `from_node` to the nodes consuming it (see the header).
        Returns the moves begun, [(queue, group, from_node, to_node, waiting)], sorted."""
        if not (_is_str(queue) and _is_str(from_node) and _is_time(now_ms)) \
                or self._serves(from_node, queue):
            return []
        targets = sorted(node for node in self.consumers if node != from_node and self._serves(node, queue))
        if not targets:
            return []
        from_number = self._node_numbers.get(from_node)
        keys = sorted((queue, group) for group, packed in self.routes.get(queue, {}).items()
                      if packed & _NODE_MASK == from_number and (queue, group) not in self.moves)
        members = set(node for node in self.nodes if node not in self.down)
        begun = []
        for key in keys[:MOVES_PER_COMMAND_MAX]:
            to_node = min(targets, key=lambda node: (self.route_counts.get((node, queue), 0), node))
            packed = self._pack(to_node, now_ms)
            if packed is None:
                break  # NODES_MAX names routed to already
            self._count(from_node, queue, -1)
            self._count(to_node, queue, 1)
            self.routes[queue][key[1]] = packed
            waiting = sorted(members | {from_node, to_node})
            self.moves[key] = [from_node, to_node, now_ms, waiting]
            begun.append((key[0], key[1], from_node, to_node, tuple(waiting)))
        if begun:
            self.revision += 1
        return begun

    def move_clear(self, entries: list, node: str) -> list:
        """`node` holds and sends nothing more of each moving group toward its old owner: entries are
        [queue, group, from_node, to_node]. Returns the moves that changed, as follow_consumers does
        (waiting () for a move that ended)."""
        if not (isinstance(entries, (list, tuple)) and _is_str(node)):
            return []
        changed = []
        for entry in entries:
            if not (isinstance(entry, (list, tuple)) and len(entry) == 4 and _is_key(entry[:2])
                    and _is_str(entry[2]) and _is_str(entry[3])):
                continue
            key = (entry[0], entry[1])
            move = self.moves.get(key)
            if move is None or move[0] != entry[2] or move[1] != entry[3] or node not in move[3]:
                continue  # another move of the group, or cleared already: a retry
            if node == move[0] and len(move[3]) > 1:
                continue  # the old owner clears last: what the others still send it, it relays
            changed.append(self._clear(key, move, node))
        if changed:
            self.revision += 1
        return changed

    def _clear(self, key: tuple, move: list, node: str) -> tuple:
        move[3].remove(node)
        if not move[3]:
            del self.moves[key]
        return (key[0], key[1], move[0], move[1], tuple(move[3]))

    def _count(self, node: str, queue: str, delta: int) -> None:
        count_key = (node, queue)
        count = self.route_counts.get(count_key, 0) + delta
        if count:
            self.route_counts[count_key] = count
        else:
            del self.route_counts[count_key]

    def touch(self, entries: list, now_ms: int) -> list:
        """Refresh routes a node relies on: entries are [queue, group, node], the node it routes to.

        Unlike a claim, a missing route is made again on the given node, never by placement: the
        group's messages are there (or on their way), so placing it elsewhere would split it. A
        route naming another node is left alone; its node is returned so the caller sees the
        conflict. Results align with entries: the route's node, or None (malformed, routes_max)."""
        if not isinstance(entries, (list, tuple)) or not _is_int(now_ms):
            return []
        if now_ms > TOUCHED_MS_MAX:
            return [None] * len(entries)  # does not fit a packed route: malformed, as a negative time for a new one
        results = []
        for entry in entries:
            if not (isinstance(entry, (list, tuple)) and len(entry) == 3 and _is_key(entry[:2])
                    and _is_str(entry[2])):
                results.append(None)
                continue
            queue, group, node = entry
            packed = self.routes.get(queue, {}).get(group)
            if packed is None:
                results.append(self._create(queue, group, node, now_ms)
                               if self.route_total < self.routes_max and now_ms >= 0 else None)
            else:
                owner = self.node_names[packed & _NODE_MASK]
                if owner == node:
                    self._refresh(queue, group, packed, now_ms)
                results.append(owner)
        if any(result is not None for result in results):
            self.revision += 1
        return results

    def report_consumers(self, node: str, counts: dict, now_ms: int) -> None:
        if not _is_str(node) or not isinstance(counts, dict):
            return
        # Sorted so the stored order is canonical whatever order the reporter built its dict in.
        queues = sorted(queue for queue in counts if _is_str(queue))
        held = {queue: counts[queue] for queue in queues
                if _is_int(counts[queue]) and counts[queue] > 0}
        if held == self.consumers.get(node, {}):
            return
        if held:
            self.consumers[node] = held
        else:
            del self.consumers[node]
        self.revision += 1

    def register_node(self, node: str, peer_address: str, amqp_address: str, admin_address: str,
                      now_ms: int) -> None:
        if not all(_is_str(value) for value in (node, peer_address, amqp_address, admin_address)):
            return
        member = {"peer_address": peer_address, "amqp_address": amqp_address,
                  "admin_address": admin_address}
        if self.nodes.get(node) == member and node not in self.down:
            return
        self.nodes[node] = member
        self.down.pop(node, None)  # a member registers when it (re)starts, so it is up
        self.revision += 1

    def mark_down(self, node: str, now_ms: int) -> None:
        if not (_is_str(node) and _is_int(now_ms)) or node in self.down:
            return  # keep the first time: it says how long the node has been gone
        self.down[node] = now_ms
        self.revision += 1

    def mark_up(self, node: str, now_ms: int) -> None:
        if not _is_str(node) or node not in self.down:
            return
        del self.down[node]
        self.revision += 1

    def fail_over(self, node: str, now_ms: int) -> list:
        """The owner-failover policy: mark `node` down and drop every route naming it, so its groups
        are placed afresh on live nodes. Returns the dropped keys, sorted."""
        if not (_is_str(node) and _is_int(now_ms)):
            return []
        self.mark_down(node, now_ms)
        for key in sorted(self.moves):  # it sends nothing more: nobody waits for it
            move = self.moves[key]
            if node in move[3]:
                self._clear(key, move, node)
        number = self._node_numbers.get(node)
        return self._remove(sorted((queue, group) for queue, groups in self.routes.items()
                                   for group, packed in groups.items() if packed & _NODE_MASK == number))

    def expire_idle(self, cutoff_ms: int, spared_nodes: list = ()) -> list:
        """Remove routes touched before cutoff_ms, except those of `spared_nodes` (members the leader
        cannot reach cannot refresh the groups they hold, which must not move meanwhile) and those
        of moving groups (both ends hold the group until the move ends; the clears end it)."""
        if not _is_int(cutoff_ms) or not isinstance(spared_nodes, (list, tuple)):
            return []
        spared = {self._node_numbers[node] for node in spared_nodes if _is_str(node) and node in self._node_numbers}
        cutoff_packed = max(cutoff_ms, 0) << NODE_BITS  # packed < this: touched before cutoff_ms
        # every route is looked at on every replica, in the raft tick thread: GroupMap.below compares a
        # bucket's values in C and decodes only buckets with idle routes (a million routes, none idle:
        # about 60 ms)
        idle = [(queue, group, packed) for queue, groups in self.routes.items()
                for group, packed in groups.below(cutoff_packed)]
        return self._remove(sorted((queue, group) for queue, group, packed in idle
                                   if (queue, group) not in self.moves and packed & _NODE_MASK not in spared))

    def unroute(self, keys: list) -> list:
        if not isinstance(keys, (list, tuple)):
            return []
        wanted = sorted({(key[0], key[1]) for key in keys if _is_key(key)})
        return self._remove([key for key in wanted if key[1] in self.routes.get(key[0], {})])

    def drop_queue(self, queue: str) -> list:
        if not _is_str(queue):
            return []
        return self._remove([(queue, group) for group in sorted(self.routes.get(queue, {}))])

    def _remove(self, keys: list) -> list:
        for key in keys:
            groups = self.routes[key[0]]
            node = self.node_names[groups.pop(key[1]) & _NODE_MASK]
            if not groups:
                del self.routes[key[0]]
            self.route_total -= 1
            self._count(node, key[0], -1)
            self.moves.pop(key, None)  # a removed route ends its move (the ROUTES feed says so)
        if keys:
            self.revision += 1
        return keys

    # ---- policy and reads: pure, never change state ------------------------------------------

    def choose_node(self, queue: str, proposer: str, placement: str = PLACEMENT_LOCAL) -> str:
        candidates = sorted(node for node in self.consumers if self._serves(node, queue))
        if not candidates:
            return proposer  # nobody consumes yet: messages wait where they were sent
        if placement == PLACEMENT_LOCAL:
            if self._serves(proposer, queue):
                return proposer  # keeps the group on the node its producer is on: no forwarding hop
            return min(candidates, key=lambda node: (self.route_counts.get((node, queue), 0), node))
        best = min(candidates, key=lambda node: (self.groups_per_consumer_after(node, queue), node))
        if proposer != best and self._serves(proposer, queue) and \
                self.groups_per_consumer_after(proposer, queue) <= \
                self.groups_per_consumer_after(best, queue) * LOCAL_TOLERANCE_RATIO:
            return proposer  # near enough to the best: saving the forwarding hop is worth more
        return best

    def groups_per_consumer_after(self, node: str, queue: str) -> Fraction:
        """The groups of `queue` per consumer of it on `node` once one more group is placed there;
        counting the new group makes a node with more consumers the better choice at equal load."""
        return Fraction(self.route_counts.get((node, queue), 0) + 1, self.consumers[node][queue])

    def _serves(self, node: str, queue: str) -> bool:
        return node not in self.down and self.consumers.get(node, {}).get(queue, 0) > 0

    def route(self, queue: str, group: str) -> str | None:
        if not (_is_str(queue) and _is_str(group)):
            return None
        packed = self.routes.get(queue, {}).get(group)
        return None if packed is None else self.node_names[packed & _NODE_MASK]

    def moves_all(self) -> list:
        """Every move in progress, as the MOVES_ALL feed carries them, sorted."""
        return [(queue, group, move[0], move[1], tuple(move[3])) for (queue, group), move in sorted(self.moves.items())]

    def routes_of(self, queue: str) -> list:
        return sorted((group, *self._unpack(packed)) for group, packed in self.routes.get(queue, {}).items())

    def snapshot(self) -> dict:
        routes_by_node: dict[str, int] = {}
        for (node, _queue), count in sorted(self.route_counts.items()):
            routes_by_node[node] = routes_by_node.get(node, 0) + count
        return {
            "revision": self.revision,
            "routes": self.route_total,
            "routes_max": self.routes_max,
            "routes_by_node": routes_by_node,
            "consumers": {node: dict(sorted(held.items())) for node, held in sorted(self.consumers.items())},
            "nodes": {node: dict(member) for node, member in sorted(self.nodes.items())},
            "down": dict(sorted(self.down.items())),
            "moving": len(self.moves),
        }
