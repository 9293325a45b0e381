"""Message grouping as ActiveMQ Artemis users expect it, against a real node on 127.0.0.1.

Scenarios from the Artemis grouping chapter (seed 002): sticky groups spread over consumers,
rebalancing on attach (with and without pausing dispatch), group buckets, grouping switched off
with zero buckets, the group-first key, closing a group with sequence -1, failover of an exclusive
owner's unsettled messages, and resetting groups from the management CLI.

Credit is the prefetch: where a scenario needs "the owner cannot take more", the owner is given
exactly the credit the scenario uses up, so which consumer gets a message is never left to a tie.
"""

from __future__ import annotations

import json

import pytest

from tests.integration.clients import FIRST_KEY, QUIET_S, Client, by_group, group_message, owners, queue_toml

QUEUE = "orders"


def config(**settings) -> str:
    return queue_toml(QUEUE, durable=False, **settings)


def assert_each_group_in_order(received) -> None:
    for group, items in by_group(received).items():
        seqs = [r.seq for r in items]
        assert seqs == sorted(seqs), f"group {group} delivered out of order: {items}"


def assert_one_owner_per_group(received) -> None:
    shared = {group: names for group, names in owners(received).items() if len(names) > 1}
    assert not shared, f"groups delivered to more than one consumer: {shared}"


def test_groups_spread_over_consumers_and_each_group_sticks_to_one_of_them(node_factory):
    node = node_factory(config())
    groups = [f"g{i}" for i in range(9)]
    with Client(node) as client:
        consumers = [client.consumer(QUEUE, f"c{i}", credit=200) for i in range(3)]
        producer = client.producer(QUEUE)
        # half the groups name themselves in properties.group-id, half in JMSXGroupID
        producer.send(*[group_message(g, seq, jms=index % 2 == 1)
                        for seq in range(1, 11) for index, g in enumerate(groups)])
        first_round = client.collect(consumers, 90)

        assert sorted((r.group, r.seq) for r in first_round) == sorted((g, s) for g in groups for s in range(1, 11))
        assert_one_owner_per_group(first_round)
        assert_each_group_in_order(first_round)
        assert {r.consumer.name for r in first_round} == {"c0", "c1", "c2"}, "a consumer got no group"

        for consumer in consumers:
            consumer.accept(*[r for r in first_round if r.consumer is consumer])
        producer.send(*[group_message(g, 11, jms=index % 2 == 1) for index, g in enumerate(groups)])
        second_round = client.collect(consumers, 9)

        before = {g: names.pop() for g, names in owners(first_round).items()}
        after = {g: names.pop() for g, names in owners(second_round).items()}
        assert after == before, "a group changed owner although its owner stayed attached"


def test_without_rebalance_a_late_consumer_gets_none_of_the_owned_groups(node_factory):
    node = node_factory(config())
    groups = [f"g{i}" for i in range(6)]
    with Client(node) as client:
        early = client.consumer(QUEUE, "early", credit=100)
        producer = client.producer(QUEUE)
        producer.send(*[group_message(g, 1) for g in groups])
        early.accept(*client.collect([early], 6))

        late = client.consumer(QUEUE, "late", credit=100)
        producer.send(*[group_message(g, 2) for g in groups])
        received = client.collect([early, late], 6)

        assert {r.consumer.name for r in received} == {"early"}


def test_rebalance_gives_a_late_consumer_some_of_the_owned_groups(node_factory):
    node = node_factory(config(group_rebalance=True))
    groups = [f"g{i}" for i in range(6)]
    with Client(node) as client:
        early = client.consumer(QUEUE, "early", credit=100)
        producer = client.producer(QUEUE)
        producer.send(*[group_message(g, 1) for g in groups])
        early.accept(*client.collect([early], 6))

        late = client.consumer(QUEUE, "late", credit=100)
        producer.send(*[group_message(g, seq) for seq in (2, 3) for g in groups])
        received = client.collect([early, late], 12)

        assert {r.consumer.name for r in received} == {"early", "late"}, \
            f"after a rebalance both consumers should own groups: {owners(received)}"
        assert_one_owner_per_group(received)
        assert_each_group_in_order(received)


def test_rebalance_without_pause_moves_a_group_while_its_messages_are_in_flight(node_factory):
    """Artemis' default: dispatch goes on during a rebalance, accepting the documented risk."""
    node = node_factory(config(group_rebalance=True))
    with Client(node) as client:
        early = client.consumer(QUEUE, "early", credit=3)
        producer = client.producer(QUEUE)
        producer.send(*[group_message("g", seq) for seq in (1, 2, 3)])
        in_flight = early.take(3)

        late = client.consumer(QUEUE, "late", credit=10)
        producer.send(*[group_message("g", seq) for seq in (4, 5, 6)])

        assert [r.seq for r in late.take(3)] == [4, 5, 6]
        early.accept(*in_flight)


def test_rebalance_with_pause_dispatch_moves_a_group_only_after_its_in_flight_messages_settle(node_factory):
    node = node_factory(config(group_rebalance=True, group_rebalance_pause_dispatch=True))
    with Client(node) as client:
        early = client.consumer(QUEUE, "early", credit=3)
        producer = client.producer(QUEUE)
        producer.send(*[group_message("g", seq) for seq in (1, 2, 3)])
        in_flight = early.take(3)

        late = client.consumer(QUEUE, "late", credit=10)
        producer.send(*[group_message("g", seq) for seq in (4, 5, 6)])
        assert late.take_all() == [], "the group moved while its earlier messages were still in flight"

        early.accept(*in_flight[:2])
        assert late.take_all() == [], "the group moved before the last in-flight message settled"

        early.accept(in_flight[2])
        assert [r.seq for r in late.take(3)] == [4, 5, 6]
        assert early.take_all() == []


def test_one_bucket_puts_every_group_on_the_same_consumer_in_queue_order(node_factory):
    node = node_factory(config(group_buckets=1))
    groups = [f"g{i}" for i in range(6)]
    with Client(node) as client:
        consumers = [client.consumer(QUEUE, f"c{i}", credit=100) for i in range(3)]
        client.producer(QUEUE).send(*[group_message(g, seq) for seq in range(1, 6) for g in groups])
        received = client.collect(consumers, 30)

        assert len({r.consumer.name for r in received}) == 1, f"one bucket, several owners: {owners(received)}"
        assert [(r.group, r.seq) for r in received] == [(g, s) for s in range(1, 6) for g in groups]


def test_more_groups_than_buckets_stay_in_order_and_sticky_per_bucket(node_factory):
    buckets = 2
    node = node_factory(config(group_buckets=buckets))
    groups = [f"g{i}" for i in range(20)]
    with Client(node) as client:
        consumers = [client.consumer(QUEUE, f"c{i}", credit=200) for i in range(4)]
        producer = client.producer(QUEUE)
        producer.send(*[group_message(g, seq) for seq in range(1, 6) for g in groups])
        first_round = client.collect(consumers, 100)

        assert_one_owner_per_group(first_round)
        assert_each_group_in_order(first_round)
        used = {r.consumer.name for r in first_round}
        assert 1 <= len(used) <= buckets, f"{buckets} buckets were spread over {sorted(used)}"

        listed = node.cli("groups", QUEUE, "--json")
        assert listed.returncode == 0, listed.stderr
        rows = json.loads(listed.stdout)
        assert 1 <= len(rows) <= buckets, f"the node tracks more than {buckets} buckets: {rows}"

        for consumer in consumers:
            consumer.accept(*[r for r in first_round if r.consumer is consumer])
        producer.send(*[group_message(g, 6) for g in groups])
        second_round = client.collect(consumers, 20)
        before = {g: names.pop() for g, names in owners(first_round).items()}
        after = {g: names.pop() for g, names in owners(second_round).items()}
        assert after == before, "a group changed owner although every bucket owner stayed attached"


def test_zero_buckets_turn_grouping_off_and_spread_a_group_round_robin(node_factory):
    node = node_factory(config(group_buckets=0))
    with Client(node) as client:
        consumers = [client.consumer(QUEUE, f"c{i}", credit=100) for i in range(2)]
        client.producer(QUEUE).send(*[group_message("g", seq) for seq in range(1, 11)])
        received = client.collect(consumers, 10)

        counts = {c.name: sum(1 for r in received if r.consumer is c) for c in consumers}
        assert counts == {"c0": 5, "c1": 5}, f"grouping off should spread round-robin, got {counts}"
        rows = json.loads(node.cli("groups", QUEUE, "--json").stdout)
        assert rows == [], f"with grouping off the node should track no group: {rows}"


def test_first_key_marks_only_a_new_owners_first_message_of_each_group(node_factory):
    node = node_factory(config(group_first_key=FIRST_KEY))
    with Client(node) as client:
        first = client.consumer(QUEUE, "first", credit=100)
        producer = client.producer(QUEUE)
        producer.send(group_message("a", 1), group_message("a", 2), group_message("b", 1),
                      group_message("a", 3), group_message("b", 2), group_message(None, 1))
        received = first.take(6)
        marks = {(r.group, r.seq): r.first_for_consumer for r in received}
        assert marks == {("a", 1): True, ("a", 2): False, ("b", 1): True, ("a", 3): False,
                         ("b", 2): False, ("None", 1): False}
        first.accept(*received)

        producer.send(group_message("a", 4))
        [again] = first.take(1)
        assert not again.first_for_consumer, "the owner did not change, yet the first key was set again"
        first.accept(again)
        first.close()

        second = client.consumer(QUEUE, "second", credit=100)
        producer.send(group_message("a", 5), group_message("a", 6))
        moved = second.take(2)
        assert [(r.seq, r.first_for_consumer) for r in moved] == [(5, True), (6, False)]


def test_first_key_marks_the_first_redelivered_message_of_a_group_that_failed_over(node_factory):
    node = node_factory(config(group_first_key=FIRST_KEY))
    with Client(node) as client:
        owner = client.consumer(QUEUE, "owner", credit=100)
        standby = client.consumer(QUEUE, "standby", credit=0)
        client.producer(QUEUE).send(*[group_message("a", seq) for seq in (1, 2, 3)])
        assert [r.first_for_consumer for r in owner.take(3)] == [True, False, False]

        standby.flow(100)
        owner.close()
        redelivered = standby.take(3)
        assert [(r.seq, r.first_for_consumer) for r in redelivered] == [(1, True), (2, False), (3, False)]


@pytest.mark.parametrize("close", ["jms", "amqp"])
def test_closing_message_goes_to_the_owner_then_the_group_is_free_for_another_consumer(node_factory, close):
    node = node_factory(config())
    with Client(node) as client:
        owner = client.consumer(QUEUE, "owner", credit=2)
        other = client.consumer(QUEUE, "other", credit=0)
        producer = client.producer(QUEUE)
        producer.send(group_message("g", 1))
        opened = owner.take(1)
        other.flow(10)

        producer.send(group_message("g", 2, close=close))
        closing = owner.take(1)
        assert other.take_all(QUIET_S) == [], "the closing message bypassed the owner"

        producer.send(group_message("g", 3))
        assert other.take_all(QUIET_S) == [], \
            "the group's next message went to another consumer while the closing message was in flight"

        owner.accept(*opened, *closing)
        [reopened] = other.take(1)
        assert reopened.seq == 3


def test_without_closing_a_group_waits_for_its_owner_even_when_another_consumer_is_idle(node_factory):
    node = node_factory(config())
    with Client(node) as client:
        owner = client.consumer(QUEUE, "owner", credit=2)
        other = client.consumer(QUEUE, "other", credit=0)
        producer = client.producer(QUEUE)
        producer.send(group_message("g", 1))
        owner.accept(*owner.take(1))
        other.flow(10)
        producer.send(group_message("g", 2))
        owner.accept(*owner.take(1))

        producer.send(group_message("g", 3))
        assert other.take_all(QUIET_S) == []
        owner.flow(1)
        assert [r.seq for r in owner.take(1)] == [3]


@pytest.mark.parametrize("leaves_by", ["link", "connection"])
def test_owner_leaving_with_unsettled_messages_hands_them_in_order_to_another_consumer(node_factory, leaves_by):
    node = node_factory(config())
    with Client(node) as client, Client(node) as owner_client:
        owner = owner_client.consumer(QUEUE, "owner", credit=10)
        standby = client.consumer(QUEUE, "standby", credit=0)
        producer = client.producer(QUEUE)
        producer.send(*[group_message("g", seq) for seq in range(1, 6)])
        first_five = owner.take(5)
        owner.accept(*first_five[:2])
        standby.flow(20)
        producer.send(group_message("g", 6), group_message("g", 7))
        assert [r.seq for r in owner.take(2)] == [6, 7], "the group left its owner while the owner was attached"

        if leaves_by == "link":
            owner.close()
        else:
            owner_client.close()

        handed_over = standby.take(5)
        assert [r.seq for r in handed_over] == [3, 4, 5, 6, 7]
        for item in handed_over:
            assert item.delivery_count >= 1, f"{item}: a redelivery must count the earlier delivery"
            assert item.message.first_acquirer is False, f"{item}: a redelivery is not a first acquisition"

        producer.send(group_message("g", 8))
        [fresh] = standby.take(1)
        assert (fresh.seq, fresh.delivery_count) == (8, 0)
        standby.accept(*handed_over, fresh)
        assert standby.take_all() == [], "an accepted message came back"


def test_group_reset_from_the_cli_frees_one_group_or_every_group(node_factory):
    node = node_factory(config())
    groups = ["g0", "g1", "g2", "g3"]
    with Client(node) as client:
        owner = client.consumer(QUEUE, "owner", credit=4)
        other = client.consumer(QUEUE, "other", credit=0)
        producer = client.producer(QUEUE)
        producer.send(*[group_message(g, 1) for g in groups])
        owner.accept(*owner.take(4))  # owner now owns every group and has no credit left
        other.flow(100)

        reset = node.cli("group", "reset", QUEUE, "g0")
        assert reset.returncode == 0, reset.stderr
        producer.send(*[group_message(g, 2) for g in groups])
        freed = other.take(1)
        assert [(r.group, r.seq) for r in freed] == [("g0", 2)]
        assert other.take_all() == [], "only the reset group may leave its owner"
        other.accept(*freed)

        owner.flow(3)
        still_owned = owner.take(3)
        assert sorted(r.group for r in still_owned) == ["g1", "g2", "g3"]
        owner.accept(*still_owned)

        reset_all = node.cli("group", "reset", QUEUE)
        assert reset_all.returncode == 0, reset_all.stderr
        producer.send(*[group_message(g, 3) for g in ["g1", "g2", "g3"]])
        moved = other.take(3)
        assert sorted((r.group, r.seq) for r in moved) == [("g1", 3), ("g2", 3), ("g3", 3)]


def test_group_reset_of_a_group_in_flight_waits_until_its_messages_settle(node_factory):
    node = node_factory(config())
    with Client(node) as client:
        owner = client.consumer(QUEUE, "owner", credit=1)
        other = client.consumer(QUEUE, "other", credit=0)
        producer = client.producer(QUEUE)
        producer.send(group_message("g", 1))
        in_flight = owner.take(1)
        other.flow(10)

        reset = node.cli("group", "reset", QUEUE, "g")
        assert reset.returncode == 0, reset.stderr
        producer.send(group_message("g", 2))
        assert other.take_all() == [], "a reset group moved while its earlier message was in flight"

        owner.accept(*in_flight)
        assert [r.seq for r in other.take(1)] == [2]
