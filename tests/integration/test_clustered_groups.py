"""Artemis's clustered-grouping scenarios, in our words, against three real node processes.

Each test starts a 3-node cluster on 127.0.0.1 (raft, gRPC peers, AMQP), attaches consumers on
some nodes, waits until the route table knows them (so placement is deterministic), then sends
through any node and checks where each group went, in what order, and that no group is split.
"""

from __future__ import annotations

import json
import signal
import time

from proton import Delivery

from tests.integration.clients import queue_toml
from tests.integration.harness import ManualReceiver, close_quietly, connect, grouped, send_outcome

QUEUE = "orders"


class Clients:
    """Connections opened by a test, closed at its end."""

    def __init__(self):
        self.connections = []

    def connection(self, node):
        connection = connect(node)
        self.connections.append(connection)
        return connection

    def consumer(self, node, queue: str, name: str, credit: int = 100) -> ManualReceiver:
        return ManualReceiver(self.connection(node), queue, name, credit=credit)

    def send(self, node, queue: str, messages, name: str = "producer") -> None:
        sender = self.connection(node).create_sender(queue, name=name)
        for message in messages:
            state, condition = send_outcome(sender, message)
            assert state == Delivery.ACCEPTED, (message.body, condition)

    def close(self):
        for connection in self.connections:
            close_quietly(connection)


def bodies(helds) -> list[str]:
    for held in helds:
        held.accept()
    return [held.body for held in helds]


def by_group(received: list[str]) -> dict[str, list[int]]:
    groups: dict[str, list[int]] = {}
    for body in received:
        group, seq = body.rsplit(":", 1)
        groups.setdefault(group, []).append(int(seq))
    return groups


def test_a_group_sent_via_any_node_reaches_the_same_consumer_in_order(cluster, clients):
    consumers = [clients.consumer(node, QUEUE, f"c{i}") for i, node in enumerate(cluster.nodes)]
    cluster.wait_consumers(QUEUE, {0: 1, 1: 1, 2: 1})
    for i, node in enumerate(cluster.nodes):
        clients.send(node, QUEUE, [grouped(f"g:{i * 10 + n}", "g") for n in range(5)], name=f"p{i}")
    received = [bodies(consumer.fetch_many(15)) if i == 0 else [] for i, consumer in enumerate(consumers)]
    # the first message came in at node 0, which has a consumer: the group lives there
    assert by_group(received[0])["g"] == [*range(5), *range(10, 15), *range(20, 25)]
    for consumer in consumers[1:]:
        assert consumer.poll() is None


def test_groups_spread_over_consumers_on_different_nodes(cluster, clients):
    consumers = {i: clients.consumer(cluster.nodes[i], QUEUE, f"c{i}") for i in (1, 2)}
    cluster.wait_consumers(QUEUE, {1: 1, 2: 1})
    groups = [f"g{n}" for n in range(10)]
    clients.send(cluster.nodes[0], QUEUE, [grouped(f"{g}:{seq}", g) for seq in range(3) for g in groups])
    received = drain(consumers, 30)
    seen = {i: by_group(r) for i, r in received.items()}
    assert len(seen[1]) == len(seen[2]) == 5  # fewest routes first: an even spread
    assert not set(seen[1]) & set(seen[2])  # no group at both
    for groups_of_node in seen.values():
        assert all(seqs == [0, 1, 2] for seqs in groups_of_node.values())
    rows = cluster.groups(QUEUE)
    assert {row["node"] for row in rows} <= {cluster.node_ids[1], cluster.node_ids[2]}


def drain(consumers: dict, count: int) -> dict:
    """Accept from every consumer until `count` messages came in all together: node index -> bodies."""
    received = {i: [] for i in consumers}
    while sum(len(r) for r in received.values()) < count:
        progressed = False
        for i, consumer in consumers.items():
            held = consumer.poll()
            if held is not None:
                received[i].append(held.body)
                held.accept()
                progressed = True
        if not progressed:
            for i, consumer in consumers.items():
                received[i].extend(bodies(consumer.fetch_many(1)))
    return received


def test_balanced_placement_spreads_one_producers_new_groups_over_every_nodes_consumers(cluster, clients):
    consumers = {i: clients.consumer(node, QUEUE, f"c{i}") for i, node in enumerate(cluster.nodes)}
    cluster.wait_consumers(QUEUE, {0: 1, 1: 1, 2: 1})
    groups = [f"g{n}" for n in range(30)]
    clients.send(cluster.nodes[0], QUEUE, [grouped(f"{g}:{seq}", g) for seq in range(3) for g in groups])
    seen = {i: by_group(r) for i, r in drain(consumers, 90).items()}
    # fewest groups per consumer, node 0 keeping near-ties: 11, 10, 9; at least 5 each cannot flake
    assert all(len(seen[i]) >= 5 for i in seen), {i: len(seen[i]) for i in seen}
    assert sum(len(seen[i]) for i in seen) == 30  # no group at two nodes
    for groups_of_node in seen.values():
        assert all(seqs == [0, 1, 2] for seqs in groups_of_node.values())
    nodes = {row["group"]: row["node"] for row in cluster.groups(QUEUE)}
    for i, groups_of_node in seen.items():
        assert all(nodes[group] == cluster.node_ids[i] for group in groups_of_node)


def test_local_placement_keeps_a_producers_new_groups_on_its_node_while_it_has_a_consumer(cluster_factory, clients):
    cluster = cluster_factory("", "--placement", "local")
    consumers = {i: clients.consumer(node, QUEUE, f"c{i}") for i, node in enumerate(cluster.nodes)}
    cluster.wait_consumers(QUEUE, {0: 1, 1: 1, 2: 1})
    clients.send(cluster.nodes[0], QUEUE, [grouped(f"g{n}:0", f"g{n}") for n in range(6)])
    assert sorted(bodies(consumers[0].fetch_many(6))) == sorted(f"g{n}:0" for n in range(6))
    assert consumers[1].poll() is None and consumers[2].poll() is None


def test_a_node_without_consumers_is_not_chosen_while_another_has_one(cluster, clients):
    consumer = clients.consumer(cluster.nodes[2], QUEUE, "c2")
    idle = clients.consumer(cluster.nodes[1], "elsewhere", "c1")  # a consumer, but on another queue
    cluster.wait_consumers(QUEUE, {0: 0, 1: 0, 2: 1})
    clients.send(cluster.nodes[0], QUEUE, [grouped(f"g{n}:0", f"g{n}") for n in range(6)])
    assert sorted(bodies(consumer.fetch_many(6))) == sorted(f"g{n}:0" for n in range(6))
    assert idle.poll() is None
    status = cluster.status()
    assert {m["node"]: m["routes"] for m in status["members"]}[cluster.node_ids[2]] == 6


def test_two_queues_are_grouped_independently(cluster, clients):
    on_a = clients.consumer(cluster.nodes[1], "queue-a", "ca")
    on_b = clients.consumer(cluster.nodes[2], "queue-b", "cb")
    cluster.wait_consumers("queue-a", {1: 1})
    cluster.wait_consumers("queue-b", {2: 1})
    clients.send(cluster.nodes[0], "queue-a", [grouped(f"g:{n}", "g") for n in range(3)], name="pa")
    clients.send(cluster.nodes[0], "queue-b", [grouped(f"g:{n}", "g") for n in range(3)], name="pb")
    assert bodies(on_a.fetch_many(3)) == ["g:0", "g:1", "g:2"]
    assert bodies(on_b.fetch_many(3)) == ["g:0", "g:1", "g:2"]
    nodes = {(row["group"], row["node"]) for row in cluster.groups("queue-a")}
    assert nodes <= {("g", cluster.node_ids[1])}


def test_a_deleted_queues_stale_routes_are_proposed_again(cluster, clients):
    first = clients.consumer(cluster.nodes[1], QUEUE, "first")
    cluster.wait_consumers(QUEUE, {1: 1})
    clients.send(cluster.nodes[0], QUEUE, [grouped("g:0", "g")], name="p1")
    assert bodies(first.fetch_many(1)) == ["g:0"]
    first.close()
    result = cluster.nodes[2].cli("queue", "delete", QUEUE)  # on every node, through any (it is empty)
    assert result.returncode == 0, result.stderr
    cluster.wait_for(lambda s: s["routes"] == 0, "the deleted queue's routes dropped")
    second = clients.consumer(cluster.nodes[2], QUEUE, "second")
    cluster.wait_consumers(QUEUE, {1: 0, 2: 1})
    clients.send(cluster.nodes[0], QUEUE, [grouped("g:1", "g")], name="p2")
    assert bodies(second.fetch_many(1)) == ["g:1"]


def test_a_group_moved_into_another_queue_lives_where_its_messages_went(cluster_factory, clients):
    cluster = cluster_factory(queue_toml("archive"))
    clients.consumer(cluster.nodes[1], QUEUE, "idle", credit=0)  # places the group on node 1, takes nothing
    cluster.wait_consumers(QUEUE, {1: 1})
    clients.send(cluster.nodes[0], QUEUE, [grouped(f"g:{n}", "g") for n in range(2)], name="p1")
    cluster.wait_for(lambda s: s["routes"] == 1, "the group's route")

    moved = cluster.nodes[2].cli("group", "move", QUEUE, "g", "archive")  # acts where the messages are
    assert moved.returncode == 0, moved.stderr
    # node 1 put them in its archive queue: the group's route there names node 1 at once, before any
    # send could place it by the consumers (only node 2's, below) and split it
    cluster.wait_for(lambda s: s["routes"] == 2, "the moved group's route in archive")
    elsewhere = clients.consumer(cluster.nodes[2], "archive", "elsewhere", credit=10)
    cluster.wait_consumers("archive", {2: 1})
    clients.send(cluster.nodes[0], "archive", [grouped("g:2", "g")], name="p2")

    here = clients.consumer(cluster.nodes[1], "archive", "here", credit=10)
    assert bodies(here.fetch_many(3)) == ["g:0", "g:1", "g:2"]
    assert elsewhere.poll() is None


def test_group_timeout_expires_idle_routes(cluster_factory, clients):
    cluster = cluster_factory("", "--group-timeout-ms", "1000")
    consumer = clients.consumer(cluster.nodes[1], QUEUE, "c1")
    cluster.wait_consumers(QUEUE, {1: 1})
    clients.send(cluster.nodes[0], QUEUE, [grouped(f"g{n}:0", f"g{n}") for n in range(3)])
    assert cluster.status()["routes"] == 3
    held = consumer.fetch_many(3)
    # while a message of each group is unsettled at its owner, the routes are kept
    cluster.wait_for(lambda s: True, "one more status")
    assert cluster.status()["routes"] == 3
    bodies(held)
    # settled, but the consumer still owns its groups (exclusive, the default policy): kept while it
    # does, through twice the group timeout (a route nobody refreshed would be gone by then)
    kept_until_s = time.monotonic() + 2.0
    while time.monotonic() < kept_until_s:
        assert cluster.status()["routes"] == 3
    consumer.close()
    cluster.wait_for(lambda s: s["routes"] == 0, "idle routes expired", timeout_s=10)


def test_routes_max_limits_live_routes_so_a_full_table_frees_its_slots_as_groups_go_idle(cluster_factory, clients):
    routes_max = 4
    cluster = cluster_factory(f"[node]\nroutes_max = {routes_max}\n", "--group-timeout-ms", "1000")
    consumer = clients.consumer(cluster.nodes[1], QUEUE, "first")
    cluster.wait_consumers(QUEUE, {1: 1})
    clients.send(cluster.nodes[0], QUEUE, [grouped(f"old{n}:0", f"old{n}") for n in range(routes_max)])
    assert cluster.status()["routes"] == routes_max
    sender = clients.connection(cluster.nodes[0]).create_sender(QUEUE, name="past-the-limit")
    assert send_outcome(sender, grouped("new0:0", "new0")) == (Delivery.REJECTED, "amqp:resource-limit-exceeded")
    assert sorted(bodies(consumer.fetch_many(routes_max))) == [f"old{n}:0" for n in range(routes_max)]
    consumer.close()  # the groups go idle: no messages, no owner
    cluster.wait_for(lambda s: s["routes"] == 0, "idle routes expired", timeout_s=15)
    second = clients.consumer(cluster.nodes[2], QUEUE, "second")
    cluster.wait_consumers(QUEUE, {1: 0, 2: 1})
    clients.send(cluster.nodes[0], QUEUE, [grouped(f"new{n}:0", f"new{n}") for n in range(routes_max)], name="p2")
    assert sorted(bodies(second.fetch_many(routes_max))) == [f"new{n}:0" for n in range(routes_max)]


def test_a_pinned_nodes_restart_keeps_its_groups_and_queued_messages(cluster, clients):
    owner = cluster.nodes[1]
    consumer = clients.consumer(owner, QUEUE, "c1")
    cluster.wait_consumers(QUEUE, {1: 1})
    clients.send(cluster.nodes[0], QUEUE, [grouped("g:0", "g")], name="p1")
    assert bodies(consumer.fetch_many(1)) == ["g:0"]
    consumer.close()
    clients.send(cluster.nodes[0], QUEUE, [grouped("g:1", "g")], name="p2")  # queued at its owner
    owner.kill()
    # accepted into node 0's outbound store while the owner is down
    clients.send(cluster.nodes[0], QUEUE, [grouped(f"g:{n}", "g") for n in (2, 3)], name="p3")
    owner.start()
    consumer = clients.consumer(owner, QUEUE, "c1-again")
    assert bodies(consumer.fetch_many(3)) == ["g:1", "g:2", "g:3"]
    others = clients.consumer(cluster.nodes[2], QUEUE, "c2")
    clients.send(cluster.nodes[2], QUEUE, [grouped("g:4", "g")], name="p4")
    assert bodies(consumer.fetch_many(1)) == ["g:4"]  # the route still names node 1
    assert others.poll() is None


def test_without_a_majority_new_groups_are_refused_with_the_handler_condition(cluster_factory, clients):
    # one copy: with replication (the default) a known group whose backup died waits until raft takes the
    # backup out of the in-sync set, which needs a majority (docs/replica-streams.md)
    cluster = cluster_factory("[node]\nreplication_factor = 1\n", "--handler-timeout-ms", "1500")
    consumer = clients.consumer(cluster.nodes[0], QUEUE, "c0")
    cluster.wait_consumers(QUEUE, {0: 1})
    clients.send(cluster.nodes[0], QUEUE, [grouped("known:0", "known")], name="p1")
    assert bodies(consumer.fetch_many(1)) == ["known:0"]
    cluster.nodes[1].kill()
    cluster.nodes[2].kill()
    sender = clients.connection(cluster.nodes[0]).create_sender(QUEUE, name="p2")
    state, condition = send_outcome(sender, grouped("new:0", "new"))
    assert (state, condition) == (Delivery.REJECTED, "grouper:grouping-handler-unavailable")
    # a group whose route is already known keeps flowing: its order cannot be broken by it
    state, condition = send_outcome(sender, grouped("known:1", "known"))
    assert state == Delivery.ACCEPTED
    assert bodies(consumer.fetch_many(1)) == ["known:1"]


def test_a_node_joins_and_leaves_without_restarting_the_others(cluster, clients, tmp_path):
    from tests.integration.cluster import free_ports
    from tests.integration.harness import NodeProcess

    [port] = free_ports(1)
    joiner_id = f"127.0.0.1:{port}"
    joiner = NodeProcess(tmp_path / "joiner", "", ("--raft-port", str(port),
                                                  "--peers", ",".join([*cluster.node_ids, joiner_id])))
    try:
        joiner.start()
        result = cluster.nodes[0].cli("cluster", "add-node", joiner_id)
        assert result.returncode == 0, result.stderr
        cluster.wait_for(lambda s: joiner_id in [m["node"] for m in s["members"] if m["amqp_address"]],
                         "the new node registered")
        consumer = clients.consumer(joiner, QUEUE, "cj")
        cluster.wait_for(lambda s: {m["node"]: m["consumers"] for m in s["members"]}[joiner_id].get(QUEUE) == 1,
                         "the new node's consumer known")
        clients.send(joiner, QUEUE, [grouped(f"g:{n}", "g") for n in range(3)])
        assert bodies(consumer.fetch_many(3)) == ["g:0", "g:1", "g:2"]
        result = cluster.nodes[1].cli("cluster", "remove-node", joiner_id)
        assert result.returncode == 0, result.stderr
        assert "dropped 1 route" in result.stdout
        status = cluster.wait_for(lambda s: joiner_id not in [m["node"] for m in s["members"]]
                                  and s["routes"] == 0, "the node removed, forgotten and its route dropped")
        assert status["leader"] in cluster.node_ids
        # it still runs with its consumer, but new groups go to members only (finding 11)
        clients.send(cluster.nodes[0], QUEUE, [grouped(f"n:{n}", f"new{n}") for n in range(5)])
        status = cluster.wait_for(lambda s: s["routes"] == 5, "the new groups placed")
        assert sum(m["routes"] for m in status["members"]) == 5, status
        assert joiner_id not in [m["node"] for m in status["members"]], status
        again = cluster.nodes[1].cli("cluster", "remove-node", joiner_id)  # the node that saw its removal commit
        assert again.returncode != 0 and f"{joiner_id} is not a member of the raft cluster" in again.stderr, again
    finally:
        joiner.kill()


def test_with_owner_failover_a_dead_owners_groups_move_to_a_live_node_and_it_is_marked_up_on_return(cluster_factory, clients):
    cluster = cluster_factory("", "--owner-failover-ms", "1000")
    owner, spare = cluster.nodes[1], cluster.nodes[2]
    on_owner = clients.consumer(owner, QUEUE, "c1")
    on_spare = clients.consumer(spare, QUEUE, "c2")
    cluster.wait_consumers(QUEUE, {1: 1, 2: 1})
    clients.send(owner, QUEUE, [grouped("g:0", "g")], name="p1")  # placed on node 1, which has a consumer
    assert bodies(on_owner.fetch_many(1)) == ["g:0"]
    owner.kill()
    status = cluster.wait_for(lambda s: any(m["down"] for m in s["members"]), "the dead owner marked down",
                              via=0)
    assert [m["node"] for m in status["members"] if m["down"]] == [cluster.node_ids[1]]
    clients.send(cluster.nodes[0], QUEUE, [grouped("g:1", "g")], name="p2")
    assert bodies(on_spare.fetch_many(1)) == ["g:1"]  # the group was placed afresh on a live node
    owner.start()  # registering again clears its down mark
    cluster.wait_for(lambda s: not any(m["down"] for m in s["members"]), "the owner marked up again")


def test_a_node_started_with_join_adds_itself_and_rejoins_after_a_restart(cluster, clients, tmp_path):
    from tests.integration.cluster import free_ports
    from tests.integration.harness import NodeProcess

    # --join asks a member at the member's host and this node's admin port: on one machine, the
    # joiner takes another loopback address and node 0's admin port number
    admin_port = cluster.nodes[0].admin_address.rsplit(":", 1)[1]
    [port] = free_ports(1)
    joiner_id = f"127.0.0.2:{port}"
    joiner = NodeProcess(tmp_path / "joiner", "", ("--host", "127.0.0.2", "--raft-port", str(port),
                                                  "--peers", cluster.node_ids[0], "--join"))
    joiner._admin_port = int(admin_port)
    try:
        joiner.start()
        assert any("joined the cluster" in line for line in joiner.output), joiner.output
        status = cluster.wait_for(lambda s: joiner_id in [m["node"] for m in s["members"] if m["amqp_address"]
                                                          and m["raft_member"]], "the joiner registered")
        assert status["leader"] in cluster.node_ids
        consumer = clients.consumer(joiner, QUEUE, "cj")
        cluster.wait_for(lambda s: {m["node"]: m["consumers"] for m in s["members"]}[joiner_id].get(QUEUE) == 1,
                         "the joiner's consumer known")
        clients.send(cluster.nodes[1], QUEUE, [grouped(f"g:{n}", "g") for n in range(3)])
        assert bodies(consumer.fetch_many(3)) == ["g:0", "g:1", "g:2"]
        joiner.kill()
        joiner.start()  # a member already: asks, finds itself in the membership, serves
        assert any("already a member" in line for line in joiner.output), joiner.output
    finally:
        joiner.kill()


def test_cluster_status_answers_while_a_member_hangs_naming_it_unreachable(cluster):
    # a stopped process neither answers nor closes its connections: as a partition looks to the others
    hung = cluster.nodes[2]
    hung.process.send_signal(signal.SIGSTOP)
    try:
        result = cluster.nodes[0].cli("cluster", "status", "--json", "--timeout-ms", "2500")
    finally:
        hung.process.send_signal(signal.SIGCONT)
    assert result.returncode == 0, result.stderr
    rows = {row["node"]: row for row in json.loads(result.stdout)["members"]}
    assert rows[cluster.node_ids[2]]["error"].startswith("unreachable"), rows[cluster.node_ids[2]]
    assert not rows[cluster.node_ids[1]]["error"], rows[cluster.node_ids[1]]
