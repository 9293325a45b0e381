"""Cluster-wide queue definitions against three real node processes: `grouper queue add / update /
delete` through one node act on every node (handler/queue_definitions.py, replicated by raft).

What each node holds is read through its own admin API (`queue list --json`), and settings are
checked by what they do: with no consumer anywhere, a group stays on its producer's node, so a depth
limit defined through node 0 refuses sends at node 1.
"""

from __future__ import annotations

import json

from proton import Delivery

from tests.integration.cluster import free_ports
from tests.integration.clients import queue_toml
from tests.integration.harness import NodeProcess, grouped, send_outcome, wait_until

QUEUE = "orders"


def queues_of(node) -> dict[str, dict]:
    result = node.cli("queue", "list", "--json", "--local")  # what this node holds
    assert result.returncode == 0, result.stderr
    return {stats["name"]: stats for stats in json.loads(result.stdout)}


def outcome(sender, body: str, group: str) -> str:
    state, condition = send_outcome(sender, grouped(body, group))
    return "accepted" if state == Delivery.ACCEPTED else f"refused ({condition})"


def test_add_update_and_delete_act_on_every_node_and_a_restarted_node_catches_up(cluster_factory, clients):
    cluster = cluster_factory(queue_toml("seeded", groups_max=50))
    first, second, third = cluster.nodes

    added = first.cli("queue", "add", QUEUE, "--depth-max-messages", "2", "--group-buckets", "16")
    assert added.returncode == 0, added.stderr
    for node in cluster.nodes:
        wait_until(lambda: QUEUE in queues_of(node), f"{QUEUE} on {node.admin_address}")

    # no consumer anywhere: node 1 keeps its producer's groups, so node 0's limit is what refuses here
    sender = clients.connection(second).create_sender(QUEUE, name="producer")
    assert [outcome(sender, f"m{n}", f"g{n}") for n in range(3)] == \
        ["accepted", "accepted", "refused (amqp:resource-limit-exceeded)"]

    updated = third.cli("queue", "update", QUEUE, "--depth-max-messages", "3")
    assert updated.returncode == 0, updated.stderr
    # node 1 may apply the update a moment after node 2 answered: a refused send changes nothing
    wait_until(lambda: outcome(sender, "m3", "g3") == "accepted", "the new limit at node 1")

    refused = third.cli("queue", "update", QUEUE, "--group-buckets", "4")
    assert refused.returncode == 1 and "group_buckets cannot change on a live queue" in refused.stderr

    conflicting = second.cli("queue", "add", QUEUE, "--group-buckets", "8")
    assert conflicting.returncode == 1 and "ALREADY_EXISTS" in conflicting.stderr, conflicting.stderr

    # a config file's queue is a cluster-wide definition too: it can be updated through any node
    seeded = third.cli("queue", "update", "seeded", "--groups-max", "60")
    assert seeded.returncode == 0, seeded.stderr

    # a node that was down meanwhile gets what it missed from the raft log when it comes back
    third.kill()
    late = first.cli("queue", "add", "late", "--no-durable")
    assert late.returncode == 0, late.stderr
    third.start()
    wait_until(lambda: "late" in queues_of(third), "the late queue on the restarted node")

    # the delete is refused while node 1 holds messages of the queue, naming it and the depth
    busy = first.cli("queue", "delete", QUEUE)
    assert busy.returncode == 1, busy.stderr
    assert "FAILED_PRECONDITION" in busy.stderr and f"node {cluster.node_ids[1]}: 3" in busy.stderr, busy.stderr
    assert all(QUEUE in queues_of(node) for node in cluster.nodes)

    forced = first.cli("queue", "delete", QUEUE, "--force")
    assert forced.returncode == 0, forced.stderr
    for node in cluster.nodes:
        wait_until(lambda: QUEUE not in queues_of(node), f"{QUEUE} gone from {node.admin_address}")
    missing = first.cli("queue", "delete", QUEUE)
    assert missing.returncode == 1 and "NOT_FOUND" in missing.stderr, missing.stderr

    # node 1 journalled both the queue and its deletion: restarted, it does not bring the queue back
    second.restart()
    cluster.wait_leader()
    assert QUEUE not in queues_of(second)
    assert "late" in queues_of(second) and "seeded" in queues_of(second)


def test_a_node_that_joins_later_gets_every_definition_and_none_deleted(cluster_factory, clients, tmp_path):
    cluster = cluster_factory()
    first = cluster.nodes[0]
    for command in (("queue", "add", "early", "--groups-max", "7"), ("queue", "add", "gone"),
                    ("queue", "delete", "gone")):
        result = first.cli(*command)
        assert result.returncode == 0, (command, result.stderr)
    # --join asks a member at its host and this node's admin port: on one machine, the joiner takes
    # another loopback address and node 0's admin port number (as tests/integration/test_rejoin.py)
    [port] = free_ports(1)
    joiner = NodeProcess(tmp_path / "joiner", "", ("--host", "127.0.0.2", "--raft-port", str(port),
                                                  "--peers", cluster.node_ids[0], "--join"))
    joiner._admin_port = int(first.admin_address.rsplit(":", 1)[1])
    try:
        joiner.start()
        wait_until(lambda: "early" in queues_of(joiner), "the definition on the node that joined")
        assert "gone" not in queues_of(joiner)
        # and the joiner's own commands act on the founders
        assert joiner.cli("queue", "add", "from-joiner").returncode == 0
        for node in cluster.nodes:
            wait_until(lambda: "from-joiner" in queues_of(node), f"from-joiner on {node.admin_address}")
    finally:
        joiner.kill()
