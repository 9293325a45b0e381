"""Groups follow their consumers, simulated: the leader moves a group whose owner lost its consumers,
and the handover (node/core/cluster/handover.py) keeps every invariant through every fault.

Beyond the invariants every simulation checks after every step (tests/sim/simulation.py), a moving
group's new owner delivers none of it until the move ends, no two consumers anywhere hold a group at
once, and once a move ended the group's messages are on its new owner only.
"""

from __future__ import annotations

import collections

import pytest

from node.core.cluster import handover
from node.core.dispatch.cold import GROUP_RECORD_BYTES, MESSAGE_RECORD_BYTES
from tests.sim.simulation import Simulation

FOLLOW_SWEEP_SEEDS = 60
FOLLOW_JOURNAL_FAIL_SEEDS = 20
FOLLOW_OUTBOUND_BOUND_SEEDS = 30  # runs whose outbound stores hold a few messages per owner
FOLLOW_OUTBOUND_PAGING_SEEDS = 30  # runs whose outbound stores keep about one body per owner in memory
FOLLOW_BODY_PAGING_SEEDS = 30  # runs whose nodes keep ~15 bodies and a few records of their queues in memory
FOLLOW_PIECES_SEEDS = 40  # runs whose old owners hand over two messages a tick
SWEEP_STEPS = 300
NODES_BY_SEED = (3, 3, 2, 5)
ROUTE_FOLLOW_MS = 100
RECORD_MEMORY_MAX_BYTES = 4 * (MESSAGE_RECORD_BYTES + GROUP_RECORD_BYTES)  # a few warm groups' worth
READ_BACK_MAX_BYTES = 40  # a read of cold records stops at about three bodies (ids of ~13 bytes)


def scripted(seed: int, **overrides) -> Simulation:
    settings = {"scripted": True, "forward_loss": 0.0, "ack_loss": 0.0, "duplicate": 0.0,
                "route_follow_ms": ROUTE_FOLLOW_MS, **overrides}
    return Simulation(seed, **settings)


def sweep(seeds: int, **overrides) -> collections.Counter:
    """The summaries of `seeds` random runs with groups following their consumers, added up."""
    totals: collections.Counter = collections.Counter()
    for seed in range(seeds):
        sim = Simulation(seed, nodes=NODES_BY_SEED[seed % len(NODES_BY_SEED)], route_follow_ms=ROUTE_FOLLOW_MS,
                         **overrides).run(SWEEP_STEPS)
        totals.update(sim.summary())
    return totals


def test_groups_follow_consumers_that_move_between_nodes_through_every_fault():
    totals = sweep(FOLLOW_SWEEP_SEEDS)
    for counted in ("migrations", "moves_begun", "moves_done", "messages_handed_over", "messages_relayed",
                    "messages_parked", "crashes", "torn_tails", "leader_outages", "snapshots", "redeliveries"):
        assert totals[counted] > 0, (counted, totals)
    assert totals["moves_done"] == totals["moves_begun"]  # the drain ends every move


def test_groups_follow_consumers_past_small_outbound_bounds_which_handovers_and_relays_may_pass():
    totals = sweep(FOLLOW_OUTBOUND_BOUND_SEEDS, outbound_max_bytes=40)
    for counted in ("moves_done", "messages_handed_over", "outbound_refused"):
        assert totals[counted] > 0, (counted, totals)
    assert totals["moves_done"] == totals["moves_begun"]


def test_groups_follow_consumers_while_the_outbound_store_pages_handovers_and_relays():
    totals = sweep(FOLLOW_OUTBOUND_PAGING_SEEDS, outbound_memory_max_bytes=10)
    for counted in ("moves_done", "messages_handed_over", "messages_relayed", "outbound_paged", "outbound_read_back"):
        assert totals[counted] > 0, (counted, totals)
    assert totals["moves_done"] == totals["moves_begun"] and totals["forwards_lost"] == 0


def test_groups_follow_consumers_while_bodies_page_and_backlogs_go_cold_and_a_moving_group_takes_its_cold_messages():
    # both budgets, as runtime.Node sets them: bodies past ~200 bytes page out once on disk and a group
    # handed over has its paged bodies read back first; past a few records a queue's newest messages are
    # only counted, and a group moving away takes them along (the protocol's sweep of the tail, read back
    # through cold_records, its reads cut short at a few bodies' bytes); the invariants check that a moved
    # group's messages are on its new owner only
    totals = sweep(FOLLOW_BODY_PAGING_SEEDS, message_memory_max_bytes=200, record_memory_max_bytes=RECORD_MEMORY_MAX_BYTES,
                   read_back_max_bytes=READ_BACK_MAX_BYTES)
    for counted in ("moves_done", "messages_handed_over", "bodies_paged_out", "bodies_read_back", "cold_read_back",
                    "cold_reads_cut",
                    "cold_recovered", "cold_sweeps", "cold_handed_over", "crashes", "torn_tails"):
        assert totals[counted] > 0, (counted, totals)
    assert totals["moves_done"] == totals["moves_begun"]


def test_groups_follow_consumers_while_old_owners_hand_over_a_few_messages_and_bytes_a_tick(monkeypatch):
    # the per-tick handover bounds at a couple of messages: groups go in pieces over many ticks, their paged
    # bodies read back a window at a time, and what arrives meanwhile goes behind them (7b846e5)
    monkeypatch.setattr(handover, "HANDOVER_MESSAGES_PER_TICK", 2)
    monkeypatch.setattr(handover, "HANDOVER_BYTES_PER_TICK", 30)
    totals: collections.Counter = collections.Counter()
    for seed in range(FOLLOW_PIECES_SEEDS):
        sim = Simulation(seed, nodes=NODES_BY_SEED[seed % len(NODES_BY_SEED)], route_follow_ms=ROUTE_FOLLOW_MS,
                         message_memory_max_bytes=(seed % 3) * 100, read_back_max_bytes=READ_BACK_MAX_BYTES,
                         record_memory_max_bytes=RECORD_MEMORY_MAX_BYTES if seed % 2 else 0)
        sim.run(SWEEP_STEPS)
        sim.drain()
        totals.update(sim.summary())
    for counted in ("moves_done", "messages_handed_over", "bodies_read_back", "cold_handed_over"):
        assert totals[counted] > 0, (counted, totals)
    assert totals["moves_done"] == totals["moves_begun"]


def test_groups_follow_consumers_with_failed_journal_writes_too():
    totals = sweep(FOLLOW_JOURNAL_FAIL_SEEDS, journal_fail_rate=0.02)
    for counted in ("moves_done", "journal_failures", "stops"):
        assert totals[counted] > 0, (counted, totals)


def test_a_message_unparked_at_a_moving_groups_old_owner_never_goes_cold_behind_a_finished_sweep():
    # was a strict xfail: the old owner of a group moving away unparked what it had parked into its queue
    # once the queue would not put it cold, checked once, but the first ones could fill the record
    # budget: the next went cold in a tail already swept for the group, and the next arrival was relayed
    # to the new owner ahead of it (seed 59: p5/q2/g1/7 delivered before /6; seed 194 likewise). _unpark
    # now stops where the queue would put the next cold, and the rest is relayed from the park
    for sim, steps in ((Simulation(59, nodes=5, route_follow_ms=ROUTE_FOLLOW_MS, message_memory_max_bytes=100,
                                   record_memory_max_bytes=RECORD_MEMORY_MAX_BYTES), 178),
                       (Simulation(194, nodes=2, route_follow_ms=50, message_memory_max_bytes=30,
                                   record_memory_max_bytes=600, producers_max=6, consumers_max=3), 400)):
        sim.run(steps)
        sim.drain()


SEND_INTERVAL_MS = 15  # each producer sends this often: well within what one simulated forwarder carries


def send_for(sim: Simulation, producers: list, duration_ms: int, sent: list) -> None:
    for _ in range(max(1, duration_ms // SEND_INTERVAL_MS)):
        for producer in producers:
            sent.append(sim.send(producer, "g1"))
        sim.advance(SEND_INTERVAL_MS)


@pytest.mark.parametrize("seed", range(4))
def test_consumers_leaving_a_node_take_its_groups_backlog_with_them_in_order_while_producers_keep_sending(seed):
    sim = scripted(seed)
    leaving = sim.consumer("n1", "q1", accept_all=False)  # no credit: the group's messages queue on n1
    sim.advance(50)
    producers = [sim.producer("n1", "q1"), sim.producer("n3", "q1"), sim.producer("n2", "q1")]
    sent: list = []
    send_for(sim, producers, 100, sent)
    assert sim.route("q1", "g1") == "n1"
    sim.detach(leaving)
    arriving = sim.consumer("n2", "q1", accept_all=False)
    send_for(sim, producers, 800, sent)  # the leader moves g1 meanwhile; nobody stops sending
    assert sim.route("q1", "g1") == "n2" and sim.raft.table.moves == {}
    assert sim.moved[("q1", "g1")] == 1 and sim.stats["messages_handed_over"] > 0
    assert not sim.nodes["n1"].live  # the backlog left n1
    arriving.accept_all = True
    sim.advance(300)
    assert all(sim.outcome[mid] == "accepted" for mid in sent)
    assert set(sent) <= sim.accepted_by_consumer  # every one, in order per producer (checked at each delivery)
    sim.drain()


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("crashing", ["n1", "n2"])
def test_a_crash_of_the_old_or_the_new_owner_mid_handover_loses_and_reorders_nothing(seed, crashing):
    sim = scripted(seed)
    leaving = sim.consumer("n1", "q1", accept_all=False)
    sim.advance(50)
    producers = [sim.producer("n3", "q1")]
    sent: list = []
    send_for(sim, producers, 100, sent)
    sim.detach(leaving)
    arriving = sim.consumer("n2", "q1", accept_all=True)
    while not sim.raft.table.moves:  # until the leader's follow_consumers is in the log
        send_for(sim, producers, SEND_INTERVAL_MS, sent)
    sim.crash_node(crashing)
    send_for(sim, producers, 50, sent)
    sim.restart_node(crashing)
    if crashing == "n2":
        arriving = sim.consumer("n2", "q1", accept_all=True)  # its consumer died with it
    send_for(sim, producers, 800, sent)
    assert sim.route("q1", "g1") == "n2" and sim.raft.table.moves == {}
    assert arriving.alive
    sim.drain()
    assert {mid for mid in sent if sim.outcome.get(mid) == "accepted"} <= sim.accepted_by_consumer


def test_a_restarted_node_holds_a_recovered_group_moving_between_two_other_nodes_until_the_move_ends():
    # found by a sweep with failed journal writes (seed 65): n1 restarted with an old message of g2 in its
    # journal while g2 moved between n2 and n3; its restored hold ended as the move did not involve it,
    # and n1 delivered the message while n2's consumer held the group. Now it stays held until the move
    # ends and then goes to the group's owner
    sim = Simulation(65, route_follow_ms=100, journal_fail_rate=0.02)
    sim.run(400)
    sim.drain()


def test_a_route_whose_move_outlasted_the_group_timeout_is_not_expired_under_its_new_owner():
    # was a strict xfail: the table spares a moving group's route, but its touched time was still from
    # before the move when the move ended; the old owner had stopped on a failed journal write mid-move
    # (~960 ms, past the group timeout), and the next reaper run removed the route 32 ms after the move
    # ended, before the new owner's first refresh, while its consumer held ('q1', 'g3') (seed 172). Both
    # ends of a move now refresh its route while it lasts
    sim = Simulation(172, route_follow_ms=100, journal_fail_rate=0.02, message_memory_max_bytes=100,
                     record_memory_max_bytes=RECORD_MEMORY_MAX_BYTES)
    sim.run(400)
    sim.drain()
