"""Takeover and fencing (issue 28): the pure order of steps (node/core/replication/takeover.py), its crash rule
checked at every crash point with hypothesis, and the cluster protocol carrying it out
(node/core/cluster/takeovers.py): a promotion's routes read the replica, hold and park the groups, enqueue
the taken-over messages first with their delivery counts raised, serve once the unit is on disk and then
drop the replica copy; an old owner fenced by a newer epoch empties the groups it lost and keeps the rest.
"""

from __future__ import annotations

from hypothesis import given, settings, strategies as st

from node.core.cluster import ClusterProtocol
from node.core.cluster.context import PARK_PREFIX
from node.core.cluster.feed import REPLICAS, ROUTES
from node.core.cluster.takeovers import FENCE_MARK
from node.core.dispatch.broker import Broker
from node.core.dispatch.message import Message
from node.core.dispatch.settings import QueueSettings
from node.core.effects import AfterFlush, Declared, Deliver, EnqueueLocal, Removed, Stored
from node.core.replication.takeover import (BEGUN, STORED, DropReplica, Plan, ReadReplica, Takeover, mark_name,
                                            promoted_owners, recovered, taken_over)


def msg(seq: int, group: str, count: int = 0, payload: bytes | None = None) -> Message:
    return Message(payload or f"{group}{seq}".encode(), group, seq=seq, delivery_count=count)


def same_key(queue, group_id):
    return group_id


# ---- the pure core -------------------------------------------------------------------------------

def test_the_steps_go_read_then_plan_then_drop_and_the_plan_keeps_group_order_and_only_the_keys():
    takeover = Takeover("n2", 0, [("q", "b"), ("q", "a")])
    assert takeover.begin() == ReadReplica("n2", 0, ("q",))
    found = {"q": [msg(3, "a"), msg(1, "b", 1), msg(2, "c"), msg(5, "a", 2), msg(4, "b")]}
    plan = takeover.read(found, same_key, 100)
    assert type(plan) is Plan
    assert plan.begun["state"] == BEGUN and plan.begun["first_seq"] == 100 and plan.begun["name"] == mark_name("n2")
    assert plan.stored["state"] == STORED and plan.stored["keys"] == [["q", "a"], ["q", "b"]]
    assert [(key, [m.seq for m in messages]) for key, messages in plan.enqueues] == [
        (("q", "a"), [3, 5]), (("q", "b"), [1, 4])]  # "c" went to another backup: not ours
    assert takeover.stored() == DropReplica("n2", 0, (("q", 1), ("q", 3), ("q", 4), ("q", 5)))
    takeover.dropped()


def test_a_stored_mark_only_drops_the_replica_leftovers_and_a_begun_mark_undoes_and_runs_again():
    stored = recovered({"name": mark_name("n2"), "owner": "n2", "epoch": 0, "state": STORED, "first_seq": 7,
                        "keys": [["q", "a"]]})
    assert stored.undo_first_seq is None and stored.takeover.redrop
    stored.takeover.begin()
    assert stored.takeover.read({"q": [msg(3, "a"), msg(4, "z")]}, same_key, 50) == DropReplica("n2", 0, (("q", 3),))
    begun = recovered({"name": mark_name("n2"), "owner": "n2", "epoch": 0, "state": BEGUN, "first_seq": 7,
                       "keys": [["q", "a"]]})
    assert begun.undo_first_seq == 7 and not begun.takeover.redrop


def test_only_routes_moving_to_this_node_from_an_owner_whose_epoch_grew_are_taken_over():
    promoted = promoted_owners({"n2": 0, "n3": 1}, {"n1": 4, "n2": 1, "n3": 1}, "n1")
    assert promoted == {"n2": 1}  # n1's own bump is fencing's business, n3's did not move
    routes = {("q", "a"): "n2", ("q", "b"): "n3", ("q", "c"): "n2"}
    payload = [("q", "a", "n1"), ("q", "b", "n1"), ("q", "c", "n3"), ("q", "new", "n1")]
    assert taken_over(payload, routes, promoted, "n1") == {"n2": [("q", "a")]}


# ---- crash points: recovery sees the replica copy or the local one, never both, never neither -----

def run_with_crash(messages: list, keys: list, crash_at: int, drop_done: bool):
    """A model of both journals: the local one a list of records (a crash keeps a prefix), the replica one
    a dict. Runs the takeover, crashes after `crash_at` local records (the drop done only when the whole
    unit was), recovers with the crash rule and runs what it says. Returns (local queue, replica)."""
    replica = {m.seq: m for m in messages}
    local: list = []  # ("mark", values) | ("store", key, payload, count, seq)
    next_seq = [1000]

    def execute(takeover: Takeover, crash: int | None, drop: bool):
        takeover.begin()
        step = takeover.read({"q": sorted(replica.values(), key=lambda m: m.seq)}, same_key, next_seq[0])
        if type(step) is DropReplica:
            for _, seq in step.seqs:
                replica.pop(seq, None)
            return
        unit = [("mark", step.begun)]
        for key, taken in step.enqueues:
            for m in taken:
                unit.append(("store", key, m.payload, m.delivery_count + 1, next_seq[0]))
                next_seq[0] += 1
        unit.append(("mark", step.stored))
        local.extend(unit if crash is None else unit[:crash])
        if (crash is None or crash >= len(unit)) and drop:
            for _, seq in takeover.stored().seqs:
                replica.pop(seq)

    execute(Takeover("n2", 0, keys), crash_at, drop_done)
    # restart: the last mark of the owner's name wins; BEGUN undoes the local stores of the keys
    marks = [record[1] for record in local if record[0] == "mark"]
    if marks:
        again = recovered(marks[-1])
        if again.undo_first_seq is not None:
            local[:] = [r for r in local if not (r[0] == "store" and r[4] >= again.undo_first_seq
                                                 and r[1] in again.takeover.keys)]
        execute(again.takeover, None, True)
    else:
        execute(Takeover("n2", 0, keys), None, True)
    return [r for r in local if r[0] == "store"], replica


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from("abc"), min_size=0, max_size=8), st.integers(0, 12), st.booleans(),
       st.lists(st.integers(0, 3), max_size=8))
def test_a_crash_at_any_point_loses_nothing_and_duplicates_nothing(groups, crash_at, drop_done, counts):
    messages = [msg(seq, group, counts[seq - 1] if seq - 1 < len(counts) else 0)
                for seq, group in enumerate(groups, 1)]
    keys = [("q", "a"), ("q", "b")]
    stores, replica = run_with_crash(messages, keys, crash_at, drop_done)
    wanted = [m for m in messages if ("q", m.group_id) in keys]
    for key in keys:  # each key's messages once, in the owner's order, each counted one delivery more
        assert [(r[2], r[3]) for r in stores if r[1] == key] == [
            (m.payload, m.delivery_count + 1) for m in wanted if ("q", m.group_id) == key]
    assert sorted(replica) == [m.seq for m in messages if m not in wanted]  # the other backups' groups stay


# ---- the cluster protocol carrying it out ----------------------------------------------------------

def cluster_of(node_id: str = "n1") -> ClusterProtocol:
    broker = Broker()
    broker.declare_queue(QueueSettings(name="q", durable=True))
    cluster = ClusterProtocol(node_id, broker, handler_timeout_ms=300, routes_max=100, seq_reserve_block=100)
    cluster.ready(0)
    return cluster


def of(kind, effects: list) -> list:
    return [effect for effect in effects if type(effect) is kind]


def promote_n2(cluster: ClusterProtocol, groups=("a", "b")) -> list:
    cluster.applied(ROUTES, [("q", group, "n2") for group in groups], 0, 0)
    cluster.applied(REPLICAS, {"epochs": {"n2": 1}, "in_sync": {}}, None, 1)
    return cluster.applied(ROUTES, [("q", group, "n1") for group in groups], 1, 1)


def test_a_promotion_reads_the_replica_and_an_ordinary_move_here_does_not():
    cluster = cluster_of()
    assert of(ReadReplica, promote_n2(cluster)) == [ReadReplica("n2", 0, ("q",))]
    cluster.applied(ROUTES, [("q", "x", "n3")], 2, 2)
    assert of(ReadReplica, cluster.applied(ROUTES, [("q", "x", "n1")], 3, 3)) == []  # n3 was not promoted


def test_taken_over_messages_go_first_with_raised_counts_are_held_until_stored_and_then_the_replica_is_dropped():
    cluster = cluster_of()
    broker = cluster.broker
    broker.attach_consumer("q", "c", False, 0)
    promote_n2(cluster)
    # a producer's send of a group being taken over parks behind it; the park's write is good
    sent = cluster.arrive("p1", "q", "a", Message(b"new", "a"), True, False, 2)
    assert of(EnqueueLocal, sent) == [] and [s.queue for s in of(Stored, sent)] == [PARK_PREFIX + "q"]
    for flush in of(AfterFlush, sent):
        cluster.flushed(flush.what, None, 2)
    effects = cluster.takeovers.replica_read("n2", {"q": [msg(7, "a", 1, b"a7"), msg(8, "b", 0, b"b8"),
                                                          msg(9, "a", 0, b"a9")]}, 3)
    kinds = [type(effect) for effect in effects if type(effect) in (Stored, AfterFlush)
             or type(effect) is Declared and effect.values["name"] == mark_name("n2")]
    assert kinds == [Declared, Stored, Stored, Stored, Declared, AfterFlush]  # BEGUN, the stores, STORED
    assert [e.values["state"] for e in of(Declared, effects) if "state" in e.values] == [BEGUN, STORED]
    assert [(s.message.payload, s.message.delivery_count) for s in of(Stored, effects)] == [
        (b"a7", 2), (b"a9", 1), (b"b8", 1)]
    assert of(Deliver, broker.set_credit("c", 10, 3)) == []  # held until the unit is on disk
    [after] = of(AfterFlush, effects)
    released = cluster.flushed(after.what, None, 4)
    assert of(DropReplica, released) == [DropReplica("n2", 0, (("q", 7), ("q", 8), ("q", 9)))]
    delivered = [d.message for d in of(Deliver, released)]
    assert [(m.payload, m.delivery_count) for m in delivered if m.group_id == "a"] == [
        (b"a7", 2), (b"a9", 1), (b"new", 0)]  # the parked send behind what was taken over
    assert [s.message.payload for s in of(Stored, released) if s.queue == "q"] == [b"new"]
    assert cluster.handovers.taking_over == set() and cluster.held == set()
    cluster.takeovers.replica_dropped("n2", None, [])
    assert cluster.takeovers.running == {}


def test_a_failed_takeover_write_stops_the_node_so_a_restart_takes_over_again():
    cluster = cluster_of()
    promote_n2(cluster, ("a",))
    effects = cluster.takeovers.replica_read("n2", {"q": [msg(7, "a")]}, 3)
    [after] = of(AfterFlush, effects)
    stopped = cluster.flushed(after.what, "disk full", 4)
    assert [type(e).__name__ for e in stopped] == ["StopNode"] and "restart takes them over" in stopped[0].reason


def test_a_restart_after_a_begun_mark_undoes_the_partial_local_copy_and_takes_over_again():
    broker = Broker()
    broker.declare_queue(QueueSettings(name="q", durable=True))
    broker.restore("q", Message(b"torn", "a", seq=50))  # a STORE of the torn unit
    cluster = ClusterProtocol("n1", broker, handler_timeout_ms=300, seq_reserve_block=100)
    assert cluster.recover_declaration({"name": mark_name("n2"), "owner": "n2", "epoch": 0, "state": BEGUN,
                                        "first_seq": 50, "keys": [["q", "a"]]})
    cluster.hold_recovered()
    cluster.applied(ROUTES, [("q", "a", "n1")], 0, 0)
    effects = cluster.ready(1)
    assert [r.seq for r in of(Removed, effects)] == [50] and of(ReadReplica, effects) == [ReadReplica("n2", 0, ("q",))]
    broker.attach_consumer("q", "c", False, 1)
    assert of(Deliver, broker.set_credit("c", 10, 1)) == []  # nothing of the torn copy is served


# ---- fencing --------------------------------------------------------------------------------------

def test_a_node_promoted_away_drops_the_groups_it_lost_keeps_the_rest_and_journals_its_new_epoch():
    broker = Broker()
    broker.declare_queue(QueueSettings(name="q", durable=True))
    for seq, group in enumerate(["lost", "kept", "lost"], 1):
        broker.restore("q", Message(group.encode() + bytes([seq]), group, seq=seq))
    cluster = ClusterProtocol("n1", broker, handler_timeout_ms=300, seq_reserve_block=100)
    cluster.hold_recovered()
    cluster.applied(REPLICAS, {"epochs": {"n1": 1}, "in_sync": {}}, None, 0)
    cluster.applied(ROUTES, [("q", "lost", "n2"), ("q", "kept", "n1")], 0, 0)
    broker.attach_consumer("q", "c", False, 0)
    effects = cluster.ready(1)
    assert sorted(r.seq for r in of(Removed, effects)) == [1, 3]  # never handed over to n2: it has them
    assert of(Stored, effects) == []
    assert [e.values for e in of(Declared, effects) if e.values["name"] == FENCE_MARK] == [{"name": FENCE_MARK,
                                                                                          "epoch": 1}]
    assert [d.message.seq for d in of(Deliver, broker.set_credit("c", 10, 2))] == [2]
    assert of(Removed, cluster.tick(5, {})) == []  # once


def test_a_restart_after_a_stored_mark_only_drops_the_replica_leftovers_once_and_serves_the_local_copy():
    broker = Broker()
    broker.declare_queue(QueueSettings(name="q", durable=True))
    broker.restore("q", Message(b"local", "a", seq=50))  # the taken-over copy, whole
    cluster = ClusterProtocol("n1", broker, handler_timeout_ms=300, seq_reserve_block=100)
    cluster.recover_declaration({"name": mark_name("n2"), "owner": "n2", "epoch": 0, "state": STORED,
                                 "first_seq": 50, "keys": [["q", "a"]]})
    cluster.hold_recovered()
    cluster.applied(ROUTES, [("q", "a", "n1")], 0, 0)
    broker.attach_consumer("q", "c", False, 0)
    effects = cluster.ready(1)
    assert of(ReadReplica, effects) == [ReadReplica("n2", 0, ("q",))] and of(Removed, effects) == []
    assert of(ReadReplica, cluster.ready(2)) == []  # begun once, however often the replica catches up
    assert [d.message.payload for d in of(Deliver, broker.set_credit("c", 10, 2))] == [b"local"]
    dropped = cluster.takeovers.replica_read("n2", {"q": [msg(7, "a"), msg(8, "z")]}, 3)
    assert dropped == [DropReplica("n2", 0, (("q", 7),))]  # the leftovers of the keys only; nothing enqueued
    assert cluster.takeovers.replica_read("n2", {"q": [msg(7, "a")]}, 4) == []  # a late second answer: nothing


def test_a_node_promoted_away_relays_what_others_still_forward_it_for_a_lost_group_and_serves_the_rest():
    from node.core.cluster.outbound import Entry, outbound_name
    cluster = cluster_of()
    cluster.applied(REPLICAS, {"epochs": {"n1": 1}, "in_sync": {}}, None, 0)
    cluster.applied(ROUTES, [("q", "lost", "n2"), ("q", "kept", "n1")], 0, 0)
    cluster.tick(1, {})  # nothing to drop: fenced at once, its new epoch journalled
    assert cluster.handovers.promoted_away
    entries = [Entry(7, "q", "lost", b"late", 0, False, 5), Entry(8, "q", "kept", b"mine", 0, False, 5)]
    effects = cluster.forward_received("n3", entries, "call", 2)
    stored = {(effect.queue, effect.message.payload) for effect in of(Stored, effects)}
    assert stored == {(outbound_name("n2", "q"), b"late"), ("q", b"mine")}  # on to n2, once; the kept one here


def test_a_restart_with_no_mark_of_a_promoted_owner_scans_its_replica_and_takes_over_what_is_routed_here():
    # a crash came after the promotion's ROUTES and before the takeover's first record: nothing else would
    # ever take those messages out of the replica journal
    cluster = cluster_of_recovering()
    cluster.applied(REPLICAS, {"epochs": {"n2": 1}, "in_sync": {}}, None, 0)
    cluster.applied(ROUTES, [("q", "a", "n1"), ("q", "z", "n3")], 0, 0)
    assert of(ReadReplica, cluster.ready(1)) == [ReadReplica("n2", 0, ("q",))]
    effects = cluster.takeovers.replica_read("n2", {"q": [msg(7, "a", 0, b"a7"), msg(8, "z", 0, b"z8")]}, 2)
    assert [(s.message.payload, s.message.delivery_count) for s in of(Stored, effects)] == [(b"a7", 1)]
    assert cluster.handovers.taking_over == {("q", "a")}  # held until its unit is on disk
    nothing = cluster_of_recovering()
    nothing.applied(REPLICAS, {"epochs": {"n2": 1}, "in_sync": {}}, None, 0)
    nothing.applied(ROUTES, [("q", "z", "n3")], 0, 0)
    nothing.ready(1)
    assert nothing.takeovers.replica_read("n2", {"q": [msg(8, "z")]}, 2) == []  # no mark written, done
    assert nothing.takeovers.running == {}


def cluster_of_recovering() -> ClusterProtocol:
    broker = Broker()
    broker.declare_queue(QueueSettings(name="q", durable=True))
    return ClusterProtocol("n1", broker, handler_timeout_ms=300, routes_max=100, seq_reserve_block=100)
