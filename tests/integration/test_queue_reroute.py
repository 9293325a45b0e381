"""`grouper queue reroute` against real nodes and proton clients: a group's backlog and the first N
of a queue go to another queue in group order, nothing left behind or doubled, through a kill -9;
a destination that fills up says what moved and what stayed; in a cluster, a rerouted group joins
its destination group on the node that owns it."""

from __future__ import annotations

import json

import pytest

from tests.integration.clients import queue_toml
from tests.integration.cluster import Cluster
from tests.integration.harness import ManualReceiver, connect, grouped, send_outcome

SOURCE = "orders"
DESTINATION = "archive"
SMALL = "small"  # a destination with room for two messages


def send(node, queue: str, bodies: list[tuple[str, str]]) -> None:
    connection = connect(node)
    try:
        sender = connection.create_sender(queue, name="producer")
        for group, body in bodies:
            state, condition = send_outcome(sender, grouped(body, group))
            assert condition is None, (body, condition)
    finally:
        connection.close()


def drain(node, queue: str, expected_count: int) -> list[str]:
    """Every message of `queue` (expected_count of them), accepted, and then proof that no more came."""
    connection = connect(node)
    try:
        receiver = ManualReceiver(connection, queue, f"drain-{queue}", credit=0)
        helds = receiver.fetch_many(expected_count)
        for held in helds:
            held.accept()
        assert receiver.poll() is None
        return [held.body for held in helds]
    finally:
        connection.close()


def of_group(bodies: list[str], group: str) -> list[str]:
    return [body for body in bodies if body.startswith(f"{group}:")]


@pytest.fixture
def node(node_factory):
    return node_factory(queue_toml(SOURCE) + queue_toml(DESTINATION) + queue_toml(SMALL, depth_max_messages=2))


def test_a_groups_backlog_and_then_the_first_n_are_rerouted_in_order_and_survive_a_kill(node):
    sends = [("a", "a:0"), ("b", "b:0"), ("a", "a:1"), ("c", "c:0"), ("b", "b:1"), ("a", "a:2"), ("c", "c:1")]
    send(node, SOURCE, sends)

    group = node.cli("queue", "reroute", SOURCE, "--to", DESTINATION, "--group", "a")
    assert group.returncode == 0, group.stderr
    assert group.stdout.strip() == f"rerouted 3 messages from group a of queue {SOURCE} to {DESTINATION}"
    first = node.cli("queue", "reroute", SOURCE, "--to", DESTINATION, "--count", "3")
    assert first.returncode == 0, first.stderr
    assert "rerouted 3 messages" in first.stdout  # b:0, c:0, b:1: the first three left, in queue order

    node.kill()  # the answers came once the journal had them: a kill -9 loses and doubles nothing
    node.start()
    archived = drain(node, DESTINATION, 6)
    assert of_group(archived, "a") == ["a:0", "a:1", "a:2"]
    assert of_group(archived, "b") == ["b:0", "b:1"]
    assert of_group(archived, "c") == ["c:0"]
    assert drain(node, SOURCE, 1) == ["c:1"]


def test_a_destination_that_fills_up_says_what_moved_and_what_stayed(node):
    send(node, SOURCE, [("a", "a:0"), ("a", "a:1"), ("a", "a:2"), ("b", "b:0")])
    result = node.cli("queue", "reroute", SOURCE, "--to", SMALL)
    assert result.returncode == 1, result
    assert f"rerouted 2 messages from queue {SOURCE} to {SMALL}" in result.stdout
    assert f"2 messages stayed in queue {SOURCE}" in result.stderr
    assert "depth_max_messages=2" in result.stderr
    assert drain(node, SMALL, 2) == ["a:0", "a:1"]
    assert drain(node, SOURCE, 2) == ["a:2", "b:0"]  # the group's tail stayed behind nothing of it


@pytest.mark.parametrize("args, says", [
    (("nowhere", "--to", DESTINATION), "no queue 'nowhere'"),
    ((SOURCE, "--to", "nowhere"), "no queue or multicast address 'nowhere'"),
    ((SOURCE, "--to", SOURCE), "its messages would come back to it"),
    ((SOURCE, "--to", DESTINATION, "--group", "nobody"), "has no group 'nobody'"),
])
def test_a_bad_reroute_is_refused_naming_what_is_wrong_and_moves_nothing(node, args, says):
    send(node, SOURCE, [("a", "a:0")])
    result = node.cli("queue", "reroute", *args)
    assert result.returncode in (1, 2), result
    assert says in result.stderr, result.stderr
    assert drain(node, SOURCE, 1) == ["a:0"]


def test_bodies_paged_out_to_the_journal_are_read_back_and_rerouted_in_order(node_factory):
    node = node_factory(queue_toml(SOURCE, memory_max_bytes=1000) + queue_toml(DESTINATION))
    sends = [(f"g{index % 3}", f"g{index % 3}:{index // 3}" + "." * 200) for index in range(30)]
    send(node, SOURCE, sends)
    paged = json.loads(node.cli("queue", "list", "--json").stdout)
    assert [row["paged_bytes"] for row in paged if row["name"] == SOURCE][0] > 0, paged

    result = node.cli("queue", "reroute", SOURCE, "--to", DESTINATION)
    assert result.returncode == 0, result.stderr
    assert "rerouted 30 messages" in result.stdout
    archived = drain(node, DESTINATION, 30)
    for group in ("g0", "g1", "g2"):
        assert of_group(archived, group) == [body for g, body in sends if g == group]


def test_a_multicast_address_gives_each_subscription_a_copy_grouped_by_its_own_group_header(node_factory):
    node = node_factory(queue_toml(SOURCE) + '[[address]]\nname = "prices"\n\n'
                        '[[address.queue]]\nname = "prices.all"\n\n'
                        '[[address.queue]]\nname = "prices.by-region"\ngroup_header = "region"\n')
    connection = connect(node)
    try:
        sender = connection.create_sender(SOURCE, name="producer")
        for body, group, region in (("a:0", "a", "north"), ("b:0", "b", "north"), ("a:1", "a", "south")):
            state, condition = send_outcome(sender, grouped(body, group, region=region))
            assert condition is None, (body, condition)
    finally:
        connection.close()
    result = node.cli("queue", "reroute", SOURCE, "--to", "prices")
    assert result.returncode == 0, result.stderr
    assert "rerouted 3 messages" in result.stdout
    by_group = {name: {row["group"]: row["messages"] for row in json.loads(
        node.cli("groups", name, "--json").stdout)} for name in ("prices.all", "prices.by-region")}
    assert by_group == {"prices.all": {"a": 2, "b": 1}, "prices.by-region": {"north": 2, "south": 1}}
    north = [body for body in drain(node, "prices.by-region", 3) if body in ("a:0", "b:0")]
    assert north == ["a:0", "b:0"]  # the order they had in orders


def test_in_a_cluster_a_group_joins_its_destination_group_where_that_lives_and_the_first_n_span_the_nodes(
        tmp_path):
    # placement local: a new group lives on the node its first message was sent through
    cluster = Cluster(tmp_path, 2, queue_toml(SOURCE) + queue_toml(DESTINATION), ("--placement", "local"))
    cluster.start()
    try:
        first, second = cluster.nodes
        send(first, DESTINATION, [("g", "g:archived")])  # archive's group g lives on node 0...
        send(second, SOURCE, [("g", "g:0"), ("g", "g:1"), ("g", "g:2")])  # ...orders' group g on node 1
        cluster.wait_for(lambda status: status["routes"] == 2, "both groups' routes")

        # asked of node 0, which holds nothing of orders: node 1 has the group, and forwards it to node 0
        result = first.cli("queue", "reroute", SOURCE, "--to", DESTINATION, "--group", "g")
        assert result.returncode == 0, result.stderr
        assert "rerouted 3 messages" in result.stdout
        assert drain(first, DESTINATION, 4) == ["g:archived", "g:0", "g:1", "g:2"]

        # the first 3 of the cluster: the node asked moves its 2, then node 1 the 1 that leaves of 3
        send(first, SOURCE, [("x", "x:0"), ("x", "x:1")])
        send(second, SOURCE, [("y", "y:0"), ("y", "y:1")])
        result = first.cli("queue", "reroute", SOURCE, "--to", DESTINATION, "--count", "3")
        assert result.returncode == 0, result.stderr
        assert "rerouted 3 messages" in result.stdout
        assert sorted(drain(first, DESTINATION, 2) + drain(second, DESTINATION, 1)) == ["x:0", "x:1", "y:0"]
        assert drain(second, SOURCE, 1) == ["y:1"]
        cluster.wait_for(lambda status: not status["in_transit"], "nothing in transit")
        groups = cluster.groups(SOURCE) + cluster.groups(DESTINATION)
        assert all(row["messages"] == 0 for row in groups), groups
    finally:
        cluster.kill_all()
