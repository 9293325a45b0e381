"""Queues and subscriptions an attach makes in a cluster become cluster-wide definitions: three real
node processes and python-qpid-proton clients (node/core/cluster/definitions.py, "A queue this node
makes on a client's behalf").

Settings are read by what they do: an attach whose address parameters differ from a queue's settings
is refused naming both, one whose parameters match is kept, and `grouper queue update` finds the
definition through any node. A subscription is seen in every node's `queue list`, and its consumer
gets what any node takes for its address.
"""

from __future__ import annotations

import contextlib
import json

from tests.integration.clients import Client, group_message, parse_body
from tests.integration.cluster import Cluster
from tests.integration.harness import wait_until
from tests.integration.test_multicast import Topic
from tests.integration.test_security import link_outcome

GROUPS = ("IBM", "ACME", "INTC")
PER_GROUP = 4


def queue_names(node) -> set[str]:
    result = node.cli("queue", "list", "--json", "--local")  # what this node holds
    assert result.returncode == 0, result.stderr
    return {row["name"] for row in json.loads(result.stdout)}


def wait_everywhere(cluster: Cluster, present, name: str, nodes=None) -> None:
    for node in nodes or cluster.nodes:
        wait_until(lambda: (name in queue_names(node)) == present,
                   f"{name} {'on' if present else 'gone from'} {node.admin_address}")


def test_a_queue_an_attach_made_with_parameters_has_the_same_settings_on_every_node_and_a_late_one(tmp_path):
    cluster = Cluster(tmp_path, 3).start()
    try:
        cluster.nodes[2].kill()  # down while the queue is made: it learns of it from the raft log
        first, second = Client(cluster.nodes[0]), Client(cluster.nodes[1])
        third = None
        try:
            assert link_outcome(first.connection, "send", "orders.new?group-buckets=8") is None
            wait_everywhere(cluster, True, "orders.new", cluster.nodes[:2])
            refused = link_outcome(second.connection, "consume", "orders.new?group-buckets=16")
            assert refused is not None and refused.name == "amqp:precondition-failed", refused
            assert "group-buckets=8" in refused.description and "group-buckets=16" in refused.description, \
                refused.description
            cluster.nodes[2].start()
            wait_everywhere(cluster, True, "orders.new", cluster.nodes[2:])
            third = Client(cluster.nodes[2])
            assert link_outcome(third.connection, "consume", "orders.new?group-buckets=8") is None
            refused = link_outcome(third.connection, "send", "orders.new?group-buckets=4")
            assert refused is not None and "group-buckets=8" in refused.description, refused
            # a definition the cluster holds: an update through any node finds it
            updated = cluster.nodes[2].cli("queue", "update", "orders.new", "--depth-max-messages", "5")
            assert updated.returncode == 0, updated.stderr
        finally:
            for client in (first, second, third):
                if client is not None:
                    client.close()
    finally:
        cluster.kill_all()


def test_a_topic_subscriber_on_one_node_gets_what_every_node_takes_in_group_order_until_its_link_ends(tmp_path):
    cluster = Cluster(tmp_path, 3).start()
    try:
        clients = [Client(node, container_id=f"app{index}") for index, node in enumerate(cluster.nodes)]
        try:
            subscriber = clients[0].consumer("ticks", "live", credit=100, options=(Topic(),))
            name = wait_until(lambda: next((queue for queue in queue_names(cluster.nodes[0])
                                            if queue.startswith("app0.live.")), None), "the subscription queue")
            wait_everywhere(cluster, True, name)
            cluster.wait_consumers(name, {0: 1, 1: 0, 2: 0})
            # each group from one producer, sent through nodes 1 and 2: the node taking it fans it out
            for index, group in ((1, "IBM"), (2, "ACME"), (1, "INTC")):
                clients[index].producer("ticks").send(*(group_message(group, seq) for seq in range(PER_GROUP)))
            received = [parse_body(r.message) for r in subscriber.take(len(GROUPS) * PER_GROUP)]
            for group in GROUPS:
                assert [seq for g, seq in received if g == group] == list(range(PER_GROUP)), received
            subscriber.close()
            wait_everywhere(cluster, False, name)
        finally:
            for client in clients:
                client.close()
    finally:
        cluster.kill_all()


def test_a_temporary_subscription_of_a_node_marked_down_is_deleted_on_every_node(tmp_path):
    cluster = Cluster(tmp_path, 3, "", ("--owner-failover-ms", "1000")).start()
    try:
        client = Client(cluster.nodes[2], container_id="doomed")
        client.consumer("ticks", "live", credit=10, options=(Topic(),))
        name = wait_until(lambda: next((queue for queue in queue_names(cluster.nodes[2])
                                        if queue.startswith("doomed.live.")), None), "the subscription queue")
        wait_everywhere(cluster, True, name)
        cluster.nodes[2].kill()  # its link never ends: the node is gone under it
        with contextlib.suppress(Exception):
            client.close()
        # marked down after owner_failover_ms: the live nodes delete what no link can consume any more
        wait_everywhere(cluster, False, name, cluster.nodes[:2])
    finally:
        cluster.kill_all()


def test_queue_add_with_an_address_declares_a_subscription_on_every_node(tmp_path):
    cluster = Cluster(tmp_path, 3).start()
    try:
        same = cluster.nodes[0].cli("queue", "add", "prices", "--address", "prices")
        assert same.returncode != 0 and "--address" in same.stderr and "prices.subscriber" in same.stderr, same.stderr
        added = cluster.nodes[0].cli("queue", "add", "prices.audit", "--address", "prices")
        assert added.returncode == 0 and "subscribes to prices" in added.stdout, added.stderr
        wait_everywhere(cluster, True, "prices.audit")
        consumer_client, producer_client = Client(cluster.nodes[2]), Client(cluster.nodes[1])
        try:
            audit = consumer_client.consumer("prices::prices.audit", "audit", credit=100)
            cluster.wait_consumers("prices.audit", {0: 0, 1: 0, 2: 1})
            producer_client.producer("prices").send(*(group_message(group, seq) for seq in range(PER_GROUP)
                                                      for group in GROUPS))
            received = [parse_body(r.message) for r in audit.take(len(GROUPS) * PER_GROUP)]
            for group in GROUPS:
                assert [seq for g, seq in received if g == group] == list(range(PER_GROUP)), received
        finally:
            consumer_client.close()
            producer_client.close()
    finally:
        cluster.kill_all()


def test_a_durable_subscription_outlives_its_link_resumes_through_another_node_and_a_close_ends_it_everywhere(
        tmp_path):
    cluster = Cluster(tmp_path, 3).start()
    try:
        with Client(cluster.nodes[0], container_id="app") as client:
            subscriber = client.consumer("ticks", "keep", credit=10, options=(Topic(durable=True),))
            wait_everywhere(cluster, True, "app.keep")
            subscriber.link.detach()  # closed=false: suspended, the subscription stays on every node
            client.wait_for(lambda: subscriber.link.state & subscriber.link.REMOTE_CLOSED, 10)
        cluster.wait_consumers("app.keep", {0: 0, 1: 0, 2: 0})
        with Client(cluster.nodes[1]) as producer_client:
            producer_client.producer("ticks").send(*(group_message(group, seq) for seq in range(PER_GROUP)
                                                     for group in GROUPS))
        with Client(cluster.nodes[1], container_id="app") as client:  # the same container id and link name
            subscriber = client.consumer("ticks", "keep", credit=100, options=(Topic(durable=True),))
            received = [parse_body(r.message) for r in subscriber.take(len(GROUPS) * PER_GROUP)]
            for group in GROUPS:
                assert [seq for g, seq in received if g == group] == list(range(PER_GROUP)), received
            subscriber.accept(*subscriber.history)
            subscriber.close()  # closed=true: the client ends its durable subscription, on every node
        wait_everywhere(cluster, False, "app.keep")
    finally:
        cluster.kill_all()
