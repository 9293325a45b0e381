"""LoopControl's membership changes: a denial is retried until the change is done, bounded by time."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from node.core.errors import HandlerUnavailable, NotFound
from node.admin.loop_control import LoopControl


class FakeHandler:
    """Answers each proposal with the next outcome (None: committed); `members` is this node's view."""

    def __init__(self, outcomes, members):
        self.outcomes = list(outcomes)
        self.members = set(members)
        self.proposals = 0

    def _propose(self, node_id, on_done, adding):
        self.proposals += 1
        outcome = self.outcomes.pop(0) if self.outcomes else "the raft cluster denied the request"
        if outcome is None:
            (self.members.add if adding else self.members.discard)(node_id)
        threading.Thread(target=on_done, args=(outcome,)).start()  # pysyncobj calls back on its tick thread

    def add_member(self, node_id, on_done):
        self._propose(node_id, on_done, True)

    def remove_member(self, node_id, on_done):
        self._propose(node_id, on_done, False)

    def forget_node(self, node_id, on_result):  # remove-node's second step (handler/member_removal.py)
        threading.Thread(target=on_result, args=(None, 0)).start()

    def status(self):
        return {"members": sorted(self.members)}


def control(handler, admin_timeout_ms=2000):
    cluster = SimpleNamespace(router=SimpleNamespace(routes={}), members={"nodes": {}})
    node = SimpleNamespace(handler=handler, cluster=cluster, config=SimpleNamespace(admin_timeout_ms=admin_timeout_ms),
                           bridge=SimpleNamespace(call=lambda fn, timeout_ms: fn()))
    return LoopControl(node)


DENIED = "the raft cluster denied the request"


def test_a_denied_change_is_proposed_again_until_it_commits():
    handler = FakeHandler([DENIED, DENIED, None], members=["a:1", "b:1"])
    control(handler).add_member("c:1")
    assert handler.proposals == 3 and "c:1" in handler.members


def test_adding_a_member_that_is_one_already_succeeds_without_retrying():
    handler = FakeHandler([DENIED], members=["a:1", "b:1", "c:1"])
    control(handler).add_member("c:1")
    assert handler.proposals == 1


def test_removing_a_node_that_is_no_member_is_not_found_at_once():
    handler = FakeHandler([DENIED], members=["a:1", "b:1"])
    with pytest.raises(NotFound, match="x:1 is not a member of the raft cluster"):
        control(handler).remove_member("x:1")
    assert handler.proposals == 1


def test_a_change_denied_for_half_the_admin_timeout_fails_naming_the_tries_and_the_reason():
    handler = FakeHandler([], members=["a:1", "b:1", "c:1"])
    with pytest.raises(HandlerUnavailable, match=r"did not change membership of c:1 in \d+ tries over 500 ms: "
                                                 r"the raft cluster denied the request"):
        control(handler, admin_timeout_ms=1000).remove_member("c:1")
    assert 2 <= handler.proposals <= 4  # one every 200 ms within 500 ms
