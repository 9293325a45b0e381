"""The handover's one question (node/core/cluster/handover.py `placement`): where a message of a group
goes, for a producer's send here (source None) and for a forwarded entry, while the group moves or not.
And a journal answer goes back to the continuation its AfterFlush carried, nothing else."""

import pytest

from node.core.dispatch.broker import Broker
from node.core.cluster import ClusterProtocol
from node.core.cluster.feed import MOVES, ROUTES
from node.core.cluster.handover import AS_ROUTED, PARK, QUEUE, REFUSE, RELAY
from node.core.dispatch.message import Message
from node.core.dispatch.settings import QueueSettings

KEY = ("q", "g")


def node(node_id: str, owner: str = "n1") -> ClusterProtocol:
    broker = Broker()
    broker.declare_queue(QueueSettings(name="q", durable=True))
    cluster = ClusterProtocol(node_id, broker, handler_timeout_ms=300, routes_max=10, follows_consumers=True)
    cluster.ready(0)
    cluster.applied(ROUTES, [("q", "g", owner)], 0, 0)
    return cluster


def moving(cluster: ClusterProtocol, from_node: str = "n1", to_node: str = "n2") -> ClusterProtocol:
    cluster.applied(MOVES, [("q", "g", from_node, to_node, ("n1", "n2", "n3"))], None, 1)
    cluster.applied(ROUTES, [("q", "g", to_node)], 1, 1)
    return cluster


def test_a_group_no_move_concerns_goes_as_routed_from_a_producer_and_into_the_queue_when_forwarded_here():
    cluster = node("n1")
    assert cluster.handovers.placement(KEY, None, "n1") == AS_ROUTED
    assert cluster.handovers.placement(KEY, "n3") == QUEUE


def test_the_new_owner_queues_what_the_old_owner_sends_and_parks_everything_else():
    cluster = moving(node("n2"))
    assert cluster.handovers.placement(KEY, "n1") == QUEUE
    assert cluster.handovers.placement(KEY, "n3") == PARK
    assert cluster.handovers.placement(KEY, None, "n2") == PARK


def test_the_old_owner_relays_forwarded_messages_once_nothing_of_the_group_is_left_here():
    cluster = moving(node("n1"))
    assert cluster.handovers.placement(KEY, "n3") == RELAY
    assert cluster.handovers.placement(KEY, None, "n2") == AS_ROUTED  # its producers' sends follow the route


def test_the_old_owner_queues_behind_what_the_group_still_has_here_and_refuses_behind_a_park():
    cluster = moving(node("n1"))
    cluster.broker.enqueue("q", Message(b"m1", "g"), 0)
    assert cluster.handovers.placement(KEY, "n3") == QUEUE
    assert cluster.handovers.placement(KEY, None, "n2") == QUEUE
    cluster.parked[KEY] = [Message(b"m2", "g")]  # parked behind a cold tail
    assert cluster.handovers.placement(KEY, "n3") == PARK
    assert cluster.handovers.placement(KEY, None, "n2") == REFUSE


def test_a_third_node_queues_what_the_groups_next_owner_sends_it_and_parks_the_rest():
    # another node's group sent here: a move to this node its replica has not seen yet. What the group's
    # owner (once the move between the other two ends) sends goes first; anything else waits behind it
    cluster = moving(node("n3"))
    assert cluster.handovers.placement(KEY, "n2") == QUEUE
    assert cluster.handovers.placement(KEY, "n1") == PARK
    cluster.applied(MOVES, [("q", "g", "n1", "n2", ())], None, 2)  # ended
    assert cluster.handovers.placement(KEY, "n2") == QUEUE
    assert cluster.handovers.placement(KEY, "n1") == PARK


def test_flushed_hands_a_journal_answer_to_the_continuation_and_refuses_anything_else():
    cluster = node("n1", owner="n2")
    cluster.arrive("m1", "q", "g", Message(b"m1", "g"), True, False, 0)
    [after_flush] = [effect for effect in cluster.quiesced(0) if type(effect).__name__ == "AfterFlush"]
    assert [type(effect).__name__ for effect in cluster.flushed(after_flush.what, None, 1)] == ["SubmitForward"]
    with pytest.raises(AssertionError, match="no AfterFlush of this protocol made"):
        cluster.flushed(("batch", None), None, 1)
