"""The raft cluster as the simulation sees it: one linearizable log of route-table commands.

Raft itself is not simulated (elections, terms and log repair are pysyncobj's and tested there).
What the nodes can observe is: a proposal made while the leader is up is committed after a seeded
delay; one made while it is down fails (MISSING_LEADER). The leader going down turns proposals in
flight into unknown outcomes: each is committed anyway or dropped, seeded, and its proposer hears
"failed" either way (LEADER_CHANGED / DISCARDED), so it retries what may have won.

Every committed command is applied once, here, to the authoritative `RouteTable`, which yields the
feed every replica reports to its node as `handler/replicated.py` does: (kind, payload, at_ms), with
ROUTES carrying the command's now_ms as at_ms (claim, touch) or None (expire_idle), and REFUSED /
MEMBERS with None. Each node replays that feed in log order after its own seeded lag.
`route_history` keeps every (owner, touched_ms) each (queue, group) ever had with the log index that
set it, so the invariants (and snapshot installs) can ask what a replica must know at the index it
has applied.
"""

from __future__ import annotations

import bisect

from handler.queue_definitions import QueueDefinitions
from handler.route_table import RouteTable
from node.core.cluster.feed import ADDED, MEMBERS, MOVES, QUEUES, REFUSED, ROUTES, UPDATED  # the feed's kinds


class RaftLog:
    def __init__(self, sim, routes_max: int):
        self.sim = sim
        self.table = RouteTable(routes_max)
        self.entries: list[tuple] = []  # (command, feed, commit_ms); log index = position + 1
        # key -> (indexes, [(owner or None, touched_ms or None)]): a new element whenever either changed
        self.route_history: dict[tuple[str, str], tuple[list[int], list[tuple]]] = {}
        self.current: dict[tuple[str, str], str] = {}  # the routes at the commit index, by the log alone
        self.moves_history: list[tuple[int, list]] = [(0, [])]  # (index, table.moves_all()) at each change
        self.queues = QueueDefinitions()  # the queue definitions, replicated beside the table
        self.definitions_history: list[tuple[int, tuple]] = [(0, (0, {}, {}))]  # (index, QUEUES_ALL payload)
        self.leader_up = True
        self._in_flight: dict[int, tuple] = {}  # proposal number -> (command, on_failed)
        self._on_committed: dict[int, object] = {}  # proposal number -> told once committed (queue commands)
        self._next_proposal = 1

    @property
    def commit_index(self) -> int:
        return len(self.entries)

    # ---- proposals ---------------------------------------------------------------------------

    def propose(self, command: tuple, on_failed=None, on_committed=None, rng=None) -> None:
        """`rng`: where its delays are drawn (default the simulation's): commands added since a seed's
        scripted scenario was written draw from their own, so its other events keep their times."""
        sim = self.sim
        rng = rng or sim.rng
        if not self.leader_up:
            if on_failed is not None:
                sim.schedule(rng.randint(1, sim.config.propose_fail_ms_max), lambda: on_failed("no leader"),
                             f"proposal {command[0]} fails: no leader")
            return
        number = self._next_proposal
        self._next_proposal += 1
        self._in_flight[number] = (command, on_failed)
        if on_committed is not None:
            self._on_committed[number] = on_committed
        sim.schedule(rng.randint(1, sim.config.commit_ms_max), lambda: self._commit_proposal(number), None)

    def _commit_proposal(self, number: int) -> None:
        proposal = self._in_flight.pop(number, None)
        on_committed = self._on_committed.pop(number, None)
        if proposal is not None:
            self.commit(proposal[0])
            if on_committed is not None:
                self.sim.schedule(1, on_committed, None)

    def set_leader(self, up: bool) -> None:
        if up == self.leader_up:
            return
        self.leader_up = up
        if up:
            return
        sim = self.sim
        for number in sorted(self._in_flight):
            command, on_failed = self._in_flight[number]
            if sim.rng.random() < 0.5:
                self.commit(command)  # the outcome was unknown to the proposer: it won anyway
            if on_failed is not None:
                sim.schedule(1, lambda on_failed=on_failed: on_failed("leader changed"), None)
        self._in_flight.clear()
        self._on_committed.clear()  # an unknown outcome: the proposers heard "failed"

    # ---- the log: each command as RouteTableReplica (handler/replicated.py) applies it -------

    def commit(self, command: tuple) -> None:
        table = self.table
        kind = command[0]
        feed: list[tuple] = []
        keys: list[tuple[str, str]] = []  # whose route the command may have made, moved or refreshed
        if kind == "claim":
            _, keys, proposer, now_ms, placement = command
            before = [table.route(queue, group) for queue, group in keys]
            nodes = table.claim([list(key) for key in keys], proposer, now_ms, placement)
            self._check_kept(keys, before, nodes, kind)
            self.sim.stats["groups_placed_away"] += sum(  # new routes on a node other than the proposer's
                1 for old, node in zip(before, nodes) if old is None and node is not None and node != proposer)
            decided = [(key[0], key[1], node) for key, node in zip(keys, nodes) if node is not None]
            if decided:
                feed.append((ROUTES, decided, now_ms))
            refused = [tuple(key) for key, node in zip(keys, nodes) if node is None]
            if refused:
                self.sim.stats["claims_refused"] += len(refused)
                feed.append((REFUSED, refused, None))
        elif kind == "touch":
            _, entries, now_ms = command
            keys = [(queue, group) for queue, group, _ in entries]
            before = [table.route(queue, group) for queue, group in keys]
            results = table.touch([list(entry) for entry in entries], now_ms)
            self._check_kept(keys, before, results, kind)
            # only what was refreshed or made: a conflicting route's node heard of it when it was made
            kept = [(entry[0], entry[1], node) for entry, node in zip(entries, results)
                    if node is not None and node == entry[2]]
            if kept:
                feed.append((ROUTES, kept, now_ms))
            self.sim.stats["touch_conflicts"] += sum(
                1 for entry, node in zip(entries, results) if node is not None and node != entry[2])
            self.sim.stats["routes_remade"] += sum(1 for old, node in zip(before, results)
                                                   if old is None and node is not None)
        elif kind == "expire_idle":
            _, cutoff_ms, spared_nodes = command
            keys = table.expire_idle(cutoff_ms, list(spared_nodes))
            self.sim.stats["routes_expired"] += len(keys)
            if keys:
                feed.append((ROUTES, [(queue, group, None) for queue, group in keys], None))
        elif kind == "register_node":
            _, node, now_ms = command
            table.register_node(node, "", "", "", now_ms)
            feed.append((MEMBERS, {"nodes": {n: dict(info) for n, info in table.nodes.items()},
                                   "consumers": {n: dict(c) for n, c in table.consumers.items()},
                                   "down": dict(table.down)}, None))
            self.sim.registered(node)
        elif kind == "follow_consumers":
            _, queue, from_node, now_ms = command
            begun = table.follow_consumers(queue, from_node, now_ms)
            keys = [(entry[0], entry[1]) for entry in begun]
            self.sim.stats["moves_begun"] += len(begun)
            if begun:  # the moves first: a new owner must hold the group before the route names it
                feed.append((MOVES, begun, None))
                feed.append((ROUTES, [(entry[0], entry[1], entry[3]) for entry in begun], now_ms))
        elif kind == "move_clear":
            _, entries, node = command
            changed = table.move_clear([list(entry) for entry in entries], node)
            self.sim.stats["moves_done"] += sum(1 for entry in changed if not entry[4])
            if changed:
                feed.append((MOVES, changed, None))
        elif kind == "define_queue":
            _, values, seed = command
            outcome, held = self.queues.define(dict(values), seed)
            if outcome == ADDED:
                feed.append((QUEUES, [(self.queues.revision, values["name"], held)], None))
        elif kind == "update_queue":
            _, name, changes = command
            outcome, detail = self.queues.update(name, dict(changes))
            if outcome == UPDATED:
                feed.append((QUEUES, [(self.queues.revision, name, detail)], None))
        elif kind == "delete_queue":
            _, name, seen_revision = command
            revision = self.queues.revision
            self.queues.delete(name, seen_revision)
            if self.queues.revision != revision:  # the routes first, as handler/replicated.py does
                keys = table.drop_queue(name)
                if keys:
                    feed.append((ROUTES, [(queue, group, None) for queue, group in keys], None))
                feed.append((QUEUES, [(self.queues.revision, name, None)], None))
        elif kind == "report_consumers":
            _, node, counts, now_ms = command
            table.report_consumers(node, counts, now_ms)
            feed.append((MEMBERS, {"consumers": {n: dict(c) for n, c in table.consumers.items()}}, None))
        else:
            raise AssertionError(f"unknown command {command!r}")
        self.entries.append((command, feed, self.sim.now_ms))
        index = len(self.entries)
        if self.queues.revision != self.definitions_history[-1][1][0]:
            self.definitions_history.append(
                (index, (self.queues.revision, self.queues.all(), dict(self.queues.deleted))))
        if kind in ("follow_consumers", "move_clear", "expire_idle", "delete_queue") and table.moves_all() != self.moves_history[-1][1]:
            before = {(move[0], move[1]) for move in self.moves_history[-1][1]}
            self.moves_history.append((index, table.moves_all()))
            for key in sorted(before - set(table.moves)):
                self.sim.move_ended(key)
        changes = []
        for key in keys:
            route = table.entry(*key)
            state = (None, None) if route is None else route
            indexes, states = self.route_history.setdefault(key, ([], []))
            if (states[-1] if states else (None, None)) == state:
                continue
            if (states[-1][0] if states else None) != state[0]:
                changes.append((key[0], key[1], state[0]))
            indexes.append(index)
            states.append(state)
            if state[0] is None:
                del self.current[key]
            else:
                self.current[key] = state[0]
        if changes:
            routed = ", ".join(f"{queue}/{group}->{node}" for queue, group, node in changes)
            self.sim.trace(f"  log {index} {kind}: {routed}")
        self.sim.committed(index)

    def _check_kept(self, keys, before, nodes, kind: str) -> None:
        for key, old, new in zip(keys, before, nodes):
            if old is not None and new != old:
                self.sim.violation(f"first proposal wins broken: {kind} of {key} moved it from {old} to {new}")

    def _state_at(self, key: tuple[str, str], index: int) -> tuple:
        history = self.route_history.get(key)
        if history is None:
            return None, None
        position = bisect.bisect_right(history[0], index)
        return history[1][position - 1] if position else (None, None)

    def owner_at(self, key: tuple[str, str], index: int) -> str | None:
        """The owner the log had given `key` once its first `index` entries were applied."""
        return self._state_at(key, index)[0]

    def touched_at(self, key: tuple[str, str], index: int) -> int | None:
        """The route's touched_ms once the first `index` entries were applied (None: no route)."""
        return self._state_at(key, index)[1]

    def routes_at(self, index: int) -> list[tuple[str, str, str, int]]:
        """The SNAPSHOT payload of a replica restored to `index`: every route with its touched_ms."""
        routes = []
        for key in sorted(self.route_history):
            owner, touched_ms = self._state_at(key, index)
            if owner is not None:
                routes.append((key[0], key[1], owner, touched_ms))
        return routes

    def moves_at(self, index: int) -> list[tuple]:
        """The MOVES_ALL payload of a replica restored to `index`: every move then in progress."""
        position = bisect.bisect_right([at for at, _ in self.moves_history], index)
        return self.moves_history[position - 1][1]

    def definitions_at(self, index: int) -> tuple:
        """The QUEUES_ALL payload of a replica restored to `index`."""
        position = bisect.bisect_right([at for at, _ in self.definitions_history], index)
        return self.definitions_history[position - 1][1]

    def feed(self, index: int) -> list[tuple]:
        return self.entries[index - 1][1]
