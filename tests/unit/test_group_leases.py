"""Group leases (issue 30), one rule per example, through the Broker facade (tests/unit/conftest.py's harness).

A consumer holding unsettled deliveries loses its groups after group_lease_ms with no settlement or flow
on its link: the broker detaches it (DetachConsumer, GroupLeaseExpired), its deliveries come back in
order with their delivery count raised, and its groups go to other consumers. Time moves only when a
test says so; lapses are judged at ticks.
"""

from __future__ import annotations

import dataclasses

import pytest

from node.amqp.conditions import condition_for
from node.core.dispatch.message import Outcome
from node.core.dispatch.settings import QueueSettings
from node.core.effects import DetachConsumer
from node.core.errors import GroupLeaseExpired, InvalidConfig

LEASE_MS = 500


def detached(h) -> list[tuple]:
    return [(e.consumer_id, e.error) for e in h.last_effects if isinstance(e, DetachConsumer)]


def hung_consumer_holding_a(make):
    """c1 holds a1 and a2 unsettled from t=0; c2 waits with credit; a3 is queued for c1."""
    h = make(group_lease_ms=LEASE_MS)
    h.attach("c1", 2)
    h.attach("c2", 10)
    for n in (1, 2, 3):
        h.send("a", f"a{n}")
    assert h.held_by("c1") == ["a1", "a2"]
    return h


def test_a_consumer_that_stops_settling_loses_its_group_to_another_in_order_with_counts_raised(make):
    h = hung_consumer_holding_a(make)
    assert h.tick(LEASE_MS - 1) == []
    assert h.tick(LEASE_MS) == [("c2", "a1"), ("c2", "a2"), ("c2", "a3")]
    assert h.delivery_counts() == {"a1": 1, "a2": 1, "a3": 0}
    assert h.owners() == {"a": "c2"}
    [(consumer, error)] = detached(h)
    assert consumer == "c1" and isinstance(error, GroupLeaseExpired)
    assert (error.queue, error.group, error.lease_ms) == ("q", "a", LEASE_MS)
    assert "group_lease_ms=500 ms" in error.description and "group 'a'" in error.description
    assert h.last_effects.index(next(e for e in h.last_effects if isinstance(e, DetachConsumer))) == 0


def test_the_lapsed_consumers_late_settlement_is_refused(make):
    h = hung_consumer_holding_a(make)
    h.tick(LEASE_MS)
    late = h.broker.settle("c1", 0, Outcome.ACCEPTED, LEASE_MS + 10)  # c1's delivery id 0 was a1
    assert late == []
    assert h.stats()["depth_messages"] == 3 and h.stats()["acquired_messages"] == 3  # a1..a3 all c2's
    assert h.held_by("c2") == ["a1", "a2", "a3"]


def test_a_slow_consumer_that_keeps_settling_keeps_its_group(make):
    h = hung_consumer_holding_a(make)
    for step, name in enumerate(["a1", "a2", "a3"], start=1):
        h.now_ms = step * (LEASE_MS - 100)  # each settlement comes within the lease of the last one
        h.accept(name)
        h.credit("c1", 1)  # a receiver tops its credit up as it settles
        h.tick(h.now_ms + 50)
        assert detached(h) == []
    assert h.owners() == {"a": "c1"} and h.log == [("c1", "a1"), ("c1", "a2"), ("c1", "a3")]


def test_a_flow_renews_the_lease_too(make):
    h = hung_consumer_holding_a(make)
    h.now_ms = LEASE_MS - 100
    h.credit("c1", 0)
    assert h.tick(LEASE_MS) == [] and detached(h) == []
    h.tick(2 * LEASE_MS - 100)
    assert [consumer for consumer, _ in detached(h)] == ["c1"]


def test_a_consumer_with_nothing_in_flight_keeps_its_group_however_long_it_waits(make):
    h = make(group_lease_ms=LEASE_MS)
    h.attach("c1", 5)
    h.attach("c2", 5)
    h.send("a", "a1")
    h.accept("a1")
    h.tick(100 * LEASE_MS)
    assert detached(h) == [] and h.owners() == {"a": "c1"}
    h.now_ms = 100 * LEASE_MS
    assert h.send("a", "a2") == [("c1", "a2")]  # its lease starts with this delivery
    assert h.tick(101 * LEASE_MS - 1) == [] and detached(h) == []
    assert h.tick(101 * LEASE_MS) == [("c2", "a2")]


def test_a_lapsed_group_waits_unassigned_when_no_other_consumer_has_credit(make):
    h = make(group_lease_ms=LEASE_MS)
    h.attach("c1", 1)
    h.send("a", "a1")
    assert h.tick(LEASE_MS) == []
    assert h.owners() == {"a": None} and h.stats()["consumers"] == 0
    h.attach("c2", 1)
    assert h.delivery_counts() == {"a1": 1}


def test_consumers_lapsing_at_one_tick_do_not_take_each_others_deliveries(make):
    h = make(group_lease_ms=LEASE_MS)
    h.attach("c1", 1)
    h.attach("c2", 5)
    h.send("a", "a1")
    h.send("b", "b1")
    assert h.held_by("c1") == ["a1"] and h.held_by("c2") == ["b1"]
    assert h.tick(LEASE_MS) == []
    assert sorted(consumer for consumer, _ in detached(h)) == ["c1", "c2"]
    assert h.attach("c3", 5) == [("c3", "a1"), ("c3", "b1")]
    assert h.delivery_counts() == {"a1": 1, "b1": 1}


def test_leases_are_off_by_default(make):
    h = make()
    h.attach("c1", 1)
    h.send("a", "a1")
    h.tick(10**9)
    assert detached(h) == [] and h.queue.next_deadline_ms() is None


def test_the_timer_holds_one_entry_per_consumer_whose_lease_runs_whatever_the_group_count(make):
    h = make(group_lease_ms=LEASE_MS)
    h.attach("c1", 1000)
    for n in range(1000):
        h.send(f"g{n}", f"g{n}")
    leases = h.queue._leases
    assert len(leases.heap) == 1 and h.queue.next_deadline_ms() == LEASE_MS
    for n in range(999):
        h.now_ms = n
        h.accept(f"g{n}")
    assert len(leases.heap) == 1  # renewals only write a time
    assert h.tick(LEASE_MS) == [] and leases.heap[0][0] == 998 + LEASE_MS  # pushed again at its true deadline


def test_a_lease_set_on_a_live_queue_runs_from_then_for_consumers_already_holding_deliveries(make):
    h = make()
    h.attach("c1", 1)
    h.send("a", "a1")
    h.broker.redefine_queue(dataclasses.replace(h.queue.settings, group_lease_ms=LEASE_MS))
    h.tick(1000)
    assert detached(h) == []
    h.tick(1000 + LEASE_MS)
    assert [consumer for consumer, _ in detached(h)] == ["c1"]


def test_the_condition_names_the_lease_for_amqp_clients():
    error = GroupLeaseExpired("orders", "customer-7", 30000, 2)
    name, description = condition_for(error)
    assert name == "grouper:group-lease-expired"
    assert "'orders'" in description and "'customer-7'" in description and "30000 ms" in description
    assert error.fault == "client" and error.retriable


def test_a_negative_lease_is_refused_and_an_unset_one_stays_out_of_records():
    with pytest.raises(InvalidConfig, match="group_lease_ms"):
        QueueSettings(name="q", group_lease_ms=-1).validate()
    assert "group_lease_ms" not in QueueSettings(name="q").to_dict()
    assert QueueSettings.from_dict(QueueSettings(name="q", group_lease_ms=30000).to_dict()).group_lease_ms == 30000


def test_queue_add_and_update_carry_the_lease_to_the_node():
    import argparse

    from node.admin.client import _settings_to_pb
    from node.admin.queue_flags import add_queue_flags, queue_changes_from_args, queue_settings_from_args
    from node.admin.wire import settings_changes_from_pb, settings_from_pb
    from proto import admin_pb2

    parser = argparse.ArgumentParser()
    add_queue_flags(parser)
    args = parser.parse_args(["--group-lease-ms", "30000"])
    assert settings_from_pb(_settings_to_pb(queue_settings_from_args("jobs", args))).group_lease_ms == 30000
    changes = queue_changes_from_args(args)
    assert settings_changes_from_pb(admin_pb2.QueueSettings(name="jobs", **changes)) == {"group_lease_ms": 30000}
    with pytest.raises(InvalidConfig, match="group-lease-ms"):
        queue_settings_from_args("jobs", parser.parse_args(["--group-lease-ms", "-5"]))


def test_consumers_coming_and_going_under_a_long_lease_leave_a_bounded_timer(make):
    from node.core.dispatch.queue_leases import DEPARTED_ENTRIES_MIN

    h = make(group_lease_ms=10**9)
    h.attach("stays", 0)
    for n in range(1000):
        h.attach(f"c{n}", 1)
        assert h.send(f"g{n}", f"g{n}") == [(f"c{n}", f"g{n}")]  # its lease starts
        h.accept(f"g{n}")
        h.detach(f"c{n}")
        assert len(h.queue._leases.heap) <= 2 * 2 + DEPARTED_ENTRIES_MIN + 1
    assert len(h.queue._leases.renewed_ms) <= 2 * 2 + DEPARTED_ENTRIES_MIN + 1
