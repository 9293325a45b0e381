"""Forgetting a member removed from the raft cluster (handler/member_removal.py, forget_node ver=4).

Examples first (what goes, what stays, the feed, the admin's remove-node path proposing it), then
hypothesis: any sequence of commands with forgets, applied to two tables, leaves them equal (pickled,
so dict order counts); a forget applied again changes nothing; and once a node is forgotten no claim
places a group on it, nor does a promotion, until it registers again (docs/reliability.md finding 11).
"""

from __future__ import annotations

import pickle
import threading
from types import SimpleNamespace

from hypothesis import given, settings as hypothesis_settings, strategies as st

from handler import replicated
from handler.placement import PLACEMENT_BALANCED, PLACEMENT_LOCAL
from handler.replicated import RouteTableReplica
from handler.member_removal import forget_node
from handler.route_table import RouteTable
from node.admin.loop_control import LoopControl

NODES = ("n1", "n2", "n3", "n4")


def three_nodes_with_consumers() -> RouteTable:
    table = RouteTable(100)
    for node in ("n1", "n2", "n3"):
        table.register_node(node, f"{node}:1", f"{node}:2", f"{node}:3", 1)
        table.report_consumers(node, {"q": 2}, 1)
    return table


def test_forget_drops_consumers_member_entry_down_mark_routes_and_in_sync_places_but_keeps_the_epoch():
    table = three_nodes_with_consumers()
    table.touch([["q", "a", "n3"], ["q", "b", "n3"], ["q", "c", "n1"]], 5)
    sets = table.replica_sets()
    sets.replica_in_sync("n1", "n3", 0)
    sets.replica_in_sync("n3", "n2", 0)
    sets.replica_in_sync("n2", "n1", 0)
    sets.replica_in_sync("n2", "n3", 0)
    table.epochs["n3"] = 2
    table.mark_down("n3", 9)
    revision = table.revision
    assert forget_node(table, "n3") == [("q", "a"), ("q", "b")]
    assert table.revision == revision + 1
    assert "n3" not in table.consumers and "n3" not in table.nodes and "n3" not in table.down
    assert table.in_sync == {"n2": ["n1"]}
    assert sorted(key for key, _ in table.entries()) == [("q", "c")]
    assert table.epochs == {"n3": 2}  # epochs only grow: a name that comes back stays fenced
    assert ("n3", "q") not in table.route_counts


def test_forgetting_again_or_a_node_never_known_or_malformed_input_changes_nothing():
    table = three_nodes_with_consumers()
    table.touch([["q", "a", "n3"]], 5)
    forget_node(table, "n3")
    state, revision = pickle.dumps(table.state()), table.revision
    for node in ("n3", "nobody", None, 7, ["n1"]):
        assert forget_node(table, node) == []
    assert pickle.dumps(table.state()) == state and table.revision == revision


def test_a_forgotten_node_is_never_placed_on_even_by_balanced_placement_that_favoured_it():
    table = three_nodes_with_consumers()
    table.report_consumers("n3", {"q": 50}, 2)  # by far the most consumers: balanced placement picks it
    assert table.claim([["q", "x"]], "n1", 3, PLACEMENT_BALANCED) == ["n3"]
    forget_node(table, "n3")
    placed = table.claim([["q", f"g{index}"] for index in range(20)], "n1", 4, PLACEMENT_BALANCED)
    placed += table.claim([["q", f"h{index}"] for index in range(20)], "n2", 4, PLACEMENT_LOCAL)
    assert "n3" not in placed and set(placed) == {"n1", "n2"}
    assert table.claim([["q", "x"]], "n2", 5) == ["n2"]  # its old group placed afresh on a live member


def test_a_late_consumer_report_of_a_removed_node_never_gets_it_a_group_from_a_members_only_claim():
    table = three_nodes_with_consumers()
    forget_node(table, "n3")
    table.report_consumers("n3", {"q": 50}, 5)  # proposed before its removal, applied after it
    for placement in (PLACEMENT_BALANCED, PLACEMENT_LOCAL):
        placed = table.claim([["q", f"{placement}{index}"] for index in range(10)], "n1", 6, placement, True)
        assert set(placed) == {"n1", "n2"} if placement == PLACEMENT_BALANCED else {"n1"}
    # a claim journalled before version 4 replays with the rule it was decided by: reports alone count
    assert table.claim([["q", "old"]], "n1", 7, PLACEMENT_BALANCED) == ["n3"]
    assert table.claim([["q", "bad"]], "n1", 7, PLACEMENT_BALANCED, 1) == [None]  # malformed: not a bool


def test_moves_waiting_for_the_forgotten_node_stop_waiting_and_its_own_moves_end():
    table = three_nodes_with_consumers()
    table.touch([["q", "a", "n3"], ["q", "b", "n1"]], 5)
    table.report_consumers("n1", {}, 6)  # n1 serves q no more: b follows to n2 or n3
    table.report_consumers("n3", {}, 6)
    begun = table.follow_consumers("q", "n1", 7)
    assert [(queue, group) for queue, group, *_ in begun] == [("q", "b")]
    assert "n3" in table.moves[("q", "b")][3]
    forget_node(table, "n3")
    assert "n3" not in table.moves.get(("q", "b"), [None, None, None, []])[3]


def test_the_replica_feeds_removed_routes_moves_replicas_and_members_without_the_node():
    heard = []
    replica = RouteTableReplica(lambda kind, payload, at_ms: heard.append((kind, payload)), routes_max=10)
    for node in ("n1", "n2"):
        replica.register_node(node, "h:1", "h:2", "h:3", 1, _doApply=True)
    replica.touch([["q", "a", "n2"]], 5, _doApply=True)
    replica.replica_in_sync("n1", "n2", 0, _doApply=True)
    heard.clear()
    assert replica.forget_node("n2", _doApply=True) == 1
    assert [kind for kind, _ in heard] == [replicated.ROUTES, replicated.MOVES_ALL, replicated.REPLICAS,
                                           replicated.MEMBERS]  # the members last: nodes then re-home outbound
    assert heard[0][1] == [("q", "a", None)]
    assert heard[2][1] == {"epochs": {}, "in_sync": {}}
    assert list(heard[3][1]["nodes"]) == ["n1"]
    revision = replica.table.revision
    heard.clear()
    assert replica.forget_node("n2", _doApply=True) == 0  # a retry changes nothing, and says the same again
    assert [kind for kind, _ in heard] == [replicated.MOVES_ALL, replicated.REPLICAS, replicated.MEMBERS]
    assert replica.table.revision == revision


# ---- the admin's remove-node path proposes it ------------------------------------------------------

class RemovingHandler:
    def __init__(self, members, forget_outcome=(None, 3)):
        self.members = set(members)
        self.forgotten: list = []
        self.forget_outcome = forget_outcome

    def remove_member(self, node_id, on_done):
        self.members.discard(node_id)
        threading.Thread(target=on_done, args=(None,)).start()

    def forget_node(self, node_id, on_result):
        self.forgotten.append(node_id)
        threading.Thread(target=on_result, args=self.forget_outcome).start()

    def status(self):
        return {"members": sorted(self.members)}


def control(handler, table_nodes):
    cluster = SimpleNamespace(router=SimpleNamespace(routes={}), members={"nodes": dict.fromkeys(table_nodes, {})})
    node = SimpleNamespace(handler=handler, cluster=cluster, config=SimpleNamespace(admin_timeout_ms=2000),
                           bridge=SimpleNamespace(call=lambda fn, timeout_ms: fn()))
    return LoopControl(node)


def test_remove_node_forgets_the_node_in_the_route_table_once_it_left_raft():
    handler = RemovingHandler(["a:1", "b:1", "c:1"])
    assert control(handler, ["a:1", "b:1", "c:1"]).remove_member("c:1") == 3
    assert handler.forgotten == ["c:1"] and "c:1" not in handler.members


def test_remove_node_again_forgets_a_node_that_left_raft_but_is_still_in_the_table():
    handler = RemovingHandler(["a:1", "b:1"], forget_outcome=(None, 0))
    assert control(handler, ["a:1", "b:1", "c:1"]).remove_member("c:1") == 0
    assert handler.forgotten == ["c:1"]


# ---- hypothesis: determinism, idempotence, never placed on a forgotten node --------------------------

nodes = st.sampled_from(NODES)
commands = st.one_of(
    st.tuples(st.just("register"), nodes),
    st.tuples(st.just("consumers"), nodes, st.dictionaries(st.sampled_from("qr"), st.integers(0, 3), max_size=2)),
    st.tuples(st.just("claim"), st.lists(st.tuples(st.sampled_from("qr"), st.sampled_from("abcdef")), max_size=4),
              nodes, st.sampled_from([PLACEMENT_LOCAL, PLACEMENT_BALANCED])),
    st.tuples(st.just("touch"), st.sampled_from("qr"), st.sampled_from("abcdef"), nodes),
    st.tuples(st.just("mark_down"), nodes),
    st.tuples(st.just("in_sync"), nodes, nodes),
    st.tuples(st.just("follow"), st.sampled_from("qr"), nodes),
    st.tuples(st.just("promote"), nodes),
    st.tuples(st.just("forget"), nodes),
)


def apply(table: RouteTable, command: tuple, now_ms: int):
    kind, *args = command
    if kind == "register":
        return table.register_node(args[0], "h:1", "h:2", "h:3", now_ms)
    if kind == "consumers":
        return table.report_consumers(args[0], dict(args[1]), now_ms)
    if kind == "claim":
        return table.claim([list(key) for key in args[0]], args[1], now_ms, args[2], True)
    if kind == "touch":
        return table.touch([list(args)], now_ms)
    if kind == "mark_down":
        return table.mark_down(args[0], now_ms)
    if kind == "in_sync":
        return table.replica_sets().replica_in_sync(args[0], args[1], table.replica_sets().epoch_of(args[0]))
    if kind == "follow":
        return table.follow_consumers(args[0], args[1], now_ms)
    if kind == "promote":
        return table.replica_sets().promote(args[0], table.replica_sets().epoch_of(args[0]), now_ms, 2)
    return forget_node(table, args[0])


@hypothesis_settings(max_examples=300, deadline=None)
@given(st.lists(commands, max_size=40))
def test_any_command_sequence_with_forgets_leaves_two_tables_equal_and_nothing_lands_on_a_forgotten_node(sequence):
    first, second = RouteTable(10), RouteTable(10)
    forgotten: set = set()  # forgotten and not registered since
    for now_ms, command in enumerate(sequence, start=1):
        kind = command[0]
        if kind == "register":
            forgotten.discard(command[1])
        if kind in ("consumers", "mark_down", "promote") and command[1] in forgotten \
                or kind in ("touch", "in_sync") and command[-1] in forgotten or kind == "claim" and command[2] in forgotten:
            continue  # a removed node proposes nothing more, the leader's duties name raft members only, and
            # nobody touches a route to it
        result = apply(first, command, now_ms)
        assert apply(second, command, now_ms) == result
        if kind == "forget":
            node = command[1]
            forgotten.add(node)
            state, revision = pickle.dumps(first.state()), first.revision
            assert apply(first, command, now_ms) == []  # a retry changes nothing
            assert pickle.dumps(first.state()) == state and first.revision == revision
            apply(second, command, now_ms)
        if kind == "claim":
            assert not forgotten & {node for node in result if node is not None}
        for node in forgotten:
            assert node not in first.nodes and node not in first.consumers and node not in first.down
            assert node not in first.in_sync and all(node not in backups for backups in first.in_sync.values())
            assert all(owner != node for _key, (owner, _touched) in first.entries())
            assert all(node not in move[3] and node != move[1] for move in first.moves.values())
    assert pickle.dumps(first.state()) == pickle.dumps(second.state())
