"""The route table's owner epochs, in-sync backups and promotion (handler/replica_sets.py), and their feed.

Examples first, then hypothesis: any sequence of commands applied twice, in the same order, to two
tables leaves equal state (pickled, so dict order counts too); a promote applied again changes nothing;
a promotion moves a route only to an in-sync, live backup of that very group.
"""

from __future__ import annotations

import pickle

from hypothesis import given, settings as hypothesis_settings, strategies as st

from handler import replicated
from handler.replicated import RouteTableReplica
from handler.route_table import RouteTable
from node.core.replication.assignment import backups_of, promotion_target

NODES = ("n1", "n2", "n3", "n4")


def registered(*nodes: str, routes_max: int = 100) -> RouteTable:
    table = RouteTable(routes_max)
    for node in nodes:
        table.register_node(node, f"{node}:1", f"{node}:2", f"{node}:3", 1)
    return table


def owned_by(table: RouteTable, owner: str, queue: str, groups) -> None:
    table.touch([[queue, group, owner] for group in groups], 5)


# ---- in sync and out of sync ----------------------------------------------------------------------

def test_a_backup_is_in_sync_only_at_its_owners_current_epoch_and_only_once():
    table = registered("n1", "n2", "n3")
    assert table.replica_sets().replica_in_sync("n1", "n3", 0) is True
    assert table.replica_sets().replica_in_sync("n1", "n2", 0) is True
    revision = table.revision
    assert table.replica_sets().replica_in_sync("n1", "n2", 0) is False  # a retry: nothing changes
    assert table.replica_sets().replica_in_sync("n1", "n2", 1) is False  # not the owner's epoch
    assert table.in_sync == {"n1": ["n2", "n3"]} and table.revision == revision


def test_an_owner_is_not_its_own_backup_and_unregistered_or_down_members_are_never_in_sync():
    table = registered("n1", "n2")
    table.mark_down("n2", 7)
    assert not table.replica_sets().replica_in_sync("n1", "n1", 0)
    assert not table.replica_sets().replica_in_sync("n1", "n9", 0)  # not registered
    assert not table.replica_sets().replica_in_sync("n9", "n1", 0)
    assert not table.replica_sets().replica_in_sync("n1", "n2", 0)  # down
    assert not table.replica_sets().replica_in_sync("n1", 5, 0)
    assert not table.replica_sets().replica_in_sync("n1", "n2", True)
    assert table.in_sync == {}


def test_a_backup_leaves_the_set_at_the_current_epoch_and_a_stale_epoch_is_ignored():
    table = registered("n1", "n2", "n3")
    table.replica_sets().replica_in_sync("n1", "n2", 0)
    table.epochs["n1"] = 2
    assert table.replica_sets().replica_out_of_sync("n1", "n2", 1) is False
    assert table.in_sync == {"n1": ["n2"]}
    assert table.replica_sets().replica_out_of_sync("n1", "n2", 2) is True
    assert table.in_sync == {}  # no empty lists: equal states pickle alike
    assert table.replica_sets().replica_out_of_sync("n1", "n2", 2) is False


def test_a_new_member_name_empties_every_set_and_a_member_registering_again_does_not():
    table = registered("n1", "n2", "n3")
    table.replica_sets().replica_in_sync("n1", "n2", 0)
    table.register_node("n2", "elsewhere:1", "n2:2", "n2:3", 9)  # restarted with a new address
    assert table.in_sync == {"n1": ["n2"]}
    table.register_node("n4", "n4:1", "n4:2", "n4:3", 9)
    assert table.in_sync == {}


# ---- promote ---------------------------------------------------------------------------------------

def test_promote_moves_each_route_to_its_first_in_sync_backup_bumps_the_epoch_and_marks_the_owner_down():
    table = registered(*NODES)
    owned_by(table, "n1", "q", ["a", "b", "c", "d", "e", "f"])
    for backup in ("n2", "n3", "n4"):
        table.replica_sets().replica_in_sync("n1", backup, 0)
    table.replica_sets().replica_in_sync("n2", "n1", 0)
    moved = table.replica_sets().promote("n1", 0, 40, 2)
    members = sorted(NODES)
    expected = sorted((q, g, promotion_target("n1", q, g, members, {"n2", "n3", "n4"}, 2))
                      for q, g in [("q", group) for group in "abcdef"])
    assert moved == expected and all(target is not None for _, _, target in moved)
    assert {table.route(q, g) for q, g, _ in moved} <= {"n2", "n3", "n4"}
    assert table.entry("q", "a")[1] == 40  # touched now: the new owner's route is fresh
    assert table.epochs == {"n1": 1} and table.down == {"n1": 40}
    assert table.in_sync == {}  # its own set emptied, and it left n2's


def test_a_retried_promote_is_a_no_op():
    table = registered(*NODES)
    owned_by(table, "n1", "q", ["a", "b"])
    table.replica_sets().replica_in_sync("n1", "n2", 0)
    table.replica_sets().promote("n1", 0, 40, 3)
    state = pickle.dumps(table.state())
    assert table.replica_sets().promote("n1", 0, 41, 3) is None
    assert pickle.dumps(table.state()) == state


def test_routes_whose_backups_are_not_in_sync_stay_with_their_owner():
    table = registered("n1", "n2", "n3")
    owned_by(table, "n1", "q", [str(number) for number in range(20)])
    table.replica_sets().replica_in_sync("n1", "n2", 0)
    moved = table.replica_sets().promote("n1", 0, 40, 2)  # factor 2: one backup per group, n2 for about half of them
    stayed = [key for key, (node, _) in table.entries() if node == "n1"]
    assert moved and stayed and len(moved) + len(stayed) == 20
    for queue, group in stayed:
        assert backups_of("n1", queue, group, ["n1", "n2", "n3"], 2) == ("n3",)


def test_without_an_in_sync_backup_promote_only_moves_the_epoch_on():
    table = registered("n1", "n2")
    owned_by(table, "n1", "q", ["a"])
    assert table.replica_sets().promote("n1", 0, 40, 2) == []
    assert table.route("q", "a") == "n1" and table.epochs == {"n1": 1} and "n1" in table.down


def test_a_backup_that_went_down_since_it_was_in_sync_is_never_promoted():
    table = registered("n1", "n2")
    owned_by(table, "n1", "q", ["a"])
    table.replica_sets().replica_in_sync("n1", "n2", 0)
    table.mark_down("n2", 30)
    assert table.replica_sets().promote("n1", 0, 40, 2) == []
    assert table.route("q", "a") == "n1"


def test_a_moving_group_stays_where_its_route_is_until_its_move_ends():
    table = registered("n1", "n2")
    owned_by(table, "n1", "q", ["a", "b"])
    table.moves[("q", "a")] = ["n2", "n1", 3, ["n1", "n2"]]  # moving from n2 to n1
    table.replica_sets().replica_in_sync("n1", "n2", 0)
    assert table.replica_sets().promote("n1", 0, 40, 2) == [("q", "b", "n2")]
    assert table.route("q", "a") == "n1"


def test_malformed_promotes_change_nothing():
    table = registered("n1", "n2")
    owned_by(table, "n1", "q", ["a"])
    table.replica_sets().replica_in_sync("n1", "n2", 0)
    state = pickle.dumps(table.state())
    for args in [("n1", 0, -1, 2), ("n1", 0, 40, 0), ("n1", 0, 40, 6), ("n1", "0", 40, 2), (None, 0, 40, 2),
                 ("n9", 0, 40, 2), ("n1", 1, 40, 2), ("n1", 0, 40, True)]:
        assert table.replica_sets().promote(*args) is None, args
    assert table.replica_sets().promote("n1", 0, 40, 2, factors=["q"]) is None
    assert pickle.dumps(table.state()) == state


def test_the_queue_definitions_factor_decides_how_many_backups_a_group_has_else_the_default():
    replica = RouteTableReplica(lambda *args: None, routes_max=100)
    for node in NODES:
        replica.register_node(node, "h:1", "h:2", "h:3", 1, _doApply=True)
    replica.define_queue({"name": "wide", "replication_factor": 4}, False, _doApply=True)
    groups = [str(number) for number in range(30)]
    replica.touch([[queue, group, "n1"] for queue in ("wide", "plain") for group in groups], 5, _doApply=True)
    replica.replica_in_sync("n1", "n4", 0, _doApply=True)
    moved = replica.promote("n1", 0, 40, 2, _doApply=True)
    members = sorted(NODES)
    # every group of "wide" has n4 among its 3 backups; of "plain" only those whose single backup is n4
    assert sorted(group for queue, group, _ in moved if queue == "wide") == sorted(groups)
    assert sorted(group for queue, group, _ in moved if queue == "plain") == sorted(
        group for group in groups if backups_of("n1", "plain", group, members, 2) == ("n4",))


# ---- the feed and snapshots ------------------------------------------------------------------------

def test_the_replica_sets_are_fed_after_each_change_and_a_promotion_before_its_routes():
    heard = []
    replica = RouteTableReplica(lambda kind, payload, at_ms: heard.append((kind, payload)), routes_max=10)
    for node in ("n1", "n2"):
        replica.register_node(node, "h:1", "h:2", "h:3", 1, _doApply=True)
    replica.touch([["q", "a", "n1"]], 5, _doApply=True)
    heard.clear()
    assert replica.replica_in_sync("n1", "n2", 0, _doApply=True) is True
    assert heard == [(replicated.REPLICAS, {"epochs": {}, "in_sync": {"n1": ["n2"]}})]
    heard[0][1]["in_sync"]["n1"].append("x")  # a copy: the node cannot change the replica's state
    assert replica.table.in_sync == {"n1": ["n2"]}
    heard.clear()
    assert replica.replica_in_sync("n1", "n2", 0, _doApply=True) is False and heard == []
    assert replica.promote("n1", 0, 40, 2, _doApply=True) == [("q", "a", "n2")]
    assert [kind for kind, _ in heard] == [replicated.REPLICAS, replicated.MEMBERS, replicated.ROUTES]
    assert heard[0][1] == {"epochs": {"n1": 1}, "in_sync": {}} and heard[2][1] == [("q", "a", "n2")]
    heard.clear()
    assert replica.promote("n1", 0, 41, 2, _doApply=True) == [] and heard == []
    replica.replica_in_sync("n2", "n1", 1, _doApply=True)  # refused: n1 is down
    replica.register_node("n1", "h:1", "h:2", "h:3", 50, _doApply=True)  # back, and up again
    replica.replica_in_sync("n2", "n1", 0, _doApply=True)
    heard.clear()
    replica.register_node("n3", "h:1", "h:2", "h:3", 60, _doApply=True)  # a new name: every set empties
    assert heard[-1] == (replicated.REPLICAS, {"epochs": {"n1": 1}, "in_sync": {}})


def test_a_snapshot_of_version_4_keeps_the_epochs_and_sets_and_feeds_them():
    replica = RouteTableReplica(lambda *args: None, routes_max=10)
    for node in ("n1", "n2", "n3"):
        replica.register_node(node, "h:1", "h:2", "h:3", 1, _doApply=True)
    replica.replica_in_sync("n2", "n3", 0, _doApply=True)
    replica.promote("n1", 0, 40, 2, _doApply=True)
    data = pickle.loads(pickle.dumps(replica._serialize()))
    assert data["format_version"] == 4
    heard = []
    restored = RouteTableReplica(lambda kind, payload, at_ms: heard.append((kind, payload)), routes_max=10)
    restored._deserialize(data)
    assert restored.table.epochs == {"n1": 1} and restored.table.in_sync == {"n2": ["n3"]}
    assert pickle.dumps(restored.table.state()) == pickle.dumps(replica.table.state())
    assert (replicated.REPLICAS, {"epochs": {"n1": 1}, "in_sync": {"n2": ["n3"]}}) in heard


def test_a_version_3_snapshot_restores_with_no_epochs_and_no_sets_that_are_its_own():
    replica = RouteTableReplica(lambda *args: None, routes_max=10)
    replica.register_node("n1", "h:1", "h:2", "h:3", 1, _doApply=True)
    data = pickle.loads(pickle.dumps(replica._serialize()))
    data["format_version"] = 3
    for name in ("epochs", "in_sync"):
        del data["route_table"][name]
    first, second = (RouteTableReplica(lambda *args: None, routes_max=10) for _ in range(2))
    first._deserialize(data)
    second._deserialize(data)
    assert first.table.epochs == {} and first.table.in_sync == {}
    first.table.replica_sets().replica_in_sync("n1", "n1", 0)
    first.table.epochs["n1"] = 5
    assert second.table.epochs == {}  # each table its own dicts


# ---- hypothesis: determinism, idempotence, where a promotion may move a route -----------------------

nodes = st.sampled_from(NODES)
epochs = st.integers(0, 2)
commands = st.one_of(
    st.tuples(st.just("register"), nodes),
    st.tuples(st.just("claim"), st.lists(st.tuples(st.sampled_from("qr"), st.sampled_from("abcdef")),
                                          max_size=4), nodes),
    st.tuples(st.just("mark_down"), nodes),
    st.tuples(st.just("mark_up"), nodes),
    st.tuples(st.just("in_sync"), nodes, nodes, epochs),
    st.tuples(st.just("out_of_sync"), nodes, nodes, epochs),
    st.tuples(st.just("promote"), nodes, epochs, st.integers(1, 3), st.sampled_from([{}, {"q": 1}, {"r": 3}])),
    st.tuples(st.just("fail_over"), nodes),
)


def apply(table: RouteTable, command: tuple, now_ms: int):
    kind, *args = command
    if kind == "register":
        return table.register_node(args[0], "h:1", "h:2", "h:3", now_ms)
    if kind == "claim":
        return table.claim([list(key) for key in args[0]], args[1], now_ms)
    if kind == "mark_down":
        return table.mark_down(args[0], now_ms)
    if kind == "mark_up":
        return table.mark_up(args[0], now_ms)
    if kind == "in_sync":
        return table.replica_sets().replica_in_sync(*args)
    if kind == "out_of_sync":
        return table.replica_sets().replica_out_of_sync(*args)
    if kind == "promote":
        owner, epoch, default, factors = args
        return table.replica_sets().promote(owner, epoch, now_ms, default, dict(factors))
    return table.fail_over(args[0], now_ms)


def check_promotion(before: RouteTable, command: tuple, moved, after: RouteTable) -> None:
    if moved is None:
        return
    _, owner, epoch, default, factors = command
    live = set(before.in_sync.get(owner, ())) - set(before.down)
    members = sorted(before.nodes)
    for queue, group, target in moved:
        assert before.route(queue, group) == owner and after.route(queue, group) == target
        assert target in live and target not in before.down and target != owner
        assert target in backups_of(owner, queue, group, members, factors.get(queue, default))
    assert after.epochs[owner] == epoch + 1 and owner in after.down
    assert all(owner not in backups for backups in after.in_sync.values()) and owner not in after.in_sync


@hypothesis_settings(max_examples=300, deadline=None)
@given(st.lists(commands, max_size=40))
def test_any_command_sequence_leaves_two_tables_equal_and_promotions_move_routes_only_to_live_in_sync_backups(
        sequence):
    first, second = RouteTable(10), RouteTable(10)
    for now_ms, command in enumerate(sequence, start=1):
        before = RouteTable.from_state(pickle.loads(pickle.dumps(first.state())))
        result = apply(first, command, now_ms)
        assert apply(second, command, now_ms) == result
        if command[0] == "promote":
            check_promotion(before, command, result, first)
            state = pickle.dumps(first.state())
            assert apply(first, command, now_ms + 1) is None  # a retry changes nothing
            assert apply(second, command, now_ms + 1) is None
            assert pickle.dumps(first.state()) == state
        for owner, backups in first.in_sync.items():
            assert backups == sorted(set(backups)) and backups and owner not in backups
    assert pickle.dumps(first.state()) == pickle.dumps(second.state())
