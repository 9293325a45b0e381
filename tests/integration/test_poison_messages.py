"""Poison messages against a real node and a real proton client: delay, back-off, dead letter, order.

What is promised (README, "Poison messages"): a delivery that fails (modified with
delivery-failed) comes back after redelivery_delay_ms * multiplier^(n-1), at most
redelivery_delay_max_ms; its group waits meanwhile (nothing later in the group overtakes it) while
other groups flow; after delivery_count_max (default 10) failed deliveries it goes to QUEUE.DLQ,
auto-created, with its original queue named, and the group's next message follows in order.
Only "not before" is checked of the delays: a slow machine may deliver late, never early.
"""

from __future__ import annotations

import time

from proton import Delivery

from tests.integration.clients import queue_toml
from tests.integration.harness import ManualReceiver, connect, grouped, send_outcome

QUEUE = "jobs"
DELAY_MS = 40
MULTIPLIER = 2
DELAY_MAX_MS = 200
CLOCK_SLACK_MS = 5  # the node counts whole milliseconds on its own clock


def send(node, bodies: list[str]) -> None:
    connection = connect(node)
    try:
        sender = connection.create_sender(QUEUE)
        for body in bodies:
            state, condition = send_outcome(sender, grouped(body, body[0]))
            assert state == Delivery.ACCEPTED, (body, condition)
    finally:
        connection.close()


def test_a_failing_head_waits_its_growing_delay_holds_its_group_and_is_dead_lettered_after_10_attempts(
        node_factory):
    node = node_factory(queue_toml(QUEUE, redelivery_delay_ms=DELAY_MS, redelivery_delay_multiplier=MULTIPLIER,
                                   redelivery_delay_max_ms=DELAY_MAX_MS))
    send(node, ["A1", "A2", "B1", "B2"])
    connection = connect(node)
    try:
        consumer = ManualReceiver(connection, QUEUE, "worker")
        head = consumer.fetch()
        assert head.body == "A1"
        failures = 0
        others = []
        while head.body == "A1":
            failures += 1
            failed_at_s = time.monotonic()
            head.modify(failed=True)
            delay_ms = min(DELAY_MS * MULTIPLIER ** (failures - 1), DELAY_MAX_MS)
            head = consumer.fetch()
            while head.body.startswith("B"):  # other groups flow while A waits
                others.append(head.body)
                head.accept()
                head = consumer.fetch()
            if head.body == "A1":
                waited_ms = (time.monotonic() - failed_at_s) * 1000
                assert waited_ms >= delay_ms - CLOCK_SLACK_MS, (failures, waited_ms, delay_ms)
                assert head.delivery_count == failures
        assert failures == 10, f"A1 left its queue after {failures} failed deliveries"
        assert head.body == "A2", "the group's next message follows its dead-lettered head"
        assert others == ["B1", "B2"], "group B flowed, in order, while A1 waited"
        head.accept()

        dead = ManualReceiver(connection, f"{QUEUE}.DLQ", "inspector").fetch()
        assert dead.body == "A1"
        assert dead.message.annotations.get("x-opt-original-queue") == QUEUE
        assert "delivery_count_max" in str(dead.message.annotations.get("x-opt-dead-letter-reason"))
        assert dead.message.group_id == "A"
        dead.accept()
    finally:
        connection.close()
