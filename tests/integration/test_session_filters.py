"""Consumer-chosen groups as a Service Bus client asks for them (issue 30), with python-qpid-proton: the source
filter `com.microsoft:session-filter` naming a group, or null for the next free group, is answered in the
node's attach with the group the consumer got, and the consumer receives that group's messages alone, in order."""

from __future__ import annotations

import pytest
from proton import Described, Endpoint, symbol, ulong
from proton.reactor import Filter
from proton.utils import BlockingConnection, LinkDetached

from tests.integration.harness import NodeProcess, connect, grouped

WAIT_S = 10.0
SESSION_FILTER = symbol("com.microsoft:session-filter")
SESSION_FILTER_CODE = ulong(0x000001370000000C)


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    process = NodeProcess(tmp_path_factory.mktemp("sessions") / "node").start()
    yield process
    process.kill()


def session(group: str | None) -> Filter:
    return Filter({SESSION_FILTER: Described(SESSION_FILTER_CODE, group)})


def granted(receiver) -> str | None:
    answer = receiver.link.remote_source.filter
    answer.rewind()
    filters = answer.get_object() if answer.next() is not None else {}
    return filters[SESSION_FILTER].value


def test_a_session_filter_gets_its_group_or_the_next_free_one_and_only_that_groups_messages(node):
    connection = connect(node)
    try:
        sender = connection.create_sender("sessions")
        for name, group in (("a1", "a"), ("b1", "b"), ("a2", "a"), ("b2", "b"), ("b3", "b")):
            sender.send(grouped(name, group), timeout=WAIT_S)
        named = connection.create_receiver("sessions", name="named", options=session("b"))
        assert granted(named) == "b"
        got = []
        for _ in range(3):
            got.append(named.receive(timeout=WAIT_S).body)
            named.accept()
        assert got == ["b1", "b2", "b3"]
        any_free = connection.create_receiver("sessions", name="any-free", options=session(None))
        assert granted(any_free) == "a"  # the only group with messages and no consumer
        got = []
        for _ in range(2):
            got.append(any_free.receive(timeout=WAIT_S).body)
            any_free.accept()
        assert got == ["a1", "a2"]
    finally:
        connection.close()


def test_a_null_session_filter_with_no_free_group_is_refused_saying_why(node):
    connection = BlockingConnection(node.url, timeout=WAIT_S)
    try:
        with pytest.raises(LinkDetached) as refused:
            receiver = connection.create_receiver("no-sessions", options=session(None))
            connection.wait(lambda: receiver.link.state & Endpoint.REMOTE_CLOSED, timeout=WAIT_S, msg="refused")
        assert refused.value.link.remote_condition.name == "amqp:not-found"
        assert "no group with a message waiting and no consumer" in refused.value.link.remote_condition.description
    finally:
        connection.close()
