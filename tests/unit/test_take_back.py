"""Broker.take_back: what a failed journal batch refused is never delivered, or its refusal says it was.

A durable send is in the broker, and may be delivered, before its journal batch is on disk. When the
batch fails, what no consumer or browser has seen is withdrawn (no REMOVE: it was never stored) and
its group forgotten if that leaves it idle; what was handed out stays, reported as such, so its
producer is told the outcome is unknown. The hypothesis model of dispatch (test_dispatch_model.py)
takes batches back at random; these are the cases one by one.
"""

from __future__ import annotations

import pytest

from node.core.dispatch.broker import Broker
from node.core.durability import PRODUCER, Durability
from node.core.effects import Deliver, Removed, Stored, Withdrawn
from node.core.errors import ResourceLimitExceeded, StoreFailed
from node.core.dispatch.message import REMOVED, Message, Outcome
from node.core.dispatch.settings import QueueSettings


def broker_with(**settings) -> Broker:
    broker = Broker()
    broker.declare_queue(QueueSettings(name="q", **settings))
    return broker


def send(broker: Broker, group: str | None = "g", now_ms: int = 0, queue: str = "q") -> tuple[Message, list]:
    message = Message(b"m%d" % broker.next_seq, group)
    return message, broker.enqueue(queue, message, now_ms)


def consumer_with_credit(broker: Broker, consumer_id: str, credit: int, browse: bool = False) -> list:
    return broker.attach_consumer("q", consumer_id, browse, 0) + broker.set_credit(consumer_id, credit, 0)


def test_a_queued_send_is_withdrawn_without_a_removal_record_and_its_idle_group_is_forgotten():
    broker = broker_with()
    message, effects = send(broker)
    assert [type(effect) for effect in effects] == [Stored]

    handed_out, effects = broker.take_back([("q", message)], now_ms=1)

    assert handed_out == [False]
    assert effects == [Withdrawn("q", message.seq)]  # nothing to journal: its STORE never reached the disk
    queue = broker.queues["q"]
    assert message.state == REMOVED and queue.depth_messages == 0 and queue.depth_bytes == 0
    assert queue.groups == {}
    assert consumer_with_credit(broker, "c1", 5) == []  # a consumer attached afterwards gets nothing


def test_a_withdrawn_send_frees_its_groups_place_under_groups_max():
    broker = broker_with(groups_max=1)
    message, _ = send(broker, "g1")
    with pytest.raises(ResourceLimitExceeded):
        send(broker, "g2")
    broker.take_back([("q", message)], now_ms=1)
    send(broker, "g2")
    assert list(broker.queues["q"].groups) == ["g2"]


def test_a_delivered_send_is_not_taken_back_and_its_accept_journals_a_removal_of_a_seq_never_stored():
    broker = broker_with()
    consumer_with_credit(broker, "c1", 5)
    message, effects = send(broker)
    [delivery] = [effect for effect in effects if type(effect) is Deliver]

    handed_out, effects = broker.take_back([("q", message)], now_ms=1)

    assert handed_out == [True] and effects == []
    # it stays its consumer's; settled, its REMOVE names a seq the journal never stored (recovery skips it)
    assert broker.settle("c1", delivery.delivery_id, Outcome.ACCEPTED, 2) == [Removed("q", message.seq)]


def test_a_delivered_send_released_after_its_batch_failed_is_delivered_again_from_memory():
    broker = broker_with()
    consumer_with_credit(broker, "c1", 1)
    message, effects = send(broker)
    [delivery] = [effect for effect in effects if type(effect) is Deliver]
    broker.take_back([("q", message)], now_ms=1)

    effects = broker.settle("c1", delivery.delivery_id, Outcome.RELEASED, 2)
    effects += broker.set_credit("c1", 1, 3)

    assert [effect.message for effect in effects if type(effect) is Deliver] == [message]


def test_a_send_settled_before_its_batch_failed_is_reported_handed_out():
    broker = broker_with()
    consumer_with_credit(broker, "c1", 1)
    message, effects = send(broker)
    [delivery] = [effect for effect in effects if type(effect) is Deliver]
    broker.settle("c1", delivery.delivery_id, Outcome.ACCEPTED, 1)

    assert broker.take_back([("q", message)], now_ms=2) == ([True], [])


def test_a_send_a_browser_has_seen_is_reported_handed_out_and_stays_queued():
    broker = broker_with()
    consumer_with_credit(broker, "b1", 5, browse=True)
    message, effects = send(broker)
    assert any(type(effect) is Deliver and effect.browse for effect in effects)

    assert broker.take_back([("q", message)], now_ms=1) == ([True], [])
    assert broker.queues["q"].depth_messages == 1


def test_a_send_moved_to_another_queue_is_reported_handed_out():
    broker = broker_with()
    broker.declare_queue(QueueSettings(name="elsewhere"))
    message, _ = send(broker)
    broker.move_group("q", "g", "elsewhere", None, 1)  # its copy is stored in "elsewhere"

    assert broker.take_back([("q", message)], now_ms=2) == ([True], [])
    assert broker.queues["elsewhere"].depth_messages == 1


def test_a_send_that_expired_unseen_counts_as_taken_back_with_nothing_left_to_do():
    broker = broker_with()
    message = Message(b"m", "g", expires_at_ms=5)
    broker.enqueue("q", message, 0)
    broker.tick(10)

    assert broker.take_back([("q", message)], now_ms=11) == ([False], [])


def test_an_exclusive_owner_keeps_its_group_when_a_queued_send_of_it_is_withdrawn():
    broker = broker_with(group_policy="exclusive")
    consumer_with_credit(broker, "c1", 1)
    send(broker)  # delivered: c1 owns g
    queued, _ = send(broker)  # c1 has no credit left: queued
    _, effects = broker.take_back([("q", queued)], now_ms=1)

    assert effects == [Withdrawn("q", queued.seq)]
    assert broker.list_groups("q") == [{"group": "g", "messages": 1, "acquired": 1, "consumer": "c1"}]


def test_a_shared_group_whose_only_queued_send_is_withdrawn_is_forgotten_once_its_owner_settles():
    broker = broker_with(group_policy="shared")
    consumer_with_credit(broker, "c1", 1)
    _, effects = send(broker)
    [delivery] = [effect for effect in effects if type(effect) is Deliver]
    queued, _ = send(broker)
    broker.take_back([("q", queued)], now_ms=1)
    broker.settle("c1", delivery.delivery_id, Outcome.ACCEPTED, 2)

    assert broker.list_groups("q") == []


def test_sends_are_answered_in_the_order_given_and_only_the_unseen_ones_withdrawn():
    broker = broker_with()
    consumer_with_credit(broker, "c1", 1)
    delivered, _ = send(broker, "a")
    queued, _ = send(broker, "b")
    ungrouped, _ = send(broker, None)

    handed_out, effects = broker.take_back([("q", delivered), ("q", queued), ("q", ungrouped)], now_ms=1)

    assert handed_out == [True, False, False]
    assert effects == [Withdrawn("q", queued.seq), Withdrawn("q", ungrouped.seq)]
    assert broker.queues["q"].depth_messages == 1


def test_a_failed_batch_hands_back_the_send_each_producer_stored_and_none_for_other_waiters():
    durability = Durability(retry_interval_ms=1000)
    message = Message(b"m", "g", seq=7)
    durability.wait("send", PRODUCER, ("q", message))
    durability.wait("forwarded send", PRODUCER)  # held in the cluster's outbound store, not the broker
    durability.batch_ended(1)

    refused = durability.failed(1, "disk full", now_ms=0)

    assert [(w.target, w.stored) for w in refused] == [("send", ("q", message)), ("forwarded send", None)]


def test_the_refusal_of_a_send_already_delivered_says_its_outcome_is_unknown_and_a_resend_may_duplicate():
    unknown = StoreFailed("disk full: no space left", outcome_unknown=True)
    refused = StoreFailed("disk full: no space left", outcome_unknown=False)

    assert unknown.description.startswith("outcome unknown")
    assert "already been delivered to a consumer" in unknown.description
    assert "may deliver it twice" in unknown.description
    assert "will not be delivered" in refused.description and "send it again" in refused.description
    assert unknown.fault == refused.fault == "node" and "disk full" in refused.description
