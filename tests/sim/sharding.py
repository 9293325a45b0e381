"""The cluster beyond one raft group's decision ceiling, simulated: routes sharded by group hash over S raft groups.

docs/cluster-ceiling.md has the design; this module is its executable form, on top of the seeded
cluster simulation (tests/sim/simulation.py), with the nodes' own ClusterProtocol and S real
RouteTables. Rules of the model:
- S `RaftLog`s, one per shard, each with its own leader that can be lost on its own (a partition or
  crash of that shard's majority: its proposals fail, those in flight have unknown outcomes);
- a node proposes each claim, touch or move clear split by `node/core/cluster/shards.py`'s shard_of, one
  proposal per shard; membership and consumer reports go to every shard (each shard places its own
  groups and needs them); any other command goes to shard 0;
- each node keeps one replica per shard: its applied index is a tuple, one index per shard, and
  each shard's entries reach it in that shard's order after their own seeded lag, whatever the
  other shards do; every entry goes through the production ClusterProtocol.applied, which takes
  routes per group and needs no shard seam. A snapshot install (a lagging or restarted member)
  restores every shard at once, each to its own index: the node's Router replaces all its routes
  on a snapshot, and a per-shard snapshot is a seam the running node would need (see the doc);
- a node is ready once every shard's replica has applied what that shard had committed when the
  node started while any shard had a leader (in the design each shard's replica is ready on its
  own; the node's Router has one ready flag, another seam the running node would need);
- leader duties per shard: each shard's leader runs its own production LeaderDuties over its own
  table (expire_idle with a group timeout, follow_consumers with route_follow_ms) and proposes to its
  own log; a new term per shard at each of its outages;
- not modelled: owner failover (as in the simulation itself), a change of the shard count.
Invariants, on top of the simulation's own after every step (no split group, per-group order,
nothing lost, a router never ahead of its log):
- a route lives only in the table of its group's shard;
- fail closed per shard: a refused message's group belongs to a shard that had no leader at some
  moment while that group waited (from the send, or from handler_timeout_ms and a step before the
  refusal if that is earlier: a message waits behind its group's older ones and is refused with
  them); groups of the other shards are never refused.
"""

from __future__ import annotations

from handler.leader_duties import ExpireIdle, FollowConsumers, LeaderDuties, RaftStatus
from node.core.cluster.shards import shard_of, split_by_shard
from tests.sim.node_model import SimNode
from tests.sim.raft_log import RaftLog
from tests.sim.simulation import Simulation

SPLIT_BY_GROUP = {"claim": 1, "touch": 1, "move_clear": 1}  # command kind -> the field listing its groups
TO_EVERY_SHARD = {"register_node", "report_consumers"}


class _ShardView:
    """What one shard's RaftLog sees as its simulation: the real one, except that a commit is told
    with its shard, so the nodes' replicas of that shard apply it."""

    def __init__(self, sim, shard: int):
        self._sim, self._shard = sim, shard

    def __getattr__(self, name):
        return getattr(self._sim, name)

    def committed(self, index: int) -> None:
        self._sim.shard_committed(self._shard, index)


class _MergedTable:
    """The shards' RouteTables read as one, for the simulation's invariants (never written through)."""

    def __init__(self, shards: list[RaftLog]):
        self._shards = shards

    def entries(self):
        for shard in self._shards:
            yield from shard.table.entries()

    def entry(self, queue: str, group: str):
        return self._shards[shard_of(queue, group, len(self._shards))].table.entry(queue, group)

    @property
    def route_counts(self) -> dict:
        counts: dict = {}
        for shard in self._shards:
            for key, count in shard.table.route_counts.items():
                counts[key] = counts.get(key, 0) + count
        return counts

    @property
    def revision(self) -> tuple:
        return tuple(shard.table.revision for shard in self._shards)

    @property
    def moves(self) -> dict:
        return {key: move for shard in self._shards for key, move in shard.table.moves.items()}

    def moves_all(self) -> list:
        return sorted(move for shard in self._shards for move in shard.table.moves_all())

    def route(self, queue: str, group: str):
        return self._shards[shard_of(queue, group, len(self._shards))].table.route(queue, group)


class ShardedRaft:
    """S raft groups behind the interface the nodes and the invariants use (RaftLog's), where an index
    is a tuple: one index per shard."""

    def __init__(self, sim, shard_count: int, routes_max: int):
        self.sim = sim
        self.shard_count = shard_count
        self.shards = [RaftLog(_ShardView(sim, shard), routes_max) for shard in range(shard_count)]
        self.table = _MergedTable(self.shards)

    # ---- proposals: one per shard ------------------------------------------------------------

    def propose(self, command: tuple, on_failed=None, *more, **callbacks) -> None:
        """`more`, `callbacks`: RaftLog.propose's on_committed and rng, for what shard 0 holds."""
        kind = command[0]
        if kind in SPLIT_BY_GROUP:
            field = SPLIT_BY_GROUP[kind]
            for shard, part in split_by_shard(command[field], self.shard_count).items():
                self.sim.stats[f"proposals_shard_{shard}"] += 1
                self.shards[shard].propose(command[:field] + (tuple(part),) + command[field + 1:], on_failed)
        elif kind in TO_EVERY_SHARD:
            for shard in self.shards:
                shard.propose(command, on_failed)
        elif kind in ("expire_idle", "follow_consumers"):
            raise AssertionError(f"{kind}: a shard's leader proposes it to its own log, never through the nodes")
        else:  # cluster-wide metadata (queue definitions): shard 0 holds it
            self.shards[0].propose(command, on_failed, *more, **callbacks)

    def set_leader(self, up: bool) -> None:
        for shard in range(self.shard_count):
            self.set_shard_leader(shard, up)

    def set_shard_leader(self, shard: int, up: bool) -> None:
        self.shards[shard].set_leader(up)

    @property
    def leader_up(self) -> bool:
        return any(shard.leader_up for shard in self.shards)

    # ---- the logs, read at a tuple of indexes ------------------------------------------------

    @property
    def commit_index(self) -> tuple:
        return tuple(shard.commit_index for shard in self.shards)

    def _shard(self, key: tuple[str, str]) -> int:
        return shard_of(key[0], key[1], self.shard_count)

    def owner_at(self, key: tuple[str, str], index: tuple):
        shard = self._shard(key)
        return self.shards[shard].owner_at(key, index[shard])

    def touched_at(self, key: tuple[str, str], index: tuple):
        shard = self._shard(key)
        return self.shards[shard].touched_at(key, index[shard])

    def routes_at(self, index: tuple) -> list:
        return sorted(route for shard, log in enumerate(self.shards) for route in log.routes_at(index[shard]))

    def moves_at(self, index: tuple) -> list:
        return sorted(move for shard, log in enumerate(self.shards) for move in log.moves_at(index[shard]))

    @property
    def queues(self):
        """The queue definitions: cluster-wide metadata, replicated in shard 0 only."""
        return self.shards[0].queues

    def definitions_at(self, index: tuple):
        return self.shards[0].definitions_at(index[0])

    @property
    def route_history(self) -> dict:
        return {key: history for shard in self.shards for key, history in shard.route_history.items()}

    @property
    def current(self) -> dict:
        return {key: owner for shard in self.shards for key, owner in shard.current.items()}


class ShardedSimNode(SimNode):
    """A node with one replica per shard: `applied_index` is a tuple, and `apply_due_ms` is keyed by
    (shard, index). Everything else is the simulation's node, so the node's own ClusterProtocol."""

    def boot(self, config_queues=()) -> None:
        super().boot(config_queues)
        self.applied_index = (0,) * self.sim.shard_count

    def catch_up(self) -> None:
        """Each shard's replica applies what its log committed and its lag allows, on its own."""
        now_ms = self.sim.now_ms
        applied = list(self.applied_index)
        for shard, log in enumerate(self.sim.raft.shards):
            while applied[shard] < log.commit_index:
                index = applied[shard] + 1
                if self.apply_due_ms.get((shard, index), self.replay_due_ms) > now_ms:
                    break
                self.apply_due_ms.pop((shard, index), None)
                applied[shard] = index
                self.applied_index = tuple(applied)
                for kind, payload, at_ms in log.feed(index):
                    self.carry_out(self.protocol.applied(kind, payload, at_ms, now_ms))
                    if not self.alive:
                        return  # it stopped itself (StopNode): the rest dies with the process
        if (not self.router.ready and self.ready_target is not None
                and all(done >= target for done, target in zip(self.applied_index, self.ready_target))):
            self.carry_out(self.protocol.ready(now_ms))

    def install_snapshot(self, index: tuple) -> None:
        due = self.apply_due_ms
        super().install_snapshot(index)
        self.apply_due_ms = {key: due_ms for key, due_ms in due.items() if key[1] > index[key[0]]}


class ShardedSimulation(Simulation):
    """The cluster simulation over `shard_count` raft groups, with outages that hit shards one by one.

    `shard_down_rate`: per step, one shard that has a leader loses it for 10..`shard_down_ms_max` ms
    (long enough, past handler_timeout_ms, for its new groups to be refused), unless it is the last
    shard with a leader: there is always a shard whose groups must keep flowing."""

    def __init__(self, seed: int, nodes: int = 3, *, shard_count: int = 4, shard_down_rate: float = 0.01,
                 shard_down_ms_max: int = 800, **overrides):
        overrides.setdefault("leader_down_rate", 0.0)  # outages hit one shard (set_shard_leader), not all
        self.shard_count = shard_count
        self.shard_down_rate = shard_down_rate
        self.shard_down_ms_max = shard_down_ms_max
        self.outages: list[list] = [[] for _ in range(shard_count)]  # per shard: [start_ms, end_ms or None]
        self.sent_ms: dict[str, int] = {}
        self.refused_by_shard: list[int] = [0] * shard_count
        self.accepted_by_shard: list[int] = [0] * shard_count
        self.accepted_while_another_shard_down = 0
        self.shard_terms = [1] * shard_count  # a new term at each of the shard's outages: its next leader is new
        super().__init__(seed, nodes, **overrides)
        self.shard_duties = [LeaderDuties(self.config.group_timeout_ms, reaper_interval_ms=self.config.reaper_interval_ms,
                                          route_follow_ms=self.config.route_follow_ms) for _ in range(shard_count)]
        self.overrides.update(shard_count=shard_count, shard_down_rate=shard_down_rate,
                              shard_down_ms_max=shard_down_ms_max)
        self._checked_shards = None

    def _make_raft(self):
        return ShardedRaft(self, self.shard_count, self.config.routes_max)

    def _make_node(self, node_id: str) -> ShardedSimNode:
        return ShardedSimNode(self, node_id)

    def shard_committed(self, shard: int, index: int) -> None:
        """Shard `shard` committed its entry `index`: each live node's replica of it applies it after a lag."""
        for node in self._alive_nodes():
            due_ms = max(self.now_ms + self.rng.randint(0, self.config.apply_lag_ms_max), node.replay_due_ms)
            node.apply_due_ms[(shard, index)] = due_ms
            self.schedule(due_ms - self.now_ms, node.guarded(node.catch_up), None)

    def committed(self, index) -> None:
        raise AssertionError("a sharded log commits through shard_committed")

    def restart(self, node, config_queues=()) -> None:
        """Simulation.restart with one replica per shard: maybe a snapshot, each shard at its own index."""
        if node.alive:
            return
        previous = node.applied_index
        node.boot(config_queues)
        if any(previous) and self.rng.random() < 0.5:
            node.install_snapshot(tuple(self.rng.randint(0, index) for index in previous))

    # ---- faults on one shard -----------------------------------------------------------------

    def set_shard_leader(self, shard: int, up: bool) -> None:
        """Scripted: shard `shard` loses its majority (up=False) or gets a leader again."""
        self.trace(f"shard {shard} leader {'up' if up else 'down'}")
        self._set_shard_leader(shard, up)

    def _set_shard_leader(self, shard: int, up: bool) -> None:
        log = self.raft.shards[shard]
        if up == log.leader_up:
            return
        if not up:
            self.outages[shard].append([self.now_ms, None])
            self.stats["shard_outages"] += 1
            self.shard_terms[shard] += 1
        else:
            self.outages[shard][-1][1] = self.now_ms
        self.raft.set_shard_leader(shard, up)
        if up:
            for node in self._alive_nodes():
                if node.ready_target is None:
                    node.ready_target = self.raft.commit_index
                    self.schedule(0, node.guarded(node.catch_up), None)

    def _set_leader(self, up: bool) -> None:
        for shard in range(self.shard_count):
            self._set_shard_leader(shard, up)

    def _leader_duties(self) -> None:
        """Each shard's leader's duties thread (Simulation._leader_duties, once per shard): the production
        LeaderDuties over that shard's table, its commands proposed to that shard's log."""
        self.schedule(self.config.reaper_interval_ms, self._leader_duties, None)
        alive = tuple(sorted(node.node_id for node in self.nodes.values() if node.alive))
        down = tuple(sorted(node.node_id for node in self.nodes.values() if not node.alive))
        for shard, log in enumerate(self.raft.shards):
            table = log.table
            status = RaftStatus(leader=log.leader_up, term=self.shard_terms[shard], reachable=alive, unreachable=down,
                                consumers=tuple((node, queue, count) for node, held in sorted(table.consumers.items())
                                                for queue, count in sorted(held.items())),
                                routed=tuple((node, queue, count) for (node, queue), count
                                             in sorted(table.route_counts.items())))
            for command in self.shard_duties[shard].tick(self.now_ms, status):
                if isinstance(command, FollowConsumers):
                    self.trace(f"shard {shard} leader: groups of {command.queue} follow their consumers away "
                               f"from {command.from_node}")
                    log.propose(("follow_consumers", command.queue, command.from_node, command.now_ms))
                    continue
                assert isinstance(command, ExpireIdle), command  # no owner failover here
                log.propose(("expire_idle", command.cutoff_ms, command.spared_nodes))

    def shard_down(self, shard: int) -> bool:
        return not self.raft.shards[shard].leader_up

    def _random_action(self) -> None:
        if self.rng.random() < self.shard_down_rate:
            up = [shard for shard in range(self.shard_count) if not self.shard_down(shard)]
            if len(up) > 1:  # keep one shard up, so there is always something that must keep flowing
                shard = self.rng.choice(up)
                down_ms = self.rng.randint(10, self.shard_down_ms_max)
                self.trace(f"shard {shard} loses its majority for {down_ms} ms")
                self._set_shard_leader(shard, False)
                self.schedule(down_ms, lambda: self._set_shard_leader(shard, True), f"shard {shard} leader up")
            return
        super()._random_action()

    # ---- what clients hear, judged per shard -------------------------------------------------

    def send(self, producer, group: str) -> str:
        mid = f"{producer.id}/{producer.queue}/{group}/{producer.next_seq[group]}"
        self.sent_ms[mid] = self.now_ms
        assert super().send(producer, group) == mid
        return mid

    def producer_outcome(self, mid: str, error) -> None:
        super().producer_outcome(mid, error)
        _, queue, group, _ = self.sent[mid]
        shard = shard_of(queue, group, self.shard_count)
        if self.outcome[mid] == "accepted":
            self.accepted_by_shard[shard] += 1
            if any(self.shard_down(other) for other in range(self.shard_count) if other != shard):
                self.accepted_while_another_shard_down += 1
        elif self.outcome[mid] == "refused":
            self.refused_by_shard[shard] += 1
            # it may have waited behind older messages of its group: the oldest, refused with it, waited
            # handler_timeout_ms (plus up to a step until a tick saw it)
            waited_from_ms = min(self.sent_ms[mid], self.now_ms - self.config.handler_timeout_ms
                                 - self.config.step_ms_max)
            if not any(end_ms is None or end_ms >= waited_from_ms for start_ms, end_ms in self.outages[shard]
                       if start_ms <= self.now_ms):
                self.violation(f"{mid} was refused but its group's shard {shard} had a leader all the time "
                               f"its group waited, from t={waited_from_ms} (outages {self.outages[shard]}): a "
                               f"refusal must stay with the shard that failed")

    def check_invariants(self) -> None:
        super().check_invariants()
        revisions = self.raft.table.revision
        if revisions != self._checked_shards:
            self._checked_shards = revisions
            for shard, log in enumerate(self.raft.shards):
                for (queue, group), _route in log.table.entries():
                    if shard_of(queue, group, self.shard_count) != shard:
                        self.violation(f"route of {(queue, group)} is in shard {shard}'s table, but the group "
                                       f"belongs to shard {shard_of(queue, group, self.shard_count)}")

    def summary(self) -> dict:
        return {**super().summary(), "shards": self.shard_count, "refused_by_shard": list(self.refused_by_shard),
                "accepted_by_shard": list(self.accepted_by_shard),
                "accepted_while_another_shard_down": self.accepted_while_another_shard_down,
                "entries_by_shard": [log.commit_index for log in self.raft.shards]}


def main(argv: list[str]) -> int:
    """python3 -m tests.sim.sharding [SEEDS [STEPS [SHARDS [GROUP_TIMEOUT_MS [ROUTE_FOLLOW_MS]]]]]: a longer
    sweep than CI's, totals per shard."""
    seeds = int(argv[0]) if argv else 50
    steps = int(argv[1]) if len(argv) > 1 else 3000
    shard_count = int(argv[2]) if len(argv) > 2 else 4
    duties = {"group_timeout_ms": int(argv[3]) if len(argv) > 3 else 0,
              "route_follow_ms": int(argv[4]) if len(argv) > 4 else 0}
    totals: dict = {"refused_by_shard": [0] * shard_count, "accepted_by_shard": [0] * shard_count}
    counted = ("sent", "accepted", "refused", "delivered", "shard_outages", "crashes", "snapshots",
               "accepted_while_another_shard_down", "routes_expired", "moves_begun", "moves_done")
    for seed in range(seeds):
        summary = ShardedSimulation(seed, shard_count=shard_count, groups=40, **duties).run(steps).summary()
        for key in counted:
            totals[key] = totals.get(key, 0) + summary.get(key, 0)
        for key in ("refused_by_shard", "accepted_by_shard"):
            totals[key] = [total + count for total, count in zip(totals[key], summary[key])]
    print(f"{seeds} seeds (0..{seeds - 1}) x {steps} steps, {shard_count} shards, {duties}, every invariant held "
          f"after every step: {totals}")
    return 0


if __name__ == "__main__":
    import sys
    sys.exit(main(sys.argv[1:]))
