"""Examples of the Broker facade: seq, journal effects, dead-lettering, moves, limits, deletion."""

from __future__ import annotations

import pytest

from node.amqp.conditions import condition_for
from node.core.dispatch.broker import Broker
from node.core.effects import Deliver, DetachConsumer, Dropped, Removed, Stored
from node.core.errors import (AlreadyExists, InvalidField, NotFound, ResourceDeleted,
                              ResourceLimitExceeded)
from node.core.dispatch.message import Message, Outcome
from node.core.dispatch.settings import QueueSettings


def snapshot(broker: Broker) -> tuple:
    return broker.next_seq, broker.list_queues(), {n: q.group_rows() for n, q in broker.queues.items()}


# ---- seq -----------------------------------------------------------------------------------------

def test_seq_is_node_wide_and_increases_across_queues(make):
    h = make()
    h.broker.declare_queue(QueueSettings(name="other"))
    h.send("a", "a1")
    h.send("a", "o1", queue="other")
    h.send("a", "a2")
    assert [m.seq for m in h.queue.browse_available()] == [1, 3]
    assert [m.seq for m in h.broker.queue("other").browse_available()] == [2]


def test_restore_keeps_the_stored_seq_and_moves_next_seq_past_it():
    broker = Broker()
    broker.declare_queue(QueueSettings(name="q"))
    broker.restore("q", Message(b"x", "a", seq=41))
    broker.restore("q", Message(b"y", "a", seq=7))
    assert broker.next_seq == 42
    assert broker.restore("q", Message(b"z", None, seq=50)) is None  # no effects: it is already journalled
    assert broker.queue("q").stats()["depth_messages"] == 3


# ---- journal effects -----------------------------------------------------------------------------

def test_a_durable_queue_journals_a_message_before_delivering_it(make):
    h = make(durable=True)
    h.attach("c1", 1)
    h.send("a", "a1")
    kinds = [type(e) for e in h.last_effects]
    assert kinds == [Stored, Deliver]


def test_a_durable_queue_journals_the_removal_of_an_accepted_message(make):
    h = make(durable=True)
    h.attach("c1", 1)
    h.send("a", "a1")
    h.accept("a1")
    assert h.journal() == [("removed", "q", 1)]


def test_a_released_message_is_not_removed_from_the_journal(make):
    h = make(durable=True)
    h.attach("c1", 1)
    h.send("a", "a1")
    h.release("a1")
    assert h.journal() == []


def test_a_non_durable_queue_emits_no_journal_effects(make):
    h = make(durable=False)
    h.attach("c1", 1)
    h.send("a", "a1")
    h.accept("a1")
    h.send("a", "a2", ttl_ms=5)
    h.tick(5)
    assert h.journal() == []
    assert [reason for _, _, reason in h.dropped()] == ["ttl expired"]


def test_an_expiry_on_a_durable_queue_is_journalled_as_a_removal_then_reported(make):
    h = make(durable=True)
    h.send("a", "a1", ttl_ms=5)
    h.tick(5)
    assert h.last_effects == [Removed("q", 1), Dropped("q", 1, "ttl expired")]


# ---- dead letters --------------------------------------------------------------------------------

def test_a_rejected_message_is_stored_in_the_dead_letter_queue_before_it_is_removed(make):
    h = make(durable=True, dead_letter_queue="dlq")
    h.attach("c1", 1)
    h.send("a", "a1")
    h.reject("a1")
    assert h.journal() == [("stored", "dlq", "a1"), ("removed", "q", 1)]
    dead = h.broker.queue("dlq").browse_available()
    assert [(m.payload, m.group_id, m.seq) for m in dead] == [(b"a1", "a", 2)]


def test_a_rejected_message_goes_to_the_auto_created_dead_letter_queue_by_default(make):
    h = make(durable=True)
    h.attach("c1", 1)
    h.send("a", "a1")
    h.reject("a1")
    assert h.journal() == [("stored", "q.DLQ", "a1"), ("removed", "q", 1)]
    assert sorted(h.broker.queues) == ["q", "q.DLQ"]


def test_a_rejected_message_with_no_dead_letter_queue_allowed_is_dropped_with_a_reason(make):
    h = make(durable=True, dead_letter_queue_auto_create=False)
    h.attach("c1", 1)
    h.send("a", "a1")
    h.reject("a1")
    assert h.journal() == [("removed", "q", 1)]
    assert [reason.split(";")[0] for _, _, reason in h.dropped()] == ["rejected"]
    assert sorted(h.broker.queues) == ["q"]


def test_a_message_reaching_delivery_count_max_is_dead_lettered_with_its_count(make):
    h = make(durable=True, delivery_count_max=2, dead_letter_queue="dlq")
    h.attach("c1", 5)
    h.send("a", "a1")
    h.modify("a1")
    h.modify("a1")
    assert h.journal() == [("stored", "dlq", "a1"), ("removed", "q", 1)]
    assert [m.delivery_count for m in h.broker.queue("dlq").browse_available()] == [2]


def test_detach_dead_letters_messages_that_reach_delivery_count_max(make):
    h = make(durable=True, delivery_count_max=1, dead_letter_queue="dlq")
    h.attach("c1", 5)
    h.send("a", "a1")
    h.send("b", "b1")
    h.detach("c1")
    assert h.journal() == [("stored", "dlq", "a1"), ("stored", "dlq", "b1"),
                           ("removed", "q", 1), ("removed", "q", 2)]


def test_the_dead_letter_queue_is_delivered_to_its_own_consumers(make):
    h = make(dead_letter_queue="dlq")
    h.broker.declare_queue(QueueSettings(name="dlq"))
    h.broker.attach_consumer("dlq", "d1", False, 0)
    h.broker.set_credit("d1", 5, 0)
    h.attach("c1", 1)
    h.send("a", "a1")
    h.reject("a1")
    assert ("d1", "a1") in h.log


def test_an_auto_created_dead_letter_queue_does_not_inherit_itself_as_dead_letter_queue():
    broker = Broker(template=QueueSettings(name="template", dead_letter_queue="dlq"))
    broker.enqueue("orders", Message(b"o1", "a"), 0)
    broker.attach_consumer("orders", "c1", False, 0)
    broker.set_credit("c1", 1, 0)
    broker.settle("c1", 0, Outcome.REJECTED, 0)
    dlq = broker.queue("dlq")
    assert dlq.settings.dead_letter_queue == ""
    assert dlq.stats()["depth_messages"] == 1


def test_dead_lettering_to_a_missing_queue_drops_the_message_and_keeps_dispatching():
    broker = Broker(auto_create=False)
    broker.declare_queue(QueueSettings(name="q", group_policy="shared", dead_letter_queue="dlq",
                                       dead_letter_queue_auto_create=False))
    broker.enqueue("q", Message(b"a1", "a"), 0)
    broker.enqueue("q", Message(b"a2", "a"), 0)
    broker.attach_consumer("q", "c1", False, 0)
    broker.set_credit("c1", 1, 0)
    broker.attach_consumer("q", "c2", False, 0)
    broker.set_credit("c2", 1, 0)
    effects = broker.settle("c1", 0, Outcome.REJECTED, 0)
    assert Removed("q", 1) in effects
    assert [e.reason.split(" and ")[0] for e in effects if isinstance(e, Dropped)] == \
        ["rejected; dead-letter queue 'dlq' does not exist"]
    assert [(e.consumer_id, e.message.payload) for e in effects if isinstance(e, Deliver)] == [("c2", b"a2")]


# ---- moving and purging groups -------------------------------------------------------------------

def test_move_group_stores_at_the_destination_before_removing_at_the_source(make):
    h = make(durable=True)
    h.broker.declare_queue(QueueSettings(name="elsewhere"))
    h.send("a", "a1")
    h.send("b", "b1")
    h.send("a", "a2")
    moved, effects = h.broker.move_group("q", "a", "elsewhere", None, 0)
    h._take(effects)
    assert moved == 2
    assert h.journal() == [("stored", "elsewhere", "a1"), ("stored", "elsewhere", "a2"),
                           ("removed", "q", 1), ("removed", "q", 3)]
    assert [m.payload for m in h.broker.queue("elsewhere").browse_available()] == [b"a1", b"a2"]
    assert [m.payload for m in h.queue.browse_available()] == [b"b1"]


def test_move_group_takes_only_available_messages_from_the_head(make):
    h = make()
    h.broker.declare_queue(QueueSettings(name="elsewhere"))
    h.attach("c1", 1)
    for n in range(1, 5):
        h.send("a", f"a{n}")
    moved, _ = h.broker.move_group("q", "a", "elsewhere", 2, 0)
    assert moved == 2
    assert [m.payload for m in h.broker.queue("elsewhere").browse_available()] == [b"a2", b"a3"]
    h.accept("a1")
    assert h.credit("c1", 5) == [("c1", "a4")]


def test_move_group_to_the_same_queue_or_a_missing_one_raises_and_changes_nothing(make):
    h = make()
    h.send("a", "a1")
    before = snapshot(h.broker)
    with pytest.raises(AlreadyExists):
        h.broker.move_group("q", "a", "q", None, 0)
    with pytest.raises(NotFound):
        h.broker.move_group("q", "a", "missing", None, 0)
    with pytest.raises(NotFound):
        h.broker.purge_group("q", "nosuchgroup", None, 0)
    assert snapshot(h.broker) == before


def test_purge_group_removes_available_messages_and_lets_the_owner_continue(make):
    h = make(durable=True)
    h.attach("c1", 1)
    for n in range(1, 4):
        h.send("a", f"a{n}")
    purged, effects = h.broker.purge_group("q", "a", None, 0)
    assert purged == 2
    assert [e for e in effects if isinstance(e, Removed)] == [Removed("q", 2), Removed("q", 3)]
    h.accept("a1")
    assert h.stats()["depth_messages"] == 0
    assert h.send("a", "a4") == []  # c1 has no credit; the group is still its own
    assert h.owners() == {"a": "c1"}


def test_a_bucket_is_named_by_its_number_in_management_calls(make):
    h = make(group_buckets=4)
    h.send("a", "a1")
    bucket = h.queue.group_rows()[0]["group"]
    assert h.broker.purge_group("q", bucket, None, 0)[0] == 1
    h.send("a", "a2")
    assert h.broker.purge_group("q", "a", None, 0)[0] == 1  # a group id names its bucket too


# ---- limits and refusals -------------------------------------------------------------------------

def test_a_full_queue_in_messages_refuses_with_resource_limit_exceeded_and_changes_nothing(make):
    h = make(depth_max_messages=2)
    h.send("a", "a1")
    h.send("a", "a2")
    before = snapshot(h.broker)
    with pytest.raises(ResourceLimitExceeded) as raised:
        h.send("a", "a3")
    assert raised.value.retriable
    assert snapshot(h.broker) == before


def test_a_full_queue_in_bytes_refuses_with_resource_limit_exceeded_and_changes_nothing(make):
    h = make(depth_max_bytes=5)
    h.send("a", "a1")  # 2 bytes
    before = snapshot(h.broker)
    with pytest.raises(ResourceLimitExceeded):
        h.send("a", "long")
    assert snapshot(h.broker) == before
    h.send("a", "a2")  # 4 bytes fit
    assert h.stats()["depth_bytes"] == 4


def test_acquired_messages_count_against_the_depth_limit_until_settled(make):
    h = make(depth_max_messages=1)
    h.attach("c1", 1)
    h.send("a", "a1")
    with pytest.raises(ResourceLimitExceeded):
        h.send("a", "a2")
    h.accept("a1")
    h.send("a", "a2")


@pytest.mark.parametrize("group", [7, b"bytes", 1.5])
def test_a_group_id_that_is_not_a_string_is_refused_as_invalid_field_and_changes_nothing(make, group):
    h = make()
    h.send("a", "a1")
    before = snapshot(h.broker)
    with pytest.raises(InvalidField):
        h.send(group, "x")
    assert snapshot(h.broker) == before


def test_a_group_id_longer_than_the_limit_is_refused_as_invalid_field(make):
    h = make(group_id_length_max_chars=8)
    h.send("g" * 8, "ok")
    with pytest.raises(InvalidField) as raised:
        h.send("g" * 9, "x")
    assert condition_for(raised.value)[0] == "amqp:invalid-field"
    assert h.stats()["depth_messages"] == 1


def test_a_refused_message_does_not_leave_an_auto_created_queue_behind():
    broker = Broker()
    with pytest.raises(InvalidField):
        broker.enqueue("fresh", Message(b"x", 7), 0)
    assert broker.queues == {}
    assert broker.next_seq == 1


def test_a_missing_queue_without_auto_create_is_not_found():
    broker = Broker(auto_create=False)
    with pytest.raises(NotFound):
        broker.enqueue("q", Message(b"x"), 0)
    with pytest.raises(NotFound):
        broker.attach_consumer("q", "c1", False, 0)
    assert broker.queues == {}


def test_declaring_a_queue_again_with_other_settings_raises_unless_exist_ok():
    broker = Broker()
    first = broker.declare_queue(QueueSettings(name="q"))
    assert broker.declare_queue(QueueSettings(name="q")) is first
    with pytest.raises(AlreadyExists):
        broker.declare_queue(QueueSettings(name="q", group_policy="shared"))
    assert broker.declare_queue(QueueSettings(name="q", group_policy="shared"), exist_ok=True) is first


def test_attaching_the_same_consumer_id_twice_raises_already_exists(make):
    h = make()
    h.attach("c1")
    with pytest.raises(AlreadyExists):
        h.attach("c1")
    assert h.stats()["consumers"] == 1


def test_calls_for_an_unknown_consumer_do_nothing():
    broker = Broker()
    assert broker.set_credit("ghost", 5, 0) == []
    assert broker.settle("ghost", 0, Outcome.ACCEPTED, 0) == []
    assert broker.detach_consumer("ghost", 0) == []


# ---- deleting a queue ----------------------------------------------------------------------------

def test_deleting_a_queue_detaches_every_consumer_and_browser_with_resource_deleted(make):
    h = make()
    h.attach("c1", 1)
    h.attach("v1", 1, browse=True)
    h.send("a", "a1")
    effects = h.broker.delete_queue("q")
    assert sorted(e.consumer_id for e in effects) == ["c1", "v1"]
    assert all(isinstance(e, DetachConsumer) and isinstance(e.error, ResourceDeleted) for e in effects)
    assert condition_for(effects[0].error)[0] == "amqp:resource-deleted"
    assert "q" not in h.broker.queues


def test_after_a_queue_is_deleted_its_consumers_are_forgotten(make):
    h = make()
    h.attach("c1", 1)
    h.send("a", "a1")
    h.broker.delete_queue("q")
    assert h.broker.settle("c1", 0, Outcome.ACCEPTED, 0) == []
    assert h.broker.detach_consumer("c1", 0) == []
    h.broker.attach_consumer("q", "c1", False, 0)  # the id is free again; q is auto-created anew
    assert h.broker.queue("q").stats()["depth_messages"] == 0


# ---- time and listing ----------------------------------------------------------------------------

def test_tick_reaches_every_queue_and_next_deadline_is_the_earliest(make):
    h = make()
    h.broker.declare_queue(QueueSettings(name="other"))
    h.send("a", "a1", ttl_ms=20)
    h.send("a", "o1", ttl_ms=10, queue="other")
    assert h.broker.next_deadline_ms() == 10
    assert [e.queue for e in h.broker.tick(20) if isinstance(e, Dropped)] == ["q", "other"]
    assert h.broker.next_deadline_ms() is None


def test_queues_and_groups_are_listed_in_name_order(make):
    h = make()
    h.broker.declare_queue(QueueSettings(name="a-queue"))
    h.attach("c1", 1)
    h.send("b", "b1")
    h.send("a", "a1")
    assert [row["name"] for row in h.broker.list_queues()] == ["a-queue", "q"]
    assert h.broker.list_groups("q") == [
        {"group": "a", "messages": 1, "acquired": 0, "consumer": None},
        {"group": "b", "messages": 1, "acquired": 1, "consumer": "c1"},
    ]
