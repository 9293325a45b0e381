"""A live queue given new settings (Broker.redefine_queue) applies them at once in every part of it:
node/core/dispatch/queue.py hands `settings` to each collaborator, and each reads its limits at each use."""

from __future__ import annotations

import dataclasses

import pytest

from node.core.errors import ResourceLimitExceeded
from node.core.dispatch.message import Message, Outcome
from node.core.dispatch.queue import Queue
from node.core.dispatch.settings import QueueSettings


def deliveries(effects: list) -> list:
    return [effect for effect in effects if type(effect).__name__ == "Deliver"]


def test_a_raised_depth_limit_admits_at_once():
    queue = Queue(QueueSettings(name="q", durable=False, depth_max_messages=1))
    queue.enqueue(Message(b"1", "a", seq=1), 0, [])
    with pytest.raises(ResourceLimitExceeded):
        queue.enqueue(Message(b"2", "a", seq=2), 0, [])
    queue.settings = dataclasses.replace(queue.settings, depth_max_messages=2)
    queue.enqueue(Message(b"2", "a", seq=2), 0, [])
    assert queue.depth_messages == 2


def test_a_lowered_delivery_count_max_dead_letters_at_the_next_failure():
    queue = Queue(QueueSettings(name="q", durable=False, delivery_count_max=10))
    effects: list = []
    queue.attach("c1", False, 0, effects)
    queue.set_credit("c1", 10, 0, effects)
    queue.enqueue(Message(b"1", "a", seq=1), 0, effects)
    [delivery] = deliveries(effects)
    queue.settings = dataclasses.replace(queue.settings, delivery_count_max=1)
    dead = queue.settle("c1", delivery.delivery_id, Outcome.MODIFIED, True, 0, [])
    assert [(message.seq, reason) for message, reason in dead] == [(1, "delivery_count_max=1 reached")]
    assert queue.depth_messages == 0


def test_a_redefined_groups_max_applies_to_the_next_new_group():
    queue = Queue(QueueSettings(name="q", durable=False, groups_max=0))
    queue.enqueue(Message(b"1", "a", seq=1), 0, [])
    queue.settings = dataclasses.replace(queue.settings, groups_max=1)
    with pytest.raises(ResourceLimitExceeded, match="groups_max=1"):
        queue.enqueue(Message(b"2", "b", seq=2), 0, [])
