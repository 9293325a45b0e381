"""The bridge into the engine loop: closures run in post order, one wake-up per burst, and a post
from the loop's own thread wakes it without a signal across threads."""

from __future__ import annotations

import threading

import pytest

from node.amqp.bridge import BACKLOG_MAX_CLOSURES, Bridge, BridgeFull


class Wakes:
    def __init__(self):
        self.calls: list[str] = []

    def bridge(self) -> Bridge:
        return Bridge(lambda: self.calls.append("from thread"), lambda: self.calls.append("here"))


def post_from_another_thread(bridge: Bridge, fn) -> None:
    poster = threading.Thread(target=bridge.post, args=(fn,))
    poster.start()
    poster.join()


def test_a_burst_of_posts_wakes_the_loop_once_until_it_drains():
    wakes = Wakes()
    bridge = wakes.bridge()
    ran: list[int] = []
    for number in range(3):
        bridge.post(lambda number=number: ran.append(number))
    assert wakes.calls == ["from thread"]  # no loop thread registered: every caller is another thread
    bridge.drain()
    assert ran == [0, 1, 2]
    bridge.post(lambda: ran.append(3))
    assert wakes.calls == ["from thread", "from thread"]


def test_a_post_from_the_loops_own_thread_wakes_it_here_and_keeps_post_order():
    wakes = Wakes()
    bridge = wakes.bridge()
    bridge.loop_thread_id = threading.get_ident()  # this test's thread plays the loop
    ran: list[str] = []
    bridge.post(lambda: ran.append("loop"))
    post_from_another_thread(bridge, lambda: ran.append("other"))
    assert wakes.calls == ["here"]  # the other thread found the drain already due
    bridge.drain()
    post_from_another_thread(bridge, lambda: ran.append("other again"))
    assert wakes.calls == ["here", "from thread"]
    bridge.drain()
    assert ran == ["loop", "other", "other again"]


def test_a_closed_bridge_queues_but_wakes_nobody():
    wakes = Wakes()
    bridge = wakes.bridge()
    bridge.close()
    bridge.post(lambda: None)
    assert wakes.calls == []


def test_posts_beyond_the_backlog_limit_are_refused_with_a_retry_hint():
    bridge = Wakes().bridge()
    for _ in range(BACKLOG_MAX_CLOSURES):
        bridge.post(lambda: None)
    with pytest.raises(BridgeFull, match="retry later"):
        bridge.post(lambda: None)
    bridge.drain()
    bridge.post(lambda: None)  # room again once the loop has run them
