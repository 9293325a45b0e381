"""handler/member_channel.py (MemberChannel): whole messages in order over a socketpair, and one report when the other end goes."""

from __future__ import annotations

import asyncio
import socket
import struct
import threading

from handler.member_channel import MESSAGE_BYTES_MAX, MemberChannel

WAIT_S = 30.0  # bound of every wait for the other thread; never a measure of speed


class Inbox:
    def __init__(self, expected: int = 0):
        self.messages: list = []
        self.closed: list[str] = []
        self.expected = expected
        self.all_in = threading.Event()
        self.gone = threading.Event()

    def on_message(self, message) -> None:
        self.messages.append(message)
        if len(self.messages) >= self.expected:
            self.all_in.set()

    def on_closed(self, reason: str) -> None:
        self.closed.append(reason)
        self.gone.set()


def pair(expected: int):
    left_socket, right_socket = socket.socketpair()
    left_inbox, right_inbox = Inbox(), Inbox(expected)
    left = MemberChannel(left_socket, "left", left_inbox.on_message, left_inbox.on_closed)
    right = MemberChannel(right_socket, "right", right_inbox.on_message, right_inbox.on_closed)
    left.start()
    right.start()
    return left, right, left_inbox, right_inbox


def test_messages_arrive_whole_and_in_the_order_sent_however_the_writes_batch_them():
    sent = [("applied", "routes", [("q", f"g{i}", "n1")] * (i % 7), i) for i in range(5000)]
    left, right, _, inbox = pair(len(sent))
    try:
        for message in sent:
            left.send(message)
        assert inbox.all_in.wait(WAIT_S), f"{len(inbox.messages)} of {len(sent)} arrived"
        assert inbox.messages == sent
    finally:
        left.close()
        right.close()


def test_a_message_larger_than_the_socket_buffers_and_the_read_chunk_arrives_whole():
    snapshot = ("applied", "snapshot", [("jobs", f"group-{i}", "127.0.0.1:5674", i) for i in range(200_000)], None)
    left, right, _, inbox = pair(2)
    try:
        left.send(snapshot)
        left.send(("ready",))
        assert inbox.all_in.wait(WAIT_S)
        assert inbox.messages == [snapshot, ("ready",)]
    finally:
        left.close()
        right.close()


def test_the_other_end_closing_is_reported_once_with_a_reason_and_later_sends_are_dropped():
    left, right, left_inbox, right_inbox = pair(1)
    right.close()
    assert left_inbox.gone.wait(WAIT_S)
    left.send(("claim", 1, [], 0))  # dropped: nobody is there
    left.close()
    assert len(left_inbox.closed) == 1 and "closed" in left_inbox.closed[0]
    assert right_inbox.closed == []  # closing on purpose is no loss to report


def test_a_length_beyond_the_limit_closes_the_channel_instead_of_waiting_for_a_gigabyte():
    raw, channel_socket = socket.socketpair()
    inbox = Inbox()
    channel = MemberChannel(channel_socket, "victim", inbox.on_message, inbox.on_closed)
    channel.start()
    try:
        raw.sendall(struct.pack(">I", MESSAGE_BYTES_MAX + 1))
        assert inbox.gone.wait(WAIT_S)
        assert inbox.messages == []
        assert f"more than {MESSAGE_BYTES_MAX}" in inbox.closed[0]
    finally:
        channel.close()
        raw.close()


def test_a_handler_that_raises_ends_the_channel_with_the_error_instead_of_leaving_it_deaf():
    left_socket, right_socket = socket.socketpair()
    inbox = Inbox()

    def broken(message):
        raise KeyError(message[0])

    left = MemberChannel(left_socket, "left", lambda message: None, lambda reason: None)
    right = MemberChannel(right_socket, "right", broken, inbox.on_closed)
    left.start()
    right.start()
    try:
        left.send(("no-such-request", 1))
        assert inbox.gone.wait(WAIT_S)
        assert inbox.closed == ["handling a message failed: KeyError: 'no-such-request'"]
    finally:
        left.close()
        right.close()


def run_until(loop, event: threading.Event) -> None:
    """Run `loop` until `event` is set (looked at every 10 ms), at most WAIT_S."""
    def look():
        if event.is_set():
            loop.stop()
        else:
            loop.call_later(0.01, look)
    deadline = loop.call_later(WAIT_S, loop.stop)
    loop.call_soon(look)
    loop.run_forever()
    deadline.cancel()


def test_on_an_asyncio_loop_messages_read_before_it_runs_and_after_arrive_in_order():
    left_socket, right_socket = socket.socketpair()
    sent = [("applied", "routes", [("q", f"g{i}", "n1")], i) for i in range(2000)]
    inbox = Inbox(len(sent) + 2)
    left = MemberChannel(left_socket, "left", Inbox().on_message, Inbox().on_closed)
    right = MemberChannel(right_socket, "right", inbox.on_message, inbox.on_closed)
    left.start()
    loop = asyncio.new_event_loop()
    try:
        left.send(("applied", "snapshot", [], None))  # what a member reports before it says it started
        left.send(("started",))
        left.send(sent[0])  # may come in the same read as "started": handed over in order all the same
        assert right.read_until(lambda message: message == ("started",), WAIT_S)
        right.start_on(loop)
        for message in sent[1:]:
            left.send(message)
        run_until(loop, inbox.all_in)
        assert inbox.messages == [("applied", "snapshot", [], None), ("started",), *sent]
        left.close()  # the other end going is reported on the loop too
        run_until(loop, inbox.gone)
        assert inbox.closed == ["the other end closed the channel"]
    finally:
        right.close()
        loop.close()


def test_read_until_gives_up_when_the_other_end_closes_before_the_message_comes():
    left_socket, right_socket = socket.socketpair()
    inbox = Inbox()
    right = MemberChannel(right_socket, "right", inbox.on_message, inbox.on_closed)
    left_socket.sendall(struct.pack(">I", 3))  # a length, then the end: no whole message
    left_socket.close()
    try:
        assert not right.read_until(lambda message: True, WAIT_S)
        assert inbox.closed == ["the other end closed the channel"]
    finally:
        right.close()
