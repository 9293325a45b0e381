"""Multicast addresses against real nodes and python-qpid-proton clients.

What is promised (README, "Multicast addresses"): a message sent to a multicast address is copied to
each of its subscription queues, each grouping by its own settings; ADDRESS::QUEUE names one of them;
a consumer attaching to the address with the 'topic' capability gets a subscription of its own, deleted
when its link ends unless it asked for a durable one (expiry policy never), which a reattach with the
same container id and link name resumes and a close ends; a send to an address with no subscription
is accepted and discarded, as Artemis does; a send refused (a full disk) is in no subscription; in a
cluster the node that takes the message fans it out and each subscription's groups go to their
owners, in order.
"""

from __future__ import annotations

import json
import os

from proton import Delivery, Terminus, symbol
from proton.reactor import LinkOption

from tests.integration.clients import Client, group_message, parse_body
from tests.integration.cluster import Cluster
from tests.integration.cli import write_users_file
from tests.integration.harness import ManualReceiver, NodeProcess, connect, link_refusal
from tests.integration import test_journal_disk_full as disk_full
from tests.integration.test_journal_disk_full import REFUSED_BODY_BYTES, fill, send, send_once_the_disk_takes_it
from tests.integration.test_node_endpoints import get, metric
from tests.integration.test_security import PASSWORD, assert_denied, link_outcome, login

CONFIG = """
[[address]]
name = "prices"
routing = "multicast"

[[address.queue]]
name = "prices.by-symbol"

[[address.queue]]
name = "prices.audit"
group_buckets = 0

[[address]]
name = "alerts"
"""
small_disk = disk_full.small_disk  # the fixture: a small tmpfs for the node's data directory, to fill
GROUPS = ("IBM", "ACME", "INTC")  # an odd count: round robin over two consumers splits every group
PER_GROUP = 4


class Topic(LinkOption):
    """The source capability asking for a subscription of one's own; `durable`: expiry policy never."""

    def __init__(self, durable: bool = False):
        self.durable = durable

    def apply(self, link) -> None:
        link.source.capabilities.put_symbol(symbol("topic"))
        if self.durable:
            link.source.expiry_policy = Terminus.EXPIRE_NEVER
            link.source.durability = Terminus.DELIVERIES


def prices() -> list:
    """PER_GROUP messages of each group, interleaved: IBM:0, ACME:0, ... IBM:1, ..."""
    return [group_message(group, seq) for seq in range(PER_GROUP) for group in GROUPS]


def by_consumer(*consumers) -> dict[str, list[tuple[str, int]]]:
    return {c.name: [parse_body(r.message) for r in c.take_all()] for c in consumers}


def assert_grouped_in_order(seen: dict[str, list[tuple[str, int]]]) -> None:
    """Every group whole at one consumer, in order; every message once."""
    owners: dict[str, set] = {}
    for name, bodies in seen.items():
        for group in {g for g, _ in bodies}:
            owners.setdefault(group, set()).add(name)
            assert [s for g, s in bodies if g == group] == list(range(PER_GROUP)), (name, group, bodies)
    assert sorted(owners) == sorted(GROUPS), owners
    assert all(len(names) == 1 for names in owners.values()), owners


def queue_names(node) -> list[str]:
    result = node.cli("queue", "list", "--json")
    assert result.returncode == 0, result.stderr
    return sorted(row["name"] for row in json.loads(result.stdout))


def test_a_multicast_send_reaches_every_subscription_each_grouping_on_its_own(node_factory):
    node = node_factory(CONFIG)
    with Client(node) as client:
        symbol_a = client.consumer("prices::prices.by-symbol", "symbol-a", credit=100)
        symbol_b = client.consumer("prices::prices.by-symbol", "symbol-b", credit=100)
        audit_a = client.consumer("prices.audit", "audit-a", credit=100)  # a subscription queue is a queue
        audit_b = client.consumer("prices::prices.audit", "audit-b", credit=100)
        client.producer("prices").send(*prices())
        assert_grouped_in_order(by_consumer(symbol_a, symbol_b))
        audit = by_consumer(audit_a, audit_b)
        assert sorted(m for bodies in audit.values() for m in bodies) == sorted(
            (g, s) for g in GROUPS for s in range(PER_GROUP))
        # round robin: with grouping off each consumer takes half, whatever the group
        assert len(audit["audit-a"]) == len(audit["audit-b"]) == len(GROUPS) * PER_GROUP // 2, audit
        assert all({g for g, _ in bodies} == set(GROUPS) for bodies in audit.values()), audit


def test_a_topic_attach_gets_a_subscription_of_its_own_deleted_when_its_link_ends(node_factory):
    node = node_factory(CONFIG)
    with Client(node, container_id="dashboard") as client:
        first = client.consumer("prices", "live-1", credit=100, options=(Topic(),))
        second = client.consumer("alerts", "live-2", credit=100, options=(Topic(),))
        private = [name for name in queue_names(node) if name.startswith("dashboard.")]
        assert len(private) == 2, queue_names(node)
        client.producer("prices").send(*prices())
        client.producer("alerts").send(group_message("IBM", 0))
        assert sorted(parse_body(r.message) for r in first.take_all()) == sorted(
            (g, s) for g in GROUPS for s in range(PER_GROUP))
        assert [parse_body(r.message) for r in second.take_all()] == [("IBM", 0)]
        first.close()
        second.close()
        assert [name for name in queue_names(node) if name.startswith("dashboard.")] == []
        # the declared subscriptions hold their copies still
        assert {"prices.audit", "prices.by-symbol"} <= set(queue_names(node))


def test_a_durable_subscription_outlives_a_detach_and_a_restart_and_ends_when_closed(node_factory):
    node = node_factory(CONFIG)
    with Client(node, container_id="app-1") as client:
        subscriber = client.consumer("prices", "sub-1", credit=10, options=(Topic(durable=True),))
        assert "app-1.sub-1" in queue_names(node)
        subscriber.link.detach()  # closed=false: suspended, the subscription stays
        client.wait_for(lambda: subscriber.link.state & subscriber.link.REMOTE_CLOSED, 10)
        client.producer("prices").send(*prices())
    node.restart()
    assert "app-1.sub-1" in queue_names(node)
    with Client(node, container_id="app-1") as client:
        subscriber = client.consumer("prices", "sub-1", credit=100, options=(Topic(durable=True),))
        seen = [parse_body(r.message) for r in subscriber.take_all()]
        assert sorted(seen) == sorted((g, s) for g in GROUPS for s in range(PER_GROUP))
        for group in GROUPS:
            assert [s for g, s in seen if g == group] == list(range(PER_GROUP))
        subscriber.accept(*subscriber.history)
        subscriber.close()  # closed=true: the client ends (unsubscribes) its durable subscription
        assert "app-1.sub-1" not in queue_names(node)


def test_a_send_to_a_multicast_address_without_subscriptions_is_accepted_and_discarded(node_factory):
    node = node_factory(CONFIG)
    with Client(node) as client:
        producer = client.producer("alerts")
        assert producer.send_outcomes([group_message("IBM", 0)]) == [Delivery.ACCEPTED]
        assert "alerts" not in queue_names(node)  # no anycast queue was made of the address's name
        assert metric(get(node, "/metrics")[1], 'grouper_multicast_unrouted_messages_total{address="alerts"}') == 1
        late = client.consumer("alerts", "late", credit=10)  # a plain attach to a multicast address subscribes
        producer.send(group_message("IBM", 1))
        assert [parse_body(r.message) for r in late.take_all()] == [("IBM", 1)]
        anonymous = client.producer(None)
        message = group_message("IBM", 2)
        message.address = "alerts"
        anonymous.send(message)
        assert [parse_body(r.message) for r in late.take_all()] == [("IBM", 2)]


def test_a_fully_qualified_name_must_name_a_subscription_of_that_address(node_factory):
    node = node_factory(CONFIG + '\n[[queue]]\nname = "orders"\n')
    for address in ("alerts::prices.audit", "orders::mine"):  # another address's queue; an anycast queue
        with Client(node) as client:
            refusal = link_refusal(lambda: client.connection.create_receiver(address, name="wrong"))
            assert refusal == "amqp:precondition-failed", address
    with Client(node) as client:  # an unknown one under a multicast address is created, as Artemis does
        made = client.consumer("alerts::alerts.archive", "archive", credit=10)
        client.producer("alerts").send(group_message("IBM", 0))
        assert [parse_body(r.message) for r in made.take_all()] == [("IBM", 0)]
        assert "alerts.archive" in queue_names(node)
        other = client.consumer("alerts::alerts.other", "other", credit=10)
        client.producer("alerts::alerts.archive").send(group_message("IBM", 1))  # to that subscription alone
        assert [parse_body(r.message) for r in made.take_all()] == [("IBM", 1)]
        assert other.take_all() == []
        assert link_refusal(lambda: client.connection.create_sender("alerts::nothing")) == "amqp:not-found"


CLUSTER_CONFIG = CONFIG + """
[[queue]]
name = "prices.buckets"
address = "prices"
group_buckets = 4
"""


def test_in_a_cluster_the_receiving_node_fans_out_and_each_subscriptions_groups_stay_in_order(tmp_path):
    cluster = Cluster(tmp_path, 3, CLUSTER_CONFIG).start()
    try:
        clients = [Client(node) for node in cluster.nodes]
        try:
            symbol_1 = clients[1].consumer("prices::prices.by-symbol", "symbol-1", credit=100)
            symbol_2 = clients[2].consumer("prices::prices.by-symbol", "symbol-2", credit=100)
            # ungrouped copies (group_buckets 0) stay on the node that took the send, as any ungrouped message
            audit_0 = clients[0].consumer("prices::prices.audit", "audit-0", credit=100)
            buckets_0 = clients[0].consumer("prices::prices.buckets", "buckets-0", credit=100)
            buckets_1 = clients[1].consumer("prices::prices.buckets", "buckets-1", credit=100)
            cluster.wait_consumers("prices.by-symbol", {0: 0, 1: 1, 2: 1})
            cluster.wait_consumers("prices.buckets", {0: 1, 1: 1, 2: 0})
            clients[0].producer("prices").send(*prices())
            seen = by_consumer(symbol_1, symbol_2)
            assert_grouped_in_order(seen)
            assert all(seen.values()), seen  # balanced placement gave both nodes' consumers groups
            audit = [parse_body(r.message) for r in audit_0.take_all()]
            assert sorted(audit) == sorted((g, s) for g in GROUPS for s in range(PER_GROUP))
            assert_grouped_in_order(by_consumer(buckets_0, buckets_1))  # a subscription declared as [[queue]]
            routes = cluster.groups("prices.by-symbol")
            assert sorted(row["group"] for row in routes) == sorted(GROUPS), routes
        finally:
            for client in clients:
                client.close()
    finally:
        cluster.kill_all()


def test_a_send_one_subscription_would_refuse_is_rejected_and_copies_nothing(node_factory):
    node = node_factory(CONFIG.replace('group_buckets = 0', 'group_buckets = 0\ndepth_max_messages = 1'))
    with Client(node) as client:
        producer = client.producer("prices")
        assert producer.send_outcomes([group_message("IBM", 0), group_message("IBM", 1)]) == [
            Delivery.ACCEPTED, Delivery.REJECTED]
        symbol_reader = client.consumer("prices.by-symbol", "symbol", credit=10)
        assert [parse_body(r.message) for r in symbol_reader.take_all()] == [("IBM", 0)]


def test_a_topic_attach_to_a_new_name_makes_it_a_multicast_address(node_factory):
    node = node_factory(CONFIG)
    with Client(node, container_id="watcher") as client:
        first = client.consumer("news", "one", credit=10, options=(Topic(),))
        second = client.consumer("news", "two", credit=10, options=(Topic(),))
        client.producer("news").send(group_message("IBM", 0))
        assert [parse_body(r.message) for r in first.take_all()] == [("IBM", 0)]
        assert [parse_body(r.message) for r in second.take_all()] == [("IBM", 0)]
        assert "news" not in queue_names(node)


def test_sending_needs_send_on_the_address_and_consuming_needs_consume_on_the_subscription(node_factory, tmp_path):
    users = write_users_file(tmp_path / "users.json", {"publisher": "send:prices", "auditor": "consume:prices.audit"},
                             {"publisher": "publisher", "auditor": "auditor"}, PASSWORD)
    node = node_factory(CONFIG, "--users-file", str(users), "--sasl-plain-on-loopback")
    publisher = login(node.amqp_address, "publisher")
    auditor = login(node.amqp_address, "auditor")
    try:
        assert link_outcome(publisher, "send", "prices") is None
        assert_denied(link_outcome(publisher, "consume", "prices::prices.audit"), "publisher", "consume",
                      "prices.audit")
        assert link_outcome(auditor, "consume", "prices::prices.audit") is None
        assert_denied(link_outcome(auditor, "consume", "prices::prices.by-symbol"), "auditor", "consume",
                      "prices.by-symbol")
        assert_denied(link_outcome(auditor, "send", "prices"), "auditor", "send", "prices")
        assert_denied(link_outcome(auditor, "consume", "prices"), "auditor", "consume", "prices")  # a topic one
    finally:
        publisher.close()
        auditor.close()


def test_a_multicast_send_a_full_disk_refused_is_taken_back_from_every_subscription(small_disk):
    node = NodeProcess(small_disk / "node", CONFIG).start()
    try:
        connection = connect(node)
        try:
            sender = connection.create_sender("prices")
            assert send(sender, "before")[0] == Delivery.ACCEPTED  # one copy queued in each subscription
            filler = fill(small_disk)
            state, condition, description = send(sender, "r" * REFUSED_BODY_BYTES)  # one settlement for both
            assert (state, condition) == (Delivery.REJECTED, "amqp:resource-limit-exceeded"), description
            readers = [ManualReceiver(connection, f"prices::{name}", name, credit=10)
                       for name in ("prices.by-symbol", "prices.audit")]
            os.remove(filler)
            send_once_the_disk_takes_it(sender, "after")
            for reader in readers:
                bodies = []
                while "after" not in bodies:
                    bodies.append(reader.fetch().body)
                assert bodies == ["before", "after"], reader.name  # the refused send in neither
        finally:
            connection.close()
    finally:
        node.kill()
