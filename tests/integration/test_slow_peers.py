"""Peers that stop reading their socket cannot grow the node without bound, nor stall anyone else.

Real node processes on 127.0.0.1; the slow peers are raw sockets with a small receive buffer that
speak just enough AMQP (frames built by proton's client transport in this process, or by hand) and
then never read again. The node caps what it buffers for a socket at OUTPUT_MAX_BYTES and stops
reading that socket's input while it is over the cap (node/amqp/connection.py).

Rules: assertions are on observable facts, never on time: a well-behaved client's round trips
complete, the node's metrics (acquired messages, engine objects), its RSS under a generous ceiling,
and whether the kernel still takes bytes from the flooding peer. Every wait is bounded.
"""

from __future__ import annotations

import socket
import time
import urllib.request

import pytest
from proton import Connection, Message, Transport
from proton.utils import BlockingConnection

from node.amqp.connections import OUTPUT_MAX_BYTES
from tests.integration.clients import queue_toml

WAIT_S = 20.0  # bound of every wait on the node
RSS_SLACK_BYTES = 64 << 20  # the allocator, Python, proton: generous, so only unbounded growth fails
RECEIVE_BUFFER_BYTES = 4096  # the slow peers' socket receive buffer: the kernel holds little for them
BODY_BYTES = 1 << 20  # (a) the stuck consumer's messages
QUEUED_MESSAGES = 30  # (a) on the queue, each of its own group
CREDIT = 20  # (a) what the stuck consumer grants: the node may hand it this many and no more
FLOOD_BYTES_MAX = 256 << 20  # (b) the node must stop reading the churning peer long before this
CHURN_LINK_NAME_CHARS = 8000  # (b) well under a frame (proton's 32 KiB at least): the output cap in few pairs
SHORT_CHURN_LINK_NAME_CHARS = 0  # (b) many small pairs: proton's per-attach work grows with the links it holds
STILL_ACCEPTED_MAX_BYTES = 64 << 20  # (b) what the kernel may still take once the node stopped reading
FLOOD_STALL_S = 2.0  # (b) a send blocked this long ends the churn; the checks that follow decide


# ---- helpers -------------------------------------------------------------------------------------

class Steady:
    """A well-behaved client on another connection; every round trip must complete."""

    def __init__(self, node):
        self.connection = BlockingConnection(node.url, timeout=WAIT_S)
        self.receiver = self.connection.create_receiver("steady", name="steady-in", credit=10)
        self.sender = self.connection.create_sender("steady", name="steady-out")
        self.sequence = 0

    def round_trip(self) -> None:
        self.sequence += 1
        message = Message(body=f"steady {self.sequence}")
        message.group_id = "steady-group"
        self.sender.send(message, timeout=WAIT_S)
        assert self.receiver.receive(timeout=WAIT_S).body == message.body
        self.receiver.accept()

    def close(self) -> None:
        self.connection.close()


def metrics(node) -> dict[str, float]:
    with urllib.request.urlopen(f"http://{node.http_address}/metrics", timeout=WAIT_S) as response:
        lines = response.read().decode().splitlines()
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in lines
            if line.startswith("grouper_") and not line.startswith("#")}


def wait_for(node, steady: Steady, predicate, what: str) -> dict:
    """Poll the node's metrics until `predicate(metrics)`, a steady round trip between polls."""
    deadline = time.monotonic() + WAIT_S
    while True:
        values = metrics(node)
        if predicate(values):
            return values
        assert time.monotonic() < deadline, f"not reached within {WAIT_S} s: {what}; metrics {values}"
        steady.round_trip()


def rss_bytes(node) -> int:
    with open(f"/proc/{node.process.pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS line")


def _opened_session(container: str):
    """An in-memory client transport with its connection and one session opened: (transport, session)."""
    connection = Connection()
    transport = Transport()
    transport.bind(connection)
    connection.container = container
    connection.open()
    session = connection.session()
    session.open()
    return transport, session


def client_stream(open_links) -> bytes:
    """The bytes a client sends to open a connection, a session and the links `open_links(session)` opens."""
    transport, session = _opened_session("slow-peer")
    open_links(session)
    return bytes(transport.peek(transport.pending()))


def slow_socket(node) -> socket.socket:
    """A socket whose receive buffer is small; its peer (the node) soon has to buffer what it sends."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER_BYTES)  # before connect: the window
    host, port = node.amqp_address.rsplit(":", 1)
    sock.settimeout(WAIT_S)
    sock.connect((host, int(port)))
    return sock


# ---- (a) a consumer that stops reading -----------------------------------------------------------

def test_a_consumer_that_stops_reading_gets_its_credit_and_no_more_while_others_keep_flowing(node_factory):
    node = node_factory(queue_toml("slow", durable=False) + queue_toml("steady", durable=False))
    steady = Steady(node)
    steady.round_trip()
    baseline_bytes = rss_bytes(node)
    producer = BlockingConnection(node.url, timeout=WAIT_S)
    sender = producer.create_sender("slow")
    for index in range(QUEUED_MESSAGES):
        message = Message(body=b"x" * BODY_BYTES)
        message.group_id = f"g{index}"
        sender.send(message, timeout=WAIT_S)
    producer.close()

    def open_consumer(session):
        receiver = session.receiver("stuck-in")
        receiver.source.address = "slow"
        receiver.open()
        receiver.flow(CREDIT)

    stuck = slow_socket(node)
    stuck.sendall(client_stream(open_consumer))  # and never reads again
    acquired = 'grouper_queue_acquired_messages{queue="slow"}'
    wait_for(node, steady, lambda values: values.get(acquired) == CREDIT,
             f"the stuck consumer holding its {CREDIT} credits' worth")
    for _ in range(5):
        steady.round_trip()
    values = metrics(node)
    assert values[acquired] == CREDIT  # its credit, and no more
    assert values["grouper_engine_connections"] == 2  # the steady client and the stuck one
    held_bytes = (QUEUED_MESSAGES + CREDIT) * BODY_BYTES  # the queue's payloads, and proton's copies of the sent
    growth_bytes = rss_bytes(node) - baseline_bytes
    assert growth_bytes < held_bytes + OUTPUT_MAX_BYTES + RSS_SLACK_BYTES, f"RSS grew {growth_bytes >> 20} MiB"

    # the rest of the queue goes to a consumer that reads
    reader = BlockingConnection(node.url, timeout=WAIT_S)
    receiver = reader.create_receiver("slow", name="reader", credit=5)
    for _ in range(QUEUED_MESSAGES - CREDIT):
        assert len(receiver.receive(timeout=WAIT_S).body) == BODY_BYTES
        receiver.accept()
    reader.close()

    stuck.close()  # what it held goes back to the queue, and its engine objects go
    wait_for(node, steady, lambda values: values["grouper_engine_connections"] == 1
             and values[acquired] == 0
             and values['grouper_queue_depth_messages{queue="slow"}'] == CREDIT, "the stuck consumer released")
    steady.close()


# ---- (b) a peer that keeps sending and never reads ------------------------------------------------
#
# A producer that never reads cannot flood transfers: the session window it was given runs out after
# a few hundred frames (and the node closes a peer that exceeds it, amqp:session:window-violation).
# What a peer can send for ever, never reading, is link churn: attach and detach (closed) the same
# link again and again. The node answers each pair with its own attach (echoing the link's name),
# a flow granting credit and a detach, so its output for this peer grows as fast as the input. A
# long link name makes that a matter of bytes, not of frames: the node reaches its output cap after
# a few thousand pairs, a fraction of a second of its work.

def churn_stream(name_chars: int) -> tuple[bytes, bytes]:
    """(connection open, one attach + detach pair of a producer link that can be repeated as is)."""
    transport, session = _opened_session("churning-peer")
    opening = bytes(transport.peek(transport.pending()))
    transport.pop(len(opening))
    sender = session.sender("churn-" + "x" * name_chars)
    sender.target.address = "churn"
    sender.open()
    sender.close()  # detach closed=true, handle 0: free again for the next attach
    return opening, bytes(transport.peek(transport.pending()))


@pytest.mark.parametrize("name_chars", [CHURN_LINK_NAME_CHARS, SHORT_CHURN_LINK_NAME_CHARS])
def test_a_peer_that_keeps_sending_and_never_reads_is_no_longer_read_while_others_keep_flowing(node_factory,
                                                                                                name_chars):
    # short names once stalled the node over 20 s: every attach of a 256 KiB read went to proton at
    # once, and its lookups over the links and handles of the session grew with their number
    node = node_factory(queue_toml("churn", durable=False) + queue_toml("steady", durable=False))
    steady = Steady(node)
    steady.round_trip()
    baseline_bytes = rss_bytes(node)
    opening, pair = churn_stream(name_chars)
    batch = pair * 64

    churning = slow_socket(node)
    churning.sendall(opening)  # and never reads anything
    churning.settimeout(FLOOD_STALL_S)
    pushed_bytes = 0
    while True:
        try:
            churning.sendall(batch)
        except socket.timeout:
            break  # the kernel's buffers are full: the node has stopped reading, or is slow (checked below)
        pushed_bytes += len(batch)
        assert pushed_bytes < FLOOD_BYTES_MAX, "the node kept reading a peer that never reads its answers"

    for _ in range(5):
        steady.round_trip()
    values = metrics(node)
    assert values["grouper_engine_connections"] == 2
    assert values["grouper_engine_links"] <= 3  # the steady client's two, and at most one churning link
    # the kernel may still take a little (its buffers grow), but a node that reads would take it all
    churning.setblocking(False)
    accepted_bytes = 0
    try:
        while accepted_bytes < STILL_ACCEPTED_MAX_BYTES:
            accepted_bytes += churning.send(batch)
    except BlockingIOError:
        pass
    assert accepted_bytes < STILL_ACCEPTED_MAX_BYTES, "the node reads the churning peer although its answers " \
                                                      "are still unread"
    growth_bytes = rss_bytes(node) - baseline_bytes
    assert growth_bytes < OUTPUT_MAX_BYTES + RSS_SLACK_BYTES, f"RSS grew {growth_bytes >> 20} MiB " \
                                                             f"after {pushed_bytes >> 20} MiB of churn"

    churning.close()  # unread data: a reset; the node lets go of the connection
    wait_for(node, steady, lambda values: values["grouper_engine_connections"] == 1, "the churning peer released")
    steady.close()
