"""Grouped scenarios over real sockets, each run by every real client (proton container, proton
blocking, rhea): the node as a client library outside this project sees it.

Every scenario keeps its links on one connection, so the node reads the test's steps in the order
the test took them; credit is granted explicitly and "nothing more is available" is a drain round
trip, never a sleep. The queue QUEUE has exclusive groups and the node refuses unknown addresses
(conftest.py). Messages are named by group and position: "A2" is the second message of group A.
"""

from __future__ import annotations

import pytest

from tests.interop.conftest import QUEUE

ACCEPTED = ("accepted", None)


def messages(names: str, to: str | None = None) -> list[dict]:
    return [{"body": name, "group": name.rstrip("0123456789"), "to": to} for name in names.split()]


def bodies(held: list) -> list:
    return [item.body for item in held]


def accept_all(client, held: list) -> None:
    for item in held:
        client.settle(item, "accept")


def test_groups_spread_over_consumers_and_each_group_arrives_whole_and_in_order_at_one_consumer(client):
    consumers = ("c1", "c2", "c3")
    for name in consumers:
        client.open_receiver(name, QUEUE)
        client.flow(name, 10)
    client.open_sender("p", QUEUE)
    sent = "A1 B1 C1 D1 E1 F1 A2 B2 C2 D2 E2 F2 A3 B3 C3 D3 E3 F3"

    assert client.send("p", messages(sent)) == [ACCEPTED] * 18

    # a new group goes to the consumer with credit that owns the fewest groups: two groups each
    received = {name: client.receive(name, 6) for name in consumers}
    groups_by_consumer = {name: sorted({item.group for item in held}) for name, held in received.items()}
    assert [len(groups) for groups in groups_by_consumer.values()] == [2, 2, 2], groups_by_consumer
    assert sorted(sum(groups_by_consumer.values(), [])) == list("ABCDEF")
    for name, held in received.items():
        for group in groups_by_consumer[name]:
            assert [item.body for item in held if item.group == group] == [f"{group}1", f"{group}2", f"{group}3"]
        assert all(item.delivery_count == 0 for item in held)
    for name in consumers:
        assert client.drain(name, 0).messages == []  # 4 credits left each, nothing else to give
        accept_all(client, received[name])


def test_a_released_or_modified_message_comes_back_first_in_its_group_and_only_modified_counts_a_failure(client):
    client.open_receiver("c1", QUEUE)
    client.open_sender("p", QUEUE)
    assert client.send("p", messages("A1 A2 A3 B1")) == [ACCEPTED] * 4
    client.flow("c1", 2)
    first, second = client.receive("c1", 2)
    assert bodies([first, second]) == ["A1", "A2"]

    client.settle(first, "release")  # AMQP 1.0, 3.4.4: a released message's delivery-count is not incremented
    client.settle(second, "modify")  # delivery-failed: one failed delivery more
    client.flow("c1", 10)
    again = client.receive("c1", 4)

    assert bodies(again) == ["A1", "A2", "A3", "B1"]
    # first-acquirer is the producer's own (false) until a redelivery says so
    assert [(item.delivery_count, item.first_acquirer) for item in again] == [
        (0, False), (1, False), (0, False), (0, False)]
    assert client.drain("c1", 0).messages == []
    accept_all(client, again)


@pytest.mark.parametrize("closed", [True, False], ids=["closing-detach", "suspending-detach"])
def test_a_consumer_detaching_with_unsettled_messages_hands_them_in_order_to_the_next_consumer(client, closed):
    client.open_receiver("c1", QUEUE)
    client.open_receiver("c2", QUEUE)
    client.open_sender("p", QUEUE)
    client.flow("c1", 10)
    assert client.send("p", messages("A1 A2 A3 B1 B2")) == [ACCEPTED] * 5
    held = client.receive("c1", 5)
    assert bodies(held) == ["A1", "A2", "A3", "B1", "B2"]
    client.settle(held[0], "accept")
    assert client.drain("c2", 10).messages == []  # c1 owns both groups while it is attached

    answer = client.detach("c1", closed=closed)

    assert (answer.closed, answer.condition) == (closed, None)  # the node answers in kind, with no error
    client.flow("c2", 10)
    moved = client.receive("c2", 4)
    assert bodies(moved) == ["A2", "A3", "B1", "B2"]
    assert [(item.delivery_count, item.first_acquirer) for item in moved] == [(1, False)] * 4
    assert client.send("p", messages("A4 C1")) == [ACCEPTED] * 2
    later = client.receive("c2", 2)  # group A moved with its messages; C is new and c2 is the only consumer
    assert [(item.body, item.delivery_count) for item in later] == [("A4", 0), ("C1", 0)]
    accept_all(client, moved + later)


def test_a_browser_sees_every_available_message_in_order_and_acquires_nothing(client):
    client.open_sender("p", QUEUE)
    assert client.send("p", messages("A1 B1 A2")) == [ACCEPTED] * 3
    attached = client.open_receiver("browser", QUEUE, browse=True)
    assert attached.source is not None and attached.source["distribution_mode"] == "copy"

    client.flow("browser", 10)
    seen = client.receive("browser", 3)
    assert bodies(seen) == ["A1", "B1", "A2"]
    assert client.drain("browser", 0).messages == []

    client.open_receiver("c1", QUEUE)
    client.flow("c1", 10)
    taken = client.receive("c1", 3)  # the browse took nothing and counted no delivery
    assert [(item.body, item.delivery_count) for item in taken] == [("A1", 0), ("B1", 0), ("A2", 0)]
    accept_all(client, taken)


def test_an_anonymous_relay_sends_each_message_to_the_queue_its_to_field_names(client):
    attached = client.open_sender("relay", None)
    assert attached.target is not None and attached.target["address"] is None
    client.open_receiver("c1", QUEUE)
    client.flow("c1", 10)

    outcomes = client.send("relay", messages("A1 B1 A2", to=QUEUE) + messages("X1", to="nowhere")
                           + messages("B2", to=QUEUE))

    assert outcomes == [ACCEPTED] * 3 + [("rejected", "amqp:not-found"), ACCEPTED]
    received = client.receive("c1", 4)
    assert bodies(received) == ["A1", "B1", "A2", "B2"]
    assert client.drain("c1", 0).messages == []
    accept_all(client, received)


def test_a_drain_with_nothing_available_hands_the_credit_back_at_once(client):
    client.open_receiver("c1", QUEUE)

    drained = client.drain("c1", 5)

    assert (drained.messages, drained.credit) == ([], 0)


def test_a_drain_with_messages_available_delivers_them_before_the_drained_flow(client):
    client.open_receiver("c1", QUEUE)
    client.open_sender("p", QUEUE)
    assert client.send("p", messages("A1 B1 A2")) == [ACCEPTED] * 3

    drained = client.drain("c1", 5)

    assert bodies(drained.messages) == ["A1", "B1", "A2"]
    assert drained.credit == 0
    assert client.arrived("c1") == []
    accept_all(client, drained.messages)


def test_a_consumer_of_an_unknown_queue_is_refused_with_a_null_source_then_not_found(client):
    attached = client.open_receiver("c-nowhere", "nowhere")
    detached = client.wait_detached("c-nowhere")

    assert attached.source is None
    assert (detached.closed, detached.condition) == (True, "amqp:not-found")
    assert client.open_receiver("c1", QUEUE).source["address"] == QUEUE  # the connection carries on


def test_a_producer_to_an_unknown_queue_is_refused_with_a_null_target_then_not_found(client):
    attached = client.open_sender("p-nowhere", "nowhere")
    detached = client.wait_detached("p-nowhere")

    assert attached.target is None
    assert (detached.closed, detached.condition) == (True, "amqp:not-found")
    assert client.open_sender("p", QUEUE).target["address"] == QUEUE
