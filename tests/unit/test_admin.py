"""The admin API end to end in one process: `grouper` CLI -> AdminClient -> gRPC on 127.0.0.1 ->
AdminServicer -> a NodeControl over a real Broker. Messages and consumers are set up through the
broker directly, so what the CLI reports can be checked against the core's own state."""

from __future__ import annotations

import dataclasses
import json
import logging
import socket
import threading

import grpc
import pytest

from node import cli
from node.admin.definitions import updated_settings
from node.admin.client import AdminClient, AdminError, InvalidRequest, NodeFailure
from node.admin.service import STATUS_BY_ERROR, serve, status_for
from node.admin.wire import settings_from_pb
from node.core.dispatch.broker import Broker
from node.core.errors import (AlreadyExists, GrouperError, InvalidConfig, InvalidField, NotAllowed, NotFound,
                              ResourceDeleted, ResourceLimitExceeded)
from node.core.dispatch.message import Message, Outcome
from node.core.dispatch.settings import QueueSettings
from proto import admin_pb2, admin_pb2_grpc


class BrokerControl:
    """NodeControl over a bare Broker for tests: it discards the effects, which a node must not."""

    def __init__(self, broker: Broker, now_ms):
        self.broker = broker
        self.now_ms = now_ms
        self.lock = threading.Lock()  # gRPC pool threads and the test thread share the broker

    def list_queues(self) -> list[dict]:
        with self.lock:
            return self.broker.list_queues()

    def add_queue(self, settings: QueueSettings) -> dict:
        with self.lock:
            return self.broker.declare_queue(settings).stats()

    def delete_queue(self, name: str) -> None:
        with self.lock:
            self.broker.delete_queue(name)

    def update_queue(self, name: str, changes: dict) -> dict:  # the rule a node alone follows (LoopControl)
        with self.lock:
            self.broker.redefine_queue(updated_settings(self.broker.queue(name).settings.to_dict(), changes))
            return self.broker.queues[name].stats()

    def list_groups(self, queue: str) -> list[dict]:
        with self.lock:
            return self.broker.list_groups(queue)

    def node_id(self) -> str:
        return ""

    def peers(self) -> list:
        return []

    def cluster_status(self) -> dict:
        return {"clustered": False, "members": [{"node": "", "connected": True}]}

    def reset_groups(self, queue: str, group: str | None) -> int:
        with self.lock:
            return self.broker.reset_groups(queue, group, self.now_ms())[0]

    def purge_group(self, queue: str, group: str, count: int | None) -> int:
        with self.lock:
            return self.broker.purge_group(queue, group, count, self.now_ms())[0]

    def move_group(self, queue: str, group: str, destination: str, count: int | None) -> int:
        with self.lock:
            return self.broker.move_group(queue, group, destination, count, self.now_ms())[0]


class Node:
    def __init__(self, control):
        self.control = control
        self.server, port = serve(control, "127.0.0.1", 0)
        self.address = f"127.0.0.1:{port}"

    def grouper(self, capsys, *argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        code = cli.main([*argv, "--node", self.address])
        out, err = capsys.readouterr()
        return code, out, err


@pytest.fixture
def broker():
    return Broker()


@pytest.fixture
def node(broker):
    started = Node(BrokerControl(broker, now_ms=lambda: 1_000))
    yield started
    started.server.stop(None)


def enqueue(broker: Broker, queue: str, *group_ids: str | None) -> None:
    for group_id in group_ids:
        broker.enqueue(queue, Message(b"payload", group_id), now_ms=1_000)


@pytest.fixture
def busy_queue(node, broker):
    """Queue q (shared groups): g1 has 3 messages, 2 acquired by consumer c1; g2 has 2; one has no group."""
    broker.declare_queue(QueueSettings(name="q", group_policy="shared"))
    enqueue(broker, "q", "g1", "g1", "g1", "g2", "g2", None)
    broker.attach_consumer("q", "c1", False, now_ms=1_000)
    broker.set_credit("c1", 2, now_ms=1_000)
    return broker.queues["q"]


def groups_json(node: Node, capsys, queue: str = "q") -> dict[str, dict]:
    code, out, _ = node.grouper(capsys, "groups", queue, "--json")
    assert code == 0
    return {row["group"]: row for row in json.loads(out)}


# ---- queues ----------------------------------------------------------------------------------

def test_queue_added_with_flags_is_listed_with_its_counters(node, broker, capsys):
    code, out, _ = node.grouper(capsys, "queue", "add", "orders", "--shared-groups", "--group-buckets", "8",
                                "--depth-max-messages", "10", "--no-durable")
    assert code == 0 and "added queue orders" in out
    assert broker.queues["orders"].settings == QueueSettings(
        name="orders", group_policy="shared", group_buckets=8, depth_max_messages=10, durable=False)

    enqueue(broker, "orders", "a", "b")
    code, out, _ = node.grouper(capsys, "queue", "list", "--json")
    assert code == 0
    [listed] = json.loads(out)
    assert listed["name"] == "orders" and listed["depth_messages"] == 2 and listed["groups"] == 2

    code, out, _ = node.grouper(capsys, "queue", "list")
    header, row, whose = out.splitlines()
    assert header.split() == ["QUEUE", "DEPTH", "ACQUIRED", "CONSUMERS", "GROUPS", "OWNED", "RUNNABLE", "BLOCKED",
                              "OLDEST", "HEAD"]
    assert row.split()[:8] == ["orders", "2", "0", "0", "2", "0", "2", "0"]  # two groups wait for a consumer
    assert whose == f"(a single node, at {node.address})"  # it says whose queues these are


def test_bad_queue_flag_value_exits_2_naming_the_flag_and_creates_nothing(node, broker, capsys):
    code, _, err = node.grouper(capsys, "queue", "add", "q", "--group-buckets", "-5")
    assert code == 2 and "--group-buckets" in err
    code, _, err = node.grouper(capsys, "queue", "add", "q", "--depth-max-messages", "many")
    assert code == 2 and "--depth-max-messages" in err
    assert broker.queues == {}


@pytest.mark.parametrize("argv, flag", [
    (["group", "purge", "q", "g", "--count", "0"], "--count"),
    (["group", "move", "q", "g", "d", "--count", "x"], "--count"),
    (["queue", "list", "--timeout-ms", "0"], "--timeout-ms"),
    (["queue", "list", "--node", "no-port-here"], "--node"),
])
def test_bad_command_flag_exits_2_naming_the_flag(argv, flag, capsys):
    assert cli.main(argv) == 2
    assert flag in capsys.readouterr().err


def test_node_validates_settings_and_names_the_field(node, broker):
    with grpc.insecure_channel(node.address) as channel, pytest.raises(grpc.RpcError) as raised:
        admin_pb2_grpc.AdminServiceStub(channel).AddQueue(
            admin_pb2.AddQueueRequest(settings=admin_pb2.QueueSettings(name="q", group_buckets=-7)), timeout=5)
    assert raised.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "settings.group_buckets" in raised.value.details()
    with AdminClient(node.address) as client, pytest.raises(InvalidRequest, match="settings.group_rebalance"):
        client.add_queue(QueueSettings(name="q", group_rebalance_pause_dispatch=True))
    assert broker.queues == {}


def test_absent_settings_take_the_defaults():
    assert settings_from_pb(admin_pb2.QueueSettings(name="q")) == QueueSettings(name="q")
    explicit = settings_from_pb(admin_pb2.QueueSettings(name="q", durable=False, group_buckets=0))
    assert explicit == QueueSettings(name="q", durable=False, group_buckets=0)


def test_proto_carries_every_queue_setting_and_counter():
    assert set(admin_pb2.QueueSettings.DESCRIPTOR.fields_by_name) == \
        {field.name for field in dataclasses.fields(QueueSettings)}
    broker = Broker()  # the rows the admin serves: Queue.stats() and the broker's own counters (dedup_dropped_total)
    broker.declare_queue(QueueSettings(name="q"))
    assert set(admin_pb2.QueueStats.DESCRIPTOR.fields_by_name) == set(broker.list_queues()[0])


def test_adding_an_existing_queue_with_other_settings_is_refused(node, broker, capsys):
    broker.declare_queue(QueueSettings(name="q"))
    code, _, err = node.grouper(capsys, "queue", "add", "q", "--group-policy", "none")
    assert code == 1 and "ALREADY_EXISTS" in err and "delete it first" in err


def test_update_changes_only_the_limits_given_and_keeps_the_queues_messages(node, broker, capsys):
    broker.declare_queue(QueueSettings(name="q", group_buckets=8))
    enqueue(broker, "q", "a", "b")
    code, out, _ = node.grouper(capsys, "queue", "update", "q", "--depth-max-messages", "5", "--delivery-count-max", "3")
    assert code == 0 and "updated queue q: delivery_count_max=3, depth_max_messages=5" in out
    assert broker.queues["q"].settings == QueueSettings(name="q", group_buckets=8, depth_max_messages=5,
                                                        delivery_count_max=3)
    assert broker.queues["q"].stats()["depth_messages"] == 2


def test_update_of_how_messages_are_grouped_exits_1_naming_the_fields_and_changes_nothing(node, broker, capsys):
    broker.declare_queue(QueueSettings(name="q"))
    code, _, err = node.grouper(capsys, "queue", "update", "q", "--group-buckets", "4", "--no-durable",
                                "--groups-max", "7")
    assert code == 1 and "FAILED_PRECONDITION" in err and "durable, group_buckets cannot change on a live queue" in err
    assert broker.queues["q"].settings == QueueSettings(name="q")


def test_update_with_a_bad_value_or_nothing_to_change_exits_2(node, broker, capsys):
    broker.declare_queue(QueueSettings(name="q"))
    code, _, err = node.grouper(capsys, "queue", "update", "q", "--depth-max-messages", "-1")
    assert code == 2 and "depth_max_messages" in err
    code, _, err = node.grouper(capsys, "queue", "update", "q")
    assert code == 2 and "nothing to update" in err
    code, _, err = node.grouper(capsys, "queue", "update", "nope", "--groups-max", "3")
    assert code == 1 and "NOT_FOUND" in err


def test_deleted_queue_is_gone(node, broker, capsys):
    broker.declare_queue(QueueSettings(name="q"))
    code, out, _ = node.grouper(capsys, "queue", "delete", "q")
    assert code == 0 and "deleted queue q" in out
    assert broker.queues == {}


def test_unknown_queue_exits_1_with_the_nodes_not_found_message(node, capsys):
    code, out, err = node.grouper(capsys, "groups", "nope")
    assert code == 1 and out == ""
    assert f"the node at {node.address} refused (NOT_FOUND)" in err and "no queue 'nope'" in err
    code, _, err = node.grouper(capsys, "queue", "delete", "nope")
    assert code == 1 and "no queue 'nope'" in err


# ---- groups ----------------------------------------------------------------------------------

def test_groups_json_has_exactly_the_documented_fields(node, busy_queue, capsys):
    code, out, _ = node.grouper(capsys, "groups", "q", "--json")
    assert code == 0
    assert json.loads(out) == [
        {"group": "g1", "messages": 3, "acquired": 2, "consumer": "c1", "node": "", "label": ""},
        {"group": "g2", "messages": 2, "acquired": 0, "consumer": None, "node": "", "label": ""},
        {"group": "qpid.no-group", "messages": 1, "acquired": 0, "consumer": None, "node": "", "label": ""},
    ]


def test_groups_table_shows_owner_or_dash(node, busy_queue, capsys):
    code, out, _ = node.grouper(capsys, "groups", "q")
    assert code == 0
    assert [line.split() for line in out.splitlines()] == [
        ["GROUP", "MESSAGES", "ACQUIRED", "CONSUMER", "CLIENT/LINK"],
        ["g1", "3", "2", "c1", "-"],
        ["g2", "2", "0", "-", "-"],
        ["qpid.no-group", "1", "0", "-", "-"],
    ]


def test_purge_takes_only_available_messages(node, broker, busy_queue, capsys):
    code, out, _ = node.grouper(capsys, "group", "purge", "q", "g1")
    assert code == 0 and out.strip() == "purged 1 message from group g1 of queue q"
    assert groups_json(node, capsys)["g1"] == {"group": "g1", "messages": 2, "acquired": 2, "consumer": "c1", "node": "",
                                               "label": ""}

    code, out, _ = node.grouper(capsys, "group", "purge", "q", "g2", "--count", "1")
    assert code == 0 and out.strip() == "purged 1 message from group g2 of queue q"
    assert groups_json(node, capsys)["g2"]["messages"] == 1
    assert busy_queue.depth_messages == 4


def test_move_takes_only_available_messages_to_the_destination(node, broker, busy_queue, capsys):
    broker.declare_queue(QueueSettings(name="parking", group_policy="shared"))
    code, out, _ = node.grouper(capsys, "group", "move", "q", "g1", "parking")
    assert code == 0 and out.strip() == "moved 1 message from group g1 of queue q to queue parking"
    code, out, _ = node.grouper(capsys, "group", "move", "q", "g2", "parking", "--count", "5")
    assert code == 0 and out.strip() == "moved 2 messages from group g2 of queue q to queue parking"

    assert groups_json(node, capsys)["g1"] == {"group": "g1", "messages": 2, "acquired": 2, "consumer": "c1", "node": "",
                                               "label": ""}
    assert "g2" not in groups_json(node, capsys)
    assert groups_json(node, capsys, "parking") == {
        "g1": {"group": "g1", "messages": 1, "acquired": 0, "consumer": None, "node": "", "label": ""},
        "g2": {"group": "g2", "messages": 2, "acquired": 0, "consumer": None, "node": "", "label": ""},
    }


def test_move_to_an_unknown_queue_exits_1_and_moves_nothing(node, busy_queue, capsys):
    code, _, err = node.grouper(capsys, "group", "move", "q", "g2", "nowhere")
    assert code == 1 and "no queue 'nowhere'" in err
    assert groups_json(node, capsys)["g2"]["messages"] == 2


def test_reset_frees_one_group_or_all_owned_groups(node, broker, busy_queue, capsys):
    code, out, _ = node.grouper(capsys, "group", "reset", "q", "g2")
    assert code == 0 and out.strip() == "group g2 of queue q had no owner; nothing to reset"

    code, out, _ = node.grouper(capsys, "group", "reset", "q", "g1")
    assert code == 0 and out.strip() == "reset group g1 of queue q: its owner is released"

    # g1 has messages in flight, so it stays with c1 until they settle; then anyone may take it
    for delivery_id in (0, 1):
        broker.settle("c1", delivery_id, outcome=Outcome.ACCEPTED, now_ms=1_000)
    assert groups_json(node, capsys)["g1"]["consumer"] is None

    broker.set_credit("c1", 3, now_ms=1_000)
    code, out, _ = node.grouper(capsys, "group", "reset", "q")
    assert code == 0 and out.strip() == "reset 2 owned groups of queue q"


def test_reset_of_an_unknown_group_exits_1(node, busy_queue, capsys):
    code, _, err = node.grouper(capsys, "group", "reset", "q", "nope")
    assert code == 1 and "has no group 'nope'" in err


# ---- reaching the node -----------------------------------------------------------------------

def test_unreachable_node_exits_3_naming_the_address(capsys):
    with socket.socket() as closed:  # bound but never listening: connections are refused
        closed.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{closed.getsockname()[1]}"
        code = cli.main(["queue", "list", "--node", address])
    err = capsys.readouterr().err
    assert code == 3
    assert f"cannot reach the node at {address}" in err and "check that the node is running" in err


def test_node_address_comes_from_the_environment(node, capsys, monkeypatch):
    monkeypatch.setenv("GROUPER_NODE", node.address)
    assert cli.main(["queue", "list"]) == 0
    monkeypatch.setenv("GROUPER_NODE", "nonsense")
    assert cli.main(["queue", "list"]) == 2
    assert "GROUPER_NODE" in capsys.readouterr().err


def test_a_node_slower_than_the_deadline_exits_3(capsys):
    release = threading.Event()

    class StuckControl:
        def list_queues(self):
            release.wait(5)
            return []

    slow = Node(StuckControl())
    try:
        code = cli.main(["queue", "list", "--local", "--node", slow.address, "--timeout-ms", "100"])
    finally:
        release.set()
        slow.server.stop(None)
    assert code == 3
    assert f"no answer from the node at {slow.address} within 100 ms" in capsys.readouterr().err


def test_serving_on_a_port_in_use_names_the_address():
    first = Node(BrokerControl(Broker(), now_ms=lambda: 0))
    try:
        port = int(first.address.rsplit(":", 1)[1])
        with pytest.raises(GrouperError, match=f"127.0.0.1:{port}"):
            serve(first.control, "127.0.0.1", port)
    finally:
        first.server.stop(None)


# ---- the error table -------------------------------------------------------------------------

class FailingControl:
    def __init__(self, error: BaseException):
        self.error = error

    def list_queues(self):
        raise self.error


@pytest.mark.parametrize("error, status", [
    (NotFound("gone"), grpc.StatusCode.NOT_FOUND),
    (AlreadyExists("twice"), grpc.StatusCode.ALREADY_EXISTS),
    (InvalidField("bad field"), grpc.StatusCode.INVALID_ARGUMENT),
    (InvalidConfig("some_key", "bad value"), grpc.StatusCode.INVALID_ARGUMENT),
    (ResourceLimitExceeded("full"), grpc.StatusCode.RESOURCE_EXHAUSTED),
    (ResourceDeleted("deleted meanwhile"), grpc.StatusCode.NOT_FOUND),
    (NotAllowed("not now"), grpc.StatusCode.FAILED_PRECONDITION),
    (TimeoutError("the reactor is slow"), grpc.StatusCode.DEADLINE_EXCEEDED),
    (GrouperError("unclassified"), grpc.StatusCode.INTERNAL),
    (KeyError("bug"), grpc.StatusCode.INTERNAL),
])
def test_node_errors_become_status_codes_carrying_the_message(error, status):
    failing = Node(FailingControl(error))
    try:
        with AdminClient(failing.address, timeout_ms=2000) as client, pytest.raises(AdminError) as raised:
            client.list_queues()
    finally:
        failing.server.stop(None)
    assert raised.value.status == status.name
    assert str(error).strip("'") in raised.value.message


def test_unexpected_errors_are_logged_and_reported_as_internal(caplog, capsys):
    failing = Node(FailingControl(RuntimeError("broken invariant")))
    try:
        with caplog.at_level(logging.ERROR, logger="node.admin.service"):
            code = cli.main(["queue", "list", "--local", "--node", failing.address])
    finally:
        failing.server.stop(None)
    assert code == 1
    assert "INTERNAL" in capsys.readouterr().err
    assert any("ListQueuesRequest" in record.getMessage() and record.exc_info for record in caplog.records)


def test_error_table_lists_subclasses_before_their_bases():
    types = list(STATUS_BY_ERROR)
    for index, error_type in enumerate(types):
        assert not any(issubclass(error_type, earlier) for earlier in types[:index])


def test_an_error_takes_the_code_of_its_nearest_listed_class_and_an_unknown_one_is_internal():
    class GoneMeanwhile(NotFound):
        pass

    class Surprise(GrouperError):
        pass

    assert status_for(GoneMeanwhile("queue 'q' went")) is grpc.StatusCode.NOT_FOUND
    assert status_for(Surprise("?")) is grpc.StatusCode.INTERNAL
    assert status_for(KeyError("k")) is grpc.StatusCode.INTERNAL
    assert status_for(TimeoutError()) is grpc.StatusCode.DEADLINE_EXCEEDED


def test_client_errors_of_a_refusal_are_node_failures(node):
    with AdminClient(node.address) as client, pytest.raises(NodeFailure) as raised:
        client.purge_group("nope", "g", None)
    assert raised.value.status == "NOT_FOUND" and raised.value.address == node.address


class MovingControl(BrokerControl):
    """A clustered node's status while a group moves: what the protocol's status() gives (its moves
    spelled out by node/core/cluster/status.py move_report)."""

    MOVE = {"queue": "q", "group": "g1", "from": "n1:1", "to": "n2:1", "waiting": ["n1:1", "n3:1"],
            "here": ["the other members' clears (the old owner clears last)", "2 queued and 0 in flight here"]}

    def cluster_status(self) -> dict:
        return {"clustered": True, "node": "n1:1", "leader": "n2:1", "term": 3, "has_quorum": True, "routes": 2,
                "waiting_for_route": 0, "outbound": {}, "outbound_bytes": {}, "routes_digest": "", "in_transit": {},
                "moving": 2, "moves": [self.MOVE],
                "members": [{"node": "n1:1", "connected": True, "raft_member": True, "routes": 2}]}


def test_cluster_status_shows_the_moving_groups_and_what_each_waits_for(broker, capsys):
    moving = Node(MovingControl(broker, now_ms=lambda: 1_000))
    try:
        code, out, _ = moving.grouper(capsys, "cluster", "status", "--json")
        assert code == 0
        status = json.loads(out)
        assert status["moving"] == 2 and status["moves"] == [MovingControl.MOVE]
        code, out, _ = moving.grouper(capsys, "cluster", "status")
    finally:
        moving.server.stop(None)
    assert code == 0
    assert "2 groups moving between nodes (the first 1):" in out
    [row] = [line for line in out.splitlines() if line.startswith("q ")]
    assert row.split()[:5] == ["q", "g1", "n1:1", "n2:1", "n1:1,"]
    assert row.endswith("the other members' clears (the old owner clears last); 2 queued and 0 in flight here")


class ReplicatedControl(BrokerControl):
    """A clustered node's status once owners have epochs and in-sync backups (issue 28)."""

    def cluster_status(self) -> dict:
        member = {"connected": True, "raft_member": True, "routes": 2}
        return {"clustered": True, "node": "n1:1", "leader": "n1:1", "term": 3, "has_quorum": True, "routes": 4,
                "waiting_for_route": 0, "outbound": {}, "outbound_bytes": {}, "routes_digest": "", "in_transit": {},
                "moving": 0, "moves": [],
                "members": [{**member, "node": "n1:1", "epoch": 2, "in_sync": ["n2:1"], "under_replicated": False},
                            {**member, "node": "n2:1", "epoch": 0, "in_sync": [], "under_replicated": True},
                            {**member, "node": "n3:1", "routes": 0}]}


def test_cluster_status_shows_each_owners_epoch_in_sync_backups_and_whether_it_is_under_replicated(broker, capsys):
    replicated = Node(ReplicatedControl(broker, now_ms=lambda: 1_000))
    try:
        code, out, _ = replicated.grouper(capsys, "cluster", "status", "--json")
        assert code == 0
        members = {member["node"]: member for member in json.loads(out)["members"]}
        code, out, _ = replicated.grouper(capsys, "cluster", "status")
    finally:
        replicated.server.stop(None)
    assert code == 0
    assert (members["n1:1"]["epoch"], members["n1:1"]["in_sync"], members["n2:1"]["under_replicated"]) == (
        2, ["n2:1"], True)
    assert members["n3:1"]["epoch"] == 0 and members["n3:1"]["in_sync"] == []
    rows = {line.split()[0]: line.split()[1:] for line in out.split("OWNER", 1)[1].splitlines()[1:] if line.strip()}
    assert rows == {"n1:1": ["2", "n2:1", "ok"], "n2:1": ["0", "-", "under-replicated"]}  # n3 owns nothing


def test_queue_add_with_group_rebalance_mode_incremental_turns_the_rebalance_on(node, broker, capsys):
    # issue 30: the mode is group_rebalance's, so naming it is enough; update reaches a live queue
    code, out, _ = node.grouper(capsys, "queue", "add", "q", "--group-rebalance-mode", "incremental")
    assert code == 0 and "added queue q" in out
    settings = broker.queues["q"].settings
    assert settings.group_rebalance and settings.group_rebalance_mode == "incremental"
    code, _, _ = node.grouper(capsys, "queue", "update", "q", "--group-rebalance-mode", "reset")
    assert code == 0 and broker.queues["q"].settings.group_rebalance_mode == "reset"
