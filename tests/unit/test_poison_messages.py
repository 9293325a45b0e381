"""Poison messages: the delivery limit, the redelivery delay, and the dead-letter queue. Time is `now_ms`."""

from __future__ import annotations

import pytest

from node.core.dispatch.broker import Broker
from node.core.effects import DeadLettered, Delayed, Kept
from node.core.errors import InvalidConfig
from node.core.dispatch.settings import QueueSettings


def _effects(h, kind) -> list:
    return [e for e in h.last_effects if isinstance(e, kind)]


def test_a_queue_dead_letters_after_ten_failed_deliveries_by_default(make):
    h = make(queue="jobs")
    h.attach("c1", 10)
    h.send("a", "a1")
    for _ in range(9):
        assert h.modify("a1") == [("c1", "a1")]
    h.modify("a1")
    [dead] = _effects(h, DeadLettered)
    assert (dead.queue, dead.dead_letter_queue, dead.reason) == ("jobs", "jobs.DLQ", "delivery_count_max=10 reached")
    dlq = h.broker.queues["jobs.DLQ"]
    [copy] = dlq.browse_available()
    assert (copy.payload, copy.group_id, copy.delivery_count) == (b"a1", "a", 10)
    assert h.stats()["depth_messages"] == 0
    assert h.dropped() == []


def test_the_group_next_message_is_delivered_once_its_head_is_dead_lettered(make):
    h = make(delivery_count_max=2)
    h.attach("c1", 1)
    h.send("a", "a1")
    h.send("a", "a2")
    h.modify("a1")
    assert h.credit("c1", 1) == [("c1", "a1")]
    h.modify("a1")
    assert h.credit("c1", 1) == [("c1", "a2")]


def test_a_plain_release_is_no_failed_delivery_and_waits_no_delay(make):
    h = make(redelivery_delay_ms=100, delivery_count_max=1)
    h.attach("c1", 2)
    h.send("a", "a1")
    assert h.release("a1") == [("c1", "a1")]
    assert h.delivery_counts() == {"a1": 0}


def test_a_failed_delivery_waits_out_the_delay_and_its_group_waits_with_it(make):
    h = make(redelivery_delay_ms=100)
    h.attach("c1", 10)
    h.send("a", "a1")
    h.send("a", "a2")
    h.send("b", "b1")
    assert h.held_by("c1") == ["a1", "a2", "b1"]
    h.accept("b1")
    assert h.modify("a1") == []
    assert [e.until_ms for e in _effects(h, Delayed)] == [100]
    h.accept("a2")  # already out before a1 failed: the delay holds back only what is still queued
    h.send("a", "a3")
    h.send("b", "b2")
    assert h.tick(0) == [] and h.held_by("c1") == ["b2"]  # other groups flow; a waits
    assert h.tick(99) == []
    assert h.tick(100) == [("c1", "a1"), ("c1", "a3")]


def test_the_delay_grows_by_the_multiplier_up_to_its_maximum(make):
    h = make(redelivery_delay_ms=10, redelivery_delay_multiplier=2.0, redelivery_delay_max_ms=50)
    h.attach("c1", 10)
    h.send("a", "a1")
    waits = []
    for _ in range(5):
        h.modify("a1")
        [delayed] = _effects(h, Delayed)
        waits.append(delayed.until_ms - h.now_ms)
        assert h.tick(delayed.until_ms - 1) == []
        assert h.tick(delayed.until_ms) == [("c1", "a1")]
    assert waits == [10, 20, 40, 50, 50]


def test_the_maximum_defaults_to_ten_times_the_delay():
    settings = QueueSettings(name="q", redelivery_delay_ms=7, redelivery_delay_multiplier=3.0)
    assert [settings.redelivery_delay_for_ms(n) for n in (1, 2, 3, 4)] == [7, 21, 63, 70]


def test_a_delayed_message_without_group_holds_back_no_other_message(make):
    h = make(group_policy="none", redelivery_delay_ms=100)
    h.attach("c1", 3)
    h.send(None, "m1")
    assert h.modify("m1") == []
    assert h.send(None, "m2") == [("c1", "m2")]
    assert h.tick(100) == [("c1", "m1")]


def test_the_consumer_crash_counts_as_a_failed_delivery_and_is_delayed(make):
    h = make(redelivery_delay_ms=30)
    h.attach("c1", 1)
    h.send("a", "a1")
    h.attach("c2", 0)
    h.detach("c1")
    assert h.credit("c2", 1) == []
    assert h.tick(30) == [("c2", "a1")]
    assert h.delivery_counts() == {"a1": 1}


def test_a_tick_finds_the_next_redelivery_deadline(make):
    h = make(redelivery_delay_ms=40)
    h.attach("c1", 1)
    h.send("a", "a1")
    h.modify("a1")
    assert h.broker.next_deadline_ms() == 40


def test_a_rejected_message_goes_to_the_dead_letter_queue_with_its_reason(make):
    h = make(queue="jobs")
    h.attach("c1", 1)
    h.send("a", "a1")
    h.reject("a1")
    assert [(e.dead_letter_queue, e.reason) for e in _effects(h, DeadLettered)] == [("jobs.DLQ", "rejected")]


def test_the_dead_letter_stamp_records_the_original_queue_and_reason():
    broker = Broker(dead_letter_stamp=lambda payload, queue, reason: payload + f"|{queue}|{reason}".encode())
    from tests.unit.conftest import Harness
    h = Harness(broker=broker, queue="jobs")
    h.attach("c1", 1)
    h.send("a", "a1")
    h.reject("a1")
    assert [m.payload for m in broker.queues["jobs.DLQ"].browse_available()] == [b"a1|jobs|rejected"]


def test_a_dead_letter_queue_is_created_as_one_with_no_limit_and_no_queue_of_its_own(make):
    h = make(queue="jobs", delivery_count_max=1)
    h.attach("c1", 1)
    h.send("a", "a1")
    h.modify("a1")
    settings = h.broker.queues["jobs.DLQ"].settings
    assert (settings.delivery_count_max, settings.dead_letter_queue_auto_create) == (0, False)


def test_with_no_dead_letter_queue_an_over_delivered_message_is_kept_and_said_so_once(make):
    h = make(queue="jobs", delivery_count_max=2, dead_letter_queue_auto_create=False)
    h.attach("c1", 10)
    h.send("a", "a1")
    h.modify("a1")
    assert h.modify("a1") == [("c1", "a1")]
    [kept] = _effects(h, Kept)
    assert "'jobs.DLQ' does not exist" in kept.reason and "grouper queue add jobs.DLQ" in kept.reason
    assert h.modify("a1") == [("c1", "a1")] and _effects(h, Kept) == []
    h.broker.declare_queue(QueueSettings(name="jobs.DLQ"))  # the operator makes one: the next failure uses it
    assert h.modify("a1") == []
    assert [e.dead_letter_queue for e in _effects(h, DeadLettered)] == ["jobs.DLQ"]


def test_a_full_dead_letter_queue_keeps_the_over_delivered_message(make):
    broker = Broker()
    broker.declare_queue(QueueSettings(name="jobs.DLQ", depth_max_messages=1))
    from tests.unit.conftest import Harness
    h = Harness(broker=broker, queue="jobs", delivery_count_max=1)
    h.attach("c1", 2)
    h.send("a", "a1")
    h.send("b", "b1")
    h.modify("a1")
    assert len(_effects(h, DeadLettered)) == 1
    h.modify("b1")
    [kept] = _effects(h, Kept)
    assert "'jobs.DLQ' is full" in kept.reason
    assert h.stats()["depth_messages"] == 1
    assert h.credit("c1", 1) == [("c1", "b1")]


@pytest.mark.parametrize("values, key", [
    ({"redelivery_delay_ms": -1}, "redelivery_delay_ms"),
    ({"redelivery_delay_multiplier": 0.5}, "redelivery_delay_multiplier"),
    ({"redelivery_delay_ms": 100, "redelivery_delay_max_ms": 50}, "redelivery_delay_max_ms"),
    ({"dead_letter_queue": "q"}, "dead_letter_queue"),
    ({"delivery_count_max": -1}, "delivery_count_max"),
])
def test_bad_poison_settings_name_their_key(values, key):
    with pytest.raises(InvalidConfig) as error:
        QueueSettings(name="q", **values).validate()
    assert error.value.key == key


def test_the_multiplier_reads_integers_and_refuses_text():
    assert QueueSettings.from_dict({"name": "q", "redelivery-delay-multiplier": 2}).redelivery_delay_multiplier == 2.0
    with pytest.raises(InvalidConfig, match="queue.redelivery_delay_multiplier.*expected a number"):
        QueueSettings.from_dict({"name": "q", "redelivery_delay_multiplier": "fast"})
