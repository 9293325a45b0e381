"""Message-group scenarios of Qpid's broker test suite, replayed against a real node over AMQP 1.0.

Each test drives consumers one credit at a time (`fetch` waits for a delivery, `poll` asks the node
what it would deliver right now), so what a consumer may receive is decided by the node's group
rules alone and never by timing. Most scenarios run against the shared policy (Qpid's
"sequenced consumers": a group belongs to a consumer only while it holds unsettled messages of it);
those whose outcome also pins down the exclusive policy (sticky owner) run against both.

Messages are named by group and position ("A1" is the first message of group A) and carry the group
in properties.group-id unless a test says otherwise.
"""

from __future__ import annotations

import json
import time

import pytest
from proton import Delivery, Endpoint, Message
from proton.utils import LinkDetached

from tests.integration.harness import WAIT_S, ManualReceiver, connect, grouped, link_refusal, send_outcome

QUEUE = "q"
QPID_DEFAULT_GROUP = "qpid.no-group"
TTL_S = 0.3  # short-lived messages in the expiry tests
TTL_WAIT_S = 1.0  # long enough for TTL_S to pass and for the node's expiry tick to run
HELD_TTL_S = 3.0  # a message that must still be live when a consumer takes it (1 s was too short at load 13)


# ---- helpers ---------------------------------------------------------------------------------

def toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    return str(value)


def node_config(*queues: dict, auto_create: bool = False, **node_settings) -> str:
    lines = ["[node]", f"auto_create = {toml_value(auto_create)}"]
    lines += [f"{key} = {toml_value(value)}" for key, value in node_settings.items()]
    for queue in queues:
        lines += ["", "[[queue]]"] + [f"{key} = {toml_value(value)}" for key, value in queue.items()]
    return "\n".join(lines) + "\n"


def queue_table(name: str = QUEUE, policy: str = "shared", **settings) -> dict:
    return {"name": name, "group_policy": policy, **settings}


def send(node, bodies: str, address: str = QUEUE, **message_fields) -> None:
    """Send messages named like "A1 B1 A2": the letters before the digits are the group."""
    connection = connect(node)
    try:
        sender = connection.create_sender(address)
        for body in bodies.split():
            message = grouped(body, body.rstrip("0123456789"))
            for key, value in message_fields.items():
                setattr(message, key, value)
            sender.send(message)
    finally:
        connection.close()


def send_messages(node, messages: list[Message], address: str = QUEUE) -> None:
    connection = connect(node)
    try:
        sender = connection.create_sender(address)
        for message in messages:
            sender.send(message)
    finally:
        connection.close()


def producer_detach_condition(sender) -> str | None:
    """Wait for the node to detach a blocking sender; the blocking client raises when it sees that."""
    try:
        sender.connection.wait(lambda: sender.link.state & Endpoint.REMOTE_CLOSED, timeout=WAIT_S,
                               msg="the node detaching a producer")
    except LinkDetached as error:
        return error.condition
    condition = sender.link.remote_condition
    return condition.name if condition is not None else None


def bodies(held: list) -> list:
    return [h.body for h in held]


def accept_all(*held) -> None:
    for item in held:
        item.accept()


def groups_of(node, queue: str = QUEUE) -> dict[str, dict]:
    result = node.cli("groups", queue, "--json")
    assert result.returncode == 0, result.stderr
    return {row["group"]: row for row in json.loads(result.stdout)}


def cli_ok(node, *args: str) -> str:
    result = node.cli(*args)
    assert result.returncode == 0, f"grouper {' '.join(args)} failed ({result.returncode}): {result.stderr}"
    return result.stdout


class Consumers:
    """Receivers on their own connections, closed at the end of the test."""

    def __init__(self, node):
        self.node = node
        self.connections = []

    def open(self, name: str, address: str = QUEUE, **options) -> ManualReceiver:
        connection = connect(self.node)
        self.connections.append(connection)
        return ManualReceiver(connection, address, name, **options)

    def close_all(self) -> None:
        for connection in self.connections:
            try:
                connection.close()
            except Exception:  # a test may have closed it, or the node detached it
                pass


@pytest.fixture
def consumers():
    opened: list[Consumers] = []

    def make(node) -> Consumers:
        group = Consumers(node)
        opened.append(group)
        return group

    yield make
    for group in opened:
        group.close_all()


@pytest.fixture(params=["shared", "exclusive"])
def policy(request) -> str:
    return request.param


# ---- simple: who may take which group --------------------------------------------------------

INTERLEAVED = "A1 A2 B1 C1 A3 B2 C2 B3 A4 C3"


def test_shared_group_is_blocked_for_others_while_its_consumer_holds_it_and_moves_once_settled(
        node_factory, consumers):
    node = node_factory(node_config(queue_table(policy="shared")))
    send(node, INTERLEAVED)
    pool = consumers(node)
    c1, c2 = pool.open("c1"), pool.open("c2")

    a1 = c1.fetch()
    assert a1.body == "A1"
    b1 = c2.fetch()
    assert b1.body == "B1", "A2 is earlier, but group A is held by c1"

    a1.accept()
    a2 = c2.fetch()
    assert a2.body == "A2", "group A is free again once c1 settled everything it held"
    assert c1.fetch().body == "C1", "A and B are held by c2"
    assert c1.poll().body == "C2"

    accept_all(b1, a2)
    a3 = c1.fetch()
    assert a3.body == "A3"
    b2 = c2.fetch()
    assert b2.body == "B2"
    assert bodies(c1.poll_all()) == ["A4", "C3"]
    assert bodies(c2.poll_all()) == ["B3"]


def test_exclusive_group_stays_with_its_first_consumer_after_it_settles(node_factory, consumers):
    node = node_factory(node_config(queue_table(policy="exclusive")))
    send(node, INTERLEAVED)
    pool = consumers(node)
    c1, c2 = pool.open("c1"), pool.open("c2")

    a1 = c1.fetch()
    assert a1.body == "A1"
    assert c2.fetch().body == "B1"
    a1.accept()
    assert c2.fetch().body == "C1", "A still belongs to c1 although c1 holds none of it"
    assert bodies(c1.poll_all()) == ["A2", "A3", "A4"]
    assert bodies(c2.poll_all()) == ["B2", "C2", "B3", "C3"]


def test_a_consumer_granted_several_credits_gets_that_many_messages_in_queue_order(node_factory, consumers, policy):
    node = node_factory(node_config(queue_table(policy=policy)))
    send(node, "A1 A2 B1 A3")
    pool = consumers(node)
    c1, c2 = pool.open("c1"), pool.open("c2")

    c1.flow(3)
    assert bodies(c1.fetch_many(3)) == ["A1", "A2", "B1"]
    assert c2.poll() is None, "A and B are both held by c1"


def test_custom_group_header_decides_the_group_and_group_id_is_ignored(node_factory, consumers):
    node = node_factory(node_config(queue_table(policy="shared", group_header="GROUP_KEY")))
    send_messages(node, [
        grouped("K1", "ignored", GROUP_KEY="K"),
        grouped("K2", "ignored-too", GROUP_KEY="K"),
        grouped("L1", None, GROUP_KEY="L"),
    ])
    pool = consumers(node)
    c1, c2 = pool.open("c1"), pool.open("c2")

    k1 = c1.fetch()
    assert k1.body == "K1"
    assert c2.fetch().body == "L1", "K2 shares K1's GROUP_KEY, whatever its group-id says"
    assert set(groups_of(node)) == {"K", "L"}


# ---- release ---------------------------------------------------------------------------------

def test_released_messages_go_to_the_next_consumer_in_order_without_counting_a_failure(node_factory, consumers):
    node = node_factory(node_config(queue_table(policy="shared")))
    send(node, "A1 A2 B1 B2")
    pool = consumers(node)
    c1, c2 = pool.open("c1"), pool.open("c2")

    a1, a2 = c1.fetch(), c1.fetch()
    assert bodies([a1, a2]) == ["A1", "A2"]
    b1 = c2.fetch()
    assert b1.body == "B1"

    a1.release()
    a2.release()
    again = c2.fetch_many(2)
    assert bodies(again) == ["A1", "A2"], "group A is free after both releases; c2 takes it from its head"
    # AMQP: a released delivery was not acted upon, so the node does not count it as a failed attempt
    assert [h.delivery_count for h in again] == [0, 0]
    assert c1.poll() is None, "A and B are now held by c2"


def test_a_message_released_back_comes_again_to_the_same_consumer(node_factory, consumers, policy):
    node = node_factory(node_config(queue_table(policy=policy)))
    send(node, "A1 A2")
    pool = consumers(node)
    c1 = pool.open("c1")

    c1.fetch().release()
    assert bodies(c1.fetch_many(2)) == ["A1", "A2"]


def test_releasing_one_of_two_held_messages_keeps_the_group_with_its_consumer(node_factory, consumers):
    node = node_factory(node_config(queue_table(policy="shared")))
    send(node, "A1 A2 B1")
    pool = consumers(node)
    c1, c2 = pool.open("c1"), pool.open("c2")

    a1, a2 = c1.fetch(), c1.fetch()
    a1.release()
    assert c2.fetch().body == "B1", "c1 still holds A2, so A1 waits for c1"
    assert c1.fetch().body == "A1", "A1 went back to the head of group A"
    a2.accept()


def test_a_delivery_modified_as_failed_comes_back_with_its_delivery_count_raised(node_factory, consumers, policy):
    node = node_factory(node_config(queue_table(policy=policy)))
    send(node, "A1 A2")
    pool = consumers(node)
    c1, c2 = pool.open("c1"), pool.open("c2")

    first = c1.fetch()
    assert first.delivery_count == 0 and not first.redelivered
    first.modify(failed=True)
    again = c1.fetch()
    assert again.body == "A1"
    assert again.delivery_count == 1 and again.redelivered
    again.modify(failed=True)
    assert c1.fetch().delivery_count == 2
    assert c2.poll() is None, "c1 holds A1 again"


# ---- reject ----------------------------------------------------------------------------------

@pytest.mark.parametrize("policy, next_for_c2", [("shared", "A2"), ("exclusive", None)])
def test_a_rejected_message_is_removed_and_does_not_hold_its_group(node_factory, consumers, policy, next_for_c2):
    node = node_factory(node_config(queue_table(policy=policy)))
    send(node, "A1 A2 B1")
    pool = consumers(node)
    c1, c2 = pool.open("c1"), pool.open("c2")

    a1 = c1.fetch()
    b1 = c2.fetch()
    assert b1.body == "B1"
    a1.reject()
    polled = c2.poll()
    assert (polled.body if polled else None) == next_for_c2
    if polled is None:  # exclusive: A still belongs to c1
        polled = c1.fetch()
    assert polled.body == "A2", "A1 was rejected: it is never delivered again"
    accept_all(polled, b1)
    assert c1.poll() is None and c2.poll() is None
    assert all(row["messages"] == 0 for row in groups_of(node).values())


# ---- close -----------------------------------------------------------------------------------

@pytest.mark.parametrize("how", ["link", "connection"])
def test_a_closing_consumers_unsettled_messages_go_to_the_other_consumer_in_order_marked_redelivered(
        node_factory, consumers, policy, how):
    node = node_factory(node_config(queue_table(policy=policy)))
    send(node, "A1 A2 B1 A3 B2")
    pool = consumers(node)
    c1, c2 = pool.open("c1"), pool.open("c2")

    assert bodies(c1.fetch_many(2)) == ["A1", "A2"]
    b1 = c2.fetch()
    assert b1.body == "B1"
    if how == "link":
        c1.close()
    else:
        c1.connection.close()

    taken = c2.fetch_many(4)
    assert bodies(taken) == ["A1", "A2", "A3", "B2"]
    assert [h.delivery_count > 0 for h in taken] == [True, True, False, False]
    assert [h.redelivered for h in taken] == [True, True, False, False]


# ---- browse ----------------------------------------------------------------------------------

def test_a_browser_sees_every_available_message_whoever_owns_its_group_and_acquires_nothing(
        node_factory, consumers, policy):
    node = node_factory(node_config(queue_table(policy=policy)))
    send(node, "A1 B1 A2 B2")
    pool = consumers(node)
    c1, c2 = pool.open("c1"), pool.open("c2")
    a1 = c1.fetch()
    before = groups_of(node)

    browser = pool.open("browser", browse=True)
    seen = browser.fetch_many(3)
    assert bodies(seen) == ["B1", "A2", "B2"], "A1 is acquired by c1; everything else is shown"
    assert browser.poll() is None
    assert groups_of(node) == before, "browsing changed no counts or owners"

    assert bodies(c2.poll_all()) == ["B1", "B2"]
    assert c1.fetch().body == "A2"
    a1.accept()


def test_a_browser_attached_to_an_empty_queue_sees_messages_sent_later(node_factory, consumers):
    node = node_factory(node_config(queue_table(policy="shared")))
    pool = consumers(node)
    browser = pool.open("browser", browse=True)
    assert browser.poll() is None
    send(node, "A1 B1")
    assert bodies(browser.fetch_many(2)) == ["A1", "B1"]
    assert bodies(pool.open("c1").poll_all()) == ["A1", "B1"]


# ---- default group ---------------------------------------------------------------------------

@pytest.mark.parametrize("queue_settings, node_settings, default_name", [
    ({}, {}, QPID_DEFAULT_GROUP),
    ({"default_group": "orphans"}, {}, "orphans"),
    ({}, {"default_group": "EMPTY-GROUP"}, "EMPTY-GROUP"),
], ids=["qpid-default", "queue-setting", "node-setting"])
def test_messages_without_a_group_id_share_the_default_group_and_are_serialized(
        node_factory, consumers, queue_settings, node_settings, default_name):
    node = node_factory(node_config(queue_table(policy="shared", **queue_settings), **node_settings))
    send_messages(node, [grouped("X1"), grouped("A1", "A"), grouped("X2"), grouped("X3")])
    pool = consumers(node)
    c1, c2 = pool.open("c1"), pool.open("c2")

    x1 = c1.fetch()
    assert x1.body == "X1"
    a1 = c2.fetch()
    assert a1.body == "A1"
    assert c2.poll() is None, "X2 is in c1's default group"
    rows = groups_of(node)
    assert rows[default_name]["messages"] == 3 and rows[default_name]["acquired"] == 1

    x1.accept()
    assert bodies(c2.poll_all()) == ["X2", "X3"]


def test_exclusive_queue_deals_messages_without_a_group_id_to_any_consumer(node_factory, consumers):
    node = node_factory(node_config(queue_table(policy="exclusive")))
    send_messages(node, [grouped("X1"), grouped("X2")])
    pool = consumers(node)
    c1, c2 = pool.open("c1"), pool.open("c2")

    assert c1.fetch().body == "X1"
    assert c2.fetch().body == "X2", "ungrouped messages are not serialized in the exclusive policy"
    assert QPID_DEFAULT_GROUP not in groups_of(node)


# ---- query -----------------------------------------------------------------------------------

def test_groups_query_shows_messages_acquired_and_owner_per_group(node_factory, consumers, policy):
    node = node_factory(node_config(queue_table(policy=policy)))
    send_messages(node, [grouped(b, b[0]) for b in "A1 A2 B1 C1 C2 C3".split()] + [grouped("X1")])
    pool = consumers(node)
    c1, c2 = pool.open("c1"), pool.open("c2")
    a1 = c1.fetch()
    b1 = c2.fetch()
    c1_of_c2 = c2.fetch()
    assert bodies([a1, b1, c1_of_c2]) == ["A1", "B1", "C1"]

    rows = groups_of(node)
    expected_names = {"A", "B", "C"} | ({QPID_DEFAULT_GROUP} if policy == "shared" else set())
    assert set(rows) == expected_names
    assert (rows["A"]["messages"], rows["A"]["acquired"]) == (2, 1)
    assert (rows["B"]["messages"], rows["B"]["acquired"]) == (1, 1)
    assert (rows["C"]["messages"], rows["C"]["acquired"]) == (3, 1)
    assert rows["A"]["consumer"] is not None and rows["B"]["consumer"] is not None
    assert rows["A"]["consumer"] != rows["B"]["consumer"]
    assert rows["B"]["consumer"] == rows["C"]["consumer"]
    if policy == "shared":
        assert rows[QPID_DEFAULT_GROUP] == {"group": QPID_DEFAULT_GROUP, "messages": 1, "acquired": 0,
                                            "consumer": None, "label": "", "node": ""}

    owner_of_a = rows["A"]["consumer"]
    a1.accept()
    row = groups_of(node)["A"]
    assert (row["messages"], row["acquired"]) == (1, 0)
    assert row["consumer"] == (None if policy == "shared" else owner_of_a)


def test_groups_query_forgets_a_group_once_it_is_consumed(node_factory, consumers):
    node = node_factory(node_config(queue_table(policy="shared")))
    send(node, "A1 B1")
    c1 = consumers(node).open("c1")
    accept_all(*c1.fetch_many(2))
    assert groups_of(node) == {}


# ---- purge -----------------------------------------------------------------------------------

def test_group_purge_removes_available_messages_only_and_honours_count(node_factory, consumers, policy):
    node = node_factory(node_config(queue_table(policy=policy)))
    send(node, "A1 A2 A3 A4 A5 B1")
    pool = consumers(node)
    c1, c2 = pool.open("c1"), pool.open("c2")
    a1 = c1.fetch()

    assert "purged 2 messages" in cli_ok(node, "group", "purge", QUEUE, "A", "--count", "2")
    row = groups_of(node)["A"]
    assert (row["messages"], row["acquired"]) == (3, 1), "A1 (acquired), A4 and A5 remain"

    assert "purged 2 messages" in cli_ok(node, "group", "purge", QUEUE, "A")
    row = groups_of(node)["A"]
    assert (row["messages"], row["acquired"]) == (1, 1), "the acquired A1 is never purged"

    a1.accept()
    assert bodies(c2.poll_all()) == ["B1"]
    assert c1.poll() is None
    assert groups_of(node).get("A", {"messages": 0})["messages"] == 0


def test_group_purge_of_an_unknown_group_fails_and_changes_nothing(node_factory, consumers):
    node = node_factory(node_config(queue_table(policy="shared")))
    send(node, "A1")
    result = node.cli("group", "purge", QUEUE, "nope")
    assert result.returncode == 1
    assert "nope" in result.stderr
    assert groups_of(node)["A"]["messages"] == 1


# ---- move ------------------------------------------------------------------------------------

def test_group_move_carries_available_messages_to_another_queue_in_order_and_leaves_acquired_ones(
        node_factory, consumers, policy):
    node = node_factory(node_config(queue_table(policy=policy), queue_table("other", policy=policy)))
    send(node, "A1 A2 A3 A4 B1")
    pool = consumers(node)
    c1 = pool.open("c1")
    a1 = c1.fetch()

    assert "moved 1 message " in cli_ok(node, "group", "move", QUEUE, "A", "other", "--count", "1")
    assert "moved 2 messages" in cli_ok(node, "group", "move", QUEUE, "A", "other")
    row = groups_of(node)["A"]
    assert (row["messages"], row["acquired"]) == (1, 1), "only the acquired A1 stays behind"
    assert groups_of(node, "other")["A"]["messages"] == 3

    elsewhere = pool.open("elsewhere", "other")
    moved = elsewhere.fetch_many(3)
    assert bodies(moved) == ["A2", "A3", "A4"]
    assert elsewhere.poll() is None
    accept_all(*moved)

    a1.accept()
    assert bodies(c1.poll_all()) == ["B1"]


def test_group_move_to_an_unknown_queue_fails_and_leaves_the_group_in_place(node_factory):
    node = node_factory(node_config(queue_table(policy="shared")))
    send(node, "A1 A2")
    result = node.cli("group", "move", QUEUE, "A", "nowhere")
    assert result.returncode == 1
    assert "nowhere" in result.stderr
    assert groups_of(node)["A"]["messages"] == 2


# ---- TTL -------------------------------------------------------------------------------------

def test_expired_messages_at_the_head_of_a_group_are_dropped_and_do_not_block_it(node_factory, consumers, policy):
    node = node_factory(node_config(queue_table(policy=policy)))
    send(node, "A1 A2 B1", ttl=TTL_S)
    send(node, "A3 B2")
    time.sleep(TTL_WAIT_S)  # the broker's clock is what is under test
    pool = consumers(node)
    browser = pool.open("browser", browse=True)
    assert bodies(browser.poll_all()) == ["A3", "B2"], "expired messages are not shown either"
    c1, c2 = pool.open("c1"), pool.open("c2")

    assert c1.fetch().body == "A3"
    assert c2.fetch().body == "B2"
    assert c1.poll() is None and c2.poll() is None
    rows = groups_of(node)
    assert (rows["A"]["messages"], rows["B"]["messages"]) == (1, 1)


def test_a_message_expiring_behind_a_held_one_is_dropped_before_the_group_moves_on(node_factory, consumers):
    node = node_factory(node_config(queue_table(policy="shared")))
    send(node, "A1")
    send(node, "A2", ttl=TTL_S)
    send(node, "A3")
    pool = consumers(node)
    c1, c2 = pool.open("c1"), pool.open("c2")
    a1 = c1.fetch()
    time.sleep(TTL_WAIT_S)

    a1.accept()
    assert c2.fetch().body == "A3"


def test_an_expired_message_released_by_its_holder_is_dropped_instead_of_redelivered(node_factory, consumers):
    node = node_factory(node_config(queue_table(policy="shared")))
    c1 = consumers(node).open("c1")
    # c1 must get A1 before it expires, so this TTL leaves room for a slow machine
    send(node, "A1", ttl=HELD_TTL_S)
    send(node, "A2")
    a1 = c1.fetch()
    assert a1.body == "A1"
    time.sleep(HELD_TTL_S + TTL_WAIT_S)

    a1.release()
    assert c1.fetch().body == "A2"
    assert c1.poll() is None


# ---- queue delete ----------------------------------------------------------------------------

def test_deleting_a_queue_detaches_its_consumers_with_a_condition_and_the_node_carries_on(
        node_factory, consumers):
    node = node_factory(node_config(queue_table(policy="shared"), queue_table("spare")))
    send(node, "A1 A2 B1")
    pool = consumers(node)
    holder, idle = pool.open("holder"), pool.open("idle")
    browser = pool.open("browser", browse=True)
    holder.fetch()
    producer_connection = connect(node)
    pool.connections.append(producer_connection)
    producer = producer_connection.create_sender(QUEUE)

    assert "deleted queue q" in cli_ok(node, "queue", "delete", QUEUE)
    for receiver in (holder, idle, browser):
        condition = receiver.wait_detached()
        assert condition is not None and condition.name == "amqp:resource-deleted", (receiver.name, condition)
    assert producer_detach_condition(producer) == "amqp:resource-deleted"

    listed = json.loads(cli_ok(node, "queue", "list", "--json"))
    assert [q["name"] for q in listed] == ["spare"]
    send(node, "C1", address="spare")
    assert pool.open("spare-consumer", "spare").fetch().body == "C1"

    cli_ok(node, "queue", "add", QUEUE, "--group-policy", "shared")
    assert groups_of(node) == {}, "the new queue starts empty"
    send(node, "D1 D2")
    again = pool.open("again")
    assert bodies(again.fetch_many(2)) == ["D1", "D2"]


# ---- bad input -------------------------------------------------------------------------------

def test_attaching_to_an_unknown_queue_without_auto_create_fails_with_not_found(node_factory):
    node = node_factory(node_config(queue_table(policy="shared")))
    connection = connect(node)
    try:
        assert link_refusal(lambda: ManualReceiver(connection, "missing", "r1")) == "amqp:not-found"
        assert link_refusal(lambda: connection.create_sender("missing")) == "amqp:not-found"
        assert link_refusal(lambda: ManualReceiver(connection, "missing", "b1", browse=True)) == "amqp:not-found"
    finally:
        connection.close()
    listed = json.loads(cli_ok(node, "queue", "list", "--json"))
    assert [q["name"] for q in listed] == [QUEUE]


def test_a_message_for_an_unknown_queue_on_an_anonymous_link_is_rejected_with_not_found(node_factory):
    node = node_factory(node_config(queue_table(policy="shared")))
    connection = connect(node)
    try:
        sender = connection.create_sender(None)
        lost, kept = grouped("lost", "A"), grouped("kept", "A")
        lost.address, kept.address = "missing", QUEUE
        assert send_outcome(sender, lost) == (Delivery.REJECTED, "amqp:not-found")
        assert send_outcome(sender, kept) == (Delivery.ACCEPTED, None)
    finally:
        connection.close()
    assert groups_of(node)["A"]["messages"] == 1


@pytest.mark.parametrize("make_bad", [
    lambda: grouped("bad", None, JMSXGroupID=42),
    lambda: grouped("bad", "G" * 9),
    lambda: grouped("bad", None, JMSXGroupID="J" * 9),
], ids=["jms-group-id-int", "group-id-too-long", "jms-group-id-too-long"])
def test_a_bad_group_id_is_rejected_with_invalid_field_and_other_messages_pass(node_factory, consumers, make_bad):
    node = node_factory(node_config(queue_table(policy="shared", group_id_length_max_chars=8)))
    connection = connect(node)
    try:
        sender = connection.create_sender(QUEUE)
        assert send_outcome(sender, grouped("A1", "A")) == (Delivery.ACCEPTED, None)
        assert send_outcome(sender, make_bad()) == (Delivery.REJECTED, "amqp:invalid-field")
        assert send_outcome(sender, grouped("A2", "G" * 8)) == (Delivery.ACCEPTED, None)
        assert send_outcome(sender, grouped("A3", "\u00e9" * 8)) == (Delivery.ACCEPTED, None), \
            "the limit counts characters, not UTF-8 bytes"
    finally:
        connection.close()
    c1 = consumers(node).open("c1")
    assert bodies(c1.poll_all()) == ["A1", "A2", "A3"]


def test_a_custom_group_header_with_a_non_string_value_is_rejected_with_invalid_field(node_factory):
    node = node_factory(node_config(queue_table(policy="shared", group_header="GROUP_KEY")))
    connection = connect(node)
    try:
        sender = connection.create_sender(QUEUE)
        assert send_outcome(sender, grouped("bad", None, GROUP_KEY=7)) == (Delivery.REJECTED, "amqp:invalid-field")
        assert send_outcome(sender, grouped("ok", None, GROUP_KEY="K")) == (Delivery.ACCEPTED, None)
    finally:
        connection.close()


def test_a_full_queue_rejects_with_resource_limit_exceeded_until_a_message_is_settled(node_factory, consumers):
    node = node_factory(node_config(queue_table(policy="shared", depth_max_messages=3)))
    connection = connect(node)
    c1 = consumers(node).open("c1")
    try:
        sender = connection.create_sender(QUEUE)
        for body in ("A1", "A2", "B1"):
            assert send_outcome(sender, grouped(body, body[0])) == (Delivery.ACCEPTED, None)
        assert send_outcome(sender, grouped("B2", "B")) == (Delivery.REJECTED, "amqp:resource-limit-exceeded")

        a1 = c1.fetch()
        assert send_outcome(sender, grouped("B2", "B")) == (Delivery.REJECTED, "amqp:resource-limit-exceeded"), \
            "an acquired message still counts against the depth"
        a1.accept()
        assert send_outcome(sender, grouped("B2", "B")) == (Delivery.ACCEPTED, None)
    finally:
        connection.close()
    assert bodies(c1.poll_all()) == ["A2", "B1", "B2"]


# ---- closing a group -------------------------------------------------------------------------

@pytest.mark.parametrize("close_field", ["JMSXGroupSeq", "group_sequence"])
def test_closing_an_exclusive_group_frees_it_for_another_consumer_once_settled(node_factory, consumers, close_field):
    node = node_factory(node_config(queue_table(policy="exclusive")))
    closing = grouped("A2", "A")
    if close_field == "JMSXGroupSeq":
        closing.properties = {"JMSXGroupSeq": -1}
    else:
        closing.group_sequence = 0xFFFFFFFF
    send_messages(node, [grouped("A1", "A"), closing, grouped("A3", "A")])
    pool = consumers(node)
    c1, c2 = pool.open("c1"), pool.open("c2")

    held = c1.fetch_many(2)
    assert bodies(held) == ["A1", "A2"]
    assert c2.poll() is None
    accept_all(*held)
    assert c2.fetch().body == "A3", "the closed group starts afresh with whichever consumer asks"


def test_an_exclusive_group_that_is_not_closed_stays_with_its_owner(node_factory, consumers):
    node = node_factory(node_config(queue_table(policy="exclusive")))
    send(node, "A1 A2 A3")
    pool = consumers(node)
    c1, c2 = pool.open("c1"), pool.open("c2")
    accept_all(*c1.fetch_many(2))
    assert c2.poll() is None
    assert c1.fetch().body == "A3"


# ---- reset -----------------------------------------------------------------------------------

def test_group_reset_frees_an_exclusive_group_for_the_next_consumer(node_factory, consumers):
    node = node_factory(node_config(queue_table(policy="exclusive")))
    send(node, "A1 A2 A3")
    pool = consumers(node)
    c1, c2 = pool.open("c1"), pool.open("c2")
    c1.fetch().accept()
    a2 = c1.fetch()

    cli_ok(node, "group", "reset", QUEUE, "A")
    assert c2.poll() is None, "c1 still holds A2: the group is freed only once that is settled"
    a2.accept()
    assert c2.fetch().body == "A3"
    assert c1.poll() is None
