"""Cluster-wide queue definitions, simulated: operators add, update and delete queues through the raft
log while nodes crash (torn journal tails), restart from snapshots, lag, and lose their leader, and
config-file queues are seeded at every start. After every step, every node that has applied the whole
log holds exactly the defined queues with their settings (tests/sim/simulation.py: _check_definitions)."""

from __future__ import annotations

import collections
import random

from node.core.cluster.definitions import DEFINITION_RETRY_INTERVAL_MS
from node.core.cluster.feed import TEMPORARY_OF
from node.core.dispatch.settings import QueueSettings
from tests.sim.simulation import Simulation

SEEDS = 40
STEPS = 400
NODES_BY_SEED = (3, 3, 2, 5)
CONFIG_QUEUES = (QueueSettings(name="c1", groups_max=50),)


def test_every_node_ends_each_step_with_the_logs_queue_definitions_through_every_fault():
    totals: collections.Counter = collections.Counter()
    for seed in range(SEEDS):
        sim = Simulation(seed, nodes=NODES_BY_SEED[seed % len(NODES_BY_SEED)], queue_definitions=True,
                         config_queues=CONFIG_QUEUES, crash_rate=0.03, snapshot_rate=0.02).run(STEPS)
        totals.update(sim.summary())
    for counted in ("queue_adds", "queue_updates", "queue_deletes", "crashes", "torn_tails", "snapshots",
                    "leader_outages"):
        assert totals[counted] > 0, (counted, totals)


def test_a_config_file_queue_is_seeded_once_and_a_deleted_one_stays_deleted_across_restarts():
    sim = Simulation(7, scripted=True, config_queues=CONFIG_QUEUES)
    sim.advance(200)
    assert sim.raft.queues.definitions == {"c1": CONFIG_QUEUES[0].to_dict()}
    sim.raft.propose(("delete_queue", "c1", sim.raft.queues.revision))
    sim.advance(200)
    for node_id in sim.nodes:
        assert "c1" not in sim.nodes[node_id].broker.queues
    sim.crash_node("n2")
    sim.restart_node("n2")
    sim.advance(300)
    assert sim.raft.queues.definitions == {}
    assert "c1" not in sim.nodes["n2"].broker.queues


def subscribe(sim: Simulation, node_id: str, name: str) -> None:
    """A `topic` attach's temporary subscription at `node_id` (AmqpServer._subscription), then its batch ends."""
    node = sim.nodes[node_id]
    node.broker.subscribe("prices", name, durable=False)
    node.carry_out(node.protocol.quiesced(sim.now_ms))


def held_by(sim: Simulation, name: str) -> list[str]:
    return sorted(node_id for node_id, node in sim.nodes.items() if node.alive and name in node.broker.queues)


def test_a_temporary_subscription_is_on_every_node_until_its_link_ends_or_its_node_restarts():
    sim = Simulation(7, scripted=True, queue_definitions=True)
    sim.advance(200)
    subscribe(sim, "n1", "app.live.1")
    subscribe(sim, "n2", "app.live.2")
    sim.advance(200)  # invariants after every step: every current node holds every definition
    assert sim.raft.queues.definitions["app.live.1"][TEMPORARY_OF] == "n1"
    assert held_by(sim, "app.live.1") == held_by(sim, "app.live.2") == sorted(sim.nodes)
    n2 = sim.nodes["n2"]
    n2.broker.unsubscribe("app.live.2")  # its link ended
    n2.carry_out(n2.protocol.quiesced(sim.now_ms))
    sim.crash_node("n1")  # its link ends with the process
    sim.restart_node("n1")
    sim.advance(400)
    assert sorted(sim.raft.queues.definitions) == []
    assert held_by(sim, "app.live.1") == held_by(sim, "app.live.2") == []


SUBSCRIPTION_SEEDS = 20
SUBSCRIPTION_STEPS = 300


def test_temporary_subscriptions_made_and_ended_at_random_through_faults_stay_defined_only_while_their_link_lives():
    for seed in range(SUBSCRIPTION_SEEDS):
        sim = Simulation(seed, nodes=NODES_BY_SEED[seed % len(NODES_BY_SEED)], queue_definitions=True,
                         crash_rate=0.03, snapshot_rate=0.02)
        rng = random.Random(seed)
        links: dict[str, tuple[str, int]] = {}  # subscription -> (node id, incarnation) of the link that made it

        def alive(name: str) -> bool:
            node_id, incarnation = links[name]
            node = sim.nodes[node_id]
            return node.alive and node.incarnation == incarnation and name in node.broker.temporary

        for step in range(SUBSCRIPTION_STEPS):
            sim.step()  # invariants after every step: every current node holds exactly the log's definitions
            node = sim.nodes[rng.choice(sorted(sim.nodes))]
            if node.alive and rng.random() < 0.1:
                name = f"app.s{step}"
                node.broker.subscribe("prices", name, durable=False)
                links[name] = (node.node_id, node.incarnation)
                node.carry_out(node.protocol.quiesced(sim.now_ms))
            live = sorted(name for name in links if alive(name))
            if live and rng.random() < 0.05:
                name = rng.choice(live)
                owner = sim.nodes[links[name][0]]
                owner.broker.unsubscribe(name)  # its link ended
                owner.carry_out(owner.protocol.quiesced(sim.now_ms))
        sim.drain()  # faults off, every node up and current: crashed nodes' links ended with them
        sim.advance(DEFINITION_RETRY_INTERVAL_MS * 2)  # proposals that failed during the faults are made again
        assert [node.protocol.pending_definitions for node in sim.nodes.values()] == [set()] * len(sim.nodes), seed
        defined = {name for name, values in sim.raft.queues.definitions.items() if TEMPORARY_OF in values}
        assert defined == {name for name in links if alive(name)}, (seed, defined)
