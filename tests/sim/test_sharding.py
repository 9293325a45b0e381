"""A cluster whose routes are sharded over several raft groups (tests/sim/sharding.py, docs/cluster-ceiling.md):
losing one shard's majority refuses new groups of that shard only, and the shards add up their decisions."""

from __future__ import annotations

import collections

import pytest

from node.core.cluster.shards import shard_of
from tests.sim import decision_capacity
from tests.sim.sharding import ShardedRaft, ShardedSimulation
from tests.sim.simulation import SimulationFailure

SWEEP_SEEDS = 3
SWEEP_STEPS = 1000
SWEEP_GROUPS = 40  # per queue: enough that new groups keep arriving, so outages meet claims
SHARD_COUNT = 4
C = decision_capacity.CAPACITY_PER_S_MEASURED


def quiet(seed: int, **overrides) -> ShardedSimulation:
    """Scripted, no network faults: only what the test does happens."""
    settings = {"scripted": True, "forward_loss": 0.0, "ack_loss": 0.0, "duplicate": 0.0, **overrides}
    return ShardedSimulation(seed, shard_count=SHARD_COUNT, **settings)


def groups_of_shard(shard: int, count: int, queue: str = "q1", avoid: bool = False) -> list[str]:
    """`count` group ids of `queue` in shard `shard` (or, with avoid, in any other shard)."""
    found = []
    index = 0
    while len(found) < count:
        group = f"g{index}"
        if (shard_of(queue, group, SHARD_COUNT) == shard) != avoid:
            found.append(group)
        index += 1
    return found


def test_random_runs_with_shards_losing_their_majority_keep_every_invariant():
    totals: collections.Counter = collections.Counter()
    refused_by_shard = [0] * SHARD_COUNT
    for seed in range(SWEEP_SEEDS):
        sim = ShardedSimulation(seed, shard_count=SHARD_COUNT, groups=SWEEP_GROUPS).run(SWEEP_STEPS)
        summary = sim.summary()
        totals.update({key: value for key, value in summary.items() if isinstance(value, int)})
        refused_by_shard = [total + count for total, count in zip(refused_by_shard, summary["refused_by_shard"])]
        assert all(entries > 0 for entries in summary["entries_by_shard"]), summary  # every shard decided
    for counted in ("shard_outages", "crashes", "snapshots", "refused", "accepted_while_another_shard_down"):
        assert totals[counted] > 0, (counted, totals)
    assert sum(1 for refused in refused_by_shard if refused) >= 2, refused_by_shard  # not one unlucky shard


DUTIES_SEEDS = 2
DUTIES_STEPS = 600


@pytest.mark.parametrize("setting", [{"group_timeout_ms": 400}, {"route_follow_ms": 100}])
def test_each_shards_leader_runs_its_own_duties_expiring_and_moving_only_its_groups(setting):
    totals: collections.Counter = collections.Counter()
    for seed in range(DUTIES_SEEDS):
        sim = ShardedSimulation(seed, shard_count=SHARD_COUNT, groups=SWEEP_GROUPS, **setting).run(DUTIES_STEPS)
        totals.update({key: value for key, value in sim.summary().items() if isinstance(value, int)})
    assert totals["shard_outages"] > 0 and totals["crashes"] > 0, totals
    if "group_timeout_ms" in setting:
        assert totals["routes_expired"] > 0, totals
    else:
        assert totals["moves_begun"] > 0 and totals["moves_done"] == totals["moves_begun"], totals


@pytest.mark.parametrize("seed", range(3))
def test_a_shard_without_majority_refuses_only_its_own_new_groups_while_known_groups_and_other_shards_flow(seed):
    sim = quiet(seed)
    down = seed % SHARD_COUNT
    known = groups_of_shard(down, 2)  # routed before the outage: the cached-route path needs no raft
    new_down = groups_of_shard(down, 3)[2:] + groups_of_shard(down, 4, queue="q2")[:2]
    new_up = groups_of_shard(down, 6, avoid=True)
    consumers = [sim.consumer(node, queue) for node in sim.nodes for queue in ("q1", "q2")]
    producer_q1, producer_q2 = sim.producer("n3", "q1"), sim.producer("n2", "q2")
    before = [sim.send(producer_q1, group) for group in known]
    sim.advance(100)
    assert all(sim.outcome[mid] == "accepted" for mid in before)

    sim.set_shard_leader(down, False)
    new_down_sent = [sim.send(producer_q1 if i < 1 else producer_q2, group) for i, group in enumerate(new_down)]
    flowing = [sim.send(producer_q1, group) for group in known + new_up for _ in range(3)]
    sim.advance(sim.config.handler_timeout_ms + 200)

    assert all(sim.outcome[mid] == "refused" for mid in new_down_sent), [sim.outcome.get(mid) for mid in new_down_sent]
    assert all(sim.outcome[mid] == "accepted" for mid in flowing)
    assert set(flowing) <= sim.accepted_by_consumer  # delivered, in order per group (checked at each delivery)
    assert all(sim.route("q1", group) is not None for group in new_up)
    assert all(sim.route(queue, group) is None for queue, group in (("q1", new_down[0]), ("q2", new_down[1])))

    sim.set_shard_leader(down, True)  # the majority is back: the refused groups can be sent again
    again = [sim.send(producer_q1, new_down[0])]
    sim.advance(100)
    assert sim.outcome[again[0]] == "accepted" and sim.route("q1", new_down[0]) is not None
    assert consumers[0].alive
    sim.drain()


def test_the_fail_closed_check_catches_a_refusal_blamed_on_the_wrong_shard():
    class MisattributingSimulation(ShardedSimulation):
        def _set_shard_leader(self, shard, up):  # takes down one shard but records another's outage
            super()._set_shard_leader(shard, up)
            if not up:
                self.outages[shard].pop()
                self.outages[(shard + 1) % self.shard_count].append([self.now_ms, None])

    sim = MisattributingSimulation(0, shard_count=SHARD_COUNT, scripted=True, forward_loss=0.0, ack_loss=0.0,
                                   duplicate=0.0)
    sim.consumer("n1", "q1")
    producer = sim.producer("n2", "q1")
    sim.set_shard_leader(0, False)
    sim.send(producer, groups_of_shard(0, 1)[0])
    with pytest.raises(SimulationFailure, match="had a leader all the time"):
        sim.advance(sim.config.handler_timeout_ms + 200)


def test_the_invariants_catch_a_route_decided_in_the_wrong_shard():
    class OneShardForAll(ShardedRaft):
        def propose(self, command, on_failed=None, *more, **callbacks):
            if command[0] == "claim":
                return self.shards[0].propose(command, on_failed)
            return super().propose(command, on_failed, *more, **callbacks)

    class Misrouting(ShardedSimulation):
        def _make_raft(self):
            return OneShardForAll(self, self.shard_count, self.config.routes_max)

    sim = Misrouting(0, shard_count=SHARD_COUNT, scripted=True)
    sim.consumer("n1", "q1")
    sim.send(sim.producer("n2", "q1"), groups_of_shard(1, 1)[0])
    with pytest.raises(SimulationFailure, match="shard"):
        sim.advance(100)


# ---- decisions per second: S shards add up, one saturates ---------------------------------------

def test_one_shard_below_its_capacity_decides_everything_and_keeps_no_backlog():
    result = decision_capacity.run(1, int(0.9 * C), duration_ms=1000)
    assert result.decided == int(0.9 * C) and result.backlog_end == 0 and not result.grows


def test_one_shard_above_its_capacity_decides_at_capacity_and_its_backlog_grows_without_bound():
    result = decision_capacity.run(1, int(1.2 * C), duration_ms=1000)
    assert result.decided_per_s == pytest.approx(C, rel=0.01)
    assert result.grows
    assert result.backlog_end == pytest.approx(0.2 * C, rel=0.02)  # (offered - C) x 1 s


def test_four_shards_sustain_what_saturates_one():
    offered_per_s = int(0.9 * 4 * C)
    sharded = decision_capacity.run(4, offered_per_s, duration_ms=1000)
    single = decision_capacity.run(1, offered_per_s, duration_ms=1000)
    assert sharded.decided_per_s == pytest.approx(offered_per_s, rel=0.005) and not sharded.grows
    assert sharded.backlog_end < offered_per_s / 100  # under 10 ms of arrivals waiting
    assert single.decided_per_s == pytest.approx(C, rel=0.01) and single.grows


@pytest.mark.parametrize("shard_count", [2, 4])
def test_s_shards_overloaded_decide_s_times_the_capacity_of_one(shard_count):
    result = decision_capacity.run(shard_count, 2 * shard_count * C, duration_ms=1000)
    assert result.decided_per_s == pytest.approx(shard_count * C, rel=0.01)
    assert result.grows
