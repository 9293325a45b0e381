"""Source filters at attach, as a client sees them (AMQP 1.0, 3.5.8): the node applies JMS selectors
(`apache.org:selector-filter:string`, docs/selectors.md) and echoes exactly those in its attach; any
other filter is left out, never echoed, so a client knows it does not hold. A malformed selector is
refused with amqp:invalid-field saying where and what. Tried with python-qpid-proton's Selector
option, as its users write it."""

from __future__ import annotations

import pytest
from proton import Described, Endpoint, Message, symbol
from proton.reactor import Filter, Selector
from proton.utils import BlockingConnection, LinkDetached

from tests.integration.harness import NodeProcess
from tests.integration.test_multicast import Topic

WAIT_S = 10.0
SELECTOR_FILTER = symbol("apache.org:selector-filter:string")


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    process = NodeProcess(tmp_path_factory.mktemp("filters") / "node").start()
    yield process
    process.kill()


def answered_filter(node: NodeProcess, option) -> dict:
    connection = BlockingConnection(node.url, timeout=WAIT_S)
    try:
        receiver = connection.create_receiver("filtered", options=option)
        answer = receiver.link.remote_source.filter
        answer.rewind()
        return answer.get_object() if answer.next() is not None else {}  # an empty Data: no filter map
    finally:
        connection.close()


def test_an_applied_jms_selector_is_echoed_in_the_attach(node):
    assert answered_filter(node, Selector("colour = 'green'")) == {
        symbol("selector"): Described(SELECTOR_FILTER, "colour = 'green'")}


def test_only_the_applied_selector_is_echoed_of_several_filters(node):
    both = Filter({symbol("x-opt-custom"): "anything",
                   symbol("jms-selector"): Described(SELECTOR_FILTER, "n > 1")})
    assert answered_filter(node, both) == {symbol("jms-selector"): Described(SELECTOR_FILTER, "n > 1")}


def test_a_consumer_with_a_selector_receives_only_what_it_selects_and_the_rest_stays_queued(node):
    connection = BlockingConnection(node.url, timeout=WAIT_S)
    try:
        green = connection.create_receiver("colours", options=Selector("colour = 'green'"))
        sender = connection.create_sender("colours")
        for number, colour in enumerate(["red", "green", "red", "green", "blue"]):
            sender.send(Message(body=number, properties={"colour": colour}), timeout=WAIT_S)
        received = []
        for _ in range(2):
            received.append(green.receive(timeout=WAIT_S).body)
            green.accept()
        assert received == [1, 3]
        with pytest.raises(Exception):  # nothing else is green: the red and blue messages are not offered
            green.receive(timeout=0.5)
        green.close()
        everything = connection.create_receiver("colours")
        rest = []
        for _ in range(3):
            rest.append(everything.receive(timeout=WAIT_S).body)
            everything.accept()
        assert rest == [0, 2, 4]  # kept, in queue order, for a consumer that selects them
    finally:
        connection.close()


def test_a_malformed_selector_is_refused_with_its_error_and_position(node):
    connection = BlockingConnection(node.url, timeout=WAIT_S)
    try:
        with pytest.raises(LinkDetached) as refused:
            receiver = connection.create_receiver("colours-bad", options=Selector("colour != 'green'"))
            connection.wait(lambda: receiver.link.state & Endpoint.REMOTE_CLOSED, timeout=WAIT_S,
                            msg="the refused link's detach")
        condition = refused.value.link.remote_condition
        assert condition.name == "amqp:invalid-field"
        assert condition.description == "selector: at 7, unexpected character '!'; write <> for 'not equal'"
    finally:
        connection.close()


def test_an_unknown_filter_is_not_echoed_and_the_link_still_serves(node):
    assert answered_filter(node, Filter({"x-opt-custom": "anything"})) == {}
    connection = BlockingConnection(node.url, timeout=WAIT_S)
    try:
        receiver = connection.create_receiver("filtered-serves", options=Filter({"x-opt-custom": "anything"}))
        connection.create_sender("filtered-serves").send(Message(body="still here"), timeout=WAIT_S)
        assert receiver.receive(timeout=WAIT_S).body == "still here"
        receiver.accept()
    finally:
        connection.close()


def test_subscribers_of_a_multicast_address_each_receive_what_their_selector_selects(node):
    connection = BlockingConnection(node.url, timeout=WAIT_S)
    try:
        green = connection.create_receiver("news", name="green", options=[Topic(), Selector("colour = 'green'")])
        other = connection.create_receiver("news", name="other", options=[Topic(), Selector("colour <> 'green'")])
        sender = connection.create_sender("news")
        for number, colour in enumerate(["red", "green", "blue", "green"]):
            sender.send(Message(body=number, group_id=colour, properties={"colour": colour}), timeout=WAIT_S)
        for receiver, expected in ((green, [1, 3]), (other, [0, 2])):
            received = []
            for _ in expected:
                received.append(receiver.receive(timeout=WAIT_S).body)
                receiver.accept()
            assert received == expected
    finally:
        connection.close()


def test_a_consumer_whose_selector_names_one_group_becomes_that_groups_consumer(node):
    connection = BlockingConnection(node.url, timeout=WAIT_S)
    try:
        anyone = connection.create_receiver("chosen")
        sender = connection.create_sender("chosen")
        sender.send(Message(body="X-0", group_id="X"), timeout=WAIT_S)
        assert anyone.receive(timeout=WAIT_S).body == "X-0"  # the group is anyone's now
        anyone.accept()
        chooser = connection.create_receiver("chosen", name="x", options=Selector("JMSXGroupID = 'X'"))
        for body, group in (("X-1", "X"), ("Y-0", "Y"), ("X-2", "X")):
            sender.send(Message(body=body, group_id=group), timeout=WAIT_S)
        assert [chooser.receive(timeout=WAIT_S).body for _ in range(2)] == ["X-1", "X-2"]
        chooser.accept()
        assert anyone.receive(timeout=WAIT_S).body == "Y-0"
        anyone.accept()
    finally:
        connection.close()
