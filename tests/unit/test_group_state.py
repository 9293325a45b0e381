"""What a queue keeps per group: idle groups cost nothing, live ones little, and empty owned ones
make room at groups_max (bench/memory.py measures the bytes; these check the structure).

- An idle group (no message queued or in flight, no owner) is forgotten on every path that can
  leave it idle: accept, expiry, detach, reset, withdraw, purge, hand-over, close.
- A group of one message holds no container; a drained group drops the one it had.
- The groups dict is copied small once most of its groups are gone (a dict never shrinks itself).
- Messages of one group share the group's copy of the group-id string.
- At groups_max an empty group that still has an exclusive owner gives its place to a new group;
  groups with messages queued or in flight never do, so a new group is then refused.
Hypothesis checks the lane of a group against a sorted list, and a queue at a small groups_max
against a reference of per-group order, one owner per group and nothing lost.
"""

from __future__ import annotations

import sys
from collections import deque

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from node.core.dispatch.broker import Broker
from node.core.effects import Deliver
from node.core.errors import ResourceLimitExceeded
from node.core.dispatch.message import AVAILABLE, REMOVED, Message, Outcome
from node.core.dispatch.queue_consumers import ASSIGNED_STALE_MIN
from node.core.dispatch.queue_groups import GROUPS_SHRINK_MIN
from node.core.dispatch.queue_lanes import Group
from node.core.dispatch.settings import QueueSettings


def broker_with(**settings) -> Broker:
    broker = Broker()
    broker.declare_queue(QueueSettings(name="q", durable=False, **settings))
    return broker


def send(broker: Broker, group: str | None, now_ms: int = 0, **fields) -> list:
    return broker.enqueue("q", Message(b"m%d" % broker.next_seq, group, **fields), now_ms)


def deliveries(effects: list) -> list[Deliver]:
    return [effect for effect in effects if type(effect) is Deliver]


def accept_all(broker: Broker, effects: list, now_ms: int = 0) -> list[Deliver]:
    seen = deliveries(effects)
    for deliver in seen:
        broker.settle(deliver.consumer_id, deliver.delivery_id, Outcome.ACCEPTED, now_ms)
    return seen


# ---- idle groups are forgotten on every path --------------------------------------------------

def test_a_shared_group_is_forgotten_once_its_last_message_is_accepted():
    broker = broker_with(group_policy="shared")
    broker.attach_consumer("q", "c1", False, 0)
    accept_all(broker, send(broker, "g") + broker.set_credit("c1", 10, 0))
    assert broker.queues["q"].groups == {}


def test_an_exclusive_group_is_kept_while_owned_and_forgotten_at_its_owners_detach():
    broker = broker_with()
    broker.attach_consumer("q", "c1", False, 0)
    accept_all(broker, broker.set_credit("c1", 10, 0) + send(broker, "g"))
    queue = broker.queues["q"]
    assert list(queue.groups) == ["g"] and queue.groups["g"].lane is None
    broker.detach_consumer("c1", 0)
    assert queue.groups == {}


def test_a_group_whose_only_message_expires_is_forgotten():
    broker = broker_with()
    send(broker, "g", expires_at_ms=10)
    broker.tick(10)
    assert broker.queues["q"].groups == {}


def test_a_group_is_forgotten_when_a_detach_returns_its_message_and_the_expiry_then_drops_it():
    broker = broker_with()
    broker.attach_consumer("q", "c1", False, 0)
    broker.set_credit("c1", 1, 0)
    send(broker, "g", expires_at_ms=10)
    broker.tick(20)  # acquired: its expiry waits for it to come back
    broker.detach_consumer("c1", 20)
    assert broker.queues["q"].groups == {} and broker.queues["q"].depth_messages == 0


def test_a_reset_group_without_messages_is_forgotten():
    broker = broker_with()
    broker.attach_consumer("q", "c1", False, 0)
    accept_all(broker, broker.set_credit("c1", 10, 0) + send(broker, "g"))
    broker.reset_groups("q", None, 0)
    assert broker.queues["q"].groups == {}


def test_purging_a_groups_messages_forgets_it():
    broker = broker_with()
    send(broker, "g")
    send(broker, "g")
    queue = broker.queues["q"]
    assert len(queue.take_group_messages("g", None, [])) == 2
    assert queue.groups == {}


def test_a_group_handed_over_to_another_node_is_forgotten():
    broker = broker_with()
    send(broker, "g")
    queue = broker.queues["q"]
    queue.hold_group("g")
    taken, whole = queue.hand_over_group("g", [], 10, 1 << 20)
    assert len(taken) == 1 and whole
    assert queue.groups == {}


def test_moving_a_groups_messages_to_another_queue_forgets_it_in_the_source():
    broker = broker_with()
    broker.declare_queue(QueueSettings(name="other", durable=False))
    send(broker, "g")
    send(broker, "g")
    assert broker.move_group("q", "g", "other", None, 0)[0] == 2
    assert broker.queues["q"].groups == {} and list(broker.queues["other"].groups) == ["g"]


def test_a_withdrawn_send_leaves_no_group():
    broker = broker_with()
    message = Message(b"x", "g")
    broker.enqueue("q", message, 0)
    broker.take_back([("q", message)], 0)
    assert broker.queues["q"].groups == {}


def test_a_closed_queue_keeps_no_group():
    broker = broker_with()
    broker.attach_consumer("q", "c1", False, 0)
    accept_all(broker, broker.set_credit("c1", 1, 0) + send(broker, "a"))
    send(broker, "b")
    queue = broker.queues["q"]
    queue.close([])
    assert queue.groups == {} and not queue._groups.empty_assigned


# ---- what a group holds -------------------------------------------------------------------

def test_a_group_of_one_message_holds_the_message_and_no_container():
    broker = broker_with()
    send(broker, "g")
    lane = broker.queues["q"].groups["g"].lane
    assert type(lane) is Message


def test_a_drained_group_drops_its_deque_and_an_owned_empty_group_holds_nothing():
    broker = broker_with()
    for _ in range(3):
        send(broker, "g")
    group = broker.queues["q"].groups["g"]
    assert type(group.lane) is deque
    broker.attach_consumer("q", "c1", False, 0)
    assert len(accept_all(broker, broker.set_credit("c1", 10, 0))) == 3
    assert group.lane is None and group.consumer is not None


def test_messages_of_one_group_share_the_groups_id_string():
    broker = broker_with()
    ids = ["".join(["or", "der-7"]) for _ in range(3)]  # equal strings, three objects
    assert ids[0] is not ids[1]
    for group_id in ids:
        broker.enqueue("q", Message(b"x", group_id), 0)
    queue = broker.queues["q"]
    key = next(iter(queue.groups))
    assert all(message.group_id is key for message in queue.browse_available())


def test_the_groups_dict_is_copied_small_once_most_groups_are_gone():
    broker = broker_with(group_policy="shared", groups_max=0)
    count = GROUPS_SHRINK_MIN * 16
    for index in range(count):
        send(broker, f"g{index}")
    queue = broker.queues["q"]
    full_bytes = sys.getsizeof(queue.groups)
    broker.attach_consumer("q", "c1", False, 0)
    assert len(accept_all(broker, broker.set_credit("c1", count, 0))) == count
    assert queue.groups == {}
    # copied down to what GROUPS_SHRINK_MIN groups need, below which copying is not worth it
    assert sys.getsizeof(queue.groups) <= sys.getsizeof(dict.fromkeys(range(GROUPS_SHRINK_MIN))) < full_bytes / 3


def test_a_messages_state_and_flags_share_one_int_and_are_each_set_by_name():
    message = Message(b"x", "g", closes_group=True)
    assert (message.state, message.closes_group, message.handed_out) == (AVAILABLE, True, False)
    message.handed_out = True
    message.state = REMOVED
    assert (message.state, message.closes_group, message.handed_out) == (REMOVED, True, True)
    message.state = AVAILABLE
    message.handed_out = False
    assert (message.state, message.closes_group, message.handed_out) == (AVAILABLE, True, False)
    assert not Message(b"x").closes_group


# ---- groups_max and empty owned groups ------------------------------------------------------

def test_at_groups_max_an_empty_assigned_group_gives_its_place_to_a_new_group():
    broker = broker_with(groups_max=2)
    broker.attach_consumer("q", "c1", False, 0)
    accept_all(broker, broker.set_credit("c1", 1, 0) + send(broker, "a"))  # a: empty, owned by c1
    [in_flight] = deliveries(broker.set_credit("c1", 1, 0) + send(broker, "b"))  # b: in flight
    queue = broker.queues["q"]
    send(broker, "c")  # a goes: it was empty with an owner
    assert sorted(queue.groups) == ["b", "c"]
    consumer = queue.consumers["c1"]
    assert sorted(group.key for group in consumer.assigned_groups()) == ["b"]
    with pytest.raises(ResourceLimitExceeded, match="groups_max=2"):
        send(broker, "d")  # b is in flight and c queued: neither frees itself
    assert sorted(queue.groups) == ["b", "c"] and queue.depth_messages == 2 and in_flight.message.group_id == "b"


def test_an_empty_assigned_group_that_got_a_message_again_is_not_given_away():
    broker = broker_with(groups_max=1)
    broker.attach_consumer("q", "c1", False, 0)
    accept_all(broker, broker.set_credit("c1", 10, 0) + send(broker, "a"))
    broker.set_credit("c1", 0, 0)
    send(broker, "a")  # queued again: no longer empty
    with pytest.raises(ResourceLimitExceeded):
        send(broker, "b")
    assert broker.queues["q"].groups["a"].consumer is broker.queues["q"].consumers["c1"]


def test_the_group_empty_longest_goes_first():
    broker = broker_with(groups_max=3)
    broker.attach_consumer("q", "c1", False, 0)
    broker.set_credit("c1", 100, 0)
    for group in ("a", "b", "c"):
        accept_all(broker, send(broker, group))
    send(broker, "d")
    assert sorted(broker.queues["q"].groups) == ["b", "c", "d"]


def test_stale_entries_of_empty_assigned_groups_stay_bounded():
    broker = broker_with(groups_max=2)
    broker.attach_consumer("q", "c1", False, 0)
    [in_flight] = deliveries(broker.set_credit("c1", 1, 0) + send(broker, "a"))  # a: in flight throughout
    broker.set_credit("c1", 10_000_000, 0)
    accept_all(broker, send(broker, "b"))
    accept_all(broker, send(broker, "c"))  # at groups_max: b, empty and owned, makes room; listing starts
    queue = broker.queues["q"]
    assert sorted(queue.groups) == ["a", "c"] and queue._groups.tracking_empty_assigned
    for _ in range(3 * GROUPS_SHRINK_MIN):
        accept_all(broker, send(broker, "c"))  # empty and owned after each: one more entry each time
    assert len(queue._groups.empty_assigned) <= 2 * len(queue.groups) + GROUPS_SHRINK_MIN + 1
    accept_all(broker, send(broker, "d"))  # c, listed many times over, makes room once
    assert sorted(queue.groups) == ["a", "d"] and in_flight.message.group_id == "a"


def test_empty_assigned_groups_are_listed_only_near_groups_max():
    broker = broker_with(groups_max=4)
    broker.attach_consumer("q", "c1", False, 0)
    broker.set_credit("c1", 100, 0)
    for group in ("a", "b"):
        accept_all(broker, send(broker, group))
    queue = broker.queues["q"]
    assert not queue._groups.tracking_empty_assigned and not queue._groups.empty_assigned  # far from the limit: no cost
    for group in ("c", "d", "e"):
        accept_all(broker, send(broker, group))  # e meets the limit: a goes
    assert queue._groups.tracking_empty_assigned and sorted(queue.groups) == ["b", "c", "d", "e"]
    broker.reset_groups("q", None, 0)  # every group forgotten: below half the limit, the list goes
    assert not queue._groups.tracking_empty_assigned and not queue._groups.empty_assigned and queue.groups == {}


# ---- heap entries and owner lists: stale entries are dropped --------------------------------

def test_a_heap_entry_left_in_a_former_owners_heap_is_stale_and_dropped():
    broker = broker_with(group_policy="shared")
    queue = broker.queues["q"]
    broker.attach_consumer("q", "c1", False, 0)
    broker.attach_consumer("q", "c2", False, 0)
    send(broker, "g")
    send(broker, "g")
    [first] = deliveries(broker.set_credit("c1", 1, 0))  # c1 owns g: g waits in c1's heap at seq 1
    c1, c2 = queue.consumers["c1"], queue.consumers["c2"]
    group = queue.groups["g"]
    assert c1.ready and c1.ready[0] is group.placed
    broker.settle("c1", first.delivery_id, Outcome.ACCEPTED, 0)  # g is free: placed in the unassigned heap
    assert group.consumer is None and queue._groups.unassigned[0] is group.placed and c1.ready[0] is not group.placed
    [second] = deliveries(broker.set_credit("c2", 1, 0))  # the same head seq as c1's entry, from the unassigned heap
    assert (second.consumer_id, second.message.seq) == ("c2", first.message.seq + 1) and group.consumer is c2
    assert deliveries(broker.set_credit("c1", 1, 0)) == [] and c1.ready == []  # met and dropped


def test_a_closing_groups_hold_lasts_until_its_messages_are_settled():
    broker = broker_with(group_policy="shared")
    broker.attach_consumer("q", "c1", False, 0)
    send(broker, "g", closes_group=True)
    send(broker, "g")
    [closing] = deliveries(broker.set_credit("c1", 5, 0))
    group = broker.queues["q"].groups["g"]
    assert group.paused and group.placed not in broker.queues["q"].consumers["c1"].ready
    [after] = deliveries(broker.settle("c1", closing.delivery_id, Outcome.ACCEPTED, 0))
    assert after.message.seq == closing.message.seq + 1 and not group.paused


def test_a_consumers_owned_list_keeps_few_stale_entries_and_counts_each_group_once():
    broker = broker_with(group_policy="shared")
    broker.attach_consumer("q", "c1", False, 0)
    broker.set_credit("c1", 1_000_000, 0)
    queue = broker.queues["q"]
    consumer = queue.consumers["c1"]
    [kept] = deliveries(send(broker, "kept"))  # owned throughout: its message stays unsettled
    for index in range(1_000):  # each group taken and freed; "again" taken by c1 again and again
        accept_all(broker, send(broker, "again" if index % 2 else f"g{index}"))
        assert len(consumer.assigned) <= 2 * consumer.assigned_count + ASSIGNED_STALE_MIN
    assert consumer.assigned_groups() == [queue.groups["kept"]] and consumer.assigned_count == 1
    assert len(queue.groups) == 1 and kept.message.group_id == "kept"
    broker.detach_consumer("c1", 0)
    assert queue.groups["kept"].consumer is None and queue.groups["kept"].available_count == 1


# ---- the lane of a group against a sorted list ------------------------------------------------

LANE_STEPS = st.lists(st.one_of(
    st.tuples(st.just("new")), st.tuples(st.just("return"), st.integers(0, 50)),
    st.tuples(st.just("remove"), st.integers(0, 50)), st.tuples(st.just("pop"))), max_size=60)


@given(LANE_STEPS)
def test_a_groups_lane_keeps_seq_order_through_appends_returns_removals_and_pops(steps):
    group = Group("g")
    reference: list[int] = []  # available seqs in order
    messages: dict[int, Message] = {}
    out: list[Message] = []  # popped (delivered) messages that may come back
    next_seq = 0
    for step in steps:
        if step[0] == "new":
            message = messages[next_seq] = Message(b"", "g", seq=next_seq)
            next_seq += 1
            group.push(message, returning=False)
            reference.append(message.seq)
        elif step[0] == "return" and out:
            message = out.pop(step[1] % len(out))
            message.state = AVAILABLE
            group.push(message, returning=True)
            reference.append(message.seq)
            reference.sort()
        elif step[0] == "remove" and reference:
            seq = reference.pop(step[1] % len(reference))
            messages[seq].state = REMOVED  # a tombstone: head() drops it when met
        elif step[0] == "pop" and reference:
            head = group.head()
            assert head is not None and head.seq == reference[0]
            assert group.pop_head() is head
            head.state = 1  # acquired
            out.append(head)
            reference.pop(0)
        head = group.head()
        assert (head.seq if head else None) == (reference[0] if reference else None)
        assert [m.seq for m in group.messages() if m.state == AVAILABLE] == reference
        if not reference:
            assert group.lane is None  # an empty group holds no container


# ---- a queue at a small groups_max against a reference ------------------------------------------

QUEUE_STEPS = st.lists(st.one_of(
    st.tuples(st.just("send"), st.sampled_from("abcde")),
    st.tuples(st.just("credit"), st.sampled_from(["c1", "c2"]), st.integers(0, 3)),
    st.tuples(st.just("accept"), st.integers(0, 10)),
    st.tuples(st.just("release"), st.integers(0, 10)),
    st.tuples(st.just("detach"), st.sampled_from(["c1", "c2"]))), max_size=50)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(QUEUE_STEPS, st.integers(1, 3))
def test_a_queue_at_groups_max_keeps_order_and_owners_and_loses_nothing(steps, groups_max):
    broker = broker_with(groups_max=groups_max)
    queue = broker.queues["q"]
    queued: dict[str, list[int]] = {}  # group -> seqs not yet accepted, in order
    unsettled: list[Deliver] = []
    attached: set[str] = set()
    accepted = refused = 0

    def observe(effects):
        for deliver in deliveries(effects):
            group = deliver.message.group_id
            # in order: the first of its group not already out with a consumer
            out = {d.message.seq for d in unsettled}
            expected = next(seq for seq in queued[group] if seq not in out)
            assert deliver.message.seq == expected, (group, deliver.message.seq, queued[group])
            holders = {d.consumer_id for d in unsettled if d.message.group_id == group}
            assert holders <= {deliver.consumer_id}, f"group {group} out to {holders} and {deliver.consumer_id}"
            unsettled.append(deliver)

    for step in steps:
        if step[0] == "send":
            try:
                effects = send(broker, step[1])
            except ResourceLimitExceeded:
                refused += 1
                busy = [g for g in queue.groups.values() if g.available_count or g.acquired]
                assert len(busy) == len(queue.groups) >= groups_max  # refused only when none could go
                continue
            queued.setdefault(step[1], []).append(broker.next_seq - 1)
            observe(effects)
        elif step[0] == "credit":
            if step[1] not in attached:
                observe(broker.attach_consumer("q", step[1], False, 0))
                attached.add(step[1])
            observe(broker.set_credit(step[1], step[2], 0))
        elif step[0] in ("accept", "release") and unsettled:
            deliver = unsettled.pop(step[1] % len(unsettled))
            outcome = Outcome.ACCEPTED if step[0] == "accept" else Outcome.RELEASED
            if outcome is Outcome.ACCEPTED:
                queued[deliver.message.group_id].remove(deliver.message.seq)
                accepted += 1
            observe(broker.settle(deliver.consumer_id, deliver.delivery_id, outcome, 0))
        elif step[0] == "detach" and step[1] in attached:
            attached.discard(step[1])
            unsettled[:] = [d for d in unsettled if d.consumer_id != step[1]]
            observe(broker.detach_consumer(step[1], 0))
        assert len(queue.groups) <= groups_max
        live = sum(len(seqs) for seqs in queued.values())
        assert queue.depth_messages == live  # nothing lost, nothing doubled
        for key, group in queue.groups.items():
            assert not group.idle, f"idle group {key} kept"
            if group.consumer is not None:
                assert group in group.consumer.assigned
        for consumer in queue.consumers.values():
            owned = consumer.assigned_groups()
            assert len(owned) == consumer.assigned_count
            assert all(queue.groups.get(group.key) is group for group in owned)
    assert accepted + refused <= len(steps)
