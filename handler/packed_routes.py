"""Packed routes: the route table's routes (queue, group) -> node, held in as little memory as fits.

Owns the routes, the node names they point to, and the count of routes per (node, queue) kept with
them. Memory (a million routes are held on every raft member; bench/route_memory.py measures them): a
route is one entry in its queue's GroupMap (node/core/group_map.py: the group id's bytes and 8 bytes,
~30 bytes), group -> touched_ms << NODE_BITS | node number, with node names interned in `node_names`
(append-only, at most NODES_MAX) and each queue name held once. A dict per queue cost ~127 bytes a
route, a (queue, group) tuple key and a [node, touched_ms] list ~234.
Rules:
- Deterministic, as the replicated commands calling it (handler/route_table.py): node numbers are given
  in the order names are first met, which the raft log makes the same on every replica; a name past
  NODES_MAX is refused alike everywhere.
- The callers check their input (handler/command_input.py); a time past TOUCHED_MS_MAX does not fit the
  packing, so the table refuses it before it gets here. `route_counts` has no zero entries.
- Equality and repr compare the three held parts (replicas compare so); the number index and the total
  are derived and left out of snapshots.
Never imports pysyncobj, threading, time, random, socket, grpc or proton.
"""

from __future__ import annotations

import dataclasses

from node.core.group_map import VALUE_MAX, GroupMap

NODE_BITS = 16  # low bits of a packed route: its node's number in node_names
NODES_MAX = 1 << NODE_BITS  # distinct node names a table ever routes to; a route to one more is refused
_NODE_MASK = NODES_MAX - 1
TOUCHED_MS_MAX = VALUE_MAX >> NODE_BITS  # the latest time a packed route holds (year ~10,900)


@dataclasses.dataclass
class PackedRoutes:
    # queue -> group -> touched_ms << NODE_BITS | node number
    routes: dict[str, GroupMap] = dataclasses.field(default_factory=dict)
    node_names: list[str] = dataclasses.field(default_factory=list)  # node number -> name; append-only
    route_counts: dict[tuple[str, str], int] = dataclasses.field(default_factory=dict)  # (node, queue) -> routes

    def __post_init__(self) -> None:
        self.derive()

    def derive(self) -> None:
        """What follows from the parts above: the node numbers and the number of routes."""
        self._node_numbers = {name: number for number, name in enumerate(self.node_names)}
        self.total = sum(len(groups) for groups in self.routes.values())

    def __len__(self) -> int:
        return self.total

    def pack(self, node: str, touched_ms: int) -> int | None:
        """The packed route, or None when `node` would be name number NODES_MAX + 1."""
        number = self._node_numbers.get(node)
        if number is None:
            if len(self.node_names) >= NODES_MAX:
                return None  # every replica meets the same names in the same order: all refuse alike
            number = len(self.node_names)
            self.node_names.append(node)
            self._node_numbers[node] = number
        return touched_ms << NODE_BITS | number

    def get(self, queue: str, group: str) -> int | None:
        """The packed route, or None."""
        return self.routes.get(queue, {}).get(group)

    def node_of(self, packed: int) -> str:
        return self.node_names[packed & _NODE_MASK]

    def refresh(self, queue: str, group: str, packed: int, now_ms: int) -> None:
        """The route touched at now_ms; a late proposal never makes a route look older."""
        if now_ms > packed >> NODE_BITS:
            self.routes[queue][group] = now_ms << NODE_BITS | packed & _NODE_MASK

    def create(self, queue: str, group: str, node: str, now_ms: int) -> str | None:
        """A new route to `node`; None when no name number is left for it."""
        packed = self.pack(node, now_ms)
        if packed is None:
            return None
        groups = self.routes.get(queue)
        if groups is None:
            groups = self.routes[queue] = GroupMap()
        groups[group] = packed
        self.total += 1
        self._count(node, queue, 1)
        return node

    def repoint(self, queue: str, group: str, from_node: str, to_node: str, now_ms: int) -> bool:
        """The route of a group on `from_node` names `to_node` from now_ms; False when no name number is left."""
        packed = self.pack(to_node, now_ms)
        if packed is None:
            return False
        self._count(from_node, queue, -1)
        self._count(to_node, queue, 1)
        self.routes[queue][group] = packed
        return True

    def remove(self, keys: list) -> None:
        for queue, group in keys:
            groups = self.routes[queue]
            node = self.node_names[groups.pop(group) & _NODE_MASK]
            if not groups:
                del self.routes[queue]
            self.total -= 1
            self._count(node, queue, -1)

    def _count(self, node: str, queue: str, delta: int) -> None:
        count_key = (node, queue)
        count = self.route_counts.get(count_key, 0) + delta
        if count:
            self.route_counts[count_key] = count
        else:
            del self.route_counts[count_key]

    # ---- reads ----------------------------------------------------------------------------------

    def entry(self, queue: str, group: str) -> tuple[str, int] | None:
        """(node, touched_ms) of the route, or None."""
        packed = self.get(queue, group)
        return None if packed is None else (self.node_names[packed & _NODE_MASK], packed >> NODE_BITS)

    def entries(self):
        """Every route as ((queue, group), (node, touched_ms)), in no particular order."""
        names = self.node_names
        for queue, groups in self.routes.items():
            for group, packed in groups.items():
                yield (queue, group), (names[packed & _NODE_MASK], packed >> NODE_BITS)

    def routes_of(self, queue: str) -> list:
        """[(group, node, touched_ms)] of `queue`, sorted."""
        names = self.node_names
        return sorted((group, names[packed & _NODE_MASK], packed >> NODE_BITS)
                      for group, packed in self.routes.get(queue, {}).items())

    def groups_on(self, queue: str, node: str) -> list[tuple[str, str]]:
        """The keys of `queue`'s routes naming `node`, sorted."""
        number = self._node_numbers.get(node)
        return sorted((queue, group) for group, packed in self.routes.get(queue, {}).items()
                      if packed & _NODE_MASK == number)

    def keys_on(self, node: str) -> list[tuple[str, str]]:
        """The keys of every route naming `node`, sorted."""
        number = self._node_numbers.get(node)
        return sorted((queue, group) for queue, groups in self.routes.items()
                      for group, packed in groups.items() if packed & _NODE_MASK == number)

    def idle(self, cutoff_ms: int, spared_nodes: list) -> list[tuple[str, str]]:
        """The keys of routes touched before cutoff_ms that do not name one of `spared_nodes`, sorted."""
        spared = {self._node_numbers[node] for node in spared_nodes
                  if type(node) is str and node in self._node_numbers}
        cutoff_packed = max(cutoff_ms, 0) << NODE_BITS  # packed < this: touched before cutoff_ms
        # every route is looked at on every replica, in the raft tick thread: GroupMap.below compares a
        # bucket's values in C and decodes only buckets with idle routes (a million routes, none idle:
        # about 60 ms)
        return sorted((queue, group) for queue, groups in self.routes.items()
                      for group, packed in groups.below(cutoff_packed) if packed & _NODE_MASK not in spared)
