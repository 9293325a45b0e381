"""The cluster beyond one raft group's decision ceiling, simulated: routes sharded by group hash over S raft groups.

docs/cluster-ceiling.md has the design; this module is its executable form, on top of the seeded
cluster simulation (tests/sim/simulation.py), with the nodes' own ClusterProtocol and S real
RouteTables. Rules of the model:
- S `RaftLog`s, one per shard, each with its own leader that can be lost on its own (a partition or
  crash of that shard's majority: its proposals fail, those in flight have unknown outcomes);
- a node proposes each claim, touch or move clear split by `node/core/shards.py`'s shard_of, one
  proposal per shard; membership and consumer reports go to every shard (each shard places its own
  groups and needs them); any other command goes to shard 0;
- each node applies every shard's entries in that shard's order, after its own lag; the shards'
  entries reach it merged in commit order (one real node applies its shards independently: the
  merge is one of the interleavings that allows, and every entry still reaches the node through the
  production ClusterProtocol.applied, which takes routes per group and needs no shard seam);
- a node is ready once it has applied what was committed when any shard had a leader (in the
  design each shard's replica is ready on its own; the node's Router has one ready flag, which is a
  seam the running node would need: see the doc);
- not modelled: per-shard leader duties (group timeouts, route following: refused below), a change
  of the shard count.
Invariants, on top of the simulation's own after every step (no split group, per-group order,
nothing lost, a router never ahead of its log):
- a route lives only in the table of its group's shard;
- fail closed per shard: a refused message's group belongs to a shard that had no leader at some
  moment between the send and the refusal; groups of the other shards are never refused.
"""

from __future__ import annotations

import bisect

from node.core.shards import shard_of, split_by_shard
from tests.sim.raft_log import RaftLog
from tests.sim.simulation import Simulation

SPLIT_BY_GROUP = {"claim": 1, "touch": 1, "move_clear": 1}  # command kind -> the field listing its groups
TO_EVERY_SHARD = {"register_node", "report_consumers"}


class _ShardView:
    """What one shard's RaftLog sees as its simulation: the real one, except that its commits join the
    merged order of the nodes' feed."""

    def __init__(self, sim, raft: "ShardedRaft", shard: int):
        self._sim, self._raft, self._shard = sim, raft, shard

    def __getattr__(self, name):
        return getattr(self._sim, name)

    def committed(self, local_index: int) -> None:
        self._raft.committed(self._shard, local_index)


class _MergedTable:
    """The shards' RouteTables read as one, for the simulation's invariants (never written through)."""

    def __init__(self, shards: list[RaftLog]):
        self._shards = shards

    @property
    def routes(self) -> dict:
        return {key: route for shard in self._shards for key, route in shard.table.routes.items()}

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
    """S raft groups behind the one interface the nodes and the invariants use (RaftLog's)."""

    def __init__(self, sim, shard_count: int, routes_max: int):
        self.sim = sim
        self.shard_count = shard_count
        self.shards = [RaftLog(_ShardView(sim, self, shard), routes_max) for shard in range(shard_count)]
        self.table = _MergedTable(self.shards)
        self.order: list[tuple[int, int]] = []  # merged index - 1 -> (shard, the shard's own index)
        self._merged_at: list[list[int]] = [[] for _ in range(shard_count)]  # per shard: each entry's merged index

    # ---- proposals: one per shard ------------------------------------------------------------

    def propose(self, command: tuple, on_failed=None, **callbacks) -> None:
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
            raise AssertionError(f"{kind}: per-shard leader duties are not simulated")
        else:  # cluster-wide metadata (queue definitions): shard 0 holds it
            self.shards[0].propose(command, on_failed, **callbacks)

    def set_leader(self, up: bool) -> None:
        for shard in range(self.shard_count):
            self.set_shard_leader(shard, up)

    def set_shard_leader(self, shard: int, up: bool) -> None:
        self.shards[shard].set_leader(up)

    @property
    def leader_up(self) -> bool:
        return any(shard.leader_up for shard in self.shards)

    # ---- the merged feed -----------------------------------------------------------------------

    def committed(self, shard: int, local_index: int) -> None:
        assert local_index == len(self._merged_at[shard]) + 1, (shard, local_index)
        self.order.append((shard, local_index))
        self._merged_at[shard].append(len(self.order))
        self.sim.committed(len(self.order))

    @property
    def commit_index(self) -> int:
        return len(self.order)

    def feed(self, index: int) -> list[tuple]:
        shard, local_index = self.order[index - 1]
        return self.shards[shard].feed(local_index)

    def _local(self, shard: int, index: int) -> int:
        """How many of `shard`'s entries are among the first `index` merged ones."""
        return bisect.bisect_right(self._merged_at[shard], index)

    def _shard(self, key: tuple[str, str]) -> int:
        return shard_of(key[0], key[1], self.shard_count)

    def owner_at(self, key: tuple[str, str], index: int):
        shard = self._shard(key)
        return self.shards[shard].owner_at(key, self._local(shard, index))

    def touched_at(self, key: tuple[str, str], index: int):
        shard = self._shard(key)
        return self.shards[shard].touched_at(key, self._local(shard, index))

    def routes_at(self, index: int) -> list:
        return sorted(route for shard, log in enumerate(self.shards) for route in log.routes_at(self._local(shard, index)))

    def moves_at(self, index: int) -> list:
        return sorted(move for shard, log in enumerate(self.shards) for move in log.moves_at(self._local(shard, index)))

    @property
    def queues(self):
        """The queue definitions: cluster-wide metadata, replicated in shard 0 only."""
        return self.shards[0].queues

    def definitions_at(self, index: int):
        return self.shards[0].definitions_at(self._local(0, index))

    @property
    def route_history(self) -> dict:
        return {key: history for shard in self.shards for key, history in shard.route_history.items()}

    @property
    def current(self) -> dict:
        return {key: owner for shard in self.shards for key, owner in shard.current.items()}


class ShardedSimulation(Simulation):
    """The cluster simulation over `shard_count` raft groups, with outages that hit one shard at a time.

    `shard_down_rate`: per step, one shard that has a leader loses it for 10..`shard_down_ms_max` ms
    (long enough, past handler_timeout_ms, for its new groups to be refused)."""

    def __init__(self, seed: int, nodes: int = 3, *, shard_count: int = 4, shard_down_rate: float = 0.01,
                 shard_down_ms_max: int = 800, **overrides):
        if overrides.get("group_timeout_ms", 0) or overrides.get("route_follow_ms", 0):
            raise ValueError("the sharded simulation has no per-shard leader duties: leave group_timeout_ms "
                             "and route_follow_ms at 0")
        overrides.setdefault("leader_down_rate", 0.0)  # outages hit one shard (set_shard_leader), not all
        self.shard_count = shard_count
        self.shard_down_rate = shard_down_rate
        self.shard_down_ms_max = shard_down_ms_max
        self.outages: list[list] = [[] for _ in range(shard_count)]  # per shard: [start_ms, end_ms or None]
        self.sent_ms: dict[str, int] = {}
        self.refused_by_shard: list[int] = [0] * shard_count
        self.accepted_by_shard: list[int] = [0] * shard_count
        self.accepted_while_another_shard_down = 0
        super().__init__(seed, nodes, **overrides)
        self.overrides.update(shard_count=shard_count, shard_down_rate=shard_down_rate,
                              shard_down_ms_max=shard_down_ms_max)
        self._checked_shards = None

    def _make_raft(self):
        return ShardedRaft(self, self.shard_count, self.config.routes_max)

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
            sent_ms = self.sent_ms[mid]
            if not any(end_ms is None or end_ms >= sent_ms for start_ms, end_ms in self.outages[shard]
                       if start_ms <= self.now_ms):
                self.violation(f"{mid} was refused but its group's shard {shard} had a leader all the time "
                               f"from its send at t={sent_ms} (outages {self.outages[shard]}): a refusal "
                               f"must stay with the shard that failed")

    def check_invariants(self) -> None:
        super().check_invariants()
        revisions = self.raft.table.revision
        if revisions != self._checked_shards:
            self._checked_shards = revisions
            for shard, log in enumerate(self.raft.shards):
                for queue, group in log.table.routes:
                    if shard_of(queue, group, self.shard_count) != shard:
                        self.violation(f"route of {(queue, group)} is in shard {shard}'s table, but the group "
                                       f"belongs to shard {shard_of(queue, group, self.shard_count)}")

    def summary(self) -> dict:
        return {**super().summary(), "shards": self.shard_count, "refused_by_shard": list(self.refused_by_shard),
                "accepted_by_shard": list(self.accepted_by_shard),
                "accepted_while_another_shard_down": self.accepted_while_another_shard_down,
                "entries_by_shard": [log.commit_index for log in self.raft.shards]}


def main(argv: list[str]) -> int:
    """python3 -m tests.sim.sharding [SEEDS [STEPS [SHARDS]]]: a longer sweep than CI's, totals per shard."""
    seeds = int(argv[0]) if argv else 50
    steps = int(argv[1]) if len(argv) > 1 else 3000
    shard_count = int(argv[2]) if len(argv) > 2 else 4
    totals: dict = {"refused_by_shard": [0] * shard_count, "accepted_by_shard": [0] * shard_count}
    counted = ("sent", "accepted", "refused", "delivered", "shard_outages", "crashes", "snapshots",
               "accepted_while_another_shard_down")
    for seed in range(seeds):
        summary = ShardedSimulation(seed, shard_count=shard_count, groups=12).run(steps).summary()
        for key in counted:
            totals[key] = totals.get(key, 0) + summary.get(key, 0)
        for key in ("refused_by_shard", "accepted_by_shard"):
            totals[key] = [total + count for total, count in zip(totals[key], summary[key])]
    print(f"{seeds} seeds (0..{seeds - 1}) x {steps} steps, {shard_count} shards, every invariant held after "
          f"every step: {totals}")
    return 0


if __name__ == "__main__":
    import sys
    sys.exit(main(sys.argv[1:]))
