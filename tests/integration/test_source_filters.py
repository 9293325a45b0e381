"""Source filters a node does not apply are left out of its attach (AMQP 1.0, 3.5.8), never echoed: a
client that asked for a JMS selector must learn it is not applied (issue 30 applies selectors; until then
the answer has to be true). Tried with python-qpid-proton's Selector option, as its users write it."""

from __future__ import annotations

import pytest
from proton import Message
from proton.reactor import Filter, Selector
from proton.utils import BlockingConnection

from tests.integration.harness import NodeProcess

WAIT_S = 10.0


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


def test_a_jms_selector_is_not_echoed_so_the_client_knows_it_is_not_applied(node):
    assert answered_filter(node, Selector("colour = 'green'")) == {}


def test_an_unknown_filter_is_not_echoed_either_and_the_link_still_serves(node):
    assert answered_filter(node, Filter({"x-opt-custom": "anything"})) == {}
    connection = BlockingConnection(node.url, timeout=WAIT_S)
    try:
        receiver = connection.create_receiver("filtered-serves", options=Filter({"x-opt-custom": "anything"}))
        connection.create_sender("filtered-serves").send(Message(body="still here"), timeout=WAIT_S)
        assert receiver.receive(timeout=WAIT_S).body == "still here"
        receiver.accept()
    finally:
        connection.close()
