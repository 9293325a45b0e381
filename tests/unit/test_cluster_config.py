"""Cluster settings of a node, and the replica's feed of applied commands (no raft running)."""

from __future__ import annotations

import pytest

from handler import replicated
from handler.replicated import RouteTableReplica
from handler.service import GroupingHandler
from node.cli import NODE_FLAG_KEYS, build_parser
from node.config import load
from node.core.errors import InvalidConfig
from node.core.dispatch.settings import QueueSettings


def test_without_peers_a_node_runs_alone():
    assert load(environ={}).peer_list() == []


def test_the_node_id_is_the_advertised_host_and_raft_port():
    config = load(environ={}, overrides={"host": "0.0.0.0", "advertise_host": "grouper-1.grouper", "raft_port": 7000})
    assert config.node_id == "grouper-1.grouper:7000"


def test_a_node_finds_itself_in_the_peer_list_and_leaves_itself_out():
    config = load(environ={"GROUPER_PEERS": "h1:7000, h2:7000,h3:7000,h2:7000"},
                  overrides={"advertise_host": "h2", "raft_port": 7000})
    assert config.peer_list() == ["h1:7000", "h3:7000"]


@pytest.mark.parametrize("peers", ["h1", "h1:", ":7000", "h1:port", "h1:70000"])
def test_a_peer_that_is_not_host_colon_port_is_named(peers):
    with pytest.raises(InvalidConfig) as raised:
        load(environ={}, overrides={"peers": peers})
    assert raised.value.key == "peers" and repr(peers.split(",")[0]) in raised.value.description


def test_a_cluster_node_needs_a_fixed_raft_port():
    with pytest.raises(InvalidConfig) as raised:
        load(environ={}, overrides={"peers": "h1:7000", "raft_port": 0})
    assert raised.value.key == "raft_port"


@pytest.mark.parametrize("overrides, key", [
    ({"handler_timeout_ms": 0}, "handler_timeout_ms"),
    ({"group_timeout_ms": -1}, "group_timeout_ms"),
    ({"election_timeout_min_ms": 500, "election_timeout_max_ms": 500}, "election_timeout_max_ms"),
    ({"routes_max": 0}, "routes_max"),
    ({"forward_timeout_ms": 0}, "forward_timeout_ms"),
    ({"outbound_max_bytes": -1}, "outbound_max_bytes"),
    ({"outbound_total_max_bytes": -1}, "outbound_total_max_bytes"),
    ({"outbound_max_bytes": 2000, "outbound_total_max_bytes": 1000}, "outbound_total_max_bytes"),
])
def test_cluster_limits_and_timeouts_are_checked_by_name(overrides, key):
    with pytest.raises(InvalidConfig) as raised:
        load(environ={}, overrides=overrides)
    assert raised.value.key == key


def test_the_outbound_store_bounds_come_from_the_environment_in_bytes_and_0_turns_one_off():
    config = load(environ={"GROUPER_OUTBOUND_MAX_BYTES": "65536", "GROUPER_OUTBOUND_TOTAL_MAX_BYTES": "0"})
    assert (config.outbound_max_bytes, config.outbound_total_max_bytes) == (65536, 0)
    with pytest.raises(InvalidConfig) as raised:
        load(environ={}, overrides={"outbound_max_bytes": 2000, "outbound_total_max_bytes": 1000})
    assert "raise it, or lower outbound_max_bytes" in raised.value.description


def test_queue_names_cannot_hold_control_characters_which_name_the_clusters_own_records():
    with pytest.raises(InvalidConfig) as raised:
        QueueSettings(name="orders\x00out").validate()
    assert raised.value.key == "name"


# ---- the replica's feed: what a node hears after each applied command --------------------------

def make_replica():
    heard = []
    replica = RouteTableReplica(lambda kind, payload, at_ms: heard.append((kind, payload)), routes_max=2)
    return replica, heard


def test_an_applied_claim_reports_every_decided_route_and_the_refused_keys():
    replica, heard = make_replica()
    replica.claim([["q", "a"], ["q", "b"], ["q", "c"]], "n1", 10, _doApply=True)
    assert heard == [(replicated.ROUTES, [("q", "a", "n1"), ("q", "b", "n1")]),
                     (replicated.REFUSED, [("q", "c")])]


def test_removals_are_reported_as_routes_to_none():
    replica, heard = make_replica()
    replica.claim([["q", "a"], ["r", "b"]], "n1", 10, _doApply=True)
    heard.clear()
    replica.drop_queue("q", _doApply=True)
    assert heard == [(replicated.ROUTES, [("q", "a", None)])]


def test_membership_commands_publish_copies_of_nodes_consumers_and_down_marks():
    replica, heard = make_replica()
    replica.register_node("n1", "h:1", "h:2", "h:3", 5, _doApply=True)
    replica.report_consumers("n1", {"q": 2}, 6, _doApply=True)
    kind, members = heard[-1]
    assert kind == replicated.MEMBERS
    assert members["nodes"]["n1"]["amqp_address"] == "h:2" and members["consumers"] == {"n1": {"q": 2}}
    members["consumers"]["n1"]["q"] = 99  # a copy: the node cannot change the replica's state
    assert replica.table.consumers == {"n1": {"q": 2}}


def test_a_snapshot_round_trip_restores_the_table_and_replaces_every_route_the_node_knew():
    replica, _ = make_replica()
    replica.claim([["q", "a"]], "n1", 10, _doApply=True)
    replica.register_node("n1", "h:1", "h:2", "h:3", 5, _doApply=True)
    data = replica._serialize()
    restored, heard = make_replica()
    restored._deserialize(data)
    assert vars(restored.table) == vars(replica.table)
    assert heard[0] == (replicated.SNAPSHOT, [("q", "a", "n1", 10)])
    assert heard[1] == (replicated.MOVES_ALL, [])  # every move in progress, replacing what the node knew
    assert heard[2][0] == replicated.MEMBERS


def test_the_numbering_of_replicated_commands_is_frozen_so_old_raft_journals_replay_right():
    # pysyncobj numbers commands in (ver, name) order and journals the numbers: a new command must
    # take a higher `ver` (appended), never slot in by name. Extend this list only at its end.
    commands = sorted((getattr(RouteTableReplica, name).ver, name) for name in dir(RouteTableReplica)
                      if getattr(getattr(RouteTableReplica, name), "replicated", False)
                      and name != getattr(RouteTableReplica, name).origName)
    assert [name for _, name in commands] == [
        "claim_v0", "drop_queue_v0", "expire_idle_v0", "fail_over_v0", "mark_down_v0", "mark_up_v0",
        "register_node_v0", "report_consumers_v0", "touch_v0", "unroute_v0",
        "follow_consumers_v1", "move_clear_v1",
        "define_queue_v2", "delete_queue_v2", "update_queue_v2",
        "promote_v3", "replica_in_sync_v3", "replica_out_of_sync_v3",
        "forget_node_v4"]


def test_a_founding_node_must_find_itself_in_the_peer_list():
    with pytest.raises(InvalidConfig) as raised:
        load(environ={"GROUPER_PEERS": "h1:7000,h2:7000"}, overrides={"advertise_host": "h3", "raft_port": 7000})
    assert raised.value.key == "peers" and "this node is h3:7000" in raised.value.description
    assert "--join" in raised.value.description


def test_a_joining_node_may_name_only_the_members_to_ask():
    config = load(environ={"GROUPER_PEERS": "h1:7000", "GROUPER_JOIN": "true"},
                  overrides={"advertise_host": "h3", "raft_port": 7000})
    assert config.join and config.peer_list() == ["h1:7000"]


@pytest.mark.parametrize("route_follow_ms", [-1, 1, 999])
def test_route_follow_ms_is_off_or_at_least_a_second_and_a_bad_value_is_named(route_follow_ms):
    with pytest.raises(InvalidConfig) as raised:
        load(environ={}, overrides={"route_follow_ms": route_follow_ms})
    assert raised.value.key == "route_follow_ms" and "at least 1000" in raised.value.description


def test_route_follow_ms_is_off_by_default():
    assert load(environ={}).route_follow_ms == 0
    assert load(environ={"GROUPER_ROUTE_FOLLOW_MS": "1500"}).route_follow_ms == 1500


def test_placement_is_balanced_by_default_local_on_request_and_a_bad_value_is_named():
    assert load(environ={}).placement == "balanced"
    assert load(environ={"GROUPER_PLACEMENT": "local"}).placement == "local"
    args = build_parser().parse_args(["node", "--placement", "local"])
    assert args.placement == "local" and "placement" in NODE_FLAG_KEYS
    with pytest.raises(InvalidConfig) as raised:
        load(environ={"GROUPER_PLACEMENT": "spread"})
    assert raised.value.key == "placement" and "balanced, local" in raised.value.description


def test_a_claim_carries_its_proposers_placement_and_one_journalled_without_it_replays_as_local():
    replica = RouteTableReplica(lambda kind, payload, at_ms: None, routes_max=10)
    replica.report_consumers("n1", {"q": 1}, 5, _doApply=True)
    replica.report_consumers("n2", {"q": 1}, 5, _doApply=True)
    replica.claim([["q", "a"]], "n1", 10, _doApply=True)  # a claim journalled before placement existed
    replica.claim([["q", "b"]], "n1", 10, "local", _doApply=True)
    assert replica.table.route_counts == {("n1", "q"): 2}
    replica.claim([["q", "c"]], "n1", 10, "balanced", _doApply=True)  # 3 on n1 vs 1 on n2: beyond the tie
    assert replica.table.route("q", "c") == "n2"


def test_the_grouping_handler_puts_its_placement_into_every_claim_it_proposes():
    proposed = []

    class Replica:
        def claim(self, *args, callback):
            proposed.append(args)

    class SyncObj:
        version = 3

        def getCodeVersion(self):
            return self.version

    handler = GroupingHandler.__new__(GroupingHandler)  # no raft: only the proposal's arguments matter
    handler.replica, handler.node_id, handler.placement, handler._syncobj = Replica(), "n1", "local", SyncObj()
    handler.claim([("q", "a")], 10, on_failed=lambda keys, reason: None)
    assert proposed == [([["q", "a"]], "n1", 10, "local")]  # as before raft code version 4 (forget_node)
    handler._syncobj.version = 4  # enabled: every member places on registered members only (members_only)
    handler.claim([("q", "b")], 11, on_failed=lambda keys, reason: None)
    assert proposed[1] == ([["q", "b"]], "n1", 11, "local", True)


def test_a_move_is_fed_before_its_route_and_a_clear_as_a_move_that_ends():
    replica, heard = make_replica()
    for node in ("n1", "n2"):
        replica.register_node(node, "h:1", "h:2", "h:3", 5, _doApply=True)
    replica.claim([["q", "a"]], "n1", 10, _doApply=True)
    replica.report_consumers("n2", {"q": 1}, 11, _doApply=True)
    heard.clear()
    replica.follow_consumers("q", "n1", 12, _doApply=True)
    assert heard == [(replicated.MOVES, [("q", "a", "n1", "n2", ("n1", "n2"))]),
                     (replicated.ROUTES, [("q", "a", "n2")])]
    heard.clear()
    replica.move_clear([["q", "a", "n1", "n2"]], "n2", _doApply=True)
    replica.move_clear([["q", "a", "n1", "n2"]], "n1", _doApply=True)
    assert heard == [(replicated.MOVES, [("q", "a", "n1", "n2", ("n1",))]),
                     (replicated.MOVES, [("q", "a", "n1", "n2", ())])]
