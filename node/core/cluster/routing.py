"""Where each message group of a cluster lives, as this node knows it, and the messages in transit.

Pure, owned by the engine loop thread. Two parts (the outbound store, messages on their way to the
groups' owners, is node/core/cluster/outbound.py):
- `Router`: the node's copy of the replicated routes (fed only by the handler's applied-command
  stream, so it never runs ahead of the raft log) and the messages waiting for a route. A message
  of a group that has messages waiting waits behind them even once a route is known, so a
  producer's order within a group survives a route decision in flight. A wait longer than the
  handler timeout ends the message's journey here: the adapter refuses it; nothing is ever
  enqueued without a route.
- `Inbound`: per source node, the highest forward seq already enqueued here, so a resent batch
  (after a lost acknowledgement) is not enqueued twice.
Memory: every node holds every live route (a million is routes_max's default), so `Routes` packs
one: an entry of its queue's GroupMap (node/core/group_map.py: the group id's bytes and 8 bytes,
~30 bytes), group -> refreshed_ms << NODE_BITS | the owner's number in `node_names` (interned,
append-only), as the replicated table does (handler/route_table.py). It reads as the
{(queue, group): owner} mapping it replaced, and `Router.refreshed_ms` as the
{(queue, group): refreshed_ms} one, so callers index both by key; a dict per queue cost ~127 bytes
a route, a (queue, group) tuple key and a second dict for the refresh time ~204
(bench/route_memory.py, "node").
"""

from __future__ import annotations

import collections
import hashlib
from collections.abc import Mapping

from node.core.group_map import VALUE_MAX, GroupMap
from node.core.tally import LatencyTally

NODE_BITS = 16  # low bits of a packed route: its owner's number; the replicated table allows as many owners
_NODE_MASK = (1 << NODE_BITS) - 1
_REFRESHED_MS_MAX = VALUE_MAX >> NODE_BITS  # the table refuses later times (handler/packed_routes.py: TOUCHED_MS_MAX)


class Routes(Mapping):
    """(queue, group) -> owning node, packed (see the header)."""

    def __init__(self):
        self.by_queue: dict[str, GroupMap] = {}  # queue -> group -> refreshed_ms << NODE_BITS | owner number
        self.node_names: list[str] = []
        self._node_numbers: dict[str, int] = {}
        self._count = 0

    def get(self, key, default=None):
        groups = self.by_queue.get(key[0])
        packed = groups.get(key[1]) if groups is not None else None
        return default if packed is None else self.node_names[packed & _NODE_MASK]

    def packed(self, key) -> int | None:
        """refreshed_ms << NODE_BITS | owner number, or None without a route: one lookup for both."""
        groups = self.by_queue.get(key[0])
        return groups.get(key[1]) if groups is not None else None

    def __getitem__(self, key) -> str:
        owner = self.get(key)
        if owner is None:
            raise KeyError(key)
        return owner

    def __contains__(self, key) -> bool:
        groups = self.by_queue.get(key[0])
        return groups is not None and key[1] in groups

    def __len__(self) -> int:
        return self._count

    def __iter__(self):
        for queue, groups in self.by_queue.items():
            for group in groups:
                yield queue, group

    def items(self):
        names = self.node_names
        for queue, groups in self.by_queue.items():
            for group, packed in groups.items():
                yield (queue, group), names[packed & _NODE_MASK]

    def values(self):
        names = self.node_names
        for groups in self.by_queue.values():
            for packed in groups.values():
                yield names[packed & _NODE_MASK]

    def groups_of(self, queue: str, owner: str):
        """The groups of `queue` whose routes name `owner`."""
        number = self._node_numbers.get(owner)
        groups = self.by_queue.get(queue)
        if number is None or groups is None:
            return
        for group, packed in groups.items():
            if packed & _NODE_MASK == number:
                yield group

    def refreshed(self, key) -> int | None:
        """When the log last refreshed the route of `key` (0 without a lease), or None without a route."""
        groups = self.by_queue.get(key[0])
        packed = groups.get(key[1]) if groups is not None else None
        return None if packed is None else packed >> NODE_BITS

    def put(self, key, owner: str, refreshed_ms: int) -> None:
        number = self._node_numbers.get(owner)
        if number is None:
            number = self._node_numbers[owner] = len(self.node_names)
            self.node_names.append(owner)
        groups = self.by_queue.get(key[0])
        if groups is None:
            groups = self.by_queue[key[0]] = GroupMap()
        before = len(groups)
        groups[key[1]] = min(max(refreshed_ms, 0), _REFRESHED_MS_MAX) << NODE_BITS | number
        self._count += len(groups) - before

    def remove(self, key) -> None:
        groups = self.by_queue.get(key[0])
        if groups is not None and groups.pop(key[1], None) is not None:
            self._count -= 1
            if not groups:
                del self.by_queue[key[0]]


class _Leases(Mapping):
    """(queue, group) -> when the log last refreshed its route; empty without a lease (a read-only view)."""

    def __init__(self, routes: Routes, leased: bool):
        self._routes, self._leased = routes, leased

    def __getitem__(self, key) -> int:
        refreshed_ms = self._routes.refreshed(key) if self._leased else None
        if refreshed_ms is None:
            raise KeyError(key)
        return refreshed_ms

    def __len__(self) -> int:
        return len(self._routes) if self._leased else 0

    def __iter__(self):
        return iter(self._routes) if self._leased else iter(())


class Router:
    def __init__(self, node_id: str, handler_timeout_ms: int, lease_ms: int = 0):
        self.node_id = node_id
        self.handler_timeout_ms = handler_timeout_ms
        # with a group timeout, a route is trusted only this long after the log last refreshed it
        # (the leader expires routes idle for twice as long); 0: routes never expire
        self.lease_ms = lease_ms
        self.routes = Routes()  # (queue, group) -> owning node, and when the log last refreshed it
        self.refreshed_ms = _Leases(self.routes, bool(lease_ms))  # key -> that refresh time (lease only)
        self.used: set[tuple[str, str]] = set()  # keys routed since the last refresh (lease only)
        self.waiting: dict[tuple[str, str], list] = {}  # key -> items in arrival order
        self.waiting_since_ms: dict[tuple[str, str], int] = {}  # key -> when its first item began to wait
        # what became of the waits, for metrics: routed (with how long the decision took), timed out, refused
        self.decisions = {"routed": 0, "timed_out": 0, "refused": 0}
        self.decision_latency = LatencyTally()
        self._deadlines: collections.deque = collections.deque()  # (deadline_ms, key, claim_number)
        self._claim_number: dict[tuple[str, str], int] = {}  # key -> number of its live claim
        self._next_claim_number = 1
        self.to_claim: list[tuple[str, str]] = []  # keys to propose at the end of this batch of the engine loop
        # False while the handler replays its log after a start: routes seen then may be superseded
        # later in the log, so messages wait (their timeout running) until the replica is current
        self.ready = False

    def digest(self) -> str:
        """sha256 (hex) of the routes, sorted: replicas that applied the same log report the same digest,
        so comparing digests across nodes is how drills tell diverged replicas from lagging ones."""
        hasher = hashlib.sha256()
        for (queue, group), owner in sorted(self.routes.items()):
            hasher.update(f"{len(queue)}:{queue}{len(group)}:{group}{len(owner)}:{owner}\n".encode())
        return hasher.hexdigest()

    def route(self, key: tuple[str, str], item, now_ms: int) -> str | None:
        """The owner of `key`, or None when `item` now waits for a route (or behind others that do)."""
        waiting = self.waiting.get(key)
        if waiting is not None:
            waiting.append(item)
            return None
        if self.ready:
            packed = self.routes.packed(key)
            if packed is not None:
                if not self.lease_ms:
                    return self.routes.node_names[packed & _NODE_MASK]
                if now_ms - (packed >> NODE_BITS) <= self.lease_ms:
                    self.used.add(key)
                    return self.routes.node_names[packed & _NODE_MASK]
        self.waiting[key] = [item]
        self.waiting_since_ms[key] = now_ms
        number = self._next_claim_number
        self._next_claim_number += 1
        self._claim_number[key] = number
        self._deadlines.append((now_ms + self.handler_timeout_ms, key, number))
        if self.ready:
            self.to_claim.append(key)
        return None

    def become_ready(self, now_ms: int) -> list:
        """The replica has caught up: release what now has a route, propose the rest."""
        self.ready = True
        released = []
        for key in list(self.waiting):
            owner = self.routes.get(key)
            if owner is None or (self.lease_ms and now_ms - self.routes.refreshed(key) > self.lease_ms):
                self.to_claim.append(key)
            else:
                self._claim_number.pop(key, None)
                self._decided(key, "routed", now_ms)
                released.extend((owner, item) for item in self.waiting.pop(key))
        return released

    def take_claims(self) -> list[tuple[str, str]]:
        claims, self.to_claim = list(dict.fromkeys(self.to_claim)), []
        return claims

    def learn(self, changes, now_ms: int, decided_at_ms: int | None = None) -> list:
        """Apply routes the handler decided, in log order: (queue, group, node or None) triples.

        `now_ms` starts the routes' leases (the log's refresh time); `decided_at_ms` is this node's
        clock now, which ends the waits it measures (default `now_ms`).
        Returns (owner, item) pairs released from waiting, in the order they arrived."""
        released = []
        for queue, group, owner in changes:
            key = (queue, group)
            if owner is None:
                self.routes.remove(key)
                continue
            self.routes.put(key, owner, now_ms if self.lease_ms else 0)
            items = self.waiting.pop(key, None) if self.ready else None
            if items is not None:
                self._claim_number.pop(key, None)
                self._decided(key, "routed", now_ms if decided_at_ms is None else decided_at_ms)
                released.extend((owner, item) for item in items)
        return released

    def _decided(self, key, outcome: str, now_ms: int) -> None:
        since_ms = self.waiting_since_ms.pop(key, None)
        self.decisions[outcome] += 1
        if outcome == "routed" and since_ms is not None:
            self.decision_latency.observe(max(0, now_ms - since_ms))

    def claim_failed(self, keys) -> None:
        """The proposal did not go through (no leader yet, leader changed): propose again."""
        if self.ready:
            self.to_claim.extend(key for key in keys if key in self.waiting)

    def expire(self, now_ms: int) -> list:
        """Items whose route was not decided within the handler timeout, in arrival order."""
        expired = []
        deadlines = self._deadlines
        while deadlines and deadlines[0][0] <= now_ms:
            _, key, number = deadlines.popleft()
            if self._claim_number.get(key) != number:
                continue  # decided in time, or a later claim of the same key
            del self._claim_number[key]
            self._decided(key, "timed_out", now_ms)
            expired.extend(self.waiting.pop(key, ()))
        return expired

    def give_up(self, key) -> list:
        """The handler refused to route `key`: its waiting items, in arrival order."""
        self._claim_number.pop(key, None)
        if key in self.waiting:
            self._decided(key, "refused", 0)
        return self.waiting.pop(key, [])

    def take_used(self) -> set:
        used, self.used = self.used, set()
        return used

    def waiting_count(self) -> int:
        return sum(len(items) for items in self.waiting.values())


class Inbound:
    def __init__(self):
        self.high_water: dict[str, int] = {}  # source node -> highest forward seq enqueued here

    def fresh(self, source: str, forward_seq: int) -> bool:
        return forward_seq > self.high_water.get(source, 0)

    def advance(self, source: str, forward_seq: int) -> None:
        if forward_seq > self.high_water.get(source, 0):
            self.high_water[source] = forward_seq

    def set_back(self, source: str, forward_seq: int) -> None:
        """Only for a mark the source proves it never reached (node/core/cluster/owner.py)."""
        self.high_water[source] = forward_seq
