"""Idle-timeout heartbeats: the node keeps an idle client's connection alive by sending empty frames.

A client that asks for an idle timeout closes its connection when the node sends nothing for that
long; the node must send something at least twice per timeout (AMQP 1.0, 2.4.5), driven by its own
tick rather than by traffic.
"""

from __future__ import annotations

from proton import Message, Timeout
from proton.utils import BlockingConnection

from tests.integration.harness import WAIT_S

IDLE_TIMEOUT_S = 1.0  # the client's: the node must send a frame at least every 0.5 s
IDLE_FOR_S = 3.5  # the client stays idle this long, processing I/O: over three idle timeouts


def test_an_idle_client_with_an_idle_timeout_stays_connected(node):
    connection = BlockingConnection(node.url, timeout=WAIT_S, heartbeat=IDLE_TIMEOUT_S)
    try:
        sender = connection.create_sender("heartbeats")
        frames_before = connection.conn.transport.frames_input
        try:
            connection.wait(lambda: False, timeout=IDLE_FOR_S, msg="nothing: the client idles")
        except Timeout:
            pass  # the idle time is over and the connection is still up
        assert connection.conn.transport.frames_input > frames_before  # the node's empty frames
        sender.send(Message(body="after idling"))
        receiver = connection.create_receiver("heartbeats", credit=1)
        assert receiver.receive(timeout=WAIT_S).body == "after idling"
        receiver.accept()
    finally:
        connection.close()
