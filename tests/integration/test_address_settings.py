"""Address settings and address parameters against a real node and a real proton client.

What is promised (README, "Address settings and parameters"): an auto-created queue takes each setting
from the most specific [[address-setting]] whose match takes its name, else from [template]; an attach
address's parameters (`jobs?group-first-key=K`) shape the queue it creates; an existing queue with
other values refuses them by name, equal ones attach; parameters never widen a user's permissions.
The settings are observed through what a consumer sees: the group-first-key a new owner's first
message carries.
"""

from __future__ import annotations

from proton import Delivery

from tests.integration.cli import write_users_file
from tests.integration.harness import ManualReceiver, NodeProcess, connect, grouped, send_outcome
from tests.integration.test_security import PASSWORD, assert_denied, link_outcome, login

FIRST_KEYS = ("Exact", "Star", "Hash", "Template", "Param")
CONFIG = """
[template]
group_first_key = "Template"

[[address-setting]]
match = "orders.#"
group_first_key = "Hash"

[[address-setting]]
match = "orders.*"
group_first_key = "Star"

[[address-setting]]
match = "orders.eu"
group_first_key = "Exact"
"""


def first_key_seen(connection, send_address: str, receive_address: str) -> str | None:
    """Send one message of a new group to `send_address`, take it from `receive_address`, and say which
    of the FIRST_KEYS it carries set true (None: none)."""
    sender = connection.create_sender(send_address)
    state, condition = send_outcome(sender, grouped("hello", "g1"))
    assert state == Delivery.ACCEPTED, condition
    sender.close()
    receiver = ManualReceiver(connection, receive_address, f"reader-{receive_address}")
    held = receiver.fetch()
    held.accept()
    receiver.close()
    marked = [key for key in FIRST_KEYS if (held.message.properties or {}).get(key) is True]
    assert len(marked) <= 1, marked
    return marked[0] if marked else None


def test_the_most_specific_address_setting_gives_an_auto_created_queue_its_settings(node_factory):
    node = node_factory(CONFIG)
    connection = connect(node)
    try:
        for queue, key in (("orders.eu", "Exact"), ("orders.us", "Star"), ("orders.us.west", "Hash"),
                           ("orders", "Hash"), ("invoices", "Template")):
            assert first_key_seen(connection, queue, queue) == key, queue
    finally:
        connection.close()


def test_parameters_shape_the_queue_they_create_and_messages_go_to_the_bare_name(node_factory):
    node = node_factory(CONFIG)
    connection = connect(node)
    try:
        assert first_key_seen(connection, "orders.eu?group-first-key=Param&group-buckets=64", "orders.eu") == "Param"
        # equal parameters attach fine, on either end
        assert first_key_seen(connection, "orders.eu?group-buckets=64", "orders.eu?group-first-key=Param") == "Param"
    finally:
        connection.close()


def test_an_existing_queue_refuses_parameters_that_differ_naming_both_values(node_factory):
    node = node_factory(CONFIG)
    connection = connect(node)
    try:
        assert first_key_seen(connection, "orders.us", "orders.us") == "Star"
        for kind in ("send", "consume"):
            condition = link_outcome(connection, kind, "orders.us?group-buckets=1024")
            assert condition is not None and condition.name == "amqp:precondition-failed", condition
            assert "group-buckets=-1" in condition.description and "group-buckets=1024" in condition.description, \
                condition.description
        condition = link_outcome(connection, "send", "orders.us?group-first-key=Other")
        assert "group-first-key=Star" in condition.description and "group-first-key=Other" in condition.description
        # the queue is as it was: the same first key on a new group
        assert first_key_seen(connection, "orders.us", "orders.us") == "Star"
    finally:
        connection.close()


def test_an_unknown_parameter_or_bad_value_is_refused_and_creates_nothing(node_factory):
    node = node_factory(CONFIG)
    connection = connect(node)
    try:
        for address, words in (("fresh?group-bucket=8", "'group-bucket' is unknown"),
                               ("fresh?group-buckets=lots", "expected an integer"),
                               ("fresh?group-rebalance=maybe", "expected true or false")):
            condition = link_outcome(connection, "send", address)
            assert condition is not None and condition.name == "amqp:invalid-field", condition
            assert words in condition.description, condition.description
        # nothing was made by the refusals: the queue is created now, from its address setting
        assert first_key_seen(connection, "fresh?group-first-key=Param", "fresh") == "Param"
    finally:
        connection.close()


def test_a_bad_address_setting_stops_the_node_naming_the_table_and_key(tmp_path):
    node = NodeProcess(tmp_path / "bad", '[[address-setting]]\nmatch = "a.#"\n\n'
                                         '[[address-setting]]\nmatch = "b.*x"\ngroup_buckets = 4\n')
    try:
        node.start()
    except RuntimeError as error:
        assert "address-setting[1].match" in str(error), str(error)
    else:
        node.kill()
        raise AssertionError("a node with a bad address-setting pattern started")


def test_parameters_never_let_a_user_create_a_queue_its_roles_do_not_allow(node_factory, tmp_path):
    users = write_users_file(tmp_path / "users.json", {"writer": "send:orders.#", "maker": "send,create:orders.#"},
                             {"writer": "writer", "maker": "maker"}, PASSWORD)
    node = node_factory(CONFIG, "--users-file", str(users), "--sasl-plain-on-loopback")

    def send_link(user: str, address: str):  # a connection each: a refused link's name stays taken on its own
        connection = login(node.amqp_address, user)
        try:
            return link_outcome(connection, "send", address)
        finally:
            connection.close()

    assert_denied(send_link("writer", "orders.new?group-buckets=8"), "writer", "create", "orders.new")
    assert send_link("maker", "orders.new?group-buckets=8") is None
    # now the queue exists: the writer may send, with equal parameters or none, never other ones
    assert send_link("writer", "orders.new?group-buckets=8") is None
    assert send_link("writer", "orders.new") is None
    refusal = send_link("writer", "orders.new?group-buckets=16")
    assert refusal is not None and refusal.name == "amqp:precondition-failed", refusal


def test_an_anonymous_relay_message_to_an_address_with_parameters_reaches_its_queue(node_factory):
    node = node_factory(CONFIG)
    connection = connect(node)
    try:
        relay = connection.create_sender(None)
        message = grouped("relayed", "g1")
        message.address = "orders.eu?group-first-key=Param"
        state, condition = send_outcome(relay, message)
        assert state == Delivery.ACCEPTED, condition
        receiver = ManualReceiver(connection, "orders.eu", "reader")
        held = receiver.fetch()
        assert held.body == "relayed" and held.message.properties.get("Param") is True
        held.accept()
    finally:
        connection.close()


def test_a_queue_made_by_parameters_keeps_its_settings_across_a_restart(node_factory):
    node = node_factory(CONFIG)
    connection = connect(node)
    try:
        assert first_key_seen(connection, "orders.eu?group-first-key=Param&group-buckets=64", "orders.eu") == "Param"
    finally:
        connection.close()
    node.restart()
    connection = connect(node)
    try:
        assert link_outcome(connection, "send", "orders.eu?group-buckets=64") is None
        refusal = link_outcome(connection, "consume", "orders.eu?group-first-key=Exact")
        assert refusal is not None and "group-first-key=Param" in refusal.description, refusal
        assert first_key_seen(connection, "orders.eu", "orders.eu") == "Param"
    finally:
        connection.close()


def test_a_declared_queue_with_a_question_mark_in_its_name_is_reached_by_that_name(node_factory):
    node = node_factory(CONFIG + '\n[[queue]]\nname = "odd?name"\ngroup_first_key = "Param"\n')
    connection = connect(node)
    try:
        assert first_key_seen(connection, "odd?name", "odd?name") == "Param"
    finally:
        connection.close()
