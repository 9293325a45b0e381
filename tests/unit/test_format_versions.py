"""Format versions of the raft side: snapshots and the member channel's start message.

A version this build does not read is refused by name, never misread; a version absent is 1, which is
what every snapshot and start message before versions was (the upgrade path). The journal's versions
are tested in test_journal.py, the peer and admin ones in test_peer_forwarding.py and test_admin.py.
"""

from __future__ import annotations

import pickle
import socket

import pytest
from hypothesis import given, settings as hypothesis_settings, strategies as st

from handler import replicated
from handler.member import CHANNEL_VERSION, CHANNEL_VERSIONS_SPOKEN, Member
from handler.route_table import RouteTable
from node.core.group_map import GroupMap
from handler.replicated import (SNAPSHOT_FORMAT_VERSION, SNAPSHOT_FORMAT_VERSIONS_READ, RouteTableReplica,
                                SnapshotRefused)


def all_routes(table: RouteTable) -> dict:
    """The routes as {(queue, group): [node, touched_ms]}, whatever the table's own layout."""
    return {key: [node, touched_ms] for key, (node, touched_ms) in table.entries()}


def make_replica():
    heard, refused = [], []
    replica = RouteTableReplica(lambda kind, payload, at_ms: heard.append((kind, payload)), routes_max=10,
                                on_refused=refused.append)
    return replica, heard, refused


def filled_replica():
    replica, _, _ = make_replica()
    replica.claim([["q", "a"]], "n1", 10, _doApply=True)
    replica.define_queue({"name": "orders"}, False, _doApply=True)
    return replica


def test_a_snapshot_names_the_format_version_it_was_written_in():
    assert filled_replica()._serialize()["format_version"] == SNAPSHOT_FORMAT_VERSION
    assert SNAPSHOT_FORMAT_VERSION in SNAPSHOT_FORMAT_VERSIONS_READ


def version_1_snapshot() -> dict:
    """What a build of format version 1 wrote for filled_replica(), less the version (none had one):
    the table's attributes as they were, routes {(queue, group): [node, touched_ms]}."""
    return {"route_table": {"routes_max": 10, "routes": {("q", "b"): ["n2", 12], ("q", "a"): ["n1", 10]},
                            "route_counts": {("n1", "q"): 1, ("n2", "q"): 1}, "consumers": {}, "nodes": {},
                            "down": {}, "moves": {}, "revision": 3},
            "queue_definitions": dict(vars(filled_replica().queues))}


def test_a_snapshot_without_a_version_is_version_1_and_restores_as_before():
    restored, heard, refused = make_replica()
    restored._deserialize(version_1_snapshot())
    assert refused == []
    assert all_routes(restored.table) == {("q", "a"): ["n1", 10], ("q", "b"): ["n2", 12]}
    assert restored.table.route("q", "b") == "n2" and len(restored.table) == 2
    assert restored.table.revision == 3 and restored.table.route_counts == {("n1", "q"): 1, ("n2", "q"): 1}
    assert restored.queues.all() == filled_replica().queues.all()
    assert heard[0] == (replicated.SNAPSHOT, [("q", "a", "n1", 10), ("q", "b", "n2", 12)])
    # and what it writes back is this build's version, which restores to the same table
    again, _, _ = make_replica()
    again._deserialize(restored._serialize())
    assert restored._serialize()["format_version"] == 4 == SNAPSHOT_FORMAT_VERSION
    assert all_routes(again.table) == all_routes(restored.table) and again.table.store.node_names == ["n1", "n2"]


def version_2_snapshot() -> dict:
    """What a build of format version 2 wrote for filled_replica() plus a route on n2: the table's
    state with routes {queue: {group: touched_ms << 16 | node number}}."""
    return {"format_version": 2,
            "route_table": {"routes_max": 10, "routes": {"q": {"a": 10 << 16 | 0, "b": 12 << 16 | 1}},
                            "node_names": ["n1", "n2"], "route_counts": {("n1", "q"): 1, ("n2", "q"): 1},
                            "consumers": {}, "nodes": {}, "down": {}, "moves": {}, "revision": 3},
            "queue_definitions": dict(vars(filled_replica().queues))}


def test_a_snapshot_of_version_2_restores_as_before_and_is_written_back_in_this_version():
    restored, heard, refused = make_replica()
    restored._deserialize(pickle.loads(pickle.dumps(version_2_snapshot())))
    assert refused == []
    assert all_routes(restored.table) == {("q", "a"): ["n1", 10], ("q", "b"): ["n2", 12]}
    assert restored.table.route("q", "b") == "n2" and len(restored.table) == 2 and restored.table.revision == 3
    assert heard[0] == (replicated.SNAPSHOT, [("q", "a", "n1", 10), ("q", "b", "n2", 12)])
    again, _, _ = make_replica()
    again._deserialize(pickle.loads(pickle.dumps(restored._serialize())))
    assert restored._serialize()["format_version"] == 4
    assert all_routes(again.table) == all_routes(restored.table) and again.table.store.node_names == ["n1", "n2"]
    assert again.table.claim([["q", "b"], ["q", "c"]], "n1", 20) == ["n2", "n1"]


def test_a_snapshot_of_this_version_restores_the_table_whole():
    data = filled_replica()._serialize()
    restored, heard, refused = make_replica()
    restored._deserialize(pickle.loads(pickle.dumps(data)))  # as pysyncobj stores and sends it
    assert refused == [] and all_routes(restored.table) == all_routes(filled_replica().table)
    assert restored.table.claim([["q", "a"], ["q", "c"]], "n2", 20) == ["n1", "n2"]  # numbers still name nodes
    assert heard[0] == (replicated.SNAPSHOT, [("q", "a", "n1", 10)])


def version_3_snapshot() -> dict:
    """What a build of format version 3 wrote (every build since the routes were packed as GroupMaps, the
    route table's split into packed_routes, placement, route_moves and member_reports included): the
    table's state in this key order, routes {queue: GroupMap.state()}, node names, counts, a move."""
    routes = GroupMap.from_items([("a", 10 << 16 | 0), ("b", 12 << 16 | 1)]).state()
    return {"format_version": 3,
            "route_table": {"routes_max": 10, "routes": {"q": routes}, "node_names": ["n1", "n2"],
                            "route_counts": {("n1", "q"): 1, ("n2", "q"): 1}, "consumers": {"n2": {"q": 1}},
                            "nodes": {}, "down": {}, "moves": {("q", "b"): ["n1", "n2", 12, ["n1", "n2"]]},
                            "revision": 3},
            "queue_definitions": dict(vars(filled_replica().queues))}


def test_a_snapshot_of_version_3_restores_and_is_written_back_key_for_key_in_the_same_layout():
    data = version_3_snapshot()
    restored, heard, refused = make_replica()
    restored._deserialize(pickle.loads(pickle.dumps(data)))
    assert refused == []
    assert all_routes(restored.table) == {("q", "a"): ["n1", 10], ("q", "b"): ["n2", 12]}
    assert heard[:2] == [(replicated.SNAPSHOT, [("q", "a", "n1", 10), ("q", "b", "n2", 12)]),
                         (replicated.MOVES_ALL, [("q", "b", "n1", "n2", ("n1", "n2"))])]
    written = restored._serialize()["route_table"]
    # version 4: the same keys in the same order, then the owner epochs and in-sync backups, none in a v3 table
    assert list(written) == list(data["route_table"]) + ["epochs", "in_sync"]
    assert written["epochs"] == {} and written["in_sync"] == {}
    assert pickle.dumps({key: written[key] for key in data["route_table"]}) == pickle.dumps(data["route_table"])
    assert restored.table.move_clear([["q", "b", "n1", "n2"]], "n2") == [("q", "b", "n1", "n2", ("n1",))]


@hypothesis_settings(max_examples=100, deadline=None)
@given(version=st.one_of(st.integers(), st.text(max_size=5), st.none()).filter(
    lambda v: v not in SNAPSHOT_FORMAT_VERSIONS_READ))
def test_a_snapshot_of_a_version_this_build_does_not_read_is_refused_by_name_and_nothing_restored(version):
    data = filled_replica()._serialize()
    data["format_version"] = version
    restored, heard, refused = make_replica()
    with pytest.raises(SnapshotRefused):
        restored._deserialize(data)
    [reason] = refused
    assert f"format version {version!r}" in reason and "reads versions 1" in reason
    assert "one version step" in reason
    assert heard == [] and all_routes(restored.table) == {} and restored.queues.all() == {}


def started_member(start_message):
    node_end, member_end = socket.socketpair()
    member = Member(member_end)
    sent = []
    member.channel.send = sent.append  # what the member answers the node
    member._on_message(start_message)
    node_end.close()
    member_end.close()
    return member, sent


@given(version=st.integers().filter(lambda v: v not in CHANNEL_VERSIONS_SPOKEN))
def test_a_start_message_of_a_channel_version_the_member_does_not_speak_is_refused_naming_both(version):
    member, sent = started_member(("start", "127.0.0.1:1", [], "/nonexistent", {}, version))
    [(kind, reason)] = sent
    assert kind == "start_failed" and member.handler is None
    assert f"version {version!r}" in reason and str(CHANNEL_VERSIONS_SPOKEN) in reason
    assert "one install" in reason


def test_the_node_sends_the_channel_version_this_member_speaks():
    assert CHANNEL_VERSION in CHANNEL_VERSIONS_SPOKEN


# ---- peer forwarding: ForwardBatch.format_version ------------------------------------------------

def forward_batch(version: int):
    from node.peer.forward_batch import Entry, batch_to_pb
    batch = batch_to_pb("10.0.0.1:5675", [Entry(1, "q", "g", b"payload", 0, False, 5)])
    batch.format_version = version
    return batch


def test_a_batch_names_the_peer_format_version_and_one_without_it_is_version_1():
    from node.peer.forward_batch import FORMAT_VERSION, FORMAT_VERSIONS_READ, entries_from_pb
    from proto import peer_pb2
    assert forward_batch(FORMAT_VERSION).format_version == FORMAT_VERSION in FORMAT_VERSIONS_READ
    old = peer_pb2.ForwardBatch.FromString(forward_batch(0).SerializeToString())  # as sources before versions
    assert [entry.payload for entry in entries_from_pb(old)] == [b"payload"]


@given(version=st.integers(min_value=2, max_value=2**32 - 1))
def test_a_batch_of_a_peer_format_version_this_node_does_not_read_is_refused_so_the_source_keeps_it(version):
    import grpc
    from node.core.errors import NotAllowed
    from node.peer.forward_batch import entries_from_pb
    from node.peer.service import status_for
    with pytest.raises(NotAllowed) as refused:
        entries_from_pb(forward_batch(version))
    text = str(refused.value)
    assert f"peer format version {version}" in text and "'10.0.0.1:5675'" in text and "reads 1" in text
    # not retriable by its own word, yet the forwarder keeps every unacked entry and retries any failure
    assert status_for(refused.value) is grpc.StatusCode.FAILED_PRECONDITION


# ---- admin API: the version in gRPC metadata -----------------------------------------------------

def test_an_admin_call_without_a_version_is_version_1_and_this_clients_version_is_read():
    from node.admin.client import API_VERSION, API_VERSION_KEY, api_version_refusal
    assert api_version_refusal(()) is None  # a CLI from before versions
    assert api_version_refusal((("authorization", "Basic x"),)) is None
    assert api_version_refusal(((API_VERSION_KEY, str(API_VERSION)),)) is None


@given(version=st.text(max_size=6).filter(lambda v: not (v.isascii() and v.isdigit() and int(v) == 1)))
def test_an_admin_call_of_a_version_the_node_does_not_read_is_refused_naming_it(version):
    from node.admin.client import API_VERSION_KEY, api_version_refusal
    refusal = api_version_refusal(((API_VERSION_KEY, version),))
    assert refusal is not None and f"admin API version {version!r}" in refusal
    assert "reads versions 1" in refusal and "upgrade the node" in refusal


def test_the_admin_client_sends_its_version_with_every_call():
    from node.admin.client import API_VERSION, API_VERSION_KEY, AdminClient
    with AdminClient("127.0.0.1:1", metadata=(("authorization", "Basic x"),)) as client:
        assert client._metadata == (("authorization", "Basic x"), (API_VERSION_KEY, str(API_VERSION)))


# ---- raft commands: pysyncobj's code version ------------------------------------------------------

def test_a_member_whose_code_lacks_a_command_version_the_log_enables_refuses_it_by_name():
    """Two real pysyncobj members in this process: the newer has a ver=5 command and enables it; the
    older (this build's replica) meets that entry. pysyncobj alone would log and skip it."""
    import logging
    import time

    from pysyncobj import SyncObj, SyncObjConf, replicated as replicated_command

    from handler.replicated import PYSYNCOBJ_LOGGER, RefuseNewerCommands
    from tests.integration.cluster import free_ports

    class NewerReplica(RouteTableReplica):
        @replicated_command(ver=5)
        def a_later_command(self, value):
            return value

    refused = []
    guard = RefuseNewerCommands(on_refused=refused.append)
    logging.getLogger(PYSYNCOBJ_LOGGER).addHandler(guard)
    ports = free_ports(2)
    nodes = [f"127.0.0.1:{port}" for port in ports]
    conf = dict(raftMinTimeout=0.1, raftMaxTimeout=0.2, appendEntriesPeriod=0.02, connectionRetryTime=0.1)
    newer = SyncObj(nodes[0], [nodes[1]], conf=SyncObjConf(**conf),
                    consumers=[NewerReplica(lambda *args: None, routes_max=10, on_refused=refused.append)])
    older = SyncObj(nodes[1], [nodes[0]], conf=SyncObjConf(**conf),
                    consumers=[RouteTableReplica(lambda *args: None, routes_max=10, on_refused=refused.append)])
    try:
        deadline = time.monotonic() + 20
        while not (newer._getLeader() and older._getLeader()):
            assert time.monotonic() < deadline, "no raft leader"
            time.sleep(0.02)
        enabled = []
        newer.setCodeVersion(5, callback=lambda result, error: enabled.append(error))
        while not refused:
            assert time.monotonic() < deadline, f"no refusal; enabling gave {enabled}"
            time.sleep(0.02)
    finally:
        logging.getLogger(PYSYNCOBJ_LOGGER).removeHandler(guard)
        newer.destroy()
        older.destroy()
    [reason] = refused[:1]
    assert "command version this build does not have" in reason
    assert "self version: 4, requested version: 5" in reason and "one version step" in reason


def test_a_damaged_snapshot_of_this_version_is_refused_by_name_and_nothing_restored():
    data = pickle.loads(pickle.dumps(filled_replica()._serialize()))
    data["route_table"]["routes"]["q"][2] += 1  # the GroupMap's count no longer matches its buckets
    restored, heard, refused = make_replica()
    with pytest.raises(SnapshotRefused):
        restored._deserialize(data)
    [reason] = refused
    assert "format version 4" in reason and "is damaged" in reason and "raft directory aside" in reason
    assert heard == [] and all_routes(restored.table) == {}
